"""The cross-layer parts of a variant (``share:g``, ``merge:g``, ``xkv:r/g``), fitted for a model.

:func:`cross_layer_parts` turns the cross-layer parts of a parsed spec into what runs:
:class:`~headwidget.evaluation._sharing.SharedKV` for ``share`` (the model reads shared K/V in every
forward) and cache transforms for ``merge`` and ``xkv``
(:mod:`headwidget.evaluation._cache_transforms`, after a prefill only), over the groups of
:func:`~headwidget.analysis.cross_layer.layer_groups` within each part's layers. A ``share`` reader
caches nothing (its fit's elements become 0).

Example:
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from headwidget.adapters import adapter_for
    >>> from headwidget.analysis.variants import parse_variant
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=5, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> parts = cross_layer_parts(adapter_for(model), parse_variant("share:2@0-4"), [0, 1, 2, 3, 4], {})
    >>> parts.sharing[0].groups, parts.readers
    ([[0, 1], [2, 3], [4]], {1: 0, 3: 2})
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace

from headwidget.adapters import Adapter
from headwidget.analysis.cross_layer import layer_groups
from headwidget.analysis.variant_fits import LayerFit
from headwidget.analysis.variants import MixedSpec, Variant, VariantSpec, uniform_parts
from headwidget.errors import UnsupportedConversionError
from headwidget.evaluation._cache_transforms import GroupTransform, MergedCache, SharedSVDCache
from headwidget.evaluation._sharing import SharedKV, cross_layer_blocker, mixed_attention_blocker

__all__ = ["CrossLayerParts", "cross_layer_parts", "refuse_cache_transforms", "refuse_residual"]


@dataclass
class CrossLayerParts:
    """The ``share`` parts and the cache transforms of one variant, and its readers (reader → source)."""

    sharing: list[SharedKV] = field(default_factory=list)
    caches: list[GroupTransform] = field(default_factory=list)

    @property
    def readers(self) -> dict[int, int]:
        return {r: s for shared in self.sharing for r, s in shared.readers.items()}

    def groups(self) -> list[tuple[list[int], str]]:
        """Every group a part acts on (two or more layers; xKV's also one) and the spec part it belongs to."""
        out = [(g, s.spec) for s in self.sharing for g in s.acting]
        return out + [(g, c.spec) for c in self.caches for g in c.acting]

    def __bool__(self) -> bool:
        return bool(self.sharing or self.caches)


def _shapes(
    adapter: Adapter, fits: Mapping[int, LayerFit], layers: Sequence[int]
) -> dict[int, tuple[int, int, int]]:
    """Per layer (KV heads, key channels, value channels) of the cache the layer's mechanism holds."""
    lay = adapter.layout()
    d_k, d_v = lay.head_dim, lay.value_head_dim
    out = {}
    for layer in layers:
        fit = fits.get(layer)
        heads = (
            fit.kv_elements // (d_k + d_v)
            if fit is not None
            else adapter.kv_heads_of(adapter.attention_at(layer))
        )
        out[layer] = (heads, heads * d_k, heads * d_v)
    return out


def cross_layer_parts(
    adapter: Adapter, parsed: Variant, chosen: Sequence[int], fits: dict[int, LayerFit]
) -> CrossLayerParts:
    """The cross-layer parts of ``parsed`` (over ``chosen`` for a uniform spec), and ``fits`` updated in
    place: a ``share`` reader caches nothing.

    Raises:
        UnsupportedConversionError: a family whose attention does not go through
            ``transformers.AttentionInterface``, an MLA model, or a group of layers that attend
            differently (sliding-window and full).
    """
    out = CrossLayerParts()
    parts = parsed.parts if isinstance(parsed, MixedSpec) else ((parsed, tuple(chosen)),)
    for part, layers in parts:
        cross = part.cross
        if cross is None:
            continue
        groups = layer_groups(layers, cross.group)
        reason = cross_layer_blocker(adapter.model) or mixed_attention_blocker(adapter.model, groups)
        if reason is not None:
            raise UnsupportedConversionError(f"{part.text}: {reason}")
        if cross.kind == "share":
            shared = SharedKV(part.text, groups)
            out.sharing.append(shared)
            for reader in shared.readers:
                if reader in fits:
                    fits[reader] = replace(fits[reader], kv_elements=0)
            continue
        shapes = _shapes(adapter, fits, layers)
        if cross.kind == "merge":
            out.caches.append(MergedCache(part.text, groups, shapes))
        else:
            ranks = cross.ranks
            out.caches.append(SharedSVDCache(part.text, groups, ranks["key"], shapes, ranks["value"]))
    return out


def refuse_cache_transforms(specs: Sequence[VariantSpec | Variant], protocol: str) -> None:
    """Refuse ``merge``/``xkv`` parts, and a ``kv:int`` residual (``r{R}``), under a protocol without a
    prefill (they act on a prefilled cache, and a forward of a whole window has none)."""
    for spec in specs:
        for part in uniform_parts(spec):
            refuse_residual(part, f"protocol {protocol!r} scores whole windows in one forward")
            if part.cross is not None and part.cross.cache_transform:
                raise UnsupportedConversionError(
                    f"{spec.text}: {part.cross.text} transforms the KV cache a prefill built, and protocol "
                    f"{protocol!r} scores whole windows in one forward with no cache; evaluate it with "
                    "protocol='prefill:P' (P prefill tokens, the rest scored from the transformed cache)"
                )


def refuse_residual(part: VariantSpec, where: str) -> None:
    """Refuse a ``kv:int`` residual (``r{R}``) where no prefilled cache keeps it (``where`` says why):
    there the spec would be the same numbers as without it."""
    if part.residual is not None and part.residual != part.group:
        raise UnsupportedConversionError(
            f"{part.text}: r{part.residual} is KIVI's residual of a deployed cache, the newest prefilled "
            f"tokens it keeps exact, and {where}, with no prefilled cache; evaluate it with "
            "protocol='prefill:P', or drop r (fake quantization of whole forwards quantizes every token)"
        )
