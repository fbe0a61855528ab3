"""``apply(model, spec)``: a converted copy of a model that runs as a normal transformers model.

Each layer is fitted by :func:`~headwidget.analysis.variant_fits.fit_layer` (float64, from the
original weights) and written into a copy by the model's adapter:

- **GQA/MQA/MHA on the Llama family** give a real model with that many KV heads: the layers' ``k_proj``
  / ``v_proj`` shrink (or grow), ``num_key_value_groups`` follows, and when every layer is converted
  ``config.num_key_value_heads`` is updated, so ``save_pretrained`` / ``from_pretrained`` round-trip and
  transformers' own KV cache is that much smaller. (Converting only some layers gives a model that runs
  but whose config cannot describe it: its ``save_pretrained`` refuses.)
- **Every other family** (GPT-2, GPT-NeoX, Falcon, GPT-BigCode, BERT) keeps its KV-head count: merged
  heads are written as copies (numerically the mechanism's output; the cache the family allocates is
  unchanged, the bytes reported are the mechanism's). A merge the layer cannot hold as copies (``gqa:3``
  on 6 query heads over 2 KV heads) is refused.
- **LRKV and MLA** give the same class with the reconstructed K/V weights (numerically the mechanism's
  output); the factors are kept on ``variant.headwidget_variant.factors``.
- **Partial RoPE** (``rope:r``, ``mla:d_c+rope:r``) changes how the attention applies RoPE: Llama,
  Mistral and Qwen2 only (:mod:`headwidget.adapters._partial_rope`); no checkpoint can hold the mask,
  so its ``save_pretrained`` refuses.
- DeepSeek (already MLA) supports only ``model``.
- **K/V quantizers** (``kv:int{b}``, ``kv:cq{c}c{b}b``, alone or as parts of a mixed spec) change no
  weight: the copy's ``forward`` runs every quantizer's layers fake-quantized, as
  :meth:`~headwidget.evaluation.KVQuantizer.active` does for evaluate, so the copy is the quantized
  model wherever it runs (lm-eval's ``HFLM(pretrained=variant)`` too). A ``kv:int`` forward of
  several rows needs its ``attention_mask`` (its key groups must leave padding out); lm-eval, which
  passes none, runs it with ``batch_size=1``. With a KV cache (``generate``), the cache holds the
  unquantized K/V and each step quantizes all of them again, so cached generation can differ from a
  forward of the whole text (``use_cache=False``). The quantizing forward belongs to the copy
  ``apply`` returned: ``nn.DataParallel`` replicas of it are not supported. Applying a spec to a model
  that already quantizes is refused (it would quantize twice): apply one mixed spec to the original.
- **Cross-layer parts** (``share:g``, ``merge:2``, ``xkv:r/g``; :mod:`headwidget.evaluation._cross_layer`)
  change no weight either: every forward of the copy lets each ``share`` group's readers read their first
  layer's K/V (:class:`~headwidget.evaluation._sharing.SharedForward`), and a forward that starts a KV
  cache (a ``generate`` call's prefill) has it merged or compressed before it returns
  (:class:`~headwidget.evaluation._cache_transforms.CacheTransformForward`). No checkpoint holds them.

**Saving.** A variant's ``save_pretrained`` (and ``push_to_hub``, which saves through it) first asks
:func:`save_blocker` whether the family's own ``from_pretrained`` would give the same model back; where
it would not (K/V quantizers; partial RoPE; Llama layers with different KV-head counts), it raises
:class:`~headwidget.errors.VariantSaveError` before writing anything. Every other variant saves as an
ordinary checkpoint of its weights (LRKV/MLA as their dense reconstructed K/V weights, the factors not
included) that reloads with the same logits. ``torch.save(variant.state_dict())`` cannot be checked:
it too leaves a partial-RoPE mask out; keep the spec and the statistics and rebuild with :func:`apply`.

Example:
    >>> import torch, headwidget
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> mqa = apply(model, "mqa")
    >>> mqa.config.num_key_value_heads, model.config.num_key_value_heads
    (1, 2)
    >>> mqa.headwidget_variant.kv_bytes_per_token(torch.bfloat16)  # 2 layers × (8 + 8) × 2 bytes
    64
    >>> save_blocker(mqa) is None, save_blocker(apply(model, "mqa", layers=[1]))[:55]
    (True, 'its layers hold different numbers of KV heads (layer 0:')
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from headwidget.adapters import Adapter, adapter_for, partial_rope_mask
from headwidget.analysis.cross_layer import within_layer
from headwidget.analysis.variant_fits import LayerFit, alignments, fit_layer
from headwidget.analysis.variants import (
    MixedSpec,
    Variant,
    VariantSpec,
    parse_uniform,
    parse_variant,
    uniform_parts,
)
from headwidget.errors import (
    ArgumentError,
    UnsupportedAlignmentError,
    UnsupportedConversionError,
    VariantSaveError,
)
from headwidget.evaluation._arguments import check_apply_arguments
from headwidget.evaluation._cache_transforms import (
    GroupTransform,
    install_cache_transforms,
    installed_cache_transforms,
)
from headwidget.evaluation._cross_layer import CrossLayerParts, cross_layer_parts, refuse_residual
from headwidget.evaluation._model_facts import (
    check_stats,
    converted_modules,
    layer_kv_elements,
    resolve_layers,
)
from headwidget.evaluation._quantize import (
    KVQuantizer,
    install_quantizers,
    installed_quantizers,
    quantizer_for,
)
from headwidget.evaluation._sharing import SharedKV, install_sharing, installed_sharing
from headwidget.stats import KVStats

__all__ = [
    "AppliedVariant",
    "KeptFits",
    "apply",
    "build_variant",
    "compact_fits",
    "fit_parts",
    "fit_variant",
    "refuse_layers_with_mixed",
    "save_blocker",
    "shared_copy",
]


@dataclass
class AppliedVariant:
    """What :func:`apply` did, kept on the returned model as ``headwidget_variant``.

    ``layers`` are the layers it changed (converted or quantized); ``kv_elements`` the cached K/V
    elements per token of every layer as the model holds them (a quantized layer keeps its own);
    ``fits`` the per-layer fits of the converted layers (their ``factors``, merged ``groups``,
    ``rope_keep`` and ``kept_planes``; the written weights are in the model, not kept here);
    ``quantizers`` the fitted ``kv:`` quantizers that run in every forward of the model; ``sharing``
    the ``share:g`` groups whose readers read their first layer's K/V in every forward;
    ``cache_transforms`` the ``merge``/``xkv`` transforms of every cache a prefill of the model builds.
    """

    spec: str
    layers: list[int]
    kv_elements: dict[int, int]
    fits: dict[int, LayerFit] = field(repr=False, default_factory=dict)
    quantizers: list[KVQuantizer] = field(repr=False, default_factory=list)
    sharing: list[SharedKV] = field(repr=False, default_factory=list)
    cache_transforms: list[GroupTransform] = field(repr=False, default_factory=list)

    @property
    def readers(self) -> dict[int, int]:
        """Each ``share`` reader and the layer whose K/V it reads."""
        return {r: s for shared in self.sharing for r, s in shared.readers.items()}

    @property
    def left_alone(self) -> list[int]:
        """The layers a ``share:g`` part with no conversion within the layer leaves as the model has
        them: each alone in its group (the last of an odd run for ``share:2``)."""
        return sorted(
            group[0]
            for shared in self.sharing
            if _converts_nothing_within(shared.spec)
            for group in shared.groups
            if len(group) == 1
        )

    @property
    def factors(self) -> dict[int, dict[str, torch.Tensor]]:
        """The mechanism's factors per converted layer (LRKV, MLA; empty dicts otherwise)."""
        return {layer: fit.factors for layer, fit in self.fits.items()}

    def layer_bytes(self, dtype: torch.dtype = torch.bfloat16, prefill: int | None = None) -> list[float]:
        """K/V cache bytes per token of each layer: a layer of a ``merge``/``xkv`` group by what its cache
        holds (``prefill``: the prefill length that an xKV group's basis is spread over, left out for
        None; a merge's retention as measured so far), any other by its elements in ``dtype``: as
        :meth:`VariantPlan.layer_bytes <headwidget.evaluation._plan.VariantPlan.layer_bytes>` counts
        them for evaluate with the same ``prefill``. A quantized layer is counted by its quantizer's
        formula whatever ``prefill``: this model quantizes the K/V of every forward, keeping no recent
        tokens exact (evaluate's ``prefill:P`` reads a deployed ``kv:int`` cache instead, whose KIVI
        residual stays exact; its bytes count those tokens at full precision)."""
        size = dtype.itemsize
        by_quantizer = {layer: q for q in self.quantizers for layer in q.layers}
        by_cache = {layer: c for c in self.cache_transforms for layer in c.layers}
        return [
            by_quantizer[layer].layer_bytes_per_token(layer)
            if layer in by_quantizer
            else size * by_cache[layer].layer_elements(layer, prefill)
            if layer in by_cache
            else size * elements
            for layer, elements in sorted(self.kv_elements.items())
        ]

    def kv_bytes_per_token(self, dtype: torch.dtype = torch.bfloat16, prefill: int | None = None) -> float:
        """K/V cache bytes per token of the whole model (all layers, K and V): the sum of
        :meth:`layer_bytes` (an int when whole)."""
        total = math.fsum(self.layer_bytes(dtype, prefill))
        return int(total) if float(total).is_integer() else total


