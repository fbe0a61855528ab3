"""``save(view_or_grid, path)``: one call for every export format, picked by the file suffix.

Also :func:`cell_box`, where a matrix cell lands in the saved image: what tests need to read the
colour of a known cell back from the PNG.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Sequence
from pathlib import Path

from matplotlib.figure import Figure

from headwidget.errors import ArgumentError
from headwidget.export._figure import PANEL_LABEL, export_style, figure
from headwidget.export._html import save_html
from headwidget.export._source import ExportError, GridSource
from headwidget.files import atomic_output

__all__ = ["FORMATS", "cell_box", "check_figure_size", "save", "save_all"]

#: Suffix → what is written. PNG/SVG/PDF are matplotlib figures; HTML is the interactive page.
FORMATS = {
    ".png": "PNG image (matplotlib, Agg)",
    ".svg": "SVG with text as <text> elements",
    ".pdf": "PDF with TrueType (type 42) text",
    ".html": "standalone interactive page (widget bundle and data inlined, works offline)",
}
# No creation dates in SVG/PDF, so that the same grid writes the same bytes.
METADATA: dict[str, dict[str, str | None]] = {
    ".png": {},
    ".svg": {"Date": None},
    ".pdf": {"CreationDate": None},
}


def save(
    source: GridSource,
    path: str | os.PathLike[str],
    *,
    dpi: float = 200,
    size: tuple[float, float] | None = None,
    title: str | None = None,
    layers: Sequence[int] | None = None,
    max_states: int | None = None,
) -> Path:
    """Write a view (or a :class:`PanelGrid`) to ``path``; the suffix picks the format.

    - ``.png``, ``.svg``, ``.pdf``: the figure of :func:`headwidget.export.figure` — the panels the
      view shows now, ``dpi`` dots per inch, ``size`` (width, height) in inches (default: sized for
      the panels), ``title`` above all panels (default: the view's ``caption``, its model and layer).
    - ``.html``: :func:`headwidget.export.save_html` — an offline page with hover and the view's
      controls: the layer slider over ``layers`` (default: every layer of the view), the other
      controls' states up to ``max_states`` in all (default
      :data:`~headwidget.export._source.DEFAULT_MAX_STATES`); ``dpi`` and ``size`` do not apply.

    Returns the path written.

    Example:
        >>> import numpy as np, tempfile, pathlib
        >>> from headwidget.core.panels import Panel, PanelGrid
        >>> grid = PanelGrid([Panel("a", "Keys · layer 0", np.eye(3))], -1.0, 1.0, "diverging", "r")
        >>> out = save(grid, pathlib.Path(tempfile.mkdtemp()) / "fig.png", dpi=50, size=(3, 2))
        >>> out.read_bytes()[:4], out.suffix
        (b'\\x89PNG', '.png')
    """
    dpi, size = check_figure_size(dpi, size)
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix not in FORMATS:
        known = ", ".join(FORMATS)
        raise ExportError(f"cannot export to {path.name!r}: the suffix must be one of {known}")
    if suffix == ".html":
        return save_html(source, path, title=title, layers=layers, max_states=max_states)
    if layers is not None or max_states is not None:
        what = "layers=" if layers is not None else "max_states="
        raise ExportError(f"{what} applies to .html exports; a figure shows the view's current panels")
    (written,) = save_all(source, [path], dpi=dpi, size=size, title=title)
    return written


def check_figure_size(dpi: object, size: object) -> tuple[float, tuple[float, float] | None]:
    """``(dpi, size)`` as numbers: ``dpi`` a real number, ``size`` None or two real numbers (inches).

    A string, a bool or None for ``dpi``, or a ``size`` that is not two numbers, is an
    :class:`~headwidget.errors.ArgumentError`; their values (> 0, finite, a figure of at most so many
    pixels) are checked by :func:`~headwidget.export.figure`, which says which dpi would fit.

    Example:
        >>> check_figure_size(200, (4, 3))
        (200.0, (4.0, 3.0))
        >>> check_figure_size("200", None)
        Traceback (most recent call last):
        ...
        headwidget.errors.ArgumentError: dpi must be a number of dots per inch, got the string '200'
    """
    if isinstance(dpi, bool) or not isinstance(dpi, numbers.Real):
        shown = f"the string {dpi!r}" if isinstance(dpi, str) else f"{dpi!r} ({type(dpi).__name__})"
        raise ArgumentError(f"dpi must be a number of dots per inch, got {shown}")
    if size is None:
        return float(dpi), None
    if (
        isinstance(size, (str, bytes))
        or not isinstance(size, Sequence)
        or len(size) != 2
        or any(isinstance(x, bool) or not isinstance(x, numbers.Real) for x in size)
    ):
        raise ArgumentError(f"size must be None or (width, height): two numbers of inches, got {size!r}")
    return float(dpi), (float(size[0]), float(size[1]))


def save_all(
    source: GridSource,
    paths: Sequence[str | os.PathLike[str]],
    *,
    dpi: float = 200,
    size: tuple[float, float] | None = None,
    title: str | None = None,
) -> list[Path]:
    """Write one figure to several files (``.png``, ``.svg``, ``.pdf``): laid out once, then saved to each,
    so a PNG and a PDF of the same view cost one layout instead of two. Arguments as for :func:`save`.

    Example:
        >>> import numpy as np, tempfile, pathlib
        >>> from headwidget.core.panels import Panel, PanelGrid
        >>> grid = PanelGrid([Panel("a", "Keys · layer 0", np.eye(3))], -1.0, 1.0, "diverging", "r")
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> [p.name for p in save_all(grid, [folder / "fig.png", folder / "fig.pdf"], dpi=50)]
        ['fig.png', 'fig.pdf']
    """
    dpi, size = check_figure_size(dpi, size)
    if isinstance(paths, (str, bytes, os.PathLike)):
        raise ArgumentError(f"paths must be a list of paths, got {paths!r}; pass a list: [{str(paths)!r}]")
    out = [Path(p) for p in paths]
    for path in out:
        if path.suffix.lower() not in METADATA:
            figures = ", ".join(METADATA)
            raise ExportError(f"cannot write a figure to {path.name!r}: the suffix must be one of {figures}")
    fig = figure(source, dpi=dpi, size=size, title=title)
    with export_style():
        for path in out:
            suffix = path.suffix.lower()
            with atomic_output(path) as tmp:  # each file is the old one or the whole new one
                fig.savefig(tmp, format=suffix[1:], dpi="figure", metadata=METADATA[suffix])
    return out


def cell_box(fig: Figure, panel: int, row: int, col: int) -> tuple[float, float, float, float]:
    """Pixel box (left, top, right, bottom) of a cell in the image of ``fig`` saved at its own dpi.

    Pixel coordinates start at the top-left corner, as in ``matplotlib.image.imread`` arrays.

    Example:
        >>> import numpy as np
        >>> from headwidget.core.panels import Panel, PanelGrid
        >>> fig = figure(PanelGrid([Panel("a", "A", np.zeros((2, 2)))], 0.0, 1.0, "magma", ""), dpi=50)
        >>> left, top, right, bottom = cell_box(fig, 0, 1, 1)
        >>> right > left and bottom > top
        True
    """
    matches = [ax for ax in fig.axes if ax.get_label() == PANEL_LABEL.format(panel)]
    if not matches:
        raise ExportError(f"the figure has no panel {panel}")
    ax = matches[0]
    rows, cols = ax.get_images()[0].get_size()
    if not (0 <= row < rows and 0 <= col < cols):
        raise ExportError(f"cell ({row}, {col}) is outside panel {panel}'s {rows}×{cols} matrix")
    ax.apply_aspect()
    corners = [(col / cols, 1 - row / rows), ((col + 1) / cols, 1 - (row + 1) / rows)]
    (x0, y0), (x1, y1) = ax.transAxes.transform(corners)
    height = fig.bbox.height
    return float(x0), float(height - y0), float(x1), float(height - y1)
