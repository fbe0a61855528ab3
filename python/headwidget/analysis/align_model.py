"""Rotate the heads of a Llama-family model so that heads of one group become similar, exactly.

For each group of KV heads of a layer, rotations ``R_i`` are fitted jointly (generalised Procrustes on
the Gram of per-head-normalised vectors: block-coordinate ascent of ``Σ_{i≠j} tr(R_i^T Â_ij R_j)``
from ``R = I``, so the within-group score sum never decreases). Keys get RoPE-compatible rotations
(a 2×2 rotation per rotary plane, Procrustes on non-rotary dims), which commute with RoPE; values get
orthogonal ones. They are folded into the weights so the model computes the same function:

- keys ``k → k R``: ``W_K[g] ← R^T W_K[g]``; queries of the heads using KV head g likewise, so
  ``q·k`` is unchanged (``q R (k R)^T = q k^T``), and RoPE commutes with ``R``;
- values ``v → v R``: ``W_V[g] ← R^T W_V[g]``; the output projection's input columns of every query
  head using g: ``W_O[:, h] ← W_O[:, h] R``.

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
from collections.abc import Mapping, Sequence

import torch
from torch import nn

from headwidget.adapters import adapter_for
from headwidget.analysis.procrustes import HeadSplit, fit_rotations
from headwidget.errors import GroupCountError, StatsMismatchError, UnsupportedAlignmentError
from headwidget.moments.head_metrics import head_blocks
from headwidget.stats import KVStats

__all__ = ["align_model", "fit_group_rotations"]

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
    d = split.head_dim
    blocks = head_blocks(gram.to(F64), d)
    heads = blocks.shape[0]
    rot = torch.eye(d, dtype=F64, device=gram.device).repeat(heads, 1, 1)
    for group in groups:
        members = list(group)
        if len(members) < 2:
            continue
        idx = torch.tensor(members, device=gram.device)
        sub = blocks[idx][:, idx]

        def objective(sub: torch.Tensor = sub, idx: torch.Tensor = idx) -> float:
            r = rot[idx]
            diag = sub[torch.arange(len(idx)), torch.arange(len(idx))]
            total = torch.einsum("iab,ijac,jcb->", r, sub, r) - torch.einsum("iaa->", diag)
            return float(total)

        last = objective()
        for _ in range(sweeps):
            for a, head in enumerate(members):
                others = [b for b in range(len(members)) if b != a]
                target = torch.einsum("jab,jbc->ac", sub[a, others], rot[idx[others]])
                rot[head] = fit_rotations(target[None], split)[0]
            value = objective()
            if value - last <= 1e-12 * max(1.0, abs(value)):
                break
            last = value
    return rot


def _groups_by_layer(groups: Mapping[int, Groups] | Groups, layers: Sequence[int]) -> dict[int, Groups]:
    if isinstance(groups, Mapping):
        return {int(k): v for k, v in groups.items()}
    return dict.fromkeys(layers, groups)


def _check_groups(groups: Groups, kv_heads: int, layer: int) -> None:
    flat = [int(h) for g in groups for h in g]
    if len(flat) != len(set(flat)) or any(not 0 <= h < kv_heads for h in flat):
        raise GroupCountError(
            f"layer {layer}: groups {groups} must be disjoint lists of KV head indices in 0..{kv_heads - 1}"
        )


def _linear(attn: nn.Module, name: str) -> nn.Linear:
    module = getattr(attn, name, None)
    if not isinstance(module, nn.Linear):
        raise UnsupportedAlignmentError(
            f"{name} is {type(module).__name__}, not a plain nn.Linear (quantised?); load the model "
            "in float32/float16/bfloat16 to rotate it"
        )
    return module


@torch.no_grad()
def _rotate_layer(attn: nn.Module, rk: torch.Tensor, rv: torch.Tensor, heads: int) -> None:
    kv, d = rk.shape[0], rk.shape[-1]
    dv = rv.shape[-1]
    per = heads // kv
    kv_of = torch.arange(heads) // per

    def rotate_rows(linear: nn.Linear, rot: torch.Tensor, width: int) -> None:
        rot = rot.to(linear.weight.device)
        w = linear.weight.to(F64).reshape(rot.shape[0], width, -1)
        linear.weight.copy_((rot.transpose(-2, -1) @ w).reshape(linear.weight.shape))
        if linear.bias is not None:
            b = linear.bias.to(F64).reshape(rot.shape[0], 1, width)
            linear.bias.copy_((b @ rot).reshape(linear.bias.shape))

    rotate_rows(_linear(attn, "k_proj"), rk, d)
    rotate_rows(_linear(attn, "q_proj"), rk[kv_of], d)
    rotate_rows(_linear(attn, "v_proj"), rv, dv)
    out = _linear(attn, "o_proj").weight
    o = out.to(F64).reshape(-1, heads, dv).transpose(0, 1)  # (H, d_model, d_v)
    out.copy_((o @ rv[kv_of].to(out.device)).transpose(0, 1).reshape(out.shape))


def align_model(
    model: nn.Module,
    stats: KVStats,
    groups: Mapping[int, Groups] | Groups,
    *,
    layers: Sequence[int] | None = None,
) -> nn.Module:
    """A rotated copy of ``model`` whose KV heads of each group are aligned; the input is not modified.

    Args:
        model: a Llama-family model (``adapter_for(model).family == "llama"``) without per-head
            query/key norms.
        stats: its :class:`~headwidget.stats.KVStats` with kinds ``"key"`` and ``"value"``.
        groups: KV-head groups, either ``{layer: [[heads], ...]}`` or one grouping for every layer.
        layers: the layers to rotate when ``groups`` is not a mapping (default: every captured layer).

    Example:
        >>> import torch, headwidget
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...     num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)).eval()
        >>> stats = headwidget.capture(model, torch.randint(0, 64, (2, 24)), progress=False)
        >>> align_model(model, stats, {0: [[0, 1]]}) is not model
        True

    Raises:
        UnsupportedAlignmentError: another family, or a model with ``q_norm``/``k_norm``.
        StatsMismatchError: ``stats`` were captured from a model of another shape.
    """
    adapter = adapter_for(model)
    if adapter.family != "llama":
        raise UnsupportedAlignmentError(
            f"align_model rotates Llama-family models (q_proj/k_proj/v_proj/o_proj); "
            f"{type(model).__name__} is family {adapter.family!r}. Use align() to inspect its heads"
        )
    layout = adapter.layout()
    if layout != stats.meta.layout:
        raise StatsMismatchError("these statistics were captured from a model of another shape")
    attns = adapter.attention_modules()
    if any(getattr(a, "k_norm", None) is not None or getattr(a, "q_norm", None) is not None for a in attns):
        raise UnsupportedAlignmentError(
            "this model normalises each query/key head (q_norm/k_norm) with a learned per-dim scale, "
            "which does not commute with rotations; its heads cannot be rotated exactly"
        )
    by_layer = _groups_by_layer(groups, layers if layers is not None else stats.meta.layers)
    key_split = HeadSplit.make(layout.head_dim, layout.rope.planes())
    value_split = HeadSplit.make(layout.value_head_dim, [])
    out = copy.deepcopy(model)
    out_attns = adapter_for(out).attention_modules()
    for layer, layer_groups in sorted(by_layer.items()):
        _check_groups(layer_groups, layout.num_kv_heads, layer)
        rk = fit_group_rotations(stats.moments(layer, "key").token_gram(), key_split, layer_groups)
        rv = fit_group_rotations(stats.moments(layer, "value").token_gram(), value_split, layer_groups)
        _rotate_layer(out_attns[layer], rk.cpu(), rv.cpu(), layout.num_heads)
    return out