def _kv_heads_after(adapter: Adapter, spec: VariantSpec) -> int | None:
    """The KV heads per layer ``spec`` gives (None: a mechanism that keeps the model's heads)."""
    if spec.mechanism == "mha":
        return adapter.layout().num_heads
    if spec.mechanism == "gqa":
        return spec.arg
    return 1 if spec.mechanism == "mqa" else None


def _converts_nothing_within(spec: str) -> bool:
    """Whether a cross-layer part leaves each layer's own attention as it is (``share:2``, not
    ``mqa+share:2``)."""
    part = parse_variant(spec)
    return isinstance(part, VariantSpec) and part.mechanism == "model" and not (part.align or part.rope)


def _check_buildable(adapter: Adapter, spec: VariantSpec) -> None:
    if spec.mechanism == "model":
        return
    reason = adapter.conversion_blocker()
    if reason is None and _kv_heads_after(adapter, spec) not in (None, adapter.layout().num_kv_heads):
        reason = adapter.kv_heads_blocker()
    if reason is not None:
        raise UnsupportedConversionError(f"{type(adapter.model).__name__} ({adapter.family}): {reason}")
    if spec.align:
        reason = adapter.alignment_blocker()
        if reason is not None:
            raise UnsupportedAlignmentError(f"{spec.text}: {reason}")
    if spec.rope_pairs is not None:
        reason = adapter.partial_rope_blocker()
        if reason is not None:
            raise UnsupportedConversionError(f"{spec.text}: {reason}")


