"""What a variant does to each layer: the fitted conversions and the fitted quantizers, and their bytes.

A uniform spec (``"mqa"``, ``"kv:int4"``) applies to every chosen layer; a mixed spec
(``"mla:64@0-9;kv:int4@10-11"``, :class:`~headwidget.analysis.variants.MixedSpec`) names its own
layers, one uniform spec each, and leaves the others as the model has them. Either becomes one
:class:`VariantPlan`: per layer, a :class:`~headwidget.analysis.variant_fits.LayerFit` (a converted
layer), a :class:`~headwidget.evaluation._quantize.KVQuantizer` (a layer whose K/V are fake-quantized)
or nothing, and its cross-layer parts (:mod:`headwidget.evaluation._cross_layer`: ``share`` groups, and
the ``merge``/``xkv`` cache transforms). Evaluation runs a plan (:meth:`VariantPlan.running`; with
``prefill=True`` its quantizers quantize the prefilled cache, as a deployed cache does, and its cache
transforms run), the per-layer sweep takes one cell of it at a time (:meth:`VariantPlan.cell`: a layer,
or the group a cross-layer layer belongs to), and its K/V bytes per token are the sum over layers of
each layer's own (:meth:`VariantPlan.layer_bytes`).

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from headwidget.analysis.variants import parse_variant
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64,
    ...     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> from headwidget.adapters import adapter_for
    >>> plan = plan_variant(adapter_for(model), parse_variant("mqa@0;kv:int4@2"), None, [0, 1, 2])
    >>> sorted(plan.fits), [q.layers for q in plan.quantizers]
    ([0], [[2]])
    >>> plan.layer_bytes(torch.bfloat16)  # mqa: 2·16 elements; model: 2·32 in bf16; int4: 2·(32/2 + 4)
    [64, 128, 40]
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field

import torch
from torch import nn

from headwidget.adapters import Adapter
from headwidget.analysis.variant_fits import LayerFit
from headwidget.analysis.variants import Variant
from headwidget.errors import UnsupportedConversionError
from headwidget.evaluation._apply import KeptFits, build_variant, fit_parts, shared_copy
from headwidget.evaluation._cache_transforms import (
    CacheTransform,
    GroupTransform,
    QuantizedCache,
    transforming_prefill,
)
from headwidget.evaluation._cross_layer import CrossLayerParts, cross_layer_parts
from headwidget.evaluation._model_facts import layer_kv_elements
from headwidget.evaluation._quantize import KVQuantizer
from headwidget.evaluation._sharing import SharedKV
from headwidget.stats import KVStats

__all__ = ["GroupCell", "VariantPlan", "plan_variant", "reusing_plans"]


@dataclass
class GroupCell:
    """One group of one variant alone: its layers' fits, and its sharing or cache transform."""

    layers: list[int]
    fits: dict[int, LayerFit]
    sharing: list[SharedKV] = field(default_factory=list)
    caches: list[GroupTransform] = field(default_factory=list)

    @contextmanager
    def running(self, base: nn.Module, spec: str, *, prefill: bool) -> Iterator[nn.Module]:
        """Inside, ``base`` with this group converted (every other parameter shared)."""
        variant = build_variant(base, spec, self.fits, share=True) if self.fits else shared_copy(base)
        with ExitStack() as stack:
            for shared in self.sharing:
                stack.enter_context(shared.active(variant))
            if self.caches:
                if not prefill:
                    names = ", ".join(c.spec for c in self.caches)
                    raise UnsupportedConversionError(
                        f"{names} transform a prefilled cache: run under prefill:P"
                    )
                stack.enter_context(transforming_prefill(variant, self.caches))
            yield variant


