"""Partial RoPE: which rotary frequency pairs of each KV head keep rotating, and the MLA latent beside them.

**Which pairs** (MHA2MLA's 2-norm criterion, as its authors' ``src/mha2mla/2_norm.py`` computes it).
Query head h's and KV head g's components on rotary plane m are ``q_{h,m}`` and ``k_{g,m}`` (2 dims
each; the planes are the model's own, ``2_norm.py`` pairs dims (m, m + d/2) as HF's half-split RoPE
does) of the queries and keys the model rotates: the pre-RoPE projection outputs (``2_norm.py``:
``q_proj(x)``, ``k_proj(x)`` of the attention input), after the query/key norm where the model has one
(``q_norm``/``k_norm``, which ``2_norm.py``, written for Llama and Qwen2, never meets; headwidget takes
what RoPE is applied to). RoPE turns each pair by a 2×2 rotation, so a pair's norm is the same before
and after it. The score of plane m of KV head g is

    ``score_{g,m} = mean_t ‖k_{g,m}‖ · Σ_{h reads g} mean_t ‖q_{h,m}‖``

— each query head's token-mean pair norm times its KV head's, summed over the query heads of the group
(``2_norm.py``: ``qk_states = query_states * key_states`` summed over ``group_size``): the norms are
taken per head before anything is summed, and averaged over the captured tokens (``2_norm.py``
averages over each sequence's positions, then over its sequences, all of one length; headwidget
averages over the real tokens, never padding, which is the same for sequences of one length). The
means come from the sums a capture with ``inputs=True`` keeps (:meth:`KVStats.plane_norms
<headwidget.stats.KVStats.plane_norms>`). The ``r`` planes with the largest scores keep rotating (ties:
the lower plane index; ``2_norm.py`` sorts without a tie rule); the other planes lose their rotation.

**The latent** (the deployable MLA of MHA2MLA / TransMLA): the kept rotary key rows stay as they are
(cached per KV head: ``G·2r`` elements), and the rows of the non-rotary key dims of every KV head and of
every value head are stacked and replaced by their best rank-``d_c`` approximation ``U Uᵀ W`` in the
weighted norm ``‖(W − Ŵ) Σ_x^{1/2}‖_F`` (weight space: ``Σ_x = I``), cached as the latent ``Uᵀ W x``
(``d_c`` elements).

Example:
    >>> import torch
    >>> query = torch.tensor([[1.0, 2.0], [3.0, 0.5]], dtype=torch.float64)  # 2 query heads, 2 planes
    >>> key = torch.tensor([[1.0, 1.0]], dtype=torch.float64)  # both read the one KV head
    >>> scores = plane_scores(query, key, torch.tensor([0, 0]))
    >>> scores.tolist(), kept_planes(scores, 1).tolist()
    ([[4.0, 2.5]], [[0]])
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from headwidget.analysis.conversions import top_projection_factors
from headwidget.core.weights import HeadWeights
from headwidget.errors import RankRangeError

__all__ = ["LatentFit", "keep_mask", "kept_planes", "partial_rope_latent", "plane_scores"]

F64 = torch.float64


def plane_scores(query: torch.Tensor, key: torch.Tensor, kv_of: torch.Tensor) -> torch.Tensor:
    """(G, planes) 2-norm scores of every rotary plane of every KV head (see the module docstring).

    ``query`` (H, planes) and ``key`` (G, planes) are the token-mean pair norms ``mean_t ‖q_{h,m}‖`` and
    ``mean_t ‖k_{g,m}‖`` (:meth:`PlaneNorms.query_mean <headwidget.stats.PlaneNorms.query_mean>`,
    :meth:`~headwidget.stats.PlaneNorms.key_mean`); query head h reads KV head ``kv_of[h]``.
    """
    kv_of = kv_of.to(query.device, torch.long)
    per_kv = torch.zeros_like(key).index_add_(0, kv_of, query.to(key.dtype))
    return key * per_kv


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