def _refuse_quantizer(spec: VariantSpec) -> None:
    if spec.quantizer:
        raise UnsupportedConversionError(
            f"{spec.text} quantizes the K/V the attention uses while the model runs; it fits no weight: "
            f"fit it with headwidget.evaluation.fit_quantizer(model, {spec.text!r}, stats), or build the "
            f"quantized model with headwidget.apply(model, {spec.text!r}, stats)"
        )


def _quantizers_of(model: nn.Module) -> list[KVQuantizer]:
    """The quantizers ``model`` runs: those installed on its forward, or those ``apply`` recorded (a
    forward wrapped since, by accelerate for one, hides the installed ones)."""
    info = getattr(model, "headwidget_variant", None)
    return installed_quantizers(model) or (list(info.quantizers) if isinstance(info, AppliedVariant) else [])


def _refuse_quantized_model(model: nn.Module) -> None:
    info = getattr(model, "headwidget_variant", None)
    if installed_sharing(model) or installed_cache_transforms(model):
        held = info.spec if isinstance(info, AppliedVariant) else "cross-layer parts"
        raise UnsupportedConversionError(
            f"this model already shares or transforms its K/V across layers ({held}): a variant of it would "
            "do it twice. Apply one mixed spec with every part to the original model instead"
        )
    quantizers = _quantizers_of(model)
    if quantizers:
        held = info.spec if isinstance(info, AppliedVariant) else ", ".join(q.spec for q in quantizers)
        raise UnsupportedConversionError(
            f"this model already fake-quantizes its K/V ({held}): a variant of it would quantize twice and "
            "count its bytes once. Apply one mixed spec with every part to the original model instead "
            "(e.g. 'mqa@0-9;kv:int4@10-29')"
        )


