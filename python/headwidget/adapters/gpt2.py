"""GPT-2: one fused Conv1D ``c_attn`` producing [Q | K | V], each ``hidden_size`` wide, heads contiguous."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import torch

from headwidget.adapters._heads import FusedLayout, HeadProjections, HeadSlices, head_index
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

    @cached_property
    def fused(self) -> FusedLayout:
        """Where each head's q, k and v sit among ``c_attn``'s output features."""
        c = self.config
        return FusedLayout.blocks(c.n_head, c.n_head, c.n_embd // c.n_head)

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
