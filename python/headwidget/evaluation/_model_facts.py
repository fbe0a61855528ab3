"""What fitting asks of a model before anything is fitted: its layers, the source of its statistics,
the K/V elements each layer caches as it is now, and the modules a conversion writes into.

Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> from headwidget.adapters import adapter_for
    >>> adapter = adapter_for(GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)))
    >>> resolve_layers(adapter, None), layer_kv_elements(adapter, 0)  # 4 heads × (8 + 8)
    ([0, 1], 64)
    >>> converted_modules(adapter.model, adapter, [1])  # GPT-2 keeps every projection in its attention
    ['transformer.h.1.attn', 'transformer.h.1.attn.c_attn', 'transformer.h.1.attn.c_proj']
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn

from headwidget.adapters import Adapter
from headwidget.analysis.conversions import check_stats_source
from headwidget.checks import layer_indices
from headwidget.errors import StatsMismatchError, UnsupportedModelError
from headwidget.stats import KVStats

__all__ = ["check_stats", "converted_modules", "layer_kv_elements", "output_vocab", "resolve_layers"]


def resolve_layers(adapter: Adapter, layers: Iterable[int] | None) -> list[int]:
    """Sorted, distinct, non-negative layer indices (default: every layer).

    Raises:
        ArgumentError: ``layers`` is not a non-empty list of integers
            (:func:`headwidget.checks.layer_indices`).
        LayerIndexError: an index outside the model.
    """
    total = adapter.layout().num_layers
    if layers is None:
        return list(range(total))
    return layer_indices("layers", layers, total)


def check_stats(
    model: nn.Module, adapter: Adapter, stats: KVStats | None, *, allow_other_weights: bool = False
) -> None:
    """Refuse statistics captured from another model.

    ``model`` is the model as the caller gave it (before any cast to another dtype), whose weight
    fingerprint (:mod:`headwidget.adapters.fingerprint`) must be the one the statistics recorded unless
    ``allow_other_weights``. Statistics without a fingerprint (files of older versions) are accepted
    with a warning.

    Raises:
        StatsMismatchError: the model class, its config or its attention layout differ, or the
            statistics come from other weights (a base model's statistics for its fine-tune).
    """
    check_stats_source(model, stats, allow_other_weights=allow_other_weights)
    if stats is None:
        return
    if stats.meta.layout != adapter.layout():
        raise StatsMismatchError(
            "these statistics were captured from a model with another attention layout; capture them "
            "from this model"
        )


def layer_kv_elements(adapter: Adapter, layer: int) -> int:
    """Cached K/V elements per token of ``layer`` as the model holds it now (latent + rotary key for MLA)."""
    lay = adapter.layout()
    if lay.mechanism == "mla" and lay.latent_dim:
        return int(lay.latent_dim) + lay.rope.rotary_dim
    return adapter.kv_heads_of(adapter.attention_at(layer)) * (lay.head_dim + lay.value_head_dim)


def output_vocab(model: nn.Module) -> int:
    """The rows of ``model``'s output embedding (the logits' width), or 0 without an LM head."""
    get_head = getattr(model, "get_output_embeddings", None)
    weight = getattr(get_head() if callable(get_head) else None, "weight", None)
    return int(weight.shape[0]) if isinstance(weight, torch.Tensor) and weight.ndim == 2 else 0


def converted_modules(model: nn.Module, adapter: Adapter, layers: Iterable[int]) -> list[str]:
    """The names of the modules a conversion of ``layers`` writes into, each once: every layer's
    attention and the modules that hold its head projections (BERT keeps its output projection beside
    its attention, not in it). MLPs and norms are never among them."""
    names = {id(m): n for n, m in model.named_modules()}
    out: list[str] = []
    for layer in layers:
        attention = adapter.attention_at(layer)
        try:
            projections = adapter.head_projections(attention).modules()
        except UnsupportedModelError:  # a family that does not say where its heads are (MLA)
            projections = ()
        for module in (attention, *projections):
            if names[id(module)] not in out:
                out.append(names[id(module)])
    return out
