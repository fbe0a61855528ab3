"""Where each head's weights sit inside a layer's Linear/Conv1D modules; reading and rotating them.

An adapter describes a layer once, as index tensors over module features (:class:`HeadSlices`): the
output features of the Q/K/V projections that belong to each head, and the input features of the
output projection that read each head's value. A fused QKV projection's layout is a
:class:`FusedLayout`, which the capture split uses on activations and :class:`HeadSlices` use on
weights, so the two cannot disagree. :func:`read_projections` turns the slices into
:class:`~headwidget.core.weights.HeadWeights`; :func:`fold_into` writes per-KV-head rotations back.

Example:
    >>> from torch import nn
    >>> fused = FusedLayout.per_head(heads=2, head_dim=3)
    >>> fused.k.tolist()  # per head [q | k | v]: head 0 owns features 0..8, its key 3..5
    [[3, 4, 5], [12, 13, 14]]
    >>> fused.take(torch.arange(18.0)[None], "v").tolist()
    [[6.0, 7.0, 8.0, 15.0, 16.0, 17.0]]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn
from transformers.pytorch_utils import Conv1D

from headwidget.core.weights import HeadWeights
from headwidget.errors import StatsMismatchError, UnsupportedModelError

__all__ = [
    "FusedLayout",
    "HeadProjections",
    "HeadSlices",
    "fold_into",
    "head_index",
    "plain_weight_problem",
    "read_projections",
    "weight_rows",
    "write_projections",
]

F64 = torch.float64


def head_index(heads: int, width: int, start: int = 0, stride: int | None = None) -> torch.Tensor:
    """(heads, width) feature indices: head n owns ``start + n·stride + [0, width)``.

    >>> head_index(2, 3).tolist(), head_index(2, 2, start=1, stride=5).tolist()
    ([[0, 1, 2], [3, 4, 5]], [[1, 2], [6, 7]])
    """
    step = width if stride is None else stride
    return start + torch.arange(heads)[:, None] * step + torch.arange(width)[None, :]


@dataclass
class FusedLayout:
    """Which output features of a fused QKV projection hold each head's q, k and v.

    ``q`` is (H, d_h), ``k`` and ``v`` are (G, d_h), each row one head's features in order.
    """

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    _on_device: dict[tuple[str, torch.device], torch.Tensor] = field(default_factory=dict, repr=False)

    @classmethod
    def blocks(cls, heads: int, kv_heads: int, head_dim: int) -> FusedLayout:
        """``[Q | K | V]``: all query heads, then all key heads, then all value heads (GPT-2 style).

        >>> FusedLayout.blocks(2, 1, 2).v.tolist()
        [[6, 7]]
        """
        q = head_index(heads, head_dim)
        k = head_index(kv_heads, head_dim, start=heads * head_dim)
        return cls(q, k, head_index(kv_heads, head_dim, start=(heads + kv_heads) * head_dim))

    @classmethod
    def per_head(cls, heads: int, head_dim: int) -> FusedLayout:
        """Per head ``[q | k | v]`` (GPT-NeoX style); always one KV head per query head."""
        parts = torch.arange(3 * heads * head_dim).reshape(heads, 3, head_dim)
        return cls(parts[:, 0], parts[:, 1], parts[:, 2])

    @classmethod
    def grouped(cls, heads: int, kv_heads: int, head_dim: int) -> FusedLayout:
        """Per KV group ``[q … q | k | v]`` (Falcon's new decoder; with one group it is ``[Q | k | v]``).

        >>> FusedLayout.grouped(4, 2, 1).k.tolist()
        [[2], [6]]
        """
        per = heads // kv_heads
        parts = torch.arange((heads + 2 * kv_heads) * head_dim).reshape(kv_heads, per + 2, head_dim)
        return cls(parts[:, :per].reshape(heads, head_dim), parts[:, -2], parts[:, -1])

    @property
    def width(self) -> int:
        """Output features of the fused projection."""
        return int(self.q.numel() + self.k.numel() + self.v.numel())

    def take(self, fused: torch.Tensor, part: str) -> torch.Tensor:
        """The features of ``part`` (``"q"``, ``"k"`` or ``"v"``) of a fused output ``(..., width)``."""
        if fused.shape[-1] != self.width:
            raise RuntimeError(
                f"the fused projection has {fused.shape[-1]} output features; its layout has {self.width}"
            )
        key = (part, fused.device)
        index = self._on_device.get(key)
        if index is None:  # one copy per device, so a capture does not move indices every batch
            index = self._on_device[key] = getattr(self, part).reshape(-1).to(fused.device)
        return fused.index_select(-1, index)


@dataclass(frozen=True)
class HeadSlices:
    """Features ``index[n]`` of ``module`` belong to head n.

    For the Q/K/V projections they are output features (rows of the ``(out, in)`` weight); for the
    output projection they are input features (its columns). ``index`` is (heads, width).
    """

    module: nn.Module
    index: torch.Tensor


@dataclass(frozen=True)
class HeadProjections:
    """Where one layer keeps each head's query, key, value and output weights."""

    q: HeadSlices
    k: HeadSlices
    v: HeadSlices
    o: HeadSlices

    def modules(self) -> tuple[nn.Module, ...]:
        return self.q.module, self.k.module, self.v.module, self.o.module


def plain_weight_problem(module: nn.Module) -> str | None:
    """Why ``module`` is not a plain Linear/Conv1D with a floating-point weight (None when it is).

    >>> plain_weight_problem(nn.Linear(2, 2)) is None
    True
    >>> packed = nn.Linear(2, 2)
    >>> packed.weight = nn.Parameter(torch.zeros(2, 2, dtype=torch.int8), requires_grad=False)
    >>> plain_weight_problem(packed).split(" is not")[0]
    'Linear (weight dtype torch.int8)'
    """
    weight = getattr(module, "weight", None)
    plain = isinstance(module, nn.Linear | Conv1D)
    if plain and isinstance(weight, torch.Tensor) and weight.ndim == 2 and weight.is_floating_point():
        return None
    dtype = getattr(weight, "dtype", None)
    return (
        f"{type(module).__name__} (weight dtype {dtype}) is not a plain nn.Linear/Conv1D with a "
        "floating-point weight (a quantised model?); load the model in float32/float16/bfloat16"
    )


def weight_rows(module: nn.Module) -> torch.Tensor:
    """The ``(out_features, in_features)`` weight of a Linear or Conv1D, as a view of the parameter.

    >>> layer = Conv1D(6, 4)  # GPT-2's Conv1D stores its weight (in, out)
    >>> tuple(weight_rows(layer).shape), weight_rows(layer).data_ptr() == layer.weight.data_ptr()
    ((6, 4), True)
    """
    problem = plain_weight_problem(module)
    if problem is not None:
        raise UnsupportedModelError(problem)
    weight = module.weight
    assert isinstance(weight, torch.Tensor)
    return weight.T if isinstance(module, Conv1D) else weight


def _cpu64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", F64)


def _bias(module: nn.Module) -> torch.Tensor | None:
    bias = getattr(module, "bias", None)
    return None if bias is None else _cpu64(bias).clone()


def read_projections(p: HeadProjections, *, mechanism: str) -> HeadWeights:
    """The float64 CPU :class:`HeadWeights` that ``p`` describes (copies, never views of the model)."""

    def rows(s: HeadSlices) -> tuple[torch.Tensor, torch.Tensor | None]:
        bias = _bias(s.module)
        return _cpu64(weight_rows(s.module))[s.index], None if bias is None else bias[s.index]

    (q, qb), (k, kb), (v, vb) = rows(p.q), rows(p.k), rows(p.v)
    o = _cpu64(weight_rows(p.o.module))[:, p.o.index].permute(1, 0, 2).contiguous()
    return HeadWeights(
        q=q, k=k, v=v, o=o, q_bias=qb, k_bias=kb, v_bias=vb, o_bias=_bias(p.o.module), mechanism=mechanism
    )


def _check_rotations(rot: torch.Tensor, s: HeadSlices, what: str) -> None:
    n, width = s.index.shape
    if tuple(rot.shape) != (n, width, width):
        raise StatsMismatchError(
            f"{what} rotations have shape {tuple(rot.shape)}; this layer needs ({n}, {width}, {width}) "
            "(one per KV head): fit them on statistics of this model"
        )


def _rotate_rows(s: HeadSlices, rot: torch.Tensor) -> None:
    """Head n's rows ``W[idx_n] ← R_n^T W[idx_n]`` and bias ``b[idx_n] ← b[idx_n] R_n`` (so ``y → y R``)."""
    weight = weight_rows(s.module)
    index = s.index.to(weight.device)
    r = rot.to(weight.device, F64)
    weight[index] = (r.transpose(-2, -1) @ weight[index].to(F64)).to(weight.dtype)
    bias = getattr(s.module, "bias", None)
    if bias is not None:
        bias[index] = (bias[index].to(F64)[:, None, :] @ r)[:, 0].to(bias.dtype)


def _rotate_columns(s: HeadSlices, rot: torch.Tensor) -> None:
    """Head n's input columns ``W[:, idx_n] ← W[:, idx_n] R_n`` (undoes ``v → v R`` in the output)."""
    weight = weight_rows(s.module)
    index = s.index.to(weight.device)
    block = weight[:, index].to(F64).permute(1, 0, 2)  # (heads, out, width)
    weight[:, index] = (block @ rot.to(weight.device, F64)).permute(1, 0, 2).to(weight.dtype)


@torch.no_grad()
def fold_into(p: HeadProjections, key_rotations: torch.Tensor, value_rotations: torch.Tensor) -> None:
    """Fold per-KV-head rotations into the weights ``p`` describes, in place, keeping the function.

    Keys ``k_g → k_g R_g``: the rows of KV head g and of every query head that reads it get ``R_g^T``
    on the left, so ``q·k`` is unchanged. Values ``v_g → v_g S_g``: the value rows get ``S_g^T`` and
    the output projection's columns of every query head reading g get ``S_g`` on the right. Query
    head h reads KV head ``h // (H / G)``.

    Example:
        >>> lin = {n: nn.Linear(4, 4, bias=False).double() for n in "qkvo"}
        >>> p = HeadProjections(*(HeadSlices(lin[n], head_index(2, 2)) for n in "qkvo"))
        >>> x = torch.randn(3, 4, dtype=torch.float64)
        >>> scores = (lin["q"](x).reshape(3, 2, 2) * lin["k"](x).reshape(3, 2, 2)).sum(-1)
        >>> swap = torch.tensor([[0.0, 1.0], [1.0, 0.0]], dtype=torch.float64).repeat(2, 1, 1)
        >>> fold_into(p, swap, swap)
        >>> after = (lin["q"](x).reshape(3, 2, 2) * lin["k"](x).reshape(3, 2, 2)).sum(-1)
        >>> bool(torch.allclose(after, scores))
        True
    """
    _check_rotations(key_rotations, p.k, "key")
    _check_rotations(value_rotations, p.v, "value")
    heads, kv_heads = int(p.q.index.shape[0]), int(p.k.index.shape[0])
    if p.q.index.shape[1] != p.k.index.shape[1] or p.o.index.shape[1] != p.v.index.shape[1]:
        raise RuntimeError("the adapter's query/key (or output/value) head widths disagree")
    kv_of = torch.arange(heads) // (heads // kv_heads)
    _rotate_rows(p.k, key_rotations)
    _rotate_rows(p.q, key_rotations[kv_of])
    _rotate_rows(p.v, value_rotations)
    _rotate_columns(p.o, value_rotations[kv_of])


def _write_bias(module: nn.Module, index: torch.Tensor, value: torch.Tensor | None, what: str) -> None:
    bias = getattr(module, "bias", None)
    if bias is None:
        if value is not None and bool(value.ne(0).any()):
            raise RuntimeError(f"the {what} projection has no bias to hold the converted {what} bias")
        return
    if value is None:
        value = torch.zeros(index.shape, dtype=F64)
    bias[index.to(bias.device)] = value.to(bias.device, bias.dtype)


@torch.no_grad()
def write_projections(p: HeadProjections, w: HeadWeights) -> None:
    """Write the per-head weights ``w`` (float64) into the modules ``p`` describes, in place.

    The inverse of :func:`read_projections`: every head's Q/K/V rows (and biases) and O columns (and
    the O bias) are overwritten, rounded to each module's dtype. ``w`` must have the shapes ``p`` has.

    Example:
        >>> lin = {n: nn.Linear(4, 4).double() for n in "qkvo"}
        >>> p = HeadProjections(*(HeadSlices(lin[n], head_index(2, 2)) for n in "qkvo"))
        >>> w = read_projections(p, mechanism="mha")
        >>> write_projections(p, type(w)(q=w.k, k=w.q, v=w.v, o=w.o, q_bias=w.k_bias, k_bias=w.q_bias,
        ...                               v_bias=w.v_bias, o_bias=w.o_bias))
        >>> bool(torch.equal(lin["q"].weight, w.k.reshape(4, 4)))
        True
    """
    for s, weight, bias, what in (
        (p.q, w.q, w.q_bias, "query"),
        (p.k, w.k, w.k_bias, "key"),
        (p.v, w.v, w.v_bias, "value"),
    ):
        if tuple(weight.shape[:2]) != tuple(s.index.shape):
            raise StatsMismatchError(
                f"converted {what} weights have {tuple(weight.shape[:2])} (heads, dims); this layer "
                f"holds {tuple(s.index.shape)}"
            )
        target = weight_rows(s.module)
        target[s.index.to(target.device)] = weight.to(target.device, target.dtype)
        _write_bias(s.module, s.index, bias, what)
    target = weight_rows(p.o.module)
    index = p.o.index.to(target.device)
    target[:, index] = w.o.permute(1, 0, 2).to(target.device, target.dtype)
    bias = getattr(p.o.module, "bias", None)
    if bias is not None and w.o_bias is not None:
        bias.copy_(w.o_bias.to(bias.device, bias.dtype))
