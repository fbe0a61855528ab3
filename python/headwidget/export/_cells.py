"""The numbers in a small panel's cells, and the outline of a marked row or column, on a saved figure,
as the widget draws them (``js/lib/cells.ts``, ``js/ui/panel_canvas.ts``).

A panel is labelled only when every cell has room for its number (:data:`MIN_CELL_EM` of the cell
font tall, the widest text plus :data:`CELL_PAD_PT` wide) and it has at most
:data:`MAX_LABELLED_CELLS` cells: a panel never shows numbers in some cells and not in others. The
numbers are written as the widget writes them (:func:`cell_format`): two significant digits of the
largest magnitude at least, white on a dark cell. Both are drawn once the figure's layout is final
(the cell sizes are those of the saved figure), and take no part in it.

Example:
    >>> fmt = cell_format(0.0028)
    >>> fmt(0.0028), fmt(-0.0004), fmt(float("nan")), cell_format(12.5)(3.14159), cell_format(1.0)(-0.001)
    ('0.0028', '−0.0004', '', '3.14', '0.00')
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
from matplotlib.axes import Axes
from matplotlib.patches import Rectangle

from headwidget.core.panels import Panel, PanelGrid
from headwidget.export._colormaps import lut_color
from headwidget.export._labels import text_width

__all__ = ["CELL_PT", "MAX_LABELLED_CELLS", "cell_format", "label_cells", "mark_cells"]

#: The cell numbers' font size (points), and the room a cell needs for one.
CELL_PT = 6.0
MIN_CELL_EM = 1.4
CELL_PAD_PT = 3.0
#: Most cells a labelled panel has (``js/lib/cells.ts``: ``MAX_LABELLED_CELLS``).
MAX_LABELLED_CELLS = 256
#: Relative luminance below which a cell takes white text (``js/lib/cells.ts``: ``DARK_LUMINANCE``).
DARK_LUMINANCE = 0.4
CELL_LABEL = "cell-label"
TEXT_COLOR = "#1f1f1f"


def cell_format(largest: float) -> Callable[[float], str]:
    """How a panel writes its values, from the largest magnitude among them (``cellFormat``): two
    decimals up to 10 (more where the largest is below 0.1: two significant digits of it), three
    significant digits from 10 on, an exponent below 0.0001; NaN is not written, ±inf as ``±∞``."""
    m = abs(largest)
    if m >= 10:

        def digits(v: float) -> str:
            return _precision(v, 3)
    elif 0 < m < 1e-4:

        def digits(v: float) -> str:
            return "0" if v == 0 else f"{v:.1e}".replace("e-0", "e-").replace("e+0", "e+")
    else:
        decimals = max(2, 1 - math.floor(math.log10(m))) if m > 0 else 2

        def digits(v: float) -> str:
            return f"{v:.{decimals}f}"

    def write(v: float) -> str:
        if not math.isfinite(v):
            return "" if math.isnan(v) else ("∞" if v > 0 else "−∞")
        text = digits(v)
        if text.startswith("-") and not text.strip("-0."):  # a negative that rounds to zero
            return text[1:]
        return text.replace("-", "−", 1)

    return write


def _precision(v: float, significant: int) -> str:
    """``Number.prototype.toPrecision``: ``significant`` digits, in fixed notation up to 1e21."""
    if v == 0:
        return f"{0:.{significant - 1}f}"
    exponent = math.floor(math.log10(abs(v)))
    if exponent < -6 or exponent >= significant:
        return f"{v:.{significant - 1}e}".replace("e+0", "e+").replace("e-0", "e-")
    return f"{v:.{max(0, significant - 1 - exponent)}f}"


def _luminance(rgb: tuple[int, int, int]) -> float:
    """WCAG relative luminance of an sRGB colour (``js/lib/cells.ts``: ``luminance``)."""

    def linear(c: int) -> float:
        s = c / 255
        return s / 12.92 if s <= 0.04045 else ((s + 0.055) / 1.055) ** 2.4

    r, g, b = rgb
    return 0.2126 * linear(r) + 0.7152 * linear(g) + 0.0722 * linear(b)


def _cell_size_pt(ax: Axes, rows: int, cols: int) -> tuple[float, float]:
    box = ax.get_window_extent()
    per_point = 72.0 / ax.figure.dpi if ax.figure is not None else 1.0
    return box.width * per_point / cols, box.height * per_point / rows


def label_cells(ax: Axes, panel: Panel, grid: PanelGrid) -> int:
    """Write each cell's number in the panel drawn on ``ax`` when all fit (see the module docstring);
    returns how many were written."""
    matrix = np.asarray(panel.matrix, dtype=np.float64)
    rows, cols = matrix.shape
    if rows * cols > MAX_LABELLED_CELLS or rows * cols == 0:
        return 0
    cell_w, cell_h = _cell_size_pt(ax, rows, cols)
    if cell_h < MIN_CELL_EM * CELL_PT:
        return 0
    finite = np.abs(matrix[np.isfinite(matrix)])
    write = cell_format(float(finite.max()) if finite.size else 0.0)
    texts = [[write(float(v)) for v in row] for row in matrix]
    if any(text_width(t, CELL_PT) * 72 + CELL_PAD_PT > cell_w for row in texts for t in row):
        return 0
    written = 0
    for i, row in enumerate(texts):
        for j, text in enumerate(row):
            if not text:
                continue
            dark = _luminance(lut_color(float(matrix[i, j]), grid.vmin, grid.vmax, grid.colormap))
            ax.text(
                j + 0.5,
                i + 0.5,
                text,
                ha="center",
                va="center_baseline",
                fontsize=CELL_PT,
                color="white" if dark < DARK_LUMINANCE else TEXT_COLOR,
                gid=CELL_LABEL,
                in_layout=False,
            )
            written += 1
    return written


def mark_cells(ax: Axes, panel: Panel) -> None:
    """Outline the panel's ``mark_row`` and ``mark_col`` (the selected layer) across its plot: a
    dark line with a white one inside, readable on any colour."""
    rows, cols = np.shape(panel.matrix)
    boxes = []
    if 0 <= panel.mark_row < rows:
        boxes.append((0.0, float(panel.mark_row), float(cols), 1.0))
    if 0 <= panel.mark_col < cols:
        boxes.append((float(panel.mark_col), 0.0, 1.0, float(rows)))
    for x, y, w, h in boxes:
        for colour, width in (("#000000", 1.6), ("#ffffff", 0.6)):
            outline = Rectangle((x, y), w, h, fill=False, edgecolor=colour, linewidth=width, clip_on=False)
            outline.set_in_layout(False)
            ax.add_patch(outline)
