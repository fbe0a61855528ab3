"""Charts (:mod:`headwidget.core.charts`) drawn on matplotlib axes, as the widget draws them.

The same colours by series order (Okabe–Ito, as ``js/lib/charts.ts``), points and lines, log axes,
a dotted reference line, the legend above the plot. A static figure has no hover, so each point of a
point series is labelled with the first line of its hover text (the variant's spec, say) when the
chart has few enough points to read them.

Example:
    >>> from matplotlib.figure import Figure
    >>> from headwidget.core.charts import Chart, Series
    >>> chart = Chart("c", "damage", "bytes / token", "ΔNLL",
    ...               [Series("variants", [512, 128], [0.0, 0.5], ["model", "mqa"])], x_log=True)
    >>> ax = Figure().subplots()
    >>> draw_chart(ax, chart)
    >>> ax.get_xscale(), [t.get_text() for t in ax.texts]
    ('log', ['model', 'mqa'])
"""

from __future__ import annotations

import math

from matplotlib.axes import Axes
from matplotlib.figure import Figure
from matplotlib.text import Annotation
from matplotlib.ticker import FuncFormatter, LogLocator, MaxNLocator, NullFormatter
from matplotlib.typing import CoordsType

from headwidget.core.charts import Chart
from headwidget.export._labels import printable, text_width, wrap

__all__ = ["CHART_IN", "PALETTE", "draw_chart", "place_point_labels", "tick_label"]

PALETTE = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#000000"]
#: A chart's (width, height) in inches on an automatically sized figure.
CHART_IN = (4.2, 3.3)
#: Points of one chart beyond which they are not labelled (the labels would overlap).
MAX_LABELLED = 16
#: The gid of a point's label: what :func:`place_point_labels` may move.
POINT_LABEL = "point-label"
TITLE_PT, SUBTITLE_PT, TICK_PT, NOTE_PT, LABEL_PT = 9.0, 7.5, 7.0, 6.5, 8.0
TEXT_COLOR, MUTED_COLOR = "#1f1f1f", "#5f5f5f"


def _color(chart: Chart, i: int) -> str:
    return chart.series[i].color or PALETTE[i % len(PALETTE)]


def tick_label(value: float, _pos: object = None) -> str:
    """A tick as the widget writes it: ``15,360``, ``0.25``, ``1e-05`` (plain text, no mathtext).

    Example:
        >>> tick_label(15360.0), tick_label(0.25), tick_label(1e-5), tick_label(2e9)
        ('15,360', '0.25', '1e-05', '2e+09')
    """
    if not math.isfinite(value):
        return ""
    if value == int(value) and 1000 <= abs(value) < 1e9:
        return f"{int(value):,}"
    if value != 0 and not 1e-4 <= abs(value) < 1e5:
        return f"{value:.2g}"
    return f"{value:.4g}"


#: Inches per tick label a log axis over less than a decade leaves (its ticks are spaced linearly).
NARROW_LOG_TICK_IN = 0.55


def _log_axis(axis: object, values: list[float], length_in: float) -> None:
    """Ticks at 1, 2 and 5 per decade; over less than a decade (where those give one tick or a crowd),
    round values evenly spaced in 2-5 intervals, as many as the axis' length holds."""
    positive = [v for v in values if v > 0 and math.isfinite(v)]
    if positive and max(positive) < 10 * min(positive):
        nbins = max(2, min(5, int(length_in / NARROW_LOG_TICK_IN)))
        axis.set_major_locator(MaxNLocator(nbins=nbins, steps=[1, 2, 2.5, 5, 10]))  # type: ignore[attr-defined]
    else:
        axis.set_major_locator(LogLocator(base=10, subs=(1.0, 2.0, 5.0)))  # type: ignore[attr-defined]
    axis.set_major_formatter(FuncFormatter(tick_label))  # type: ignore[attr-defined]
    axis.set_minor_formatter(NullFormatter())  # type: ignore[attr-defined]


def _padded(ends: list[float], log: bool) -> tuple[float, float]:
    """An axis' ends widened as ``js/lib/charts.ts``'s ``axisRange`` widens them: 5 % of the span on
    each side (linear; ±10 % of the value when it is one point), a twentieth of the decades (at least
    0.1 decade) on a log axis.

    >>> _padded([0.0, 100.0], False), _padded([10.0, 1000.0], True)
    ((-5.0, 105.0), (7.943282347242816, 1258.9254117941675))
    """
    lo, hi = ends
    if log and lo > 0:
        a, b = math.log10(lo), math.log10(hi)
        pad = max(0.05 * (b - a), 0.1)
        return 10 ** (a - pad), 10 ** (b + pad)
    if hi == lo:
        d = abs(lo) * 0.1 if lo else 1.0
        return lo - d, hi + d
    pad = 0.05 * (hi - lo)
    return lo - pad, hi + pad


#: Inches of a chart's text width taken by its y tick labels and y label, left of the plot.
AXIS_LABELS_IN = 0.5
#: Legend geometry (in units of its font size), as :meth:`Axes.legend` is called below.
LEGEND_HANDLE_EM, LEGEND_PAD_EM, LEGEND_GAP_EM, LEGEND_ROW_EM = 1.6, 0.8, 1.0, 1.55


