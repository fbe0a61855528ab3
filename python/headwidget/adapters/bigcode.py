"""GPT-BigCode (StarCoder): ``c_attn`` is [Q | K | V] with one shared K/V head when multi-query."""

from __future__ import annotations

from typing import Any

import torch

from headwidget.adapters.base import Adapter, Tap
from headwidget.core.layout import AttentionLayout, mechanism_of


class GPTBigCodeAdapter(Adapter):
    family = "gpt_bigcode"
    model_types = ("gpt_bigcode",)
    marker = "c_attn"

    def layout(self) -> AttentionLayout:
        c = self.config
        heads = c.n_head
        kv = 1 if c.multi_query else heads
        return AttentionLayout(
            family=self.family,
            mechanism=mechanism_of(heads, kv),
            num_layers=len(self.attention_modules()),
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=c.n_embd // heads,
            value_head_dim=c.n_embd // heads,
            hidden_size=c.n_embd,
        )

    def taps(self, attention: Any) -> list[Tap]:
        return [Tap(attention.c_attn, "qkv")]

    def split(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        c = self.config
        d, heads = c.n_embd, c.n_head
        head_dim = d // heads
        qkv = parts["qkv"]
        b, t = qkv.shape[:2]
        if c.multi_query:
            key, value = qkv[..., d : d + head_dim], qkv[..., d + head_dim :]
        else:
            per_head = qkv.reshape(b, t, heads, 3, head_dim)
            key = per_head[:, :, :, 1].reshape(b, t, -1)
            value = per_head[:, :, :, 2].reshape(b, t, -1)
        out = {"key": key, "value": value}
        return out
