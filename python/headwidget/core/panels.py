"""Panels: matrices with titles, labels and a shared colour scale, and their binary wire format.

Views produce a :class:`PanelGrid`; the widget sends it to the browser and the figure export draws
it, so both show the same thing.

Wire format rule: a matrix whose finite values all lie inside the grid's colour range (correlations in
[-1, 1], similarities in [0, 1]) is sent as little-endian float16 — its rounding error (at most 2⁻¹¹
relative, 4.9e-4 absolute in [-1, 1]) is below half a step of the 256-entry colormap (3.9e-3 for
[-1, 1]) and below the 3 decimals a tooltip needs, at 2 bytes per cell. Anything else is float32.
NaN ("undefined") survives both.

Example:
    >>> import numpy as np
    >>> p = Panel("k0", "Keys · layer 0", np.eye(3))
    >>> encoded = encode_panel(p, vmin=-1.0, vmax=1.0)
    >>> encoded["dtype"], len(encoded["data"])
    ('float16', 18)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

__all__ = ["Panel", "PanelGrid", "encode_panel"]

FLOAT16_LIMIT = 65504.0


@dataclass
class Panel:
    """One heatmap: a 2-D float64 matrix plus what the reader needs to interpret it."""

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


@dataclass
class PanelGrid:
    """Panels that share a colour scale, in display order."""

    panels: list[Panel]
    vmin: float
    vmax: float
    colormap: str  # "diverging" | "magma"
    colorbar_label: str
    columns: int = 0  # 0: wrap to the available width


def _wire_dtype(matrix: np.ndarray, vmin: float, vmax: float) -> str:
    finite = matrix[np.isfinite(matrix)]
    if finite.size == 0:
        return "float16"
    lo, hi = float(finite.min()), float(finite.max())
    inside = lo >= min(vmin, -1.0) - 1e-12 and hi <= max(vmax, 1.0) + 1e-12
    return "float16" if inside and max(abs(lo), abs(hi)) < FLOAT16_LIMIT else "float32"


def encode_panel(panel: Panel, *, vmin: float, vmax: float) -> dict[str, Any]:
    """The dict the front end reads (see ``js/lib/panels.ts``), with the matrix as raw bytes."""
    matrix = np.asarray(panel.matrix, dtype=np.float64)
    if matrix.ndim != 2:
        raise ValueError(f"panel {panel.id!r}: expected a 2-D matrix, got shape {matrix.shape}")
    dtype = _wire_dtype(matrix, vmin, vmax)
    data = np.ascontiguousarray(matrix.astype("<f2" if dtype == "float16" else "<f4")).tobytes()
    return {
        "id": panel.id,
        "title": panel.title,
        "subtitle": panel.subtitle,
        "rows": int(matrix.shape[0]),
        "cols": int(matrix.shape[1]),
        "row_labels": panel.row_labels,
        "col_labels": panel.col_labels,
        "row_offset": panel.row_offset,
        "col_offset": panel.col_offset,
        "row_step": panel.row_step,
        "col_step": panel.col_step,
        "dtype": dtype,
        "data": data,
        "note": panel.note,
    }