def legend_rows(names: list[str], width_in: float) -> tuple[int, int]:
    """(columns, rows) of a legend of ``names`` laid out in equal columns within ``width_in`` inches.

    >>> legend_rows(["mechanisms", "quantizers", "Pareto frontier"], 4.0)
    (3, 1)
    >>> legend_rows(["K pre-RoPE · joint", "K pre-RoPE · Σ marginals", "V · joint", "V · Σ marginals"], 2.0)
    (1, 4)
    """
    if not names:
        return 0, 0
    extras = (LEGEND_HANDLE_EM + LEGEND_PAD_EM + LEGEND_GAP_EM) * TICK_PT / 72
    column = max(text_width(n, TICK_PT) for n in names) + extras
    columns = max(1, min(len(names), int(width_in // column)))
    return columns, math.ceil(len(names) / columns)


def legend_height_pt(rows: int) -> float:
    """Points a legend of ``rows`` rows takes above a chart (0 without one)."""
    return rows * TICK_PT * LEGEND_ROW_EM + (2.0 if rows else 0.0)


def draw_chart(ax: Axes, chart: Chart, text_w: float = 3.8) -> None:
    """Draw ``chart`` on ``ax``; ``text_w``: inches the subtitle and note wrap to."""
    labelled = sum(len(s.finite_points(chart.x_log, chart.y_log)) for s in chart.series if s.style != "line")
    for i, s in enumerate(chart.series):
        keep = s.finite_points(chart.x_log, chart.y_log)
        xs, ys = [s.x[k] for k in keep], [s.y[k] for k in keep]
        color, name = _color(chart, i), printable(s.name) or None
        if s.style != "points":
            # A line breaks where a value is missing: draw each run of kept points on its own.
            runs: list[list[int]] = []
            for k in keep:
                if runs and k == runs[-1][-1] + 1:
                    runs[-1].append(k)
                else:
                    runs.append([k])
            for r, run in enumerate(runs):
                ax.plot(
                    [s.x[k] for k in run],
                    [s.y[k] for k in run],
                    color=color,
                    linewidth=1.2,
                    linestyle="--" if s.dashed else "-",
                    label=name if r == 0 else None,
                    marker="o" if s.style == "points+line" else None,
                    markersize=4,
                    markeredgecolor="white",
                    markeredgewidth=0.6,
                    zorder=2,
                )
        else:
            ax.scatter(xs, ys, s=22, color=color, edgecolors="white", linewidths=0.6, label=name, zorder=3)
        if s.style != "line" and chart.label_points and labelled <= MAX_LABELLED:
            for k in keep:
                text = printable(s.labels[k].split("\n", 1)[0])
                ax.annotate(
                    text,
                    (s.x[k], s.y[k]),
                    xytext=(4, 3),
                    textcoords="offset points",
                    fontsize=TICK_PT - 0.5,
                    color=TEXT_COLOR,
                    gid=POINT_LABEL,
                )
    xs_all = [x for s in chart.series for x in s.x]
    ys_all = [y for s in chart.series for y in s.y]
    if chart.x_log:
        ax.set_xscale("log")
        _log_axis(ax.xaxis, xs_all, text_w)
    else:
        ax.xaxis.set_major_formatter(FuncFormatter(tick_label))
    if chart.x_range:  # the axis charts share (the timeline's steps), padded as the widget pads it
        ax.set_xlim(*_padded(chart.x_range, chart.x_log))
    if chart.x_ticks:
        ax.set_xticks(chart.x_ticks, [printable(t) for t in chart.x_tick_labels] or None)
        ax.xaxis.set_minor_formatter(NullFormatter())
    if chart.y_log:
        ax.set_yscale("log")
        _log_axis(ax.yaxis, ys_all, text_w * 0.75)
    else:
        ax.yaxis.set_major_formatter(FuncFormatter(tick_label))
    if chart.y_reference is not None:
        ax.axhline(chart.y_reference, color=MUTED_COLOR, linewidth=0.7, linestyle=":", zorder=1)
    ax.grid(True, color="#e6e6e6", linewidth=0.6, zorder=0)
    ax.set_axisbelow(True)
    ax.tick_params(length=2.5, width=0.6, pad=1.5, labelsize=TICK_PT, colors=TEXT_COLOR)
    ax.set_xlabel(printable(chart.x_label), fontsize=LABEL_PT)
    ax.set_ylabel(printable(chart.y_label), fontsize=LABEL_PT)
    subtitle = wrap(printable(chart.subtitle), text_w, SUBTITLE_PT)
    names = [printable(s.name) for s in chart.series if s.name]
    columns, rows = legend_rows(names, text_w - AXIS_LABELS_IN)
    legend_pt = legend_height_pt(rows)
    title_axes(ax, printable(chart.title), subtitle, legend_pt)
    if names:
        # Its rows and columns are sized to the chart's text width above, so the layout need not
        # make room for it (counted in, a legend wider than the plot squeezes the plot instead).
        legend = ax.legend(
            loc="lower left",
            bbox_to_anchor=(0.0, 1.0),
            ncols=columns,
            frameon=False,
            fontsize=TICK_PT,
            borderaxespad=0.2,
            handlelength=LEGEND_HANDLE_EM,
            handletextpad=LEGEND_PAD_EM,
            columnspacing=LEGEND_GAP_EM,
        )
        legend.set_in_layout(False)
    if chart.note:
        note = "\n".join(wrap(printable(chart.note), text_w, NOTE_PT, style="italic"))
        note_under(ax, note, "axes fraction", 30)
    ax.set_gid(chart.id)


def title_axes(ax: Axes, title: str, subtitle: list[str], above: float = 0.0) -> None:
    """``title`` over ``ax`` in bold, left-aligned, the wrapped ``subtitle`` lines under it, and ``above``
    points (a chart's legend) between them and the plot."""
    pad = 2.0 + (SUBTITLE_PT * 1.2 * len(subtitle) + 2.0 if subtitle else 0.0) + above
    ax.set_title(title, loc="left", fontsize=TITLE_PT, fontweight="bold", pad=pad)
    if subtitle:
        ax.annotate(
            "\n".join(subtitle),
            xy=(0, 1),
            xycoords="axes fraction",
            xytext=(0, 3 + above),
            textcoords="offset points",
            ha="left",
            va="bottom",
            fontsize=SUBTITLE_PT,
            color=MUTED_COLOR,
        )


def note_under(ax: Axes, note: str, below: CoordsType, gap: float) -> None:
    """``note`` in muted italics from the left edge of ``ax``, ``gap`` points under ``below`` (the axes'
    bottom edge, ``"axes fraction"``, or what is drawn there)."""
    ax.annotate(
        note,
        xy=(0, 0),
        xycoords=below,
        xytext=(0, -gap),
        textcoords="offset points",
        ha="left",
        va="top",
        fontsize=NOTE_PT,
        style="italic",
        color=MUTED_COLOR,
    )


def place_point_labels(fig: Figure) -> None:
    """Move each point label of a laid-out figure off the labels placed before it.

    A label starts above and right of its point (where :func:`draw_chart` puts it); where that box
    overlaps a label already placed (two variants with nearly the same bytes and damage), it takes the
    first of: below right, above left, below left, then a line further up or down, that overlaps none
    and stays inside its axes. A label with no free place keeps its first one. Run once the layout is
    final: the places are measured on the figure as it will be drawn.

    Example:
        >>> from matplotlib.backends.backend_agg import FigureCanvasAgg
        >>> from headwidget.core.charts import Chart, Series
        >>> fig = Figure(figsize=(3, 2), dpi=100)
        >>> _ = FigureCanvasAgg(fig)
        >>> ax = fig.subplots()
        >>> draw_chart(ax, Chart("c", "", "x", "y", [Series("s", [1.0, 1.0, 9.0], [1.0, 1.0, 9.0],
        ...                                                   ["a", "b", "c"])]))
        >>> place_point_labels(fig)
        >>> [t.get_text() for t in ax.texts], ax.texts[0].xyann != ax.texts[1].xyann
        (['a', 'b', 'c'], True)
    """
    renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]
    per_point = 72.0 / fig.dpi
    for ax in fig.axes:
        labels = [t for t in ax.texts if isinstance(t, Annotation) and t.get_gid() == POINT_LABEL]
        if len(labels) < 2:
            continue
        frame = ax.get_window_extent(renderer)
        placed: list[tuple[float, float, float, float]] = []
        for label in labels:
            box = label.get_window_extent(renderer)
            w, h = box.width * per_point, box.height * per_point  # the label's size in points
            start = label.xyann
            shifts = [(0.0, 0.0), (0.0, -(h + 6.0)), (-(w + 8.0), 0.0), (-(w + 8.0), -(h + 6.0))]
            shifts += [(0.0, h), (0.0, -(2 * h + 6.0)), (-(w + 8.0), h), (-(w + 8.0), -(2 * h + 6.0))]
            chosen = None
            for dx, dy in shifts:
                x0, y0 = box.x0 + dx / per_point, box.y0 + dy / per_point
                moved = (x0, y0, x0 + box.width, y0 + box.height)
                inside = (
                    frame.x0 <= moved[0]
                    and moved[2] <= frame.x1
                    and frame.y0 <= moved[1]
                    and moved[3] <= frame.y1
                )
                if (inside or (dx, dy) == (0.0, 0.0)) and not any(_boxes_meet(moved, o) for o in placed):
                    chosen = (dx, dy), moved
                    break
            if chosen is None:
                placed.append((box.x0, box.y0, box.x1, box.y1))
                continue
            (dx, dy), moved = chosen
            label.xyann = (start[0] + dx, start[1] + dy)
            placed.append(moved)


def _boxes_meet(a: tuple[float, float, float, float], b: tuple[float, float, float, float]) -> bool:
    """Whether two (x0, y0, x1, y1) boxes share more than a pixel across and along."""
    return min(a[2], b[2]) - max(a[0], b[0]) > 1.0 and min(a[3], b[3]) - max(a[1], b[1]) > 1.0
