"""Partial RoPE: which rotary frequency pairs of each KV head keep rotating, and the MLA latent beside them.

**Which pairs** (MHA2MLA's 2-norm criterion, from second moments). Query head h's and KV head g's
components on rotary plane m are ``q_{h,m}`` and ``k_{g,m}`` (2 dims each); RoPE rotates both by the
same kind of 2×2 rotation, so their norms are the same before and after it and ``|q_{h,m}·k_{g,m}| ≤
‖q_{h,m}‖ ‖k_{g,m}‖``. From the attention input's uncentred second moment ``E[x xᵀ]`` (and mean, for
the biases) the mean squares ``E‖q_{h,m}‖²`` and ``E‖k_{g,m}‖²`` over the captured tokens are exact,
and the score of plane m of KV head g is

    ``score_{g,m} = sqrt(E‖k_{g,m}‖²) · Σ_{h reads g} sqrt(E‖q_{h,m}‖²)``

— the product of root-mean-square norms, which bounds the token mean of ``‖q_{h,m}‖·‖k_{g,m}‖`` from
above (Cauchy–Schwarz) and needs no per-token queries. The ``r`` planes with the largest scores keep
rotating (ties: the lower plane index); the other planes lose their rotation.

**The latent** (the deployable MLA of MHA2MLA / TransMLA): the kept rotary key rows stay as they are
(cached per KV head: ``G·2r`` elements), and the rows of the non-rotary key dims of every KV head and of
every value head are stacked and replaced by their best rank-``d_c`` approximation ``U Uᵀ W`` in the
weighted norm ``‖(W − Ŵ) Σ_x^{1/2}‖_F`` (weight space: ``Σ_x = I``), cached as the latent ``Uᵀ W x``
(``d_c`` elements).

Example:
    >>> import torch
    >>> z = torch.zeros(2, 4, 3, dtype=torch.float64)
    >>> q = z.clone(); q[:, 1, 0] = q[:, 3, 0] = 1.0  # both heads live on plane 1 = dims (1, 3)
    >>> w = HeadWeights(q=q, k=q.clone(), v=z.clone(), o=z.transpose(1, 2).clone())
    >>> scores = plane_scores(w, torch.eye(3, dtype=torch.float64), torch.zeros(3, dtype=torch.float64),
    ...                       [(0, 2), (1, 3)])
    >>> scores.round(decimals=9).tolist(), kept_planes(scores, 1).tolist()
    ([[0.0, 2.0], [0.0, 2.0]], [[1], [1]])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from headwidget.analysis.conversions import top_projection_factors
from headwidget.core.weights import HeadWeights
from headwidget.errors import RankRangeError

__all__ = ["LatentFit", "keep_mask", "kept_planes", "partial_rope_latent", "plane_scores", "row_mean_squares"]

F64 = torch.float64


def row_mean_squares(
    w: torch.Tensor, bias: torch.Tensor | None, second: torch.Tensor, mean: torch.Tensor
) -> torch.Tensor:
    """``E[(w_i·x + b_i)²]`` for every row i of ``w`` (…, d), from ``E[x xᵀ]`` (d, d) and ``E[x]`` (d,).

    >>> second = torch.tensor([[2.0, 0.0], [0.0, 3.0]], dtype=torch.float64)
    >>> row_mean_squares(torch.tensor([[1.0, 1.0]], dtype=torch.float64), torch.tensor([1.0]),
    ...                  second, torch.tensor([0.5, 0.0], dtype=torch.float64)).tolist()
    [7.0]
    """
    quad = torch.einsum("...a,ab,...b->...", w, second, w)
    if bias is None:
        return quad
    return quad + 2 * bias * (w @ mean) + bias * bias


def plane_scores(
    w: HeadWeights, second: torch.Tensor, mean: torch.Tensor, planes: Sequence[tuple[int, int]]
) -> torch.Tensor:
    """(G, planes) 2-norm scores of every rotary plane of every KV head (see the module docstring).

    ``second`` is the attention input's uncentred second moment ``E[x xᵀ]``, ``mean`` its ``E[x]``.
    """
    p = torch.tensor([a for a, _ in planes], dtype=torch.long)
    q = torch.tensor([b for _, b in planes], dtype=torch.long)

    def plane_rms(weights: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        rows = row_mean_squares(weights, bias, second, mean)  # (heads, d_h)
        return (rows[:, p] + rows[:, q]).clamp_min(0).sqrt()

    q_rms = plane_rms(w.q, w.q_bias)  # (H, planes)
    k_rms = plane_rms(w.k, w.k_bias)  # (G, planes)
    per_kv = torch.zeros_like(k_rms).index_add_(0, w.kv_of, q_rms)
    return k_rms * per_kv


def kept_planes(scores: torch.Tensor, r: int) -> torch.Tensor:
    """(G, r) indices of the ``r`` highest-scoring planes of each KV head, ascending (ties: lower index).

    >>> kept_planes(torch.tensor([[1.0, 3.0, 3.0, 0.5]]), 2).tolist()
    [[1, 2]]
    """
    planes = scores.shape[-1]
    if not 1 <= r <= planes:
        raise RankRangeError(f"rope:{r}: r must lie in 1..{planes} (the rotary frequency pairs of a head)")
    order = torch.sort(-scores, dim=-1, stable=True).indices[..., :r]
    return torch.sort(order, dim=-1).values


def keep_mask(kept: torch.Tensor, planes: Sequence[tuple[int, int]], head_dim: int) -> torch.Tensor:
    """(G, head_dim) booleans: the dims of each KV head that keep rotating.

    >>> keep_mask(torch.tensor([[1]]), [(0, 2), (1, 3)], 4).tolist()
    [[False, True, False, True]]
    """
    mask = torch.zeros(kept.shape[0], head_dim, dtype=torch.bool)
    for g in range(kept.shape[0]):
        for m in kept[g].tolist():
            a, b = planes[m]
            mask[g, a] = mask[g, b] = True
    return mask


@dataclass(frozen=True)
class LatentFit:
    """Per KV head keys (G, d_h, d) and values (G, d_v, d) of an MLA with decoupled rotary dims.

    ``down`` (d_c, d) makes the latent ``c = down x``; ``k_up`` (G, d_h, d_c) is zero on the rotary rows,
    which ``k`` keeps from the original; ``v_up`` (G, d_v, d_c). ``elements`` = ``d_c + G·2r``.
    """

    k: torch.Tensor
    v: torch.Tensor
    down: torch.Tensor
    k_up: torch.Tensor
    v_up: torch.Tensor
    elements: int


def partial_rope_latent(
    w: HeadWeights, keep: torch.Tensor, latent: int, sqrt: torch.Tensor | None = None
) -> LatentFit:
    """Keys and values of ``w`` with the non-rotary key rows and the values through a rank-``latent``
    factorisation, the rotary key rows (``keep``, (G, d_h) booleans) unchanged (see the module doc).

    >>> z = torch.zeros
    >>> w = HeadWeights(q=torch.randn(2, 4, 6, dtype=F64), k=torch.randn(2, 4, 6, dtype=F64),
    ...                 v=torch.randn(2, 4, 6, dtype=F64), o=z(2, 6, 4, dtype=F64))
    >>> keep = torch.tensor([[True, False, True, False]] * 2)
    >>> fit = partial_rope_latent(w, keep, 6)
    >>> bool(torch.allclose(fit.k, w.k)), bool(torch.allclose(fit.v, w.v)), fit.elements  # d_c = d: exact
    (True, True, 10)
    """
    kv, d_h, d = w.k.shape
    d_v = int(w.v.shape[1])
    nope = ~keep
    key_rows = w.k[nope]  # (Σ_g non-rotary dims, d), KV head-major
    stacked = torch.cat([key_rows, w.v.reshape(-1, d)])
    if not 1 <= latent <= stacked.shape[0]:
        raise RankRangeError(
            f"mla:{latent}: d_c must lie in 1..{stacked.shape[0]} (non-rotary key rows plus value rows)"
        )
    up, down = top_projection_factors(stacked, sqrt, latent)
    approx = up @ down
    k = w.k.clone()
    k[nope] = approx[: key_rows.shape[0]]
    k_up = torch.zeros(kv, d_h, up.shape[1], dtype=up.dtype)
    k_up[nope] = up[: key_rows.shape[0]]
    v = approx[key_rows.shape[0] :].reshape(kv, d_v, d)
    v_up = up[key_rows.shape[0] :].reshape(kv, d_v, -1)
    return LatentFit(k, v, down, k_up, v_up, latent + int(keep.sum()))
