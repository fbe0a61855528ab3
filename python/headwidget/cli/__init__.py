"""The ``headwidget`` command line: ``demo``, ``capture``, ``figure``, ``evaluate`` and ``heal``.

Exit codes: 0 success; 1 a headwidget error (bad statistics file, unsupported model, a model directory
that cannot be loaded, memory budget, a variant the model cannot take...); 2 a usage error (unknown
option, bad option value, missing or unreadable input file, output path that cannot be written). Every
failure is one line on stderr, ``headwidget COMMAND: what was wrong and what to do``. Output paths are
checked before any work, so a capture is never thrown away for want of a place to save it.

One module per job: ``_parser`` (the argument parser), ``_models`` (``--model`` and ``--device``),
``_files`` (text files in, output paths checked), ``_options`` (option types), ``_errors`` (the error
types and their one-line form), and one module per command (``_demo``, ``_capture``, ``_figure``,
``_evaluate``, ``_heal``), each a :class:`~headwidget.cli._command.Command`.

Example:
    >>> list(COMMANDS)
    ['demo', 'capture', 'figure', 'evaluate', 'heal']
"""

from __future__ import annotations

import sys

from headwidget.cli import _capture, _demo, _evaluate, _figure, _heal
from headwidget.cli._errors import ModelLoadError as ModelLoadError
from headwidget.cli._errors import UsageError, one_line
from headwidget.cli._files import check_output_dir as check_output_dir
from headwidget.cli._files import check_output_file as check_output_file
from headwidget.cli._files import read_texts as read_texts
from headwidget.cli._models import EMBEDDED as EMBEDDED
from headwidget.cli._models import check_device as check_device
from headwidget.cli._models import load_model
from headwidget.cli._options import DPI_RANGE as DPI_RANGE
from headwidget.cli._parser import build_parser
from headwidget.errors import HeadwidgetError

__all__ = ["main"]

#: The subcommands, in the order ``headwidget --help`` lists them.
COMMANDS = {
    c.name: c for c in (_demo.COMMAND, _capture.COMMAND, _figure.COMMAND, _evaluate.COMMAND, _heal.COMMAND)
}


def main(argv: list[str] | None = None) -> int:
    """Run the command line with ``argv`` (default: ``sys.argv[1:]``); returns the exit code.

    A user error prints one line, ``headwidget COMMAND: …``, on stderr and returns 1 or 2 (argparse's
    own errors exit with 2 by ``SystemExit``).

    Example:
        >>> main(["figure", "/no/such/stats.safetensors", "--out", "figure.png"])
        2
    """
    args = build_parser(COMMANDS.values()).parse_args(argv)
    try:
        return COMMANDS[args.command].run(args, load_model)  # this module's load_model, as it is now
    except UsageError as err:
        print(f"headwidget {args.command}: {one_line(err)}", file=sys.stderr)
        return 2
    except HeadwidgetError as err:
        print(f"headwidget {args.command}: {one_line(err)}", file=sys.stderr)
        return 1
    except OSError as err:  # the disk, not headwidget: full, gone, permissions changed mid-run
        print(f"headwidget {args.command}: {one_line(err)}", file=sys.stderr)
        return 1
