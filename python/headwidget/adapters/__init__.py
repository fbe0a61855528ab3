"""The adapter registry: one adapter per model family (the single source of the supported-model table)."""

from __future__ import annotations

from torch import nn

from headwidget.adapters._heads import HeadProjections
from headwidget.adapters._partial_rope import partial_rope_mask
from headwidget.adapters.base import Adapter, Tap
from headwidget.adapters.bert import BertAdapter
from headwidget.adapters.bigcode import GPTBigCodeAdapter
from headwidget.adapters.deepseek import DeepseekAdapter
from headwidget.adapters.falcon import FalconAdapter
from headwidget.adapters.fingerprint import weight_fingerprint
from headwidget.adapters.gpt2 import GPT2Adapter
from headwidget.adapters.llama import LlamaAdapter
from headwidget.adapters.neox import GPTNeoXAdapter
from headwidget.errors import UnsupportedModelError

__all__ = [
    "ADAPTERS",
    "Adapter",
    "HeadProjections",
    "Tap",
    "adapter_for",
    "partial_rope_mask",
    "supported_families",
    "weight_fingerprint",
]

ADAPTERS: tuple[type[Adapter], ...] = (
    LlamaAdapter,
    GPT2Adapter,
    GPTNeoXAdapter,
    FalconAdapter,
    GPTBigCodeAdapter,
    BertAdapter,
    DeepseekAdapter,
)


def supported_families() -> dict[str, tuple[str, ...]]:
    """``family → config.model_type values`` it accepts.

    >>> supported_families()["gpt2"]
    ('gpt2',)
    """
    return {a.family: a.model_types for a in ADAPTERS}


def adapter_for(model: nn.Module) -> Adapter:
    """The adapter for ``model``; raises :class:`UnsupportedModelError` naming what is supported.

    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> adapter = adapter_for(GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)))
    >>> adapter.family, adapter.layout().num_kv_heads
    ('gpt2', 4)
    """
    for cls in ADAPTERS:
        if cls.matches(model):
            return cls(model)
    model_type = getattr(getattr(model, "config", None), "model_type", None)
    families = "; ".join(f"{f} ({', '.join(t)})" for f, t in supported_families().items())
    raise UnsupportedModelError(
        f"headwidget has no capture adapter for {type(model).__name__} "
        f"(config.model_type={model_type!r}). Supported families (model_type values): {families}."
    )
