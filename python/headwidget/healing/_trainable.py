"""What :func:`~headwidget.healing.heal` trains: the parameters of a converted model's own structure.

A converted layer is trained through the tensors that define its mechanism, never through its dense
K/V weights, so the healed model is still that mechanism:

- merged heads (``gqa:G``, ``mqa``, ``+align``) train one K and one V per merged head: a family that
  keeps its KV-head count holds each merged head as copies, and the copies stay equal;
- ``lrkv:r`` trains the shared part and each KV head's rank-r factors (``K_g = S + U_g D_g``);
- ``mla:d_c`` trains the down projection and the up projections (``K_g = U^K_g D``, ``V_g = U^V_g D``),
  so the stacked K/V map keeps rank ≤ d_c; ``mla:d_c+rope:r`` also the rotary key rows it keeps;
- ``rope:r`` (no weight changed) trains the layer's K/V rows as they are;
- ``share:g`` trains the K/V of each group's first layer, which the group's other layers read (theirs
  are never used, so they are not trained), through the first layer's own mechanism.

Each of these :class:`Source` tensors is an ``nn.Parameter`` (or, with ``lora:r``, a frozen base plus a
rank-r update ``B A``). The projection modules read them through ``torch.nn.utils.parametrize``: their
weight becomes the original with the layer's Q/K/V rows written from the sources, so a forward, a
backward and ``DistributedDataParallel`` see ordinary parameters. :meth:`TrainableParts.write_back`
computes the final weights from the sources in float64 (the product of the factors, never a dense
reconstruction that was trained) and removes the parametrizations: the model is again a plain
transformers model of its class.

``trainable``:

- ``"kv"``: the sources of the K/V projections (with their biases) of the converted layers;
- ``"attention"``: those, plus the query rows and the output projection (and every other parameter of
  those attention modules);
- ``"all"``: every parameter of the model, the converted layers' K/V through their sources;
- ``"lora:r"``: a rank-r update of every matrix of ``"attention"`` (sources and the query/output
  weights; biases frozen), ``B`` zero at the start so the model starts as it is.

Example:
    >>> import torch, headwidget
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> variant = headwidget.apply(model, "mla:6", layers=[1])
    >>> parts = TrainableParts.install(variant, "kv", seed=0)
    >>> sorted(parts.sources[1])
    ['down', 'k_up', 'v_up']
    >>> parts.write_back()
    >>> variant.model.layers[1].self_attn.k_proj.weight.requires_grad  # as apply gave it
    True
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

import torch
from torch import nn
from torch.nn.utils import parametrize
from transformers.pytorch_utils import Conv1D

from headwidget.adapters import Adapter, HeadProjections, adapter_for
from headwidget.analysis.variant_fits import LayerFit
from headwidget.core.weights import HeadWeights
from headwidget.errors import ArgumentError, HealingInputError
from headwidget.evaluation import AppliedVariant

__all__ = ["TRAINABLE_FORMS", "Source", "TrainableParts", "parse_trainable"]

F64 = torch.float64
TRAINABLE_FORMS = "'kv', 'attention', 'all' or 'lora:r' (r a whole number ≥ 1 in ASCII digits, e.g. 'lora:8')"


def parse_trainable(trainable: object) -> tuple[str, int | None]:
    """``"kv"`` → ``("kv", None)``; ``"lora:8"`` → ``("lora", 8)``.

    >>> parse_trainable("lora:8"), parse_trainable(" ALL ")
    (('lora', 8), ('all', None))
    >>> parse_trainable("lora:0")
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: trainable='lora:0' is not one of 'kv', 'attention', 'all' or 'lora:r' ...
    >>> parse_trainable("lora:８")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: trainable='lora:８' is not one of ...
    """
    text = trainable.strip().lower() if isinstance(trainable, str) else None
    if text in ("kv", "attention", "all"):
        return text, None
    m = re.fullmatch(r"lora:([0-9]{1,6})", text or "")  # ASCII digits: \d also reads "８"
    if m and int(m.group(1)) >= 1:
        return "lora", int(m.group(1))
    raise ArgumentError(f"trainable={trainable!r} is not one of {TRAINABLE_FORMS}")


class Source(nn.Module):
    """One trained tensor: an ``nn.Parameter`` as it is, or (``rank``) a frozen base plus ``B A``.

    A 3-D tensor (heads, m, n) gets one update of the (heads·m, n) matrix. ``B`` starts at zero and ``A``
    from ``generator`` (scaled by 1/√n), so a source starts exactly at ``value``.

    >>> s = Source(torch.ones(2, 3), rank=1, generator=torch.Generator().manual_seed(0))
    >>> bool(torch.equal(s(), torch.ones(2, 3))), [n for n, _ in s.named_parameters()]
    (True, ['a', 'b'])
    """

    def __init__(
        self, value: torch.Tensor, rank: int | None = None, generator: torch.Generator | None = None
    ):
        super().__init__()
        self.rank = rank
        if rank is None or value.ndim < 2:
            self.value = nn.Parameter(value.clone(), requires_grad=rank is None)
            return
        self.register_buffer("base", value.clone())
        n = int(value.shape[-1])
        m = value.numel() // n
        a = torch.randn(rank, n, generator=generator, dtype=F64) / math.sqrt(n)
        self.a = nn.Parameter(a.to(value.dtype))
        self.b = nn.Parameter(torch.zeros(m, rank, dtype=value.dtype))

    def forward(self) -> torch.Tensor:
        if self.rank is None or not hasattr(self, "base"):
            return self.value
        base = self.base
        assert isinstance(base, torch.Tensor)
        return base + (self.b @ self.a).reshape(base.shape)


@dataclass
class _LayerMechanism:
    """How one converted layer's Q/K/V slots come from its sources."""

    kind: str  # "heads", "lrkv", "mla", "mla_rope"
    slot_of: torch.Tensor  # (S,) the source head each KV slot reads (copies of merged heads)
    keep: torch.Tensor | None = None  # (S, d_h) rotary rows of mla_rope

    def slots(self, sources: nn.ModuleDict, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        """Per-slot ``k`` (S, d_h, d), ``v`` (S, d_v, d) and the biases and query rows present (computed
        in ``dtype``, default the sources' own)."""
        get = {name: source() if dtype is None else source().to(dtype) for name, source in sources.items()}
        if self.kind == "heads":
            k, v = get["k"], get["v"]
        elif self.kind == "lrkv":
            k = get["k_shared"] + get["k_up"] @ get["k_down"]
            v = get["v_shared"] + get["v_up"] @ get["v_down"]
        else:
            k, v = get["k_up"] @ get["down"], get["v_up"] @ get["down"]
            if self.kind == "mla_rope":
                assert self.keep is not None
                k = torch.where(self.keep[..., None].to(k.device), get["k_rope"], k)
        out = {"k": k[self.slot_of.to(k.device)], "v": v[self.slot_of.to(v.device)]}
        for name in ("k_bias", "v_bias"):
            if name in get:
                out[name] = get[name][self.slot_of.to(get[name].device)]
        if "q" in get:
            out["q"] = get["q"]
        if "q_bias" in get:
            out["q_bias"] = get["q_bias"]
        return out


class _WrittenRows(nn.Module):
    """A parametrization of one projection's weight (or bias): the original with the rows of ``parts``
    (``"q"``, ``"k"``, ``"v"``; ``"k_bias"``...) written from the layer's sources."""

    def __init__(self, layer: _LayerSources, parts: list[tuple[str, torch.Tensor]], transposed: bool):
        super().__init__()
        self.layer = layer
        self.parts = parts
        self.transposed = transposed

    def forward(self, original: torch.Tensor) -> torch.Tensor:
        return self.write(original, self.layer.slots())

    def write(self, original: torch.Tensor, slots: dict[str, torch.Tensor]) -> torch.Tensor:
        """``original`` with the rows of ``parts`` taken from ``slots``."""
        rows = original.T if self.transposed else original
        for part, index in self.parts:
            value = slots[part].to(rows.dtype)
            flat = index.reshape(-1).to(rows.device)
            rows = rows.index_put((flat,), value.reshape(flat.numel(), *rows.shape[1:]))
        return rows.T if self.transposed else rows


class _LowRankDelta(nn.Module):
    """A parametrization ``W + B A`` of a whole weight (rows frame), ``B`` zero at the start."""

    def __init__(self, rows: torch.Tensor, rank: int, generator: torch.Generator, transposed: bool):
        super().__init__()
        out, n = rows.shape
        self.transposed = transposed
        a = torch.randn(rank, n, generator=generator, dtype=F64) / math.sqrt(n)
        self.a = nn.Parameter(a.to(rows.device, rows.dtype))
        self.b = nn.Parameter(torch.zeros(out, rank, dtype=rows.dtype, device=rows.device))

    def forward(self, original: torch.Tensor) -> torch.Tensor:
        delta = self.b @ self.a
        return original + (delta.T if self.transposed else delta)


def _chains(module: nn.Module) -> nn.ModuleDict:
    """The parametrizations ``torch.nn.utils.parametrize`` registered on ``module``."""
    chains = module.parametrizations
    assert isinstance(chains, nn.ModuleDict)
    return chains


class _LayerSources(nn.Module):
    """The sources of one converted layer and how its slots follow from them."""

    def __init__(self, mechanism: _LayerMechanism, sources: dict[str, Source]):
        super().__init__()
        self.mechanism = mechanism
        self.sources = nn.ModuleDict(sources)

    def slots(self, dtype: torch.dtype | None = None) -> dict[str, torch.Tensor]:
        return self.mechanism.slots(self.sources, dtype)


def _unique_heads(w: HeadWeights) -> tuple[list[int], torch.Tensor]:
    """The KV slots of ``w`` that hold distinct heads, and (S,) which of them each slot copies (the
    copies of one merged head hold the same K, V and biases, bit for bit)."""
    unique: list[int] = []
    slot_of: list[int] = []
    for s in range(w.num_kv_heads):
        same = [
            i
            for i, t in enumerate(unique)
            if torch.equal(w.k[s], w.k[t])
            and torch.equal(w.v[s], w.v[t])
            and (w.k_bias is None or torch.equal(w.k_bias[s], w.k_bias[t]))
            and (w.v_bias is None or torch.equal(w.v_bias[s], w.v_bias[t]))
        ]
        if not same:
            unique.append(s)
        slot_of.append(same[0] if same else len(unique) - 1)
    return unique, torch.tensor(slot_of)


def _per_slot(t: torch.Tensor, heads: int, slots: int) -> torch.Tensor:
    """A factor given per query head (first dim ``heads``) as one per KV slot."""
    if t.shape[0] == slots:
        return t
    if t.shape[0] != heads:
        raise RuntimeError(f"a factor of shape {tuple(t.shape)} is per neither query head nor KV head")
    return t[torch.arange(slots) * (heads // slots)]


def _mechanism_sources(
    w: HeadWeights,
    fit: LayerFit,
    layer: int,
    dtype: torch.dtype,
    mode: str,
    rank: int | None,
    generator: torch.Generator,
) -> _LayerSources:
    """The sources of a converted layer whose weights are ``w`` (float64, as the variant holds them)."""
    heads, slots = w.num_heads, w.num_kv_heads
    factors = fit.factors
    lora = rank if mode == "lora" else None

    def source(t: torch.Tensor, matrix: bool = True) -> Source:
        return Source(t.to(dtype), lora if matrix else None, generator)

    if "k_shared" in factors:
        kind = "lrkv"
        made = {f"{p}_shared": factors[f"{p}_shared"] for p in "kv"}
        made.update(
            {f"{p}_{n}": _per_slot(factors[f"{p}_{n}"], heads, slots) for p in "kv" for n in ("up", "down")}
        )
        slot_of = torch.arange(slots)
    elif "down" in factors:
        kind = "mla_rope" if "rope_keep" in factors else "mla"
        made = {
            "down": factors["down"],
            "k_up": _per_slot(factors["k_up"], heads, slots),
            "v_up": _per_slot(factors["v_up"], heads, slots),
        }
        if kind == "mla_rope":
            made["k_rope"] = w.k
        slot_of = torch.arange(slots)
    else:
        kind = "heads"
        unique, slot_of = _unique_heads(w)
        made = {"k": w.k[unique], "v": w.v[unique]}
        for name in ("k_bias", "v_bias"):
            bias = getattr(w, name)
            if bias is not None:
                made[name] = bias[unique]
    keep = factors.get("rope_keep")
    mechanism = _LayerMechanism(kind, slot_of, None if keep is None else keep.bool())
    if kind != "heads":
        _check_factors(mechanism, made, w, layer)
        for name in ("k_bias", "v_bias"):
            bias = getattr(w, name)
            if bias is not None:
                made[name] = bias
    sources = {name: source(t, matrix=not name.endswith("bias")) for name, t in made.items()}
    if mode in ("attention", "all", "lora"):
        sources["q"] = source(w.q)
        if w.q_bias is not None:
            sources["q_bias"] = source(w.q_bias, matrix=False)
    if mode == "lora":  # biases stay as they are
        for name, s in sources.items():
            if name.endswith("bias"):
                s.value.requires_grad_(False)
    return _LayerSources(mechanism, sources)


@torch.no_grad()
def _check_factors(
    mechanism: _LayerMechanism, made: dict[str, torch.Tensor], w: HeadWeights, layer: int
) -> None:
    """The factors reproduce the weights the variant holds (else it was changed after ``apply``)."""
    plain = nn.ModuleDict({n: Source(t.to(F64)) for n, t in made.items()})
    slots = mechanism.slots(plain)
    scale = max(float(w.k.abs().max()), float(w.v.abs().max()), 1e-30)
    error = max(float((slots["k"] - w.k).abs().max()), float((slots["v"] - w.v).abs().max())) / scale
    if error > 1e-3:
        raise HealingInputError(
            f"layer {layer} of the variant no longer holds the weights its factors give (relative "
            f"difference {error:.2g}): it was changed after headwidget.apply built it. Heal a variant "
            "straight from headwidget.apply(model, spec, stats)"
        )


@dataclass
class TrainableParts:
    """The trained parameters of a converted model and how to write them back (see the module doc)."""

    model: nn.Module
    mode: str
    rank: int | None
    sources: dict[int, nn.ModuleDict] = field(default_factory=dict)
    _parametrized: list[tuple[nn.Module, str]] = field(default_factory=list)
    _layers: dict[int, _LayerSources] = field(default_factory=dict)
    _requires_grad: dict[str, bool] = field(default_factory=dict)

    @classmethod
    def install(cls, model: nn.Module, trainable: str, *, seed: int = 0) -> TrainableParts:
        """Parametrize ``model`` (a variant built by :func:`headwidget.apply`, changed in place) for
        ``trainable``; every other parameter gets ``requires_grad=False`` (until :meth:`write_back`)."""
        mode, rank = parse_trainable(trainable)
        info = getattr(model, "headwidget_variant", None)
        fits: dict[int, LayerFit] = dict(getattr(info, "fits", {}))
        adapter = adapter_for(model)
        dtype = next(model.parameters()).dtype
        generator = torch.Generator().manual_seed(int(seed))
        parts = cls(model, mode, rank)
        parts._requires_grad = {name: p.requires_grad for name, p in model.named_parameters()}
        for p in model.parameters():
            p.requires_grad_(mode == "all")
        # share:g readers use their first layer's K/V; a layer alone in its group is the model's
        untrained = {*getattr(info, "readers", {}), *getattr(info, "left_alone", [])}
        for layer in sorted(fits):
            if layer not in untrained:
                parts._install_layer(adapter, layer, fits[layer], dtype, generator)
        return parts

    def _install_layer(
        self, adapter: Adapter, layer: int, fit: LayerFit, dtype: torch.dtype, generator: torch.Generator
    ) -> None:
        attention = adapter.attention_at(layer)
        projections = adapter.head_projections(attention)
        w = adapter.read_head_weights(attention)
        owner = _mechanism_sources(w, fit, layer, dtype, self.mode, self.rank, generator)
        self._layers[layer] = owner
        self.sources[layer] = owner.sources
        device = next(attention.parameters()).device
        owner.to(device)
        covered = self._write_rows(owner, projections)
        o_module = projections.o.module
        if self.mode in ("attention", "all"):
            for p in attention.parameters():
                p.requires_grad_(True)
            for module in covered:  # their rows come from the sources
                for chain in _chains(module).values():
                    chain.original.requires_grad_(False)
        elif self.mode == "lora":
            weight = o_module.weight
            assert isinstance(weight, torch.Tensor)
            rows = weight.T if isinstance(o_module, Conv1D) else weight
            delta = _LowRankDelta(rows.detach(), int(self.rank or 1), generator, isinstance(o_module, Conv1D))
            parametrize.register_parametrization(o_module, "weight", delta)
            self._parametrized.append((o_module, "weight"))

    def _write_rows(self, owner: _LayerSources, p: HeadProjections) -> list[nn.Module]:
        """Parametrize the Q/K/V projection modules of one layer; the modules it covered."""
        present = owner.slots()
        by_module: dict[int, tuple[nn.Module, list[tuple[str, torch.Tensor]]]] = {}
        for part, s in (("q", p.q), ("k", p.k), ("v", p.v)):
            if part in present:
                by_module.setdefault(id(s.module), (s.module, []))[1].append((part, s.index))
        for module, parts in by_module.values():
            transposed = isinstance(module, Conv1D)
            parametrize.register_parametrization(
                module, "weight", _WrittenRows(owner, parts, transposed), unsafe=True
            )
            self._parametrized.append((module, "weight"))
            bias_parts = [(f"{part}_bias", index) for part, index in parts if f"{part}_bias" in present]
            if bias_parts and getattr(module, "bias", None) is not None:
                parametrize.register_parametrization(
                    module, "bias", _WrittenRows(owner, bias_parts, False), unsafe=True
                )
                self._parametrized.append((module, "bias"))
        return [module for module, _ in by_module.values()]

    def parameters(self) -> Iterator[nn.Parameter]:
        """The trained parameters (those with ``requires_grad``), each once, in a fixed order."""
        seen: set[int] = set()
        for p in self.model.parameters():
            if p.requires_grad and id(p) not in seen:
                seen.add(id(p))
                yield p

    @property
    def installed(self) -> bool:
        """Whether the parametrizations are still in place (:meth:`write_back` not yet called)."""
        return bool(self._parametrized)

    @torch.no_grad()
    def healed_variant(self) -> AppliedVariant:
        """The model's :class:`AppliedVariant` with each converted layer's factors as trained (float64, in
        the shapes ``apply`` gave them: per query head where it gave them so)."""
        info = self.model.headwidget_variant
        assert isinstance(info, AppliedVariant)
        fits = dict(info.fits)
        for layer, owner in self._layers.items():
            fit = fits[layer]
            if not fit.factors:
                continue
            factors = dict(fit.factors)
            for name, source in owner.sources.items():
                if name not in factors:
                    continue
                value = source().detach().to("cpu", F64)
                given = factors[name]
                if given.shape[0] != value.shape[0]:  # per query head: each reads its KV slot
                    heads, slots = int(given.shape[0]), int(value.shape[0])
                    value = value[torch.arange(heads) // (heads // slots)]
                factors[name] = value
            fits[layer] = replace(fit, factors=factors)
        return replace(info, fits=fits)

    @torch.no_grad()
    def write_back(self) -> None:
        """Write the trained weights into the model's own parameters (factors multiplied in float64)
        and remove every parametrization; every parameter gets back the ``requires_grad`` it had before
        :meth:`install`, so the model trains further as the variant would."""
        values = []
        for module, name in self._parametrized:
            values.append(self._final(module, name))
        for (module, name), value in zip(self._parametrized, values, strict=True):
            if parametrize.is_parametrized(module, name):
                parametrize.remove_parametrizations(module, name, leave_parametrized=False)
            getattr(module, name).copy_(value)
        self._parametrized.clear()
        for name, p in self.model.named_parameters():
            p.requires_grad_(self._requires_grad.get(name, True))

    def _final(self, module: nn.Module, name: str) -> torch.Tensor:
        """The parametrized tensor ``module.name`` computed in float64, in its own dtype."""
        chain = _chains(module)[name]
        original = chain.original
        assert isinstance(original, torch.Tensor) and isinstance(chain, nn.ModuleList)
        value = original.to(F64)
        for p in chain:
            if isinstance(p, _WrittenRows):
                value = p.write(value, p.layer.slots(F64))
            elif isinstance(p, _LowRankDelta):
                delta = p.b.to(F64) @ p.a.to(F64)
                value = value + (delta.T if p.transposed else delta)
        return value.to(original.dtype)
