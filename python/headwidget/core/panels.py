"""Panels: matrices with titles, labels and a shared colour scale, and their binary wire format.

Views produce a :class:`PanelGrid`; the widget sends it to the browser and the figure export draws
it, so both show the same thing.

Wire format rule: a matrix whose finite values all lie inside the grid's colour range (correlations in
[-1, 1], similarities in [0, 1]) is sent as little-endian float16 — its rounding error (at most 2⁻¹¹
relative, 4.9e-4 absolute in [-1, 1]) is below half a step of the 256-entry colormap (3.9e-3 for
[-1, 1]) and below the 3 decimals a tooltip needs, at 2 bytes per cell. Anything else is float32.
NaN ("undefined") survives both.

Encoding a read-only matrix (``matrix.setflags(write=False)``, on it and on every array it views) is
remembered for the few most recent matrices: a view that shows the same cached array again (a slider
moved back to a layer) sends it without converting it again. A writable matrix is converted every
time, since it may have changed in place.

Example:
    >>> import numpy as np
    >>> p = Panel("k0", "Keys · layer 0", np.eye(3))
    >>> encoded = encode_panel(p, vmin=-1.0, vmax=1.0)
    >>> encoded["dtype"], len(encoded["data"])
    ('float16', 18)
"""

from __future__ import annotations

import contextlib
import hashlib
import threading
import weakref
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from headwidget.core.charts import Chart
from headwidget.core.protocol import PANEL_FIELDS

__all__ = ["Panel", "PanelGrid", "encode_ahead", "encode_panel", "frame_key"]

FLOAT16_LIMIT = 65504.0


@dataclass
class Panel:
    """One heatmap: a 2-D float64 matrix plus what the reader needs to interpret it.

    Displayed cell ``i`` of an axis stands for the original indices ``offset + i * step`` up to
    ``offset + (i + 1) * step - 1``. ``row_group`` / ``col_group``: indices per head along the axis
    (0: the axis has no heads); the front end then draws a line at every head boundary and names
    a hovered cell by head and dimension, prefixed by ``axis_prefix``
    (``"K h1·d36 × h2·d22 = 0.2310"``). ``row_axis`` / ``col_axis``: what a row / a column stands
    for, as the tooltip names it (``"variant"``, ``"layer"``; empty: "row" / "col").
    ``window_subtitle``: for a panel of a window of indices (the channel view's), the subtitle with
    ``{first}`` and ``{last}`` where it names the window's first and last index, so that a saved page
    cropping the panel to another window says which (empty: the subtitle names no window).
    ``hint``: what a click on the panel does ("a click on a row selects its layer"), said only where a
    click does it (the live widget; a saved page and a figure leave it out). ``mark_row`` /
    ``mark_col``: the displayed row / column outlined (the selected layer), -1 for none.
    ``axis_titles``: draw ``row_axis`` and ``col_axis`` as the axes' titles.
    """

    id: str
    title: str
    matrix: np.ndarray
    subtitle: str = ""
    row_labels: list[str] | None = None
    col_labels: list[str] | None = None
    row_offset: int = 0
    col_offset: int = 0
    row_step: int = 1
    col_step: int = 1
    note: str = ""
    row_group: int = 0
    col_group: int = 0
    axis_prefix: str = ""
    row_axis: str = ""
    col_axis: str = ""
    window_subtitle: str = ""
    hint: str = ""
    mark_row: int = -1
    mark_col: int = -1
    axis_titles: bool = False


@dataclass
class PanelGrid:
    """Panels that share a colour scale, in display order, and the charts above them."""

    panels: list[Panel]
    vmin: float
    vmax: float
    colormap: str  # "diverging" | "magma"
    colorbar_label: str
    columns: int = 0  # 0: wrap to the available width
    #: Charts drawn above the panels (:mod:`headwidget.core.charts`); a grid may hold only charts.
    charts: list[Chart] = field(default_factory=list)


#: How many read-only matrices' encodings are remembered (a few layers' K and V panels).
ENCODED_KEPT = 16


def _finite_range(matrix: np.ndarray) -> tuple[float, float] | None:
    """Smallest and largest finite value, None when there is none."""
    if matrix.size == 0:
        return None
    lo, hi = float(np.fmin.reduce(matrix, axis=None)), float(np.fmax.reduce(matrix, axis=None))
    if np.isfinite(lo) and np.isfinite(hi):  # fmin/fmax skip NaN: no mask needed
        return lo, hi
    finite = matrix[np.isfinite(matrix)]  # an infinity, or nothing but NaN
    return (float(finite.min()), float(finite.max())) if finite.size else None


def _wire_dtype(matrix: np.ndarray, vmin: float, vmax: float) -> str:
    bounds = _finite_range(matrix)
    if bounds is None:
        return "float16"
    lo, hi = bounds
    inside = lo >= min(vmin, -1.0) - 1e-12 and hi <= max(vmax, 1.0) + 1e-12
    return "float16" if inside and max(abs(lo), abs(hi)) < FLOAT16_LIMIT else "float32"


