"""What fitting asks of a model before anything is fitted: its layers, the source of its statistics,
and the K/V elements each layer caches as it is now.

Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> from headwidget.adapters import adapter_for
    >>> adapter = adapter_for(GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)))
    >>> resolve_layers(adapter, None), layer_kv_elements(adapter, 0)  # 4 heads × (8 + 8)
    ([0, 1], 64)
"""

from __future__ import annotations

from collections.abc import Iterable

from torch import nn

from headwidget.adapters import Adapter
from headwidget.analysis.conversions import _check_stats_source
from headwidget.checks import layer_indices
from headwidget.errors import StatsMismatchError
from headwidget.stats import KVStats

__all__ = ["check_stats", "layer_kv_elements", "resolve_layers"]


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
    _check_stats_source(model, stats, allow_other_weights=allow_other_weights)
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
