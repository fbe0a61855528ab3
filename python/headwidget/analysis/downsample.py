"""Block-aggregate a large matrix (a 4096×4096 channel correlation, say) to at most ``size × size``.

**Block rule.** One square block edge ``b = ceil(max(R, C) / size)`` for both axes. Output cell
``(I, J)`` aggregates rows ``I·b … min((I+1)·b, R) − 1`` and columns ``J·b … min((J+1)·b, C) − 1``;
the last block row / column is partial when ``b`` does not divide the side. The output has shape
``(ceil(R/b), ceil(C/b))``; ``b = 1`` returns a float64 copy.

- ``how="mean"``: the mean of the block's non-NaN cells (NaN cells are ignored);
- ``how="maxabs"``: the block's cell of largest magnitude, sign kept (first in row-major order on ties),
  so a single strong correlation stays visible.

A block whose cells are all NaN (an undefined, zero-variance channel) stays NaN under both rules.

Example:
    >>> m = np.arange(16, dtype=float).reshape(4, 4)
    >>> out, block = downsample(m, 2)
    >>> block, out.tolist()
    (2, [[2.5, 4.5], [10.5, 12.5]])
    >>> downsample(np.array([[1.0, -3.0], [np.nan, 2.0]]), 1, how="maxabs")[0].tolist()
    [[-3.0]]
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from headwidget.checks import whole_number
from headwidget.errors import ArgumentError, UnknownAggregationError

__all__ = ["DOWNSAMPLE_RULES", "downsample"]

DOWNSAMPLE_RULES = ("mean", "maxabs")
CHUNK_CELLS = 8 * 2**20


def _blocks(part: np.ndarray, b: int, cols_b: int) -> np.ndarray:
    """Pad a chunk of whole block rows with NaN and view it as (rows_b, cols_b, b·b)."""
    rows = -(-part.shape[0] // b) * b
    padded = np.full((rows, cols_b * b), np.nan)
    padded[: part.shape[0], : part.shape[1]] = part
    return padded.reshape(rows // b, b, cols_b, b).transpose(0, 2, 1, 3).reshape(rows // b, cols_b, b * b)


def downsample(matrix: Any, size: int, how: str = "mean") -> tuple[np.ndarray, int]:
    """``(aggregated matrix, block edge)`` under the rule in the module docstring.

    Args:
        matrix: a 2-D numpy array or torch tensor (converted to float64).
        size: the largest allowed output side (≥ 1).
        how: ``"mean"`` or ``"maxabs"``.

    >>> out, block = downsample(np.full((1000, 1000), 0.5), 300)
    >>> out.shape, block
    ((250, 250), 4)
    """
    if not isinstance(how, str) or how not in DOWNSAMPLE_RULES:
        raise UnknownAggregationError(f"unknown aggregation {how!r}; choose 'mean' or 'maxabs'")
    if hasattr(matrix, "detach"):
        matrix = matrix.detach().cpu().numpy()
    size = whole_number("size", size, minimum=1, hint="the largest output side")
    try:
        m = np.asarray(matrix, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ArgumentError(
            f"matrix must be a numeric 2-D array, got {type(matrix).__name__} ({err})"
        ) from None
    if m.ndim != 2 or m.size == 0:
        raise ArgumentError(f"matrix must be a non-empty 2-D array, got shape {m.shape}")
    b = math.ceil(max(m.shape) / size)
    if b == 1:
        return m.copy(), 1
    rows_b, cols_b = -(-m.shape[0] // b), -(-m.shape[1] // b)
    if how == "mean" and m.shape[0] % b == 0 and m.shape[1] % b == 0 and not np.isnan(m).any():
        # whole blocks, nothing undefined: a plain block mean (same numbers, a third of the time)
        return m.reshape(rows_b, b, cols_b, b).mean(axis=(1, 3)), b
    out = np.empty((rows_b, cols_b))
    step = max(1, CHUNK_CELLS // (b * b * cols_b))  # block rows per chunk
    for i0 in range(0, rows_b, step):
        blk = _blocks(m[i0 * b : (i0 + step) * b], b, cols_b)
        missing = np.isnan(blk)
        if how == "mean":
            count = (~missing).sum(-1)
            total = np.where(missing, 0.0, blk).sum(-1)
            with np.errstate(invalid="ignore", divide="ignore"):
                res = np.where(count > 0, total / np.maximum(count, 1), np.nan)
        else:
            mag = np.where(missing, -1.0, np.abs(blk))
            pick = np.take_along_axis(blk, mag.argmax(-1)[..., None], -1)[..., 0]
            res = np.where(missing.all(-1), np.nan, pick)
        out[i0 : i0 + res.shape[0]] = res
    return out, b