@dataclass
class VariantPlan:
    """One variant, fitted: its converted layers' fits and its quantizers (see the module docstring).

    ``layer_elements`` are the K/V elements per token of every layer of the model as it is (what an
    untouched layer costs).
    """

    spec: str
    fits: dict[int, LayerFit]
    quantizers: list[KVQuantizer]
    layer_elements: dict[int, int] = field(repr=False)
    cross: CrossLayerParts = field(default_factory=CrossLayerParts, repr=False)
    _groups: dict[int, GroupCell] | None = field(default=None, repr=False)

    @property
    def layers(self) -> list[int]:
        """The layers the variant changes (converted, quantized or in a cross-layer group), sorted."""
        grouped = (layer for group, _ in self.cross.groups() for layer in group)
        return sorted({*self.fits, *(layer for q in self.quantizers for layer in q.layers), *grouped})

    def _group_cells(self) -> dict[int, GroupCell]:
        if self._groups is None:
            cells: dict[int, GroupCell] = {}
            for shared in self.cross.sharing:
                for group in shared.acting:
                    cell = GroupCell(group, self._fits_of(group), sharing=[SharedKV(shared.spec, [group])])
                    cells.update(dict.fromkeys(group, cell))
            for cache in self.cross.caches:
                for group in cache.acting:
                    cell = GroupCell(group, self._fits_of(group), caches=[cache.only([group])])
                    cells.update(dict.fromkeys(group, cell))
            self._groups = cells
        return self._groups

    def _fits_of(self, group: list[int]) -> dict[int, LayerFit]:
        return {layer: self.fits[layer] for layer in group if layer in self.fits}

    def cell(self, layer: int) -> LayerFit | KVQuantizer | GroupCell | None:
        """What the variant does to ``layer`` alone: its fit, its quantizer, the group it belongs to (the
        same :class:`GroupCell` for every layer of the group), or None (left as it is)."""
        group = self._group_cells().get(layer)
        if group is not None:
            return group
        fit = self.fits.get(layer)
        if fit is not None and (fit.weights is not None or fit.rope_keep is not None):
            return fit  # (a cross-layer part's layer left alone in its group has nothing to measure)
        return next((q for q in self.quantizers if layer in q.layers), None)

    def layer_bytes(self, dtype: torch.dtype, prefill: int | None = None) -> list[float]:
        """K/V bytes per token of each layer: a quantized layer by its quantizer's formula (with
        ``prefill``, what its cache of that many prefilled tokens holds: ``kv:int``'s residual exact), a
        layer of a ``merge``/``xkv`` group by what its cache holds (``prefill``: the prefill length that
        an xKV basis is spread over; a merge's retention as measured so far), a converted one by its
        mechanism's elements in ``dtype`` (a ``share`` reader: 0), any other as the model holds it."""
        size = dtype.itemsize
        by_cache = {layer: c for c in self.cross.caches for layer in c.layers}
        out: list[float] = []
        for layer, elements in sorted(self.layer_elements.items()):
            quantizer = next((q for q in self.quantizers if layer in q.layers), None)
            if quantizer is not None:
                out.append(quantizer.layer_bytes_per_token(layer, prefill, size))
            elif layer in by_cache:
                out.append(size * by_cache[layer].layer_elements(layer, prefill))
            else:
                fit = self.fits.get(layer)
                out.append(size * (fit.kv_elements if fit is not None else elements))
        return out

    def kv_bytes_per_token(self, dtype: torch.dtype, prefill: int | None = None) -> float:
        """The sum of :meth:`layer_bytes` (an int when whole)."""
        total = math.fsum(self.layer_bytes(dtype, prefill))
        return int(total) if float(total).is_integer() else total

    @property
    def constant_bytes(self) -> int:
        """Bytes stored once, not per token: the CQ codebooks of the quantized layers."""
        return sum(q.constant_bytes for q in self.quantizers)

    @contextmanager
    def running(self, base: nn.Module, *, prefill: bool = False) -> Iterator[nn.Module]:
        """Inside, a model that is ``base`` with this variant: the converted layers' blocks its own (every
        other parameter shared with ``base``), the ``share`` readers reading their group's K/V, the
        quantized layers' K/V fake-quantized in every forward — or, with ``prefill``, the prefilled
        cache quantized once and the ``merge``/``xkv`` transforms run on it.

        Raises:
            UnsupportedConversionError: ``merge``/``xkv`` parts without ``prefill``.
        """
        variant = build_variant(base, self.spec, self.fits, share=True) if self.fits else shared_copy(base)
        if self.cross.caches and not prefill:
            names = ", ".join(c.spec for c in self.cross.caches)
            raise UnsupportedConversionError(f"{names} transform a prefilled cache: run under prefill:P")
        with ExitStack() as stack:
            for shared in self.cross.sharing:
                stack.enter_context(shared.active(variant))
            transforms: list[CacheTransform] = list(self.cross.caches)
            for quantizer in self.quantizers:
                if prefill:
                    transforms.append(QuantizedCache(quantizer))
                else:
                    stack.enter_context(quantizer.active(variant))
            stack.enter_context(transforming_prefill(variant, transforms))
            yield variant


def plan_variant(
    adapter: Adapter,
    parsed: Variant,
    stats: KVStats | None,
    chosen: Sequence[int],
    *,
    weight_dtype: torch.dtype | None = None,
    kept: KeptFits | None = None,
) -> VariantPlan:
    """Fit every part of ``parsed`` on ``adapter.model`` (float64, from its weights;
    :func:`~headwidget.evaluation._apply.fit_parts`), the fits kept in ``weight_dtype`` (default:
    float64); ``kept``: the fits the call's other variants made (:func:`fit_parts`). ``stats`` are
    checked against the model by the caller, once.

    Raises:
        Whatever :func:`~headwidget.evaluation._apply.fit_parts` raises.
    """
    reused = _REUSED.get()
    key = (id(adapter.model), id(stats), parsed.text, tuple(chosen), weight_dtype)
    if reused is not None and key in reused:
        model, of_stats, plan = reused[key]
        if model is adapter.model and of_stats is stats:
            return plan
    fits, quantizers = fit_parts(adapter, parsed, stats, chosen, weight_dtype=weight_dtype, kept=kept)
    cross = cross_layer_parts(adapter, parsed, chosen, fits)
    elements = {layer: layer_kv_elements(adapter, layer) for layer in range(adapter.layout().num_layers)}
    plan = VariantPlan(parsed.text, fits, quantizers, elements, cross)
    if reused is not None:  # the model and statistics are held, so their ids stay theirs
        reused[key] = (adapter.model, stats, plan)
    return plan


#: The plans of the innermost :func:`reusing_plans` of this thread (or task), by (model, statistics,
#: spec, layers, weight dtype); None outside one.
_REUSED: ContextVar[dict[tuple[object, ...], tuple[nn.Module, KVStats | None, VariantPlan]] | None]
_REUSED = ContextVar("headwidget_reused_plans", default=None)


@contextmanager
def reusing_plans() -> Iterator[None]:
    """Inside, :func:`plan_variant` fits each variant of a model once for given statistics, layers and
    weight dtype, and hands later calls the same plan: for a caller that measures one model several
    times, with weights and statistics that stay as they are meanwhile (the demo's table of variants and
    its per-layer sweep share their fits). Only in this thread; a plan would not see weights changed
    inside, so never train or edit the model in such a block.

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> from headwidget.adapters import adapter_for
        >>> from headwidget.analysis.variants import parse_variant
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64,
        ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
        >>> fit = lambda: plan_variant(adapter_for(model), parse_variant("mqa"), None, [0, 1])
        >>> with reusing_plans():
        ...     fit() is fit()
        True
        >>> fit() is fit()
        False
    """
    token = _REUSED.set({})
    try:
        yield
    finally:
        _REUSED.reset(token)
