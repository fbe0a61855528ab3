"""What a variant does to each layer: the fitted conversions and the fitted quantizers, and their bytes.

A uniform spec (``"mqa"``, ``"kv:int4"``) applies to every chosen layer; a mixed spec
(``"mla:64@0-9;kv:int4@10-11"``, :class:`~headwidget.analysis.variants.MixedSpec`) names its own
layers, one uniform spec each, and leaves the others as the model has them. Either becomes one
:class:`VariantPlan`: per layer, a :class:`~headwidget.analysis.variant_fits.LayerFit` (a converted
layer), a :class:`~headwidget.evaluation._quantize.KVQuantizer` (a layer whose K/V are fake-quantized)
or nothing. Evaluation runs a plan (:meth:`VariantPlan.running`), the per-layer sweep takes one layer
of it at a time (:meth:`VariantPlan.cell`), and its K/V bytes per token are the sum over layers of each
layer's own (:meth:`VariantPlan.layer_bytes`).

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
from headwidget.evaluation._apply import build_variant, fit_parts, shared_copy
from headwidget.evaluation._model_facts import layer_kv_elements
from headwidget.evaluation._quantize import KVQuantizer
from headwidget.stats import KVStats

__all__ = ["VariantPlan", "plan_variant", "reusing_plans"]


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

    @property
    def layers(self) -> list[int]:
        """The layers the variant changes (converted or quantized), sorted."""
        return sorted({*self.fits, *(layer for q in self.quantizers for layer in q.layers)})

    def cell(self, layer: int) -> LayerFit | KVQuantizer | None:
        """What the variant does to ``layer`` alone: its fit, its quantizer, or None (left as it is)."""
        if layer in self.fits:
            return self.fits[layer]
        return next((q for q in self.quantizers if layer in q.layers), None)

    def layer_bytes(self, dtype: torch.dtype) -> list[float]:
        """K/V bytes per token of each layer: a quantized layer by its quantizer's formula, a converted one
        by its mechanism's elements in ``dtype``, any other as the model holds it, in ``dtype``."""
        size = torch.empty((), dtype=dtype).element_size()
        out: list[float] = []
        for layer, elements in sorted(self.layer_elements.items()):
            cell = self.cell(layer)
            if isinstance(cell, KVQuantizer):
                out.append(cell.layer_bytes_per_token(layer))
            else:
                out.append(size * (cell.kv_elements if cell is not None else elements))
        return out

    def kv_bytes_per_token(self, dtype: torch.dtype) -> float:
        """The sum of :meth:`layer_bytes` (an int when whole)."""
        total = math.fsum(self.layer_bytes(dtype))
        return int(total) if float(total).is_integer() else total

    @property
    def constant_bytes(self) -> int:
        """Bytes stored once, not per token: the CQ codebooks of the quantized layers."""
        return sum(q.constant_bytes for q in self.quantizers)

    @contextmanager
    def running(self, base: nn.Module) -> Iterator[nn.Module]:
        """Inside, a model that is ``base`` with this variant: the converted layers' blocks its own (every
        other parameter shared with ``base``), the quantized layers' K/V fake-quantized."""
        variant = build_variant(base, self.spec, self.fits, share=True) if self.fits else shared_copy(base)
        with ExitStack() as stack:
            for quantizer in self.quantizers:
                stack.enter_context(quantizer.active(variant))
            yield variant


def plan_variant(
    adapter: Adapter,
    parsed: Variant,
    stats: KVStats | None,
    chosen: Sequence[int],
    *,
    weight_dtype: torch.dtype | None = None,
) -> VariantPlan:
    """Fit every part of ``parsed`` on ``adapter.model`` (float64, from its weights;
    :func:`~headwidget.evaluation._apply.fit_parts`), the fits kept in ``weight_dtype`` (default:
    float64). ``stats`` are checked against the model by the caller, once.

    Raises:
        Whatever :func:`~headwidget.evaluation._apply.fit_parts` raises.
    """
    reused = _REUSED.get()
    key = (id(adapter.model), id(stats), parsed.text, tuple(chosen), weight_dtype)
    if reused is not None and key in reused:
        model, of_stats, plan = reused[key]
        if model is adapter.model and of_stats is stats:
            return plan
    fits, quantizers = fit_parts(adapter, parsed, stats, chosen, weight_dtype=weight_dtype)
    elements = {layer: layer_kv_elements(adapter, layer) for layer in range(adapter.layout().num_layers)}
    plan = VariantPlan(parsed.text, fits, quantizers, elements)
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
