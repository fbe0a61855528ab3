"""``headwidget figure``: a view's figure from saved files, as PNG, SVG, PDF or standalone HTML.

Each view draws what it is built from (its ``sources``): statistics (the positional file, from
``headwidget capture``), a model's weights (``--model``), an evaluation report (``--report``, from
``headwidget evaluate``), healing runs (``--runs``, from ``headwidget heal``, read by
:meth:`HealingRun.load_all <headwidget.HealingRun.load_all>`) or a training run's timeline
(``--timeline``, a :class:`~headwidget.Tracker`'s folder). A view asked for without what it is built
from is refused with the option that gives it; the files given must be of one model.

Example:
    >>> COMMAND.name
    'figure'
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
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
    from headwidget.views import view_class, view_names

    names = view_names()
    fig = sub.add_parser(
        "figure",
        help="draw a view's figure from saved statistics, reports, healing runs or a timeline",
        description=f"Draw a view's figure ({', '.join(names)}) and save it as .png, .svg, .pdf or a "
        "standalone .html. Each view reads what it is built from: "
        + "; ".join(f"{name}: {_needs(view_class(name))}" for name in names)
        + ".",
    )
    fig.add_argument(
        "stats",
        type=Path,
        nargs="?",
        default=None,
        help="statistics file written by `headwidget capture` (the views of statistics)",
    )
    fig.add_argument(
        "--report", type=Path, default=None, help="evaluation report (.json) written by `headwidget evaluate`"
    )
    fig.add_argument(
        "--runs",
        type=Path,
        default=None,
        help="healing runs (.json) written by `headwidget heal` (read by headwidget.HealingRun.load_all)",
    )
    fig.add_argument(
        "--timeline", type=Path, default=None, help="timeline folder written by a headwidget.Tracker"
    )
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


#: Each source a view may be built from: the option that gives it, and what that is.
OPTIONS = {
    "stats": ("STATS", "statistics file (`headwidget capture`)"),
    "model": ("--model", "the weights of the model the statistics come from"),
    "report": ("--report", "an evaluation report written by `headwidget evaluate`"),
    "healing": ("--runs", "healing runs written by `headwidget heal`"),
    "timeline": ("--timeline", "a timeline folder written by a headwidget.Tracker"),
}


def _needs(view: type[View]) -> str:
    """What ``view`` reads, as options: ``"--report"``, ``"STATS [--report]"``."""
    made = view.sources
    main = [OPTIONS[made.main][0]] if made.main else []
    return " ".join([*main, *(f"[{OPTIONS[s][0]}]" for s in made.optional)])


def _given(args: argparse.Namespace) -> dict[str, Path | str | None]:
    return {
        "stats": args.stats,
        "model": args.model,
        "report": args.report,
        "healing": args.runs,
        "timeline": args.timeline,
    }


def _check_sources(view: type[View], name: str, given: dict[str, Path | str | None]) -> None:
    """Refuse a view without the file it is built from, or with a file it does not read."""
    made = view.sources
    if made.main and given[made.main] is None:
        option, what = OPTIONS[made.main]
        give = "a statistics file" if made.main == "stats" else option
        raise UsageError(f"--view {name} needs {give} ({what})")
    unread = [OPTIONS[s][0] for s, v in given.items() if v is not None and not made.takes(s)]
    if unread:
        raise UsageError(f"--view {name} reads {_needs(view)}, not {', '.join(unread)}")
    stats = given["stats"]
    if isinstance(stats, Path) and not stats.is_file():
        raise UsageError(f"{stats}: no such statistics file")
    for source in ("report", "healing"):
        path = given[source]
        if isinstance(path, Path) and not path.is_file():
            raise UsageError(f"{OPTIONS[source][0]} {path}: no such file ({OPTIONS[source][1]})")
    timeline = given["timeline"]
    if isinstance(timeline, Path) and not timeline.is_dir():
        raise UsageError(f"--timeline {timeline}: no such folder ({OPTIONS['timeline'][1]})")


def _read(given: dict[str, Path | str | None], load: Loader) -> dict[str, Any]:
    """The sources given, read (a model loaded on the CPU)."""
    from headwidget.evaluation import EvaluationReport
    from headwidget.healing import HealingRun
    from headwidget.stats import KVStats
    from headwidget.tracking import Timeline

    readers: dict[str, Callable[[Path | str], Any]] = {
        "stats": KVStats.load,
        "report": EvaluationReport.load,
        "healing": HealingRun.load_all,
        "timeline": Timeline.load,
    }
    read: dict[str, Any] = {s: None if v is None else readers[s](v) for s, v in given.items() if s in readers}
    model = given["model"]
    read["model"] = None if model is None else load(str(model), device="cpu", tokenizer=False)[0]
    return read


def run(args: argparse.Namespace, load: Loader) -> int:
    """Check the options and ``--out``, read what the view is built from, draw the view and save it."""
    from headwidget.export import save
    from headwidget.views import view_class

    cls = view_class(args.view)
    given = _given(args)
    _check_sources(cls, args.view, given)
    if args.out.suffix.lower() not in (".png", ".svg", ".pdf", ".html"):
        raise UsageError(f"--out {args.out}: the extension must be .png, .svg, .pdf or .html")
    layers = int_list(args.layers, "--layers")
    state = _figure_state(cls, args)
    check_output_file(args.out)
    read = _read(given, load)
    stats = read["stats"]
    if not layers and stats is not None:  # the first the view can select (layer view: a cross layer)
        layers = (cls.layers_offered(stats) or stats.layers)[:1]
    view = cls.create(layers=layers or (), interactive=False, **read, **state)
    if view.error:
        raise FigureError(view.error)
    save(view, args.out, dpi=args.dpi)
    print(f"saved {args.out}")
    return 0


COMMAND = Command("figure", add_parser, run)