def refuse_layers_with_mixed(parsed: Sequence[Variant], layers: object) -> None:
    """Refuse ``layers=`` given beside a mixed spec, which names its own layers.

    >>> refuse_layers_with_mixed([parse_variant("mqa@0-1")], [0])  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: layers=[0] was given with the mixed spec 'mqa@0-1', which names ...
    """
    mixed = [p.text for p in parsed if isinstance(p, MixedSpec)]
    if mixed and layers is not None:
        raise ArgumentError(
            f"layers={layers!r} was given with the mixed spec {mixed[0]!r}, which names its own layers; "
            "leave layers out, or write the layers into each spec instead (e.g. 'mqa@0-3')"
        )


def fit_variant(
    model: nn.Module, spec: str | VariantSpec, stats: KVStats | None, layers: Sequence[int]
) -> dict[int, LayerFit]:
    """The per-layer fits of ``spec`` for ``layers`` of ``model`` (nothing is built)."""
    parsed = spec if isinstance(spec, VariantSpec) else parse_uniform(spec, "fit_variant")
    return fits_for(adapter_for(model), parsed, stats, layers)


def fits_for(
    adapter: Adapter, parsed: VariantSpec, stats: KVStats | None, layers: Sequence[int]
) -> dict[int, LayerFit]:
    """:func:`fit_variant` of ``adapter.model`` for a parsed uniform spec."""
    _refuse_quantizer(parsed)
    _check_buildable(adapter, parsed)
    planes = adapter.layout().rope.planes()
    aligned = {}
    if parsed.align:  # every layer's rotations fitted together (one batched Procrustes per head update)
        dims = {}
        for layer in layers:
            w = adapter.head_weights(layer)
            dims[layer] = (int(w.k.shape[1]), int(w.v.shape[1]))
        aligned = alignments(parsed, stats, dims, planes)
    out = {}
    for layer in layers:
        kv_target = None if adapter.resizable_kv_heads else adapter.kv_heads_of(adapter.attention_at(layer))
        out[layer] = fit_layer(
            adapter.head_weights(layer),
            layer,
            parsed,
            stats,
            rope_planes=planes,
            kv_target=kv_target,
            alignment=aligned.get(layer),
        )
    return out


def _copy(model: nn.Module, adapter: Adapter, layers: Sequence[int], share: bool) -> nn.Module:
    """A deep copy of ``model``; with ``share``, one that shares every parameter and buffer outside the
    modules a conversion of ``layers`` writes into
    (:func:`~headwidget.evaluation._model_facts.converted_modules`), and every module
    outside them and the containers that lead to them (so a copy with one layer converted copies that
    layer's attention, not the whole model's weights or module tree)."""
    if not share:
        return copy.deepcopy(model)
    converted = converted_modules(model, adapter, layers)
    own = {
        id(t)
        for name in converted
        for t in (*model.get_submodule(name).parameters(), *model.get_submodule(name).buffers())
    }
    memo: dict[int, object] = {id(t): t for t in (*model.parameters(), *model.buffers()) if id(t) not in own}
    if converted:
        copied = {id(m) for name in converted for m in model.get_submodule(name).modules()}
        for name in converted:  # the containers on the way: ``model``, ``model.layers``, ``model.layers.3``
            parts = name.split(".")
            copied |= {id(model.get_submodule(".".join(parts[:k]))) for k in range(len(parts))}
        memo.update({id(m): m for m in model.modules() if id(m) not in copied})
    return copy.deepcopy(model, memo)


def shared_copy(model: nn.Module, adapter: Adapter | None = None) -> nn.Module:
    """A copy of ``model``'s modules that shares every parameter and buffer with it (for evaluation: a
    model whose layer blocks can be replaced, or whose attention modules can be told apart, without
    copying a weight; never hand such a copy out). ``adapter``: ``model``'s, when the caller has it."""
    return _copy(model, adapter or adapter_for(model), [], share=True)


