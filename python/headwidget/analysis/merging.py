"""Rotate, reorder and merge the heads of one layer's :class:`~headwidget.core.weights.HeadWeights`.

The align-then-merge conversion (mha2gqa without its training stage) in three float64 steps, the first
two of which leave the layer's function unchanged:

1. :func:`rotate_heads`: keys ``k_g → k_g R_g`` (row vectors), so ``W_K[g] ← R_gᵀ W_K[g]`` and the
   query rows of every head reading g alike (``q·k`` unchanged; RoPE-compatible ``R_g`` commute with
   RoPE); values ``v_g → v_g S_g``: ``W_V[g] ← S_gᵀ W_V[g]``, ``W_O[h] ← W_O[h] S_g``. Biases rotate with
   their rows.
2. :func:`regroup_heads`: reorder the KV heads so that each group is contiguous (query heads move with
   their KV head, output columns with their query head).
3. :func:`merge_groups`: each group of contiguous KV heads becomes one, its K/V weights and biases the
   group means (the same means :func:`~headwidget.analysis.conversions.convert` takes for ``gqa:G``).

Example:
    >>> import torch
    >>> r = torch.randn
    >>> w = HeadWeights(q=r(4, 2, 6), k=r(4, 2, 6), v=r(4, 2, 6), o=r(4, 6, 2))
    >>> m = merge_groups(regroup_heads(w, [[0, 2], [1, 3]]), 2)
    >>> m.num_kv_heads, bool(torch.allclose(m.k[0], (w.k[0] + w.k[2]) / 2)), bool(torch.equal(m.q[1], w.q[2]))
    (2, True, True)
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch

from headwidget.core.weights import HeadWeights
from headwidget.errors import GroupCountError

__all__ = ["merge_groups", "per_kv_head", "query_order", "regroup_heads", "rotate_heads"]


def _rows(rot: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    return rot.transpose(-2, -1) @ w


def _bias(rot: torch.Tensor, b: torch.Tensor | None) -> torch.Tensor | None:
    return None if b is None else (b[:, None, :] @ rot)[:, 0]


def rotate_heads(w: HeadWeights, key_rotations: torch.Tensor, value_rotations: torch.Tensor) -> HeadWeights:
    """``w`` with KV head g's keys turned by ``key_rotations[g]`` and values by ``value_rotations[g]``.

    >>> w = HeadWeights(q=torch.randn(2, 2, 3), k=torch.randn(1, 2, 3), v=torch.randn(1, 2, 3),
    ...                 o=torch.randn(2, 3, 2))
    >>> flip = torch.tensor([[[0.0, 1.0], [1.0, 0.0]]])
    >>> bool(torch.equal(rotate_heads(w, flip, flip).k[0], w.k[0].flip(0)))
    True
    """
    rk_q, rv_q = key_rotations[w.kv_of], value_rotations[w.kv_of]
    return replace(
        w,
        q=_rows(rk_q, w.q),
        k=_rows(key_rotations, w.k),
        v=_rows(value_rotations, w.v),
        o=w.o @ rv_q,
        q_bias=_bias(rk_q, w.q_bias),
        k_bias=_bias(key_rotations, w.k_bias),
        v_bias=_bias(value_rotations, w.v_bias),
    )


def query_order(w: HeadWeights, kv_order: Sequence[int]) -> list[int]:
    """The query heads in the order of their KV heads ``kv_order``.

    >>> z = torch.zeros
    >>> query_order(HeadWeights(q=z(4, 1, 1), k=z(2, 1, 1), v=z(2, 1, 1), o=z(4, 1, 1)), [1, 0])
    [2, 3, 0, 1]
    """
    per = w.num_heads // w.num_kv_heads
    return [g * per + i for g in kv_order for i in range(per)]


def _take(t: torch.Tensor | None, index: list[int]) -> torch.Tensor | None:
    return None if t is None else t[index].clone()


def regroup_heads(w: HeadWeights, groups: Sequence[Sequence[int]]) -> HeadWeights:
    """``w`` with its KV heads reordered group by group (a permutation: the function is unchanged).

    Raises:
        GroupCountError: ``groups`` do not partition the KV heads into equal-size groups.
    """
    order = [int(g) for group in groups for g in group]
    sizes = {len(group) for group in groups}
    if sorted(order) != list(range(w.num_kv_heads)) or len(sizes) != 1:
        raise GroupCountError(
            f"groups {[list(g) for g in groups]} must split the {w.num_kv_heads} KV heads into equal groups"
        )
    qs = query_order(w, order)
    return replace(
        w,
        q=w.q[qs].clone(),
        k=w.k[order].clone(),
        v=w.v[order].clone(),
        o=w.o[qs].clone(),
        q_bias=_take(w.q_bias, qs),
        k_bias=_take(w.k_bias, order),
        v_bias=_take(w.v_bias, order),
    )


def _mean(t: torch.Tensor, groups: int) -> torch.Tensor:
    return t.reshape(groups, t.shape[0] // groups, *t.shape[1:]).mean(1)


def _mean_bias(t: torch.Tensor | None, groups: int) -> torch.Tensor | None:
    return None if t is None else _mean(t, groups)


def merge_groups(w: HeadWeights, groups: int) -> HeadWeights:
    """``w`` with every ``G / groups`` contiguous KV heads merged into one (K/V weights and biases
    averaged); the query and output weights are unchanged.

    Raises:
        GroupCountError: ``groups`` does not divide the number of KV heads.
    """
    kv = w.num_kv_heads
    if groups < 1 or kv % groups:
        divisors = ", ".join(str(g) for g in range(1, kv + 1) if kv % g == 0)
        raise GroupCountError(f"cannot merge {kv} KV heads into {groups} equal groups; use one of {divisors}")
    mechanism = "mha" if groups == w.num_heads else "mqa" if groups == 1 else "gqa"
    return replace(
        w,
        k=_mean(w.k, groups),
        v=_mean(w.v, groups),
        k_bias=_mean_bias(w.k_bias, groups),
        v_bias=_mean_bias(w.v_bias, groups),
        mechanism=mechanism,
    )


def per_kv_head(
    per_query: torch.Tensor, kv_heads: int, *, what: str = "weights", scale: float | None = None
) -> torch.Tensor:
    """One entry per KV head from per-query-head tensors (H, …) that agree within each group of
    ``H / kv_heads`` contiguous query heads (checked to 1e-9 relative to ``scale``: the magnitude their
    rounding errors are relative to; default the largest entry of ``per_query``; a fit of K and V together,
    such as MLA's joint factorisation, passes the largest entry of both, since keys far smaller than
    the values, or zero, carry rounding errors of the values' size).

    >>> per_kv_head(torch.tensor([[1.0], [1.0], [2.0], [2.0]]), 2).tolist()
    [[1.0], [2.0]]

    Raises:
        GroupCountError: they differ within a group, so ``kv_heads`` KV heads cannot hold them.
    """
    heads = per_query.shape[0]
    if kv_heads < 1 or heads % kv_heads:
        raise GroupCountError(f"{heads} query heads do not split into {kv_heads} equal groups")
    grouped = per_query.reshape(kv_heads, heads // kv_heads, *per_query.shape[1:])
    first = grouped[:, :1]
    if not per_query.numel():
        return first[:, 0].clone()
    scale = float(per_query.abs().max()) if scale is None else max(float(scale), float(per_query.abs().max()))
    if float((grouped - first).abs().max()) > 1e-9 * max(scale, 1e-300):
        raise GroupCountError(
            f"these {what} differ between query heads that share a KV head, so a model with "
            f"{kv_heads} KV heads cannot hold them"
        )
    return first[:, 0].clone()
