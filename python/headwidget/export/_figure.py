"""A matplotlib :class:`~matplotlib.figure.Figure` of a :class:`PanelGrid`, laid out like the widget.

Panels fill a grid row by row with ``grid.columns`` columns (0: one row), as in the reference figures:
the channel view puts keys over values with one column per layer, the alignment view keys and values
× before and after, the mechanism view one row. Each panel shows its title, subtitle, tick labels
(explicit labels, else original indices ``offset + i * step``) and note; one colorbar serves all.
Cells are flat colours from the widget's own 256-entry tables (:mod:`._colormaps`).

No pyplot: the figure has its own Agg canvas, and every draw runs inside :func:`export_style`, a
temporary matplotlib style, so neither the user's rcParams change the output nor the export theirs.
The layout ("compressed", made for grids of fixed-aspect plots) is computed once and then frozen, so
the saved PNG, SVG and PDF, at any dpi, have the same geometry (see ``cell_box``). Text is drawn
through :func:`._labels.printable` (control characters would make an invalid SVG), and a figure
beyond :data:`MAX_SIDE_PX` / :data:`MAX_PIXELS` at its dpi is refused before it is allocated.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Iterator

import matplotlib.style
import numpy as np
from matplotlib.axes import Axes
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.cm import ScalarMappable
from matplotlib.colors import Normalize
from matplotlib.figure import Figure, SubFigure
from matplotlib.layout_engine import ConstrainedLayoutEngine
from matplotlib.patches import Patch
from matplotlib.ticker import MaxNLocator

from headwidget.core.charts import Chart
from headwidget.core.panels import Panel, PanelGrid
from headwidget.export._cells import label_cells, mark_cells
from headwidget.export._charts import (
    AXIS_LABELS_IN,
    CHART_IN,
    LABEL_PT,
    MUTED_COLOR,
    NOTE_PT,
    SUBTITLE_PT,
    TEXT_COLOR,
    TICK_PT,
    TITLE_PT,
    draw_chart,
    legend_height_pt,
    legend_rows,
    note_under,
    place_point_labels,
    title_axes,
)
from headwidget.export._colormaps import LutNorm, colormap, nan_color
from headwidget.export._labels import MAX_LABEL_CHARS, fit_label, panel_axis, printable, text_width, wrap
from headwidget.export._source import ExportError, GridSource, grid_of

__all__ = ["PANEL_LABEL", "export_style", "figure", "group_edges"]

FRAME_COLOR = "#444444"
AXIS_TITLE_PT = 7.5
PLOT_IN = 2.2  # longest plot side on an automatically sized figure (the widget's 320 px)
COLORBAR_IN = 0.75  # colorbar, its ticks and one label line
STYLE = {
    "svg.fonttype": "none",  # text stays <text> in SVG
    "pdf.fonttype": 42,  # TrueType text in PDF (selectable, searchable)
    "ps.fonttype": 42,
    "svg.hashsalt": "headwidget",  # stable SVG ids: the same grid writes the same file
    "text.parse_math": False,  # a "$" in a title is a dollar sign
    "figure.facecolor": "white",
    "savefig.facecolor": "white",
    "text.color": TEXT_COLOR,
    "axes.linewidth": 0.6,
    "axes.edgecolor": FRAME_COLOR,
}
PANEL_LABEL = "headwidget-panel-{}"
LAYOUT_PASSES = 2
#: Largest figure in pixels: Agg's limit per side, and 128 Mpx in all (a 512 MiB RGBA buffer).
MAX_SIDE_PX, MAX_PIXELS = 2**16 - 1, 2**27


@contextlib.contextmanager
def export_style() -> Iterator[None]:
    """matplotlib's default style plus the export's settings, restored on exit.

    Example:
        >>> import matplotlib
        >>> with export_style():
        ...     matplotlib.rcParams["svg.fonttype"]
        'none'
    """
    with matplotlib.style.context(["default", STYLE]):
        yield


def _printable_grid(grid: PanelGrid) -> PanelGrid:
    """The grid with every text made drawable (:func:`._labels.printable`); the matrices are shared."""

    def labels(values: list[str] | None) -> list[str] | None:
        return None if values is None else [printable(v) for v in values]

    panels = [
        dataclasses.replace(
            p,
            id=printable(p.id),
            title=printable(p.title),
            subtitle=printable(p.subtitle),
            note=printable(p.note),
            row_axis=printable(p.row_axis),
            col_axis=printable(p.col_axis),
            row_labels=labels(p.row_labels),
            col_labels=labels(p.col_labels),
        )
        for p in grid.panels
    ]
    return dataclasses.replace(grid, panels=panels, colorbar_label=printable(grid.colorbar_label))


def _charts_size(charts: list[Chart]) -> tuple[float, float]:
    """(width, height) in inches of a row of charts with their subtitles, legends and notes."""

    def text_h(c: Chart) -> float:
        width = CHART_IN[0] - 0.4
        lines = len(wrap(c.subtitle, width, SUBTITLE_PT)) + len(wrap(c.note, width, NOTE_PT))
        names = [printable(s.name) for s in c.series if s.name]
        rows = legend_rows(names, CHART_IN[0] - 0.6 - AXIS_LABELS_IN)[1]
        # the one legend row the base height always held is not counted twice
        return 0.14 * lines + max(0.0, legend_height_pt(rows) - legend_height_pt(1)) / 72

    return CHART_IN[0] * len(charts), CHART_IN[1] + max(text_h(c) for c in charts)


def _check_pixels(width: float, height: float, dpi: float) -> None:
    w_px, h_px = width * dpi, height * dpi
    if max(w_px, h_px) <= MAX_SIDE_PX and w_px * h_px <= MAX_PIXELS:
        return
    most = math.floor(min(MAX_SIDE_PX / max(width, height), math.sqrt(MAX_PIXELS / (width * height))))
    raise ExportError(
        f"a {width:g}×{height:g} inch figure at dpi {dpi:g} would be {w_px:.0f}×{h_px:.0f} pixels, over the "
        f"limit of {MAX_SIDE_PX} per side and {MAX_PIXELS // 2**20} Mpx in all; use dpi ≤ {most} or a "
        "smaller size"
    )


def plot_size(rows: int, cols: int) -> tuple[float, float]:
    """Plot (width, height) in inches: square cells, thin matrices stretched (``js/lib/layout.ts``)."""
    s = min(320 / rows, 320 / cols)

    def side(n: int) -> float:
        return round(max(n * s, min(96, n * 24, 320))) * PLOT_IN / 320

    return side(cols), side(rows)


def _row_label_width(panel: Panel) -> float:
    rows = np.shape(panel.matrix)[0]
    labels = panel.row_labels or [str(panel.row_offset + rows * panel.row_step - 1)]
    return max(text_width(fit_label(str(s), MAX_LABEL_CHARS["row"]), TICK_PT) for s in labels) + 0.1


def _auto_size(grid: PanelGrid, nrows: int, ncols: int, title: str | None) -> tuple[float, float]:
    """Width: the widest panel of each grid column; height: the tallest panel of each grid row."""
    widths, heights = [0.0] * ncols, [0.0] * nrows
    for k, p in enumerate(grid.panels):
        plot_w, plot_h = plot_size(*np.shape(p.matrix))
        label_w = _row_label_width(p)
        text_w = max(plot_w + label_w, PLOT_IN * 0.6)
        wrap_w = text_w - label_w - 0.1
        lines = len(wrap(p.subtitle, wrap_w, SUBTITLE_PT)), len(wrap(p.note, wrap_w, NOTE_PT, style="italic"))
        text_h = TITLE_PT * 1.4 + SUBTITLE_PT * 1.25 * lines[0] + TICK_PT * 2 + NOTE_PT * 1.3 * lines[1]
        if p.axis_titles:  # a line for the column axis' title, a rotated one left of the row labels
            text_h += AXIS_TITLE_PT * 1.6
            text_w += AXIS_TITLE_PT * 1.6 / 72
        widths[k % ncols] = max(widths[k % ncols], text_w + 0.1)
        heights[k // ncols] = max(heights[k // ncols], plot_h + text_h / 72 + 0.1)
    label = len(wrap(grid.colorbar_label, 0.85 * (sum(heights) - 0.5), LABEL_PT))
    width = sum(widths) + COLORBAR_IN + 0.14 * max(0, label - 1)
    title_h = 0.05
    if title:
        title_h = 0.3 * len(wrap(title, max(1.0, width - 0.3), TITLE_PT + 2, weight="bold"))
    return round(width, 2), round(sum(heights) + title_h, 2)


#: Head boundaries closer than this on the plot (points) are not drawn, as in the widget (4 px).
MIN_GROUP_PT = 3.0
GROUP_COLOR, GROUP_WIDTH = (0.0, 0.0, 0.0, 0.4), 0.5


def group_edges(n: int, offset: int, step: int, group: int, length_pt: float) -> list[float]:
    """Head boundaries along an axis of ``n`` displayed cells, in cell units (``js/lib/layout.ts``).

    Channel ``c`` (a multiple of ``group`` strictly inside the axis) starts a head, at
    ``(c - offset) / step``. Empty without heads, or when boundaries would be closer than
    :data:`MIN_GROUP_PT` on an axis ``length_pt`` points long.

    Example:
        >>> group_edges(8, 0, 1, 4, 200.0), group_edges(6, 2, 1, 4, 200.0), group_edges(8, 0, 1, 0, 200.0)
        ([4.0], [2.0], [])
    """
    if group <= 0 or n < 1 or length_pt * group / (n * step) < MIN_GROUP_PT:
        return []
    end = offset + n * step
    return [(c - offset) / step for c in range((offset // group + 1) * group, end, group)]


def _draw_panel(ax: Axes, index: int, panel: Panel, grid: PanelGrid, text_w: float) -> None:
    matrix = np.asarray(panel.matrix, dtype=np.float64)
    rows, cols = matrix.shape
    big = np.finfo(np.float64).max  # ±inf take the end colours, as in the widget (imshow masks inf)
    ax.imshow(
        np.nan_to_num(matrix, nan=np.nan, posinf=big, neginf=-big),
        cmap=colormap(grid.colormap),
        norm=LutNorm(grid.vmin, grid.vmax),
        interpolation="nearest",
        interpolation_stage="rgba",
        extent=(0, cols, rows, 0),
        aspect="auto",
    )
    w, h = plot_size(rows, cols)
    ax.set_box_aspect(h / w)
    # Head boundaries, as the widget draws them: a thin translucent line between heads.
    for x in group_edges(cols, panel.col_offset, panel.col_step, panel.col_group, w * 72):
        ax.axvline(x, color=GROUP_COLOR, linewidth=GROUP_WIDTH)
    for y in group_edges(rows, panel.row_offset, panel.row_step, panel.row_group, h * 72):
        ax.axhline(y, color=GROUP_COLOR, linewidth=GROUP_WIDTH)
    for orient, axis, n, labels, offset, step in (
        ("col", ax.xaxis, cols, panel.col_labels, panel.col_offset, panel.col_step),
        ("row", ax.yaxis, rows, panel.row_labels, panel.row_offset, panel.row_step),
    ):
        locator, formatter = panel_axis(n, labels, offset, step, orient, TICK_PT)
        axis.set_major_locator(locator)
        axis.set_major_formatter(formatter)
    ax.tick_params(length=2.5, width=0.6, pad=1.5, labelsize=TICK_PT, colors=TEXT_COLOR)
    subtitle = wrap(panel.subtitle, text_w, SUBTITLE_PT)
    title_axes(ax, panel.title, subtitle)
    note = "\n".join(wrap(panel.note, text_w, NOTE_PT, style="italic"))
    if panel.axis_titles and panel.row_axis:
        ax.set_ylabel(panel.row_axis, fontsize=AXIS_TITLE_PT, labelpad=2)
    if panel.axis_titles and panel.col_axis:
        ax.set_xlabel(panel.col_axis, fontsize=AXIS_TITLE_PT, labelpad=2)
        if note:  # under the axis title, from the plot's left edge
            note_under(ax, note, ("axes fraction", ax.xaxis.label), 3)
    elif note:
        ax.set_xlabel(note, loc="left", fontsize=NOTE_PT, style="italic", color=MUTED_COLOR, labelpad=3)
    ax.set_label(PANEL_LABEL.format(index))
    ax.set_gid(panel.id)  # the panel's <g id> in SVG


def _colorbar(fig: Figure | SubFigure, axes: list[Axes], grid: PanelGrid, length: float) -> None:
    # A flat grid (vmax <= vmin) shows every cell in the middle colour: centre the bar on vmin.
    lo, hi = (grid.vmin, grid.vmax) if grid.vmax > grid.vmin else (grid.vmin - 0.5, grid.vmin + 0.5)
    mappable = ScalarMappable(norm=Normalize(lo, hi), cmap=colormap(grid.colormap))
    cbar = fig.colorbar(mappable, ax=axes, location="right", shrink=0.9, aspect=24, pad=0.02)
    cbar.set_label("\n".join(wrap(grid.colorbar_label, length, LABEL_PT)), fontsize=LABEL_PT)
    cbar.set_ticks(MaxNLocator(5, steps=[1, 2, 5, 10]))
    cbar.ax.tick_params(length=2.5, width=0.6, labelsize=TICK_PT)
    cbar.outline.set_linewidth(0.6)
    if any(np.isnan(np.asarray(p.matrix, dtype=np.float64)).any() for p in grid.panels):
        r, g, b = (c / 255 for c in nan_color())
        swatch = Patch(facecolor=(r, g, b), edgecolor=FRAME_COLOR, linewidth=0.6, label="undefined")
        cbar.ax.legend(
            handles=[swatch],
            loc="upper left",
            bbox_to_anchor=(0.0, -0.02),
            frameon=False,
            fontsize=TICK_PT,
            handlelength=1.0,
            handleheight=1.0,
            handletextpad=0.4,
            borderaxespad=0.0,
        )


#: Inches of text past the figure's edge that an automatically sized figure grows to hold.
OVERFLOW_IN = 0.005


def _grow_to_fit(fig: Figure) -> None:
    """Grow an automatically sized figure by whatever its text overflows on each side (the size
    estimates come from text widths; a long note or colorbar label can still run over), then lay it
    out again. A figure that fits is left as it is."""
    for attempt in range(2):  # grow; if the layout still puts text past an edge, also widen its padding
        box = fig.get_tightbbox()  # inches
        width, height = fig.get_size_inches()
        over = [max(0.0, -box.x0), max(0.0, box.x1 - width), max(0.0, -box.y0), max(0.0, box.y1 - height)]
        if max(over) <= OVERFLOW_IN:
            return
        margin = 0.04  # a little room, so the re-laid-out text does not touch the edge
        grow_w = sum(o + margin for o in over[:2] if o > OVERFLOW_IN)
        grow_h = sum(o + margin for o in over[2:] if o > OVERFLOW_IN)
        fig.set_size_inches(round(width + grow_w, 2), round(height + grow_h, 2))
        engine = fig.get_layout_engine()
        if attempt and isinstance(engine, ConstrainedLayoutEngine):
            pads = engine.get()
            engine.set(w_pad=pads["w_pad"] + max(over[:2]) + margin, h_pad=pads["h_pad"] + max(over[2:]))
        for _pass in range(LAYOUT_PASSES):
            fig.draw_without_rendering()


def figure(
    source: GridSource, *, dpi: float = 200, size: tuple[float, float] | None = None, title: str | None = None
) -> Figure:
    """The figure of a view's (or a grid's) panels; ``size`` is (width, height) in inches.

    Without ``size`` the figure is sized for plots of about 2.2 inches and their text, and grows to
    hold any text that would still run past its edge. Without
    ``title``, a view's figure is titled with its ``caption`` (the model and the layer); ``title=""``
    gives none.

    Example:
        >>> import numpy as np
        >>> from headwidget.core.panels import Panel, PanelGrid
        >>> grid = PanelGrid([Panel("k", "Keys", np.eye(4)), Panel("v", "Values", -np.eye(4))],
        ...                  -1.0, 1.0, "diverging", "Pearson correlation", columns=1)
        >>> fig = figure(grid, dpi=100, size=(3, 5))
        >>> fig.canvas.get_width_height(), len(fig.axes)  # two panels and the colorbar
        ((300, 500), 3)
    """
    grid = _printable_grid(grid_of(source))
    if title is None:
        caption = getattr(source, "caption", "") if not isinstance(source, PanelGrid) else ""
        title = caption if isinstance(caption, str) and caption else None
    title = None if title is None else printable(title)
    if size is not None and not (len(size) == 2 and min(size) > 0):
        raise ExportError(f"size must be (width, height) in inches, both > 0; got {size!r}")
    if not dpi > 0:
        raise ExportError(f"dpi must be > 0, got {dpi!r}")
    n, charts = len(grid.panels), grid.charts
    ncols = (min(grid.columns, n) if grid.columns > 0 else n) or 1
    nrows = math.ceil(n / ncols)
    with export_style():
        chart_w, chart_h = _charts_size(charts) if charts else (0.0, 0.0)
        heat_w, heat_h = _auto_size(grid, nrows, ncols, title) if n else (0.0, 0.3 if title else 0.05)
        if size is not None:
            width, height = size
        else:
            width, height = round(max(chart_w, heat_w), 2), round(chart_h + heat_h, 2)
        _check_pixels(width, height, dpi)
        fig = Figure(figsize=(width, height), dpi=dpi, layout="compressed")
        FigureCanvasAgg(fig)
        top: Figure | SubFigure = fig
        bottom: Figure | SubFigure = fig
        if charts and n:
            parts = fig.subfigures(2, 1, height_ratios=[chart_h, heat_h], squeeze=False)
            top, bottom = parts[0, 0], parts[1, 0]
        if charts:
            chart_axes = list(top.subplots(1, len(charts), squeeze=False).flat)
            for ax, chart in zip(chart_axes, charts, strict=True):
                draw_chart(ax, chart, max(1.0, width / len(charts) - 0.6))
        if n:
            column_w = (width - COLORBAR_IN) / ncols
            axes = list(bottom.subplots(nrows, ncols, squeeze=False).flat)
            for ax in axes[n:]:
                ax.remove()
            for index, (ax, panel) in enumerate(zip(axes, grid.panels, strict=False)):
                # Subtitle and note start at the plot's left edge: wrap them before the next panel.
                _draw_panel(ax, index, panel, grid, max(1.0, column_w - _row_label_width(panel) - 0.2))
            _colorbar(bottom, axes[:n], grid, 0.8 * (height * heat_h / (heat_h + chart_h) - 0.4))
        if title:  # wrapped to the figure's width (a long layer list would run off a narrow figure)
            lines = wrap(title, max(1.0, width - 0.3), TITLE_PT + 2, weight="bold")
            fig.suptitle("\n".join(lines), fontsize=TITLE_PT + 2, fontweight="bold")
        for _ in range(LAYOUT_PASSES):  # the layout settles on the text sizes in two passes
            fig.draw_without_rendering()
        if size is None:
            _grow_to_fit(fig)
    fig.set_layout_engine("none")  # frozen: every later draw, at any dpi, has this geometry
    if charts:
        place_point_labels(fig)  # on the final geometry
    for index, panel in enumerate(grid.panels):  # (the cells' sizes are those of the final geometry)
        ax = next(a for a in fig.axes if a.get_label() == PANEL_LABEL.format(index))
        label_cells(ax, panel, grid)
        mark_cells(ax, panel)
    return fig