def compact_fits(fits: dict[int, LayerFit], dtype: torch.dtype) -> dict[int, LayerFit]:
    """``fits`` with their weights stored in ``dtype`` (the dtype of the model they will be written into:
    writing them gives the same bits as writing the float64 originals, in a fraction of the memory)."""

    def cast(t: torch.Tensor | None) -> torch.Tensor | None:
        return None if t is None else t.to(dtype)

    out = {}
    for layer, fit in fits.items():
        w = fit.weights
        if w is not None:
            w = replace(
                w,
                q=w.q.to(dtype),
                k=w.k.to(dtype),
                v=w.v.to(dtype),
                o=w.o.to(dtype),
                q_bias=cast(w.q_bias),
                k_bias=cast(w.k_bias),
                v_bias=cast(w.v_bias),
                o_bias=cast(w.o_bias),
            )
        out[layer] = replace(fit, weights=w)
    return out


def build_variant(
    model: nn.Module,
    spec: str,
    fits: dict[int, LayerFit],
    *,
    quantizers: Sequence[KVQuantizer] = (),
    share: bool = False,
    cross: CrossLayerParts | None = None,
) -> nn.Module:
    """A copy of ``model`` with the fitted layers written in (see the module docstring), whose every
    forward runs ``quantizers`` (:class:`~headwidget.evaluation._quantize.QuantizedForward`) and the
    cross-layer parts of ``cross`` (sharing in every forward, cache transforms after a prefill).

    ``share=True`` copies only the converted layers' attention modules (and the modules holding their
    head projections) and shares every other parameter with ``model`` (for evaluation; never hand such
    a copy out).
    """
    adapter = adapter_for(model)
    layers = sorted(fits)
    out = _copy(model, adapter, layers, share)
    target = adapter_for(out)
    for layer in layers:
        fit = fits[layer]
        attention = target.attention_at(layer)
        if fit.weights is not None:
            target.write_head_weights(attention, fit.weights)
        if fit.rope_keep is not None:
            target.set_partial_rope(attention, fit.rope_keep)
    if target.resizable_kv_heads:
        counts = {target.kv_heads_of(a) for a in target.attention_modules()}
        if len(counts) == 1:
            target.set_config_kv_heads(counts.pop())
    kv_elements = {
        layer: fits[layer].kv_elements if layer in fits else layer_kv_elements(adapter, layer)
        for layer in range(adapter.layout().num_layers)
    }
    kept = {layer: replace(fit, weights=None) for layer, fit in fits.items()}  # written: not kept twice
    changed = sorted({*layers, *(layer for q in quantizers for layer in q.layers)})
    cross = cross or CrossLayerParts()
    grouped = [layer for group, _ in cross.groups() for layer in group]
    changed = sorted({*changed, *grouped})
    out.headwidget_variant = AppliedVariant(  # type: ignore[assignment]
        parse_variant(spec).text, changed, kv_elements, kept, list(quantizers), cross.sharing, cross.caches
    )
    install_sharing(out, cross.sharing)
    install_cache_transforms(out, cross.caches)
    install_quantizers(out, quantizers)
    for method in _SAVING:
        if callable(getattr(type(out), method, None)):
            setattr(out, method, _CheckedSave(out, method))
    return out


def _layer_list(layers: Sequence[int]) -> str:
    """``[1]`` → ``layer 1``, ``[0, 1]`` → ``layers 0, 1``."""
    return ("layer " if len(layers) == 1 else "layers ") + ", ".join(str(layer) for layer in layers)


def save_blocker(model: nn.Module) -> str | None:
    """Why a checkpoint of ``model``'s weights and config would not load back as the same model
    (None: ``save_pretrained`` / ``from_pretrained`` round-trip it).

    It looks at the model as it is now: attention that applies RoPE to only part of each KV head's dims
    (a mask no config field or transformers code expresses), and, where a layer's KV-head count can be
    changed, layers whose counts differ from the one in the config (the module's example).
    """
    problem = _save_problem(model)
    return None if problem is None else problem[1]


