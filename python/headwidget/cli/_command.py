"""What a subcommand is: its name, how it adds its options, and how it runs.

Example:
    >>> import argparse
    >>> hello = Command("hello", lambda sub: sub.add_parser("hello"), lambda args, load: 0)
    >>> hello.run(argparse.Namespace(), lambda name, **options: (None, None))
    0
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from headwidget.cli._models import Loader

__all__ = ["Command"]


@dataclass(frozen=True)
class Command:
    """One ``headwidget COMMAND``: ``add_parser(subparsers)`` declares its options, ``run(args, load)``
    does the work and returns the exit code. ``load`` loads ``--model``: ``main`` passes
    :func:`~headwidget.cli._models.load_model` (looked up when the command runs, so it can be replaced).

    Example:
        >>> Command("noop", print, lambda args, load: 0).name
        'noop'
    """

    name: str
    add_parser: Callable[[Any], object]
    run: Callable[[argparse.Namespace, Loader], int]
