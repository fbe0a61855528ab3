"""GPT-BigCode (StarCoder): ``c_attn`` is [Q | K | V] with one shared K/V head when multi-query.

Without multi-query, ``c_attn`` is laid out per head as [q | k | v] (how the model views it).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import torch

from headwidget.adapters._heads import FusedLayout, HeadProjections, HeadSlices, head_index
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

    @cached_property
    def fused(self) -> FusedLayout:
        """Where each head's q, k and v sit among ``c_attn``'s output features."""
        c = self.config
        head_dim = c.n_embd // c.n_head
        if c.multi_query:
            return FusedLayout.blocks(c.n_head, 1, head_dim)
        return FusedLayout.per_head(c.n_head, head_dim)

    def taps(self, attention: Any) -> list[Tap]:
        return [Tap(attention.c_attn, "qkv")]

    def split(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        qkv = parts["qkv"]
        return {"key": self.fused.take(qkv, "k"), "value": self.fused.take(qkv, "v")}

    def head_projections(self, attention: Any) -> HeadProjections:
        f, c = self.fused, self.config
        return HeadProjections(
            q=HeadSlices(attention.c_attn, f.q),
            k=HeadSlices(attention.c_attn, f.k),
            v=HeadSlices(attention.c_attn, f.v),
            o=HeadSlices(attention.c_proj, head_index(c.n_head, c.n_embd // c.n_head)),
        )