def _save_problem(model: nn.Module) -> tuple[str, str] | None:
    """``(what, why)`` for :func:`save_blocker`: ``what`` is ``"kv"``, ``"cross"``, ``"rope"`` or
    ``"kv_heads"``."""
    crossing = [p.spec for p in installed_sharing(model)] + [
        t.spec for t in installed_cache_transforms(model)
    ]
    if crossing:
        return "cross", (
            f"it shares or transforms its K/V across layers ({', '.join(crossing)}) while it runs, which no "
            f"checkpoint of {type(model).__name__} can hold (its config gives every layer its own K/V and "
            "cache): the model loaded from it would run without them and give other logits"
        )
    quantizers = _quantizers_of(model)
    if quantizers:
        parts = "; ".join(f"{q.spec} on {_layer_list(q.layers)}" for q in quantizers)
        return "kv", (
            f"it fake-quantizes its K/V while it runs ({parts}), which no checkpoint holds: the model "
            "loaded from it would run unquantized and give other logits"
        )
    adapter = adapter_for(model)
    attention = adapter.attention_modules()
    config = type(adapter.config).__name__
    masks = [partial_rope_mask(a) for a in attention]
    partial = [layer for layer, keep in enumerate(masks) if keep is not None and not bool(keep.all())]
    if partial:
        verb = "applies" if len(partial) == 1 else "apply"
        return "rope", (
            f"{_layer_list(partial)} {verb} RoPE to only part of each KV head's dims (partial RoPE: "
            f"a per-head mask that neither {config} nor transformers' {type(model).__name__} code can "
            "express), so the model loaded from the checkpoint would rotate every dim and give other logits"
        )
    if adapter.resizable_kv_heads:
        counts = [adapter.kv_heads_of(a) for a in attention]
        configured = adapter.layout().num_kv_heads
        if any(count != configured for count in counts):
            held = ", ".join(f"layer {layer}: {count}" for layer, count in enumerate(counts))
            return "kv_heads", (
                f"its layers hold different numbers of KV heads ({held}), but {config} has one "
                f"num_key_value_heads ({configured}) for every layer, so from_pretrained could not load "
                "the checkpoint"
            )
    return None


def _save_refusal(model: nn.Module, method: str, what: str, reason: str) -> VariantSaveError:
    info = getattr(model, "headwidget_variant", None)
    if not isinstance(info, AppliedVariant):
        return VariantSaveError(f"{type(model).__name__}.{method}: {reason}. Nothing was written.")
    spec, layers = info.spec, info.layers
    every = layers == list(range(len(info.kv_elements)))
    chosen = "" if every or isinstance(parse_variant(spec), MixedSpec) else f", layers={layers}"
    if what == "kv" and not info.fits:
        other = "it holds no converted weight, so the original model and the spec are all it takes"
    elif what == "kv":
        other = (
            "to keep the converted weights, save the spec without its kv: parts, then apply the kv: parts to "
            "the loaded model (kv:cq with statistics of the original: allow_other_weights=True)"
        )
    elif what == "rope":
        other = "variants without rope:r (mqa, gqa:G, lrkv:r, mla:d_c) save as ordinary checkpoints"
    elif what == "cross":
        other = "the spec without its share/merge/xkv parts saves as an ordinary checkpoint"
    elif chosen:
        other = (
            f"converting every layer (headwidget.apply(model, {spec!r}, stats=stats)) gives one that saves"
        )
    else:
        other = "a spec that gives every layer the same number of KV heads gives one that saves"
    return VariantSaveError(
        f"the {spec!r} variant (changed {_layer_list(layers)}) cannot be saved with {method}: {reason}. "
        "Nothing was written. Keep the spec and the statistics (stats.save(path)) instead, and rebuild the "
        f"variant from the original model: headwidget.apply(model, {spec!r}, stats=stats{chosen}); "
        f"{other}."
    )


#: The methods of a variant that write a checkpoint (``push_to_hub`` saves through ``save_pretrained``,
#: but creates the Hub repository first: it is checked before that).
_SAVING = ("save_pretrained", "push_to_hub")


