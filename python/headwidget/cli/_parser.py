"""The ``headwidget`` argument parser: one subparser per :class:`~headwidget.cli._command.Command`.

Example:
    >>> from headwidget.cli import COMMANDS
    >>> build_parser(COMMANDS.values()).parse_args(["demo", "--no-figures"]).command
    'demo'
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from typing import NoReturn

from headwidget.cli._command import Command
from headwidget.cli._errors import one_line

__all__ = ["build_parser"]


class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line (and exit code 2), pointing at ``--help``."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: {one_line(message)} (see {self.prog} --help)\n")


def build_parser(commands: Iterable[Command]) -> argparse.ArgumentParser:
    """The parser of ``headwidget`` with a subcommand for each of ``commands``, in that order.

    Example:
        >>> from headwidget.cli import COMMANDS
        >>> build_parser(COMMANDS.values()).prog
        'headwidget'
    """
    parser = _Parser(
        prog="headwidget", description="How redundant are a transformer's attention heads and KV channels?"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for command in commands:
        command.add_parser(sub)
    return parser
