"""Rotate the heads of a model so that heads of one group become similar, exactly.

For each group of KV heads of a layer, rotations ``R_i`` are fitted jointly (generalised Procrustes on
the Gram of per-head-normalised vectors: block-coordinate ascent of ``Σ_{i≠j} tr(R_i^T Â_ij R_j)``
from ``R = I``, so the within-group score sum never decreases). Keys get RoPE-compatible rotations
(a 2×2 rotation per rotary plane, Procrustes on non-rotary dims), which commute with RoPE; values get
orthogonal ones. The model's adapter folds them into the weights so the model computes the same
function:

- keys ``k → k R``: ``W_K[g] ← R^T W_K[g]``; queries of the heads using KV head g likewise, so
  ``q·k`` is unchanged (``q R (k R)^T = q k^T``), and RoPE commutes with ``R``;
- values ``v → v R``: ``W_V[g] ← R^T W_V[g]``; the output projection's input columns of every query
  head using g: ``W_O[:, h] ← W_O[:, h] R``.

Key dims that hold one vector shared by all heads (the decoupled RoPE key of MLA) stay fixed: the
rotations are fitted on the other dims only. Families whose heads cannot be rotated exactly (per-head
query/key norms, element-wise clamps, quantised weights) raise :class:`UnsupportedAlignmentError`
naming the reason.

Example:
    >>> import torch, headwidget
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=4)).eval()
    >>> ids = torch.randint(0, 64, (2, 24))
    >>> stats = headwidget.capture(model, ids, progress=False)
    >>> aligned = align_model(model, stats, [[0, 1], [2, 3]])
    >>> bool(torch.allclose(aligned(ids).logits, model(ids).logits, atol=1e-5))
    True
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Mapping, Sequence

import torch
from torch import nn

from headwidget.adapters import adapter_for
from headwidget.analysis.conversions import check_stats_source
from headwidget.analysis.procrustes import HeadSplit, fit_rotations
from headwidget.checks import layer_index, whole_numbers
from headwidget.errors import ArgumentError, GroupCountError, StatsMismatchError, UnsupportedAlignmentError
from headwidget.moments.head_metrics import head_blocks
from headwidget.stats import KVStats

__all__ = ["align_model", "fit_group_rotations", "fit_group_rotations_many"]

F64 = torch.float64

Groups = Sequence[Sequence[int]]


def fit_group_rotations(
    gram: torch.Tensor, split: HeadSplit, groups: Groups, *, sweeps: int = 100
) -> torch.Tensor:
    """Per-head rotations (P, d_h, d_h) that make the heads of each group agree (see module doc).

    ``gram`` is a (C, C) Gram of per-head-normalised vectors; heads outside every group keep ``I``.

    >>> g = torch.eye(4, dtype=torch.float64)
    >>> fit_group_rotations(g, HeadSplit.make(2, []), [[0, 1]]).shape
    torch.Size([2, 2, 2])
    """
    return fit_group_rotations_many([gram], split, groups, sweeps=sweeps)[0]


def fit_group_rotations_many(
    grams: Sequence[torch.Tensor], split: HeadSplit, groups: Groups, *, sweeps: int = 100
) -> list[torch.Tensor]:
    """:func:`fit_group_rotations` of each of ``grams`` (of one shape, e.g. one per layer), fitted
    together: each head update is one batched Procrustes over the problems still improving (a batched
    SVD spread over the cores, instead of one small SVD at a time), and each problem stops on its own
    criterion, as it would alone.

    >>> a = torch.eye(4, dtype=torch.float64)
    >>> b = torch.tensor([[2.0, 0, 0, 1], [0, 2, 1, 0], [0, 1, 2, 0], [1, 0, 0, 2]], dtype=torch.float64)
    >>> together = fit_group_rotations_many([a, b], HeadSplit.make(2, []), [[0, 1]])
    >>> alone = [fit_group_rotations(g, HeadSplit.make(2, []), [[0, 1]]) for g in (a, b)]
    >>> all(torch.allclose(t, o, atol=1e-12) for t, o in zip(together, alone, strict=True))
    True
    """
    d = split.head_dim
    blocks = torch.stack([head_blocks(g.to(F64), d) for g in grams])  # (N, H, H, d, d)
    problems, heads = blocks.shape[0], blocks.shape[1]
    rot = torch.eye(d, dtype=F64, device=blocks.device).repeat(problems, heads, 1, 1)
    for group in groups:
        members = list(group)
        if len(members) < 2:
            continue
        idx = torch.tensor(members, device=blocks.device)
        sub = blocks[:, idx][:, :, idx]  # (N, m, m, d, d)
        pick = torch.arange(len(members), device=blocks.device)
        diagonal = torch.einsum("niaa->n", sub[:, pick, pick])
        live = torch.arange(problems, device=blocks.device)
        last = _group_scores(rot[live][:, idx], sub[live], diagonal[live])
        for _ in range(sweeps):
            for a, head in enumerate(members):
                others = [b for b in range(len(members)) if b != a]
                target = torch.einsum("njab,njbc->nac", sub[live, a][:, others], rot[live][:, idx[others]])
                rot[live, head] = fit_rotations(target, split)
            value = _group_scores(rot[live][:, idx], sub[live], diagonal[live])
            going = (value - last) > 1e-12 * value.abs().clamp_min(1.0)
            live, last = live[going], value[going]
            if live.numel() == 0:
                break
    return list(rot.unbind(0))


def _group_scores(rot: torch.Tensor, sub: torch.Tensor, diagonal: torch.Tensor) -> torch.Tensor:
    """``Σ_{i≠j} tr(R_iᵀ Â_ij R_j)`` of each problem: rotations (N, m, d, d), blocks (N, m, m, d, d) and
    the traces of their diagonal blocks (N,)."""
    return torch.einsum("niab,nijac,njcb->n", rot, sub, rot) - diagonal


def _checked_groups(groups: object, where: str) -> list[list[int]]:
    """``groups`` as lists of ints: a list of lists of integer KV-head indices (ArgumentError otherwise)."""
    if isinstance(groups, (str, bytes)) or not isinstance(groups, Iterable):
        raise ArgumentError(
            f"{where} must be a list of lists of KV-head indices such as [[0, 1]], got {groups!r}"
        )
    return [
        whole_numbers(f"{where}[{i}]", group, minimum=0, hint="KV-head indices")
        for i, group in enumerate(groups)
    ]


def _groups_by_layer(
    groups: Mapping[int, Groups] | Groups, layers: Sequence[int], num_layers: int
) -> dict[int, Groups]:
    if isinstance(groups, Mapping):
        return {
            layer_index("layer", k, num_layers): _checked_groups(v, f"groups[{k!r}]")
            for k, v in groups.items()
        }
    return dict.fromkeys(layers, _checked_groups(groups, "groups"))


def _check_groups(groups: Groups, kv_heads: int, layer: int) -> None:
    flat = [int(h) for g in groups for h in g]
    if len(flat) != len(set(flat)) or any(not 0 <= h < kv_heads for h in flat):
        raise GroupCountError(
            f"layer {layer}: groups {groups} must be disjoint lists of KV head indices in 0..{kv_heads - 1}"
        )


def _fit_with_fixed_dims(
    grams: Sequence[torch.Tensor],
    head_dim: int,
    planes: Sequence[tuple[int, int]],
    fixed: Sequence[int],
    groups: Groups,
) -> list[torch.Tensor]:
    """:func:`fit_group_rotations_many` on every head's dims except ``fixed``, which keep the identity."""
    free = [i for i in range(head_dim) if i not in set(fixed)]
    where = {dim: n for n, dim in enumerate(free)}
    if any((p in where) != (q in where) for p, q in planes):
        raise RuntimeError(f"the fixed key dims {list(fixed)} split a rotary plane of {list(planes)}")
    kept = [(where[p], where[q]) for p, q in planes if p in where]
    device = grams[0].device
    heads = grams[0].shape[0] // head_dim
    channels = torch.tensor([h * head_dim + i for h in range(heads) for i in free], device=device)
    subs = fit_group_rotations_many(
        [g[channels][:, channels] for g in grams], HeadSplit.make(len(free), kept), groups
    )
    index = torch.tensor(free, device=device)
    out = []
    for sub in subs:
        rot = torch.eye(head_dim, dtype=F64, device=device).repeat(heads, 1, 1)
        rot[:, index[:, None], index[None, :]] = sub
        out.append(rot)
    return out