class _CheckedSave:
    """A variant's ``save_pretrained`` / ``push_to_hub``: :func:`save_blocker` first, then the class's.

    Kept in the instance's ``__dict__`` (the class and the original model are untouched); it holds the
    model it belongs to, so ``copy.deepcopy`` and pickling give a copy whose check is its own.
    """

    def __init__(self, model: nn.Module, method: str) -> None:
        self.model = model
        self.method = method

    @property
    def __wrapped__(self) -> object:  # inspect.signature / help() show the transformers method
        return getattr(type(self.model), self.method).__get__(self.model)

    def __repr__(self) -> str:
        return f"<{self.method} of a headwidget variant of {type(self.model).__name__}, checked first>"

    def __call__(self, *args: object, **kwargs: object) -> object:
        problem = _save_problem(self.model)
        if problem is not None:
            raise _save_refusal(self.model, self.method, *problem)
        return getattr(type(self.model), self.method)(self.model, *args, **kwargs)


def apply(
    model: nn.Module,
    spec: str,
    stats: KVStats | None = None,
    layers: Iterable[int] | None = None,
    *,
    allow_other_weights: bool = False,
) -> nn.Module:
    """A converted copy of ``model`` (``model`` itself is not changed; see the module docstring).

    Args:
        model: a supported transformers model.
        spec: a variant spec: ``model``, ``mha``, ``gqa:G``, ``mqa``, ``lrkv:r``, ``mla:d_c``,
            ``gqa:G+align``, ``mqa+align``, ``rope:r``, ``mla:d_c+rope:r``, or a K/V quantizer
            ``kv:int{b}``, ``kv:int{b}/g{n}``, ``kv:cq{c}c{b}b``, or a cross-layer ``share:g``,
            ``merge:2``, ``xkv:r/g`` alone or after a conversion (``mqa+share:2``)
            (:mod:`headwidget.analysis.variants`),
            or a mixed spec of them that names each part's layers (``"mla:64@0-9;kv:int4@10-29"``;
            the layers it names none of stay as they are).
        stats: statistics of ``model``: ``+align`` needs its keys and values; ``rope:r`` and data-aware
            LRKV/MLA fits need ``inputs=True``; ``kv:cq`` needs samples (``rope='post', samples=R``).
            Without them LRKV/MLA are weight-space.
        layers: the layers to convert (default: all; not with a mixed spec, which names its own).
        allow_other_weights: use ``stats`` even when they were captured from other weights of the same
            architecture and config (a base model's statistics for its fine-tune); by default refused.

    Returns:
        The converted model, in eval mode like ``model``, with ``headwidget_variant``
        (:class:`AppliedVariant`: spec, layers, KV elements per layer, factors, quantizers). Its
        ``kv:`` layers fake-quantize their K/V in every forward of it
        (:class:`~headwidget.evaluation._quantize.QuantizedForward`), in whatever thread runs it.

    Example:
        >>> import torch, headwidget
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)).eval()
        >>> lrkv = apply(gpt2, "lrkv:2", layers=[1])
        >>> lrkv.headwidget_variant.kv_elements, sorted(lrkv.headwidget_variant.factors[1])[:2]
        ({0: 64, 1: 32}, ['k_down', 'k_shared'])
        >>> mixed = apply(gpt2, "lrkv:2@1;mqa@0")
        >>> mixed.headwidget_variant.spec, mixed.headwidget_variant.kv_elements
        ('mqa@0;lrkv:2@1', {0: 16, 1: 32})
        >>> int4 = apply(gpt2, "mqa@0;kv:int4@1")  # layer 1: 2·(32·4/8 + 4·32/32) bytes
        >>> int4.headwidget_variant.layer_bytes(torch.bfloat16), int4.headwidget_variant.layers
        ([32, 40], [0, 1])

    Raises:
        ArgumentError: ``stats`` that are not a KVStats, ``layers`` that are not a list of layer indices,
            ``layers`` beside a mixed spec.
        MechanismSpecError: an unreadable spec, a mixed spec naming a layer the model does not have.
        GroupCountError / RankRangeError: a G, r or d_c the model does not allow (the message names
        the possible values). MissingStatisticsError: a fit without the statistics it needs.
        StatsMismatchError: statistics of another model, or of other weights (unless
        ``allow_other_weights``).
        UnsupportedConversionError / UnsupportedAlignmentError: a variant the family cannot be built as
        (a ``kv:`` part on a family whose attention does not go through ``AttentionInterface``, or on
        an MLA model).
    """
    adapter = adapter_for(model)
    parsed = parse_variant(spec)
    _refuse_quantized_model(model)
    for part in uniform_parts(parsed):
        refuse_residual(part, "apply's model fake-quantizes every forward")
    refuse_layers_with_mixed([parsed], layers)
    stats, layers = check_apply_arguments(adapter, stats, layers)
    check_stats(model, adapter, stats, allow_other_weights=allow_other_weights)
    chosen = resolve_layers(adapter, layers)
    fits, quantizers = fit_parts(adapter, parsed, stats, chosen)
    cross = cross_layer_parts(adapter, parsed, chosen, fits)
    return build_variant(model, parsed.text, fits, quantizers=quantizers, cross=cross)