def _read_only(matrix: np.ndarray) -> bool:
    """Whether no array in the chain of views down to the memory can write to it."""
    a: Any = matrix
    while isinstance(a, np.ndarray):
        if a.flags.writeable:
            return False
        a = a.base
    return True


class _EncodedCache:
    """The wire bytes of the most recent read-only matrices, by identity (held weakly)."""

    def __init__(self, size: int) -> None:
        self.size = size
        self.lock = threading.Lock()
        self.entries: OrderedDict[
            tuple[int, float, float], tuple[weakref.ref[np.ndarray], tuple[str, bytes, str]]
        ] = OrderedDict()

    def get(self, matrix: np.ndarray, vmin: float, vmax: float) -> tuple[str, bytes, str] | None:
        key = (id(matrix), vmin, vmax)
        with self.lock:
            hit = self.entries.get(key)
            if hit is None or hit[0]() is not matrix:
                return None
            self.entries.move_to_end(key)
            return hit[1]

    def put(self, matrix: np.ndarray, vmin: float, vmax: float, wire: tuple[str, bytes, str]) -> None:
        with self.lock:
            self.entries[(id(matrix), vmin, vmax)] = (weakref.ref(matrix), wire)
            while len(self.entries) > self.size:
                self.entries.popitem(last=False)


_encoded = _EncodedCache(ENCODED_KEPT)


def frame_key(dtype: str, rows: int, cols: int, data: bytes) -> str:
    """What names a panel's cells on the wire: equal keys, equal cells (a hash of the bytes, with
    their shape and dtype). A page keeps the cells of the keys it has seen, so the kernel sends a
    revisited panel's key without its bytes (see :class:`~headwidget.widget.HeadWidget`).

    Example:
        >>> frame_key("float16", 1, 2, bytes(4))[:12]
        'float16:1x2:'
        >>> frame_key("float16", 1, 2, bytes(4)) == frame_key("float16", 1, 2, b"\\x00\\x01\\x00\\x00")
        False
    """
    digest = hashlib.blake2b(data, digest_size=12).hexdigest()
    return f"{dtype}:{rows}x{cols}:{digest}"


def _wire(matrix: np.ndarray, vmin: float, vmax: float) -> tuple[str, bytes, str]:
    """The wire dtype, bytes and frame key of a 2-D float64 matrix."""
    cacheable = _read_only(matrix)
    if cacheable and (hit := _encoded.get(matrix, vmin, vmax)) is not None:
        return hit
    dtype = _wire_dtype(matrix, vmin, vmax)
    data = np.ascontiguousarray(matrix.astype("<f2" if dtype == "float16" else "<f4")).tobytes()
    wire = (dtype, data, frame_key(dtype, matrix.shape[0], matrix.shape[1], data))
    if cacheable:
        _encoded.put(matrix, vmin, vmax, wire)
    return wire


def encode_panel(panel: Panel, *, vmin: float, vmax: float) -> dict[str, Any]:
    """The dict the front end reads (see ``js/lib/panels.ts``), with the matrix as raw bytes."""
    matrix = np.asarray(panel.matrix, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"panel {panel.id!r}: expected a 2-D matrix, got shape {matrix.shape}")
    if panel.row_group < 0 or panel.col_group < 0:
        raise ValueError(f"panel {panel.id!r}: row_group and col_group must be >= 0 (0: no heads)")
    dtype, data, key = _wire(matrix, vmin, vmax)
    wire = {
        "rows": int(matrix.shape[0]),
        "cols": int(matrix.shape[1]),
        "dtype": dtype,
        "data": data,
        "key": key,
    }
    return {f: wire[f] if f in wire else getattr(panel, f) for f in PANEL_FIELDS}  # the protocol's order


def encode_ahead(grid: PanelGrid) -> None:
    """Encode the grid's read-only float64 panels now (what computes a grid ahead, on its own thread,
    calls), so that sending the grid later finds their wire bytes and frame keys made (the encoding
    of a 820 × 820 panel takes a few milliseconds). Other panels are encoded when sent, and a panel
    that cannot be encoded is left for the sender to report.

    >>> m = np.eye(3)
    >>> m.flags.writeable = False
    >>> grid = PanelGrid([Panel("a", "eye", m)], 0.0, 1.0, "magma", "")
    >>> encode_ahead(grid)
    >>> _encoded.get(m, 0.0, 1.0)[2] == encode_panel(grid.panels[0], vmin=0.0, vmax=1.0)["key"]
    True
    """
    for panel in grid.panels:
        matrix = panel.matrix
        if isinstance(matrix, np.ndarray) and matrix.dtype == np.float64 and _read_only(matrix):
            with contextlib.suppress(ValueError):
                encode_panel(panel, vmin=grid.vmin, vmax=grid.vmax)
