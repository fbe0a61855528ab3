"""``headwidget figure``: a view's figure from saved statistics, as PNG, SVG, PDF or standalone HTML.

Example:
    >>> COMMAND.name
    'figure'
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any

from headwidget.cli._command import Command
from headwidget.cli._errors import FigureError, UsageError
from headwidget.cli._files import check_output_file
from headwidget.cli._models import Loader
from headwidget.cli._options import DPI_RANGE, ascii_int, dpi, int_list

if TYPE_CHECKING:
    from headwidget.views import View

__all__ = ["COMMAND"]


def add_parser(sub: Any) -> None:
    """Declare ``figure`` and its options on the subparsers ``sub`` (the views from the registry)."""
    from headwidget.views import view_names

    names = view_names()
    fig = sub.add_parser(
        "figure",
        help="draw a reference-style figure from saved statistics",
        description=f"Draw a view's figure ({', '.join(names)}) from a statistics file and save it as "
        ".png, .svg, .pdf or a standalone .html.",
    )
    fig.add_argument("stats", type=Path, help="statistics file written by `headwidget capture`")
    fig.add_argument("--view", default=names[0], choices=names, help=f"which view (default: {names[0]})")
    fig.add_argument(
        "--layers",
        default=None,
        help="comma-separated layers: the first is selected; the rest are the view's (channels: one "
        "column each; alignment: one flattened set of heads)",
    )
    fig.add_argument(
        "--kind",
        default="key",
        choices=("key", "key_post"),
        help="pre- or post-RoPE keys (views with a kind)",
    )
    fig.add_argument("--channels", default=None, help="channel window START:STOP (views with a window)")
    fig.add_argument("--model", default=None, help="model directory or embedded name (views of weights)")
    fig.add_argument("--out", required=True, type=Path, help="output file: .png, .svg, .pdf or .html")
    fig.add_argument(
        "--dpi",
        type=dpi,
        default=200,
        help=f"resolution of .png output, {DPI_RANGE[0]}..{DPI_RANGE[1]} (default: 200)",
    )


def _figure_state(view: type[View], args: argparse.Namespace) -> dict[str, Any]:
    """Initial state from --kind and --channels, for the views that have a kind and a window."""
    state: dict[str, Any] = {}
    if "kind" in view.state_traits():
        state["kind"] = args.kind
    window = next((c for c in view.view_controls() if c.type == "window"), None)
    if args.channels and window is not None:
        ends = [ascii_int(x) for x in args.channels.split(":")]
        start, stop = (ends[0], ends[1]) if len(ends) == 2 else (None, None)
        if start is None or stop is None:
            raise UsageError(f"--channels takes START:STOP (two integers), got {args.channels!r}")
        if not 0 <= start < stop:
            raise UsageError(f"--channels takes START:STOP with 0 ≤ START < STOP, got {args.channels!r}")
        state.update({window.trait: start, window.width: stop - start})
    return state


def run(args: argparse.Namespace, load: Loader) -> int:
    """Check the options and ``--out``, read the statistics, draw the view and save it."""
    from headwidget.export import save
    from headwidget.stats import KVStats
    from headwidget.views import view_class

    if not args.stats.is_file():
        raise UsageError(f"{args.stats}: no such statistics file")
    if args.out.suffix.lower() not in (".png", ".svg", ".pdf", ".html"):
        raise UsageError(f"--out {args.out}: the extension must be .png, .svg, .pdf or .html")
    cls = view_class(args.view)
    needs_model = cls.sources.main == "model"
    if needs_model and args.model is None:
        raise UsageError(f"--view {args.view} needs --model (the weights of the model the stats come from)")
    layers = int_list(args.layers, "--layers")
    state = _figure_state(cls, args)
    check_output_file(args.out)
    stats = KVStats.load(args.stats)
    layers = layers or stats.layers[:1]
    model = load(args.model, device="cpu", tokenizer=False)[0] if needs_model else None
    view = cls.create(stats, model, layers=layers, interactive=False, **state)
    if view.error:
        raise FigureError(view.error)
    save(view, args.out, dpi=args.dpi)
    print(f"saved {args.out}")
    return 0


COMMAND = Command("figure", add_parser, run)
