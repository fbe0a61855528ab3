"""GPT-2: one fused Conv1D ``c_attn`` producing [Q | K | V], each ``hidden_size`` wide, heads contiguous."""

from __future__ import annotations

from typing import Any

import torch

from headwidget.adapters.base import Adapter, Tap
from headwidget.core.layout import AttentionLayout


class GPT2Adapter(Adapter):
    family = "gpt2"
    model_types = ("gpt2",)
    marker = "c_attn"

    def layout(self) -> AttentionLayout:
        c = self.config
        return AttentionLayout(
            family=self.family,
            mechanism="mha",
            num_layers=len(self.attention_modules()),
            num_heads=c.n_head,
            num_kv_heads=c.n_head,
            head_dim=c.n_embd // c.n_head,
            value_head_dim=c.n_embd // c.n_head,
            hidden_size=c.n_embd,
        )

    def taps(self, attention: Any) -> list[Tap]:
        return [Tap(attention.c_attn, "qkv")]

    def split(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        d = self.config.n_embd
        qkv = parts["qkv"]
        out = {"key": qkv[..., d : 2 * d], "value": qkv[..., 2 * d :]}
        return out
