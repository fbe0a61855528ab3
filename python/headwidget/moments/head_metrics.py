"""Head × head similarity from streaming moments (no alignment).

Heads are the ``head_dim``-channel slices of a layer's K or V (the real KV heads; GQA copies are never
formed). Metrics, for heads i, j over N tokens:

- ``token_cosine``: ``(1/N) Σ_t cos(x_{i,t}, x_{j,t})`` = ``tr(Â_ij) / N`` from the Gram of
  per-head-normalised vectors (the score of the head-alignment paper, before alignment);
- ``cosine``: Frobenius cosine of the uncentred Gram, ``tr(G_ij) / sqrt(tr(G_ii) tr(G_jj))``;
- ``pearson``: the same on the centred co-moment (a Pearson-like correlation of the two heads);
- ``cka``: linear CKA, ``‖C_ij‖_F² / (‖C_ii‖_F ‖C_jj‖_F)`` with centred C.

Undefined scores (a head that is constant) are NaN. Every score is clamped to its range, ``[−1, 1]``
(``[0, 1]`` for CKA): the Grams are summed in float32 on the device, so a mean of cosines near ±1 can
come out a few float32 rounding steps (≈ 1e-7 relative) beyond it, and a similarity never exceeds 1.

Example:
    >>> import torch
    >>> from headwidget.moments import Moments
    >>> x = torch.randn(200, 4, dtype=torch.float64)
    >>> m = Moments.empty(4, head_dim=2); m.update(torch.cat([x[:, :2], x[:, :2]], 1).float(), 100)
    >>> round(float(head_similarity_from_moments(m, "pearson")[0, 1]), 6)
    1.0
"""

from __future__ import annotations

import torch

from headwidget.errors import UnknownMetricError
from headwidget.moments.streaming import Moments

__all__ = ["HEAD_METRICS", "head_blocks", "head_similarity_from_moments", "similarity_from_gram"]

HEAD_METRICS = ("token_cosine", "cosine", "pearson", "cka")


def head_blocks(matrix: torch.Tensor, head_dim: int) -> torch.Tensor:
    """View a (C×C) matrix as (heads, heads, head_dim, head_dim) blocks: ``out[i, j]`` = block (i, j)."""
    c = matrix.shape[-1]
    h = c // head_dim
    return matrix.reshape(h, head_dim, h, head_dim).permute(0, 2, 1, 3)


def _safe_div(num: torch.Tensor, den: torch.Tensor) -> torch.Tensor:
    out = num / torch.where(den > 0, den, torch.ones_like(den))
    return torch.where(den > 0, out, torch.full_like(out, float("nan")))


def similarity_from_gram(gram: torch.Tensor, head_dim: int, metric: str) -> torch.Tensor:
    """Frobenius cosine (``cosine``/``pearson``) or linear CKA (``cka``) between heads of a Gram."""
    blocks = head_blocks(gram, head_dim)
    if metric in ("cosine", "pearson"):
        tr = torch.diagonal(blocks, dim1=-2, dim2=-1).sum(-1)
        diag = torch.diagonal(tr).clamp_min(0)
        return _safe_div(tr, torch.sqrt(torch.outer(diag, diag))).clamp(-1.0, 1.0)
    if metric == "cka":
        fro2 = (blocks * blocks).sum((-2, -1))
        diag = torch.sqrt(torch.diagonal(fro2).clamp_min(0))
        return _safe_div(fro2, torch.outer(diag, diag)).clamp(0.0, 1.0)
    raise UnknownMetricError(f"unknown metric {metric!r}; choose one of {', '.join(HEAD_METRICS)}")


def head_similarity_from_moments(moments: Moments, metric: str = "token_cosine") -> torch.Tensor:
    """(heads × heads) similarity of the heads in ``moments`` under ``metric`` (float64)."""
    if moments.head_dim is None:
        raise ValueError("these moments are not split into heads")
    hd = moments.head_dim
    if metric == "token_cosine":
        if moments.count == 0:
            raise ValueError("no tokens were captured")
        blocks = head_blocks(moments.token_gram(), hd)
        tr = torch.diagonal(blocks, dim1=-2, dim2=-1).sum(-1)
        return (tr / moments.count).clamp(-1.0, 1.0)
    if metric == "cosine":
        return similarity_from_gram(moments.gram(), hd, "cosine")
    if metric in ("pearson", "cka"):
        return similarity_from_gram(moments.m2, hd, metric)
    raise UnknownMetricError(f"unknown metric {metric!r}; choose one of {', '.join(HEAD_METRICS)}")