def part_layers(parsed: Variant, chosen: Sequence[int]) -> list[tuple[VariantSpec, list[int]]]:
    """Each uniform spec of ``parsed`` with the layers it applies to: a uniform spec applies to
    ``chosen``, a mixed spec's parts to their own layers (``model`` parts left out).

    >>> [(p.text, ls) for p, ls in part_layers(parse_variant("model@0;mqa@1-2"), [0, 1, 2])]
    [('mqa', [1, 2])]
    """
    if isinstance(parsed, VariantSpec):
        return [] if parsed.unchanged else [(parsed, list(chosen))]
    return [(part, list(layers)) for part, layers in parsed.parts if not part.unchanged]


#: Fits one call keeps for all its variants (:func:`fit_parts`), by (what the part does within a layer,
#: layer, weight dtype).
KeptFits = dict[tuple[str, int, torch.dtype | None], LayerFit]


def fit_parts(
    adapter: Adapter,
    parsed: Variant,
    stats: KVStats | None,
    chosen: Sequence[int],
    *,
    weight_dtype: torch.dtype | None = None,
    kept: KeptFits | None = None,
) -> tuple[dict[int, LayerFit], list[KVQuantizer]]:
    """Fit every part of ``parsed`` on ``adapter.model`` (float64, from its weights; :func:`part_layers`
    says which layers): the converted layers' fits, kept in ``weight_dtype`` (default: float64), and one
    quantizer per ``kv:`` part. ``stats`` are checked against the model by the caller
    (:func:`~headwidget.evaluation._model_facts.check_stats`), once.

    ``kept``: the fits of the call's variants so far (one dict per call, for one model and statistics
    that stay as they are): a layer converted as one of them converts it is not fitted again (a mixed
    spec's ``mla:64`` layers beside uniform ``mla:64``, or ``mla:64+share:2`` beside it). Parts with
    ``+align``, whose rotations are fitted over their layers together, are fitted anew.

    Raises:
        MechanismSpecError: a mixed spec naming a layer the model does not have.
        Whatever :func:`fit_variant` and :func:`~headwidget.evaluation.fit_quantizer` raise for a part.
    """
    if isinstance(parsed, MixedSpec):
        parsed.check_layers(adapter.layout().num_layers)
    fits: dict[int, LayerFit] = {}
    quantizers: list[KVQuantizer] = []
    for part, layers in part_layers(parsed, chosen):
        if part.quantizer:
            quantizers.append(quantizer_for(adapter, part, stats, layers))
        else:
            fits.update(_fits_kept(adapter, part, stats, layers, weight_dtype, kept))
    return fits, quantizers


def _fits_kept(
    adapter: Adapter,
    part: VariantSpec,
    stats: KVStats | None,
    layers: list[int],
    weight_dtype: torch.dtype | None,
    kept: KeptFits | None,
) -> dict[int, LayerFit]:
    """:func:`fits_for` of ``layers`` in ``weight_dtype``, those in ``kept`` taken from it (and the new
    ones added to it)."""
    if kept is None or part.align:
        fitted = fits_for(adapter, part, stats, layers)
        return fitted if weight_dtype is None else compact_fits(fitted, weight_dtype)
    within = within_layer(part)
    missing = [layer for layer in layers if (within, layer, weight_dtype) not in kept]
    if missing:
        fitted = fits_for(adapter, part, stats, missing)
        for layer, fit in (fitted if weight_dtype is None else compact_fits(fitted, weight_dtype)).items():
            kept[(within, layer, weight_dtype)] = fit
    return {layer: kept[(within, layer, weight_dtype)] for layer in layers}