def align_model(
    model: nn.Module,
    stats: KVStats,
    groups: Mapping[int, Groups] | Groups,
    *,
    layers: Sequence[int] | None = None,
    allow_other_weights: bool = False,
) -> nn.Module:
    """A rotated copy of ``model`` whose KV heads of each group are aligned; the input is not modified.

    Args:
        model: a supported model whose adapter can fold rotations into it
            (``headwidget.adapters.adapter_for(model).alignment_blocker()`` is None, else it names the
            reason).
        stats: its :class:`~headwidget.stats.KVStats` with kinds ``"key"`` and ``"value"``.
        groups: KV-head groups, either ``{layer: [[heads], ...]}`` or one grouping for every layer.
        layers: the layers to rotate when ``groups`` is not a mapping (default: every captured layer).
        allow_other_weights: rotate by ``stats`` even when they were captured from other weights of the
            same architecture and config (a base model's statistics for its fine-tune); by default
            refused.

    Example:
        >>> import torch, headwidget
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4)).eval()
        >>> ids = torch.randint(0, 64, (2, 24))
        >>> aligned = align_model(gpt2, headwidget.capture(gpt2, ids, progress=False), {0: [[0, 1]]})
        >>> aligned is not gpt2, bool(torch.allclose(aligned(ids).logits, gpt2(ids).logits, atol=1e-5))
        (True, True)

    Raises:
        UnsupportedAlignmentError: the model's heads cannot be rotated exactly (the message says why:
            per-head query/key norms, an element-wise q/k/v clamp, quantised projections...).
        StatsMismatchError: ``stats`` were captured from a model of another shape, class or config, or
            from other weights (unless ``allow_other_weights``).
        GroupCountError: ``groups`` are not disjoint lists of KV head indices.
        ArgumentError: ``groups`` or ``layers`` that are not (lists of) integers.
    """
    adapter = adapter_for(model)
    reason = adapter.alignment_blocker()
    if reason is not None:
        raise UnsupportedAlignmentError(reason)
    layout = adapter.layout()
    if not isinstance(stats, KVStats):
        raise ArgumentError(
            f"stats must be a KVStats (from headwidget.capture or KVStats.load), got {type(stats).__name__}"
        )
    if layout != stats.meta.layout:
        raise StatsMismatchError("these statistics were captured from a model of another shape")
    check_stats_source(model, stats, allow_other_weights=allow_other_weights)
    if layers is not None:
        layers = [
            layer_index("layers", x, layout.num_layers)
            for x in whole_numbers("layers", layers, maximum=2**63)
        ]
    by_layer = _groups_by_layer(
        groups, layers if layers is not None else stats.meta.layers, layout.num_layers
    )
    for layer, layer_groups in by_layer.items():
        _check_groups(layer_groups, layout.num_kv_heads, layer)
    planes, fixed = layout.rope.planes(), adapter.shared_key_dims()
    value_split = HeadSplit.make(layout.value_head_dim, [])
    out = copy.deepcopy(model)
    target = adapter_for(out)
    batches: dict[tuple[tuple[int, ...], ...], list[int]] = {}  # layers with the same groups, fitted together
    for layer, layer_groups in sorted(by_layer.items()):
        batches.setdefault(tuple(tuple(g) for g in layer_groups), []).append(layer)
    for batch_groups, batch_layers in batches.items():
        layer_groups = [list(g) for g in batch_groups]
        keys = [stats.moments(layer, "key").token_gram() for layer in batch_layers]
        values = [stats.moments(layer, "value").token_gram() for layer in batch_layers]
        rks = _fit_with_fixed_dims(keys, layout.head_dim, planes, fixed, layer_groups)
        rvs = fit_group_rotations_many(values, value_split, layer_groups)
        for layer, rk, rv in zip(batch_layers, rks, rvs, strict=True):
            target.fold_rotations(layer, rk.cpu(), rv.cpu())
    return out
