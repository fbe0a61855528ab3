"""How many independent directions a set of heads spans: spectrum-based diversity metrics.

From the eigenvalues ``λ`` of a head × head similarity (a centred Gram, or the correlation that
:func:`~headwidget.analysis.operator_space.operator_similarity` returns), with ``p = λ / Σλ``
(negative eigenvalues, rounding noise of a PSD matrix, are set to 0):

- ``effective_rank``: ``exp(−Σ p log p)`` (entropy effective rank; H for H equal, unrelated heads);
- ``participation_ratio``: ``(Σλ)² / Σλ²``;
- ``k90``: the fewest components that explain at least 90 % of ``Σλ``;
- ``explained``: ``p`` in decreasing order (the variance explained by each principal component).

Example:
    >>> d = head_diversity(np.eye(4))
    >>> round(d["effective_rank"], 6), d["participation_ratio"], d["k90"]
    (4.0, 4.0, 4)
"""

from __future__ import annotations

from typing import Any

import numpy as np

from headwidget.checks import flag
from headwidget.errors import ArgumentError, DegenerateHeadsError

__all__ = ["head_diversity"]


def head_diversity(matrix: Any, *, centre: bool = False) -> dict[str, Any]:
    """Diversity metrics of a symmetric (H, H) head similarity or Gram (see the module docstring).

    Args:
        matrix: (H, H) array-like (numpy or torch), symmetrised before use; must be finite.
        centre: apply ``J M J`` first (pass ``True`` for a raw, uncentred Gram).

    Raises:
        ArgumentError: a matrix that is not a finite square numeric array, or a ``centre`` that is not a bool.
        DegenerateHeadsError: the matrix has no positive spectrum (e.g. centred identical heads).

    >>> d = head_diversity(np.ones((3, 3)))
    >>> round(d["effective_rank"], 6), d["k90"], d["explained"].round(6).tolist()
    (1.0, 1, [1.0, 0.0, 0.0])
    """
    centre = flag("centre", centre)
    try:
        m = np.asarray(matrix, dtype=np.float64)
    except (TypeError, ValueError) as err:
        raise ArgumentError(
            f"matrix must be a numeric (H, H) array, got {type(matrix).__name__} ({err})"
        ) from None
    if m.ndim != 2 or m.shape[0] != m.shape[1]:
        raise ArgumentError(f"matrix must be a square (H, H) array, got shape {m.shape}")
    if not np.isfinite(m).all():
        raise ArgumentError("matrix has NaN or infinite entries; drop the undefined heads first")
    m = (m + m.T) / 2
    heads = m.shape[0]
    if centre:
        j = np.eye(heads) - 1.0 / heads
        m = j @ m @ j
    lam = np.clip(np.linalg.eigvalsh(m)[::-1], 0.0, None)
    total = lam.sum()
    if total <= 1e-12 * max(1.0, float(np.abs(m).max())):
        raise DegenerateHeadsError(
            "the head similarity has no positive spectrum (all heads identical after centring?); "
            "no diversity is defined"
        )
    p = lam / total
    nz = p[p > 0]
    k90 = int(np.searchsorted(np.cumsum(p), 0.9 - 1e-12) + 1)
    return {
        "effective_rank": float(np.exp(-(nz * np.log(nz)).sum())),
        "participation_ratio": float(total**2 / (lam**2).sum()),
        "k90": min(k90, heads),
        "explained": p,
    }
