"""BERT-style encoders (BERT, MiniLM, RoBERTa...): separate ``key`` / ``value`` Linear layers, no RoPE."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from headwidget.adapters.base import Adapter, Tap
from headwidget.core.layout import AttentionLayout


class BertAdapter(Adapter):
    family = "bert"
    model_types = ("bert", "roberta", "xlm-roberta", "camembert", "electra")
    marker = "key"

    def attention_modules(self) -> list[nn.Module]:
        return [m for m in super().attention_modules() if hasattr(m, "value") and hasattr(m, "query")]

    def layout(self) -> AttentionLayout:
        c = self.config
        heads = c.num_attention_heads
        return AttentionLayout(
            family=self.family,
            mechanism="mha",
            num_layers=len(self.attention_modules()),
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=c.hidden_size // heads,
            value_head_dim=c.hidden_size // heads,
            hidden_size=c.hidden_size,
        )

    def taps(self, attention: Any) -> list[Tap]:
        return [Tap(attention.key, "key"), Tap(attention.value, "value")]

    def split(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        return {"key": parts["key"], "value": parts["value"]}
