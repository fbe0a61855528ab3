"""GPT-NeoX / Pythia: fused ``query_key_value`` laid out per head as [q | k | v]; partial rotary."""

from __future__ import annotations

from functools import cached_property
from typing import Any

import torch

from headwidget.adapters._heads import FusedLayout, HeadProjections, HeadSlices, head_index
from headwidget.adapters.base import Adapter, Tap
from headwidget.core.layout import AttentionLayout, RopeLayout


class GPTNeoXAdapter(Adapter):
    family = "gpt_neox"
    model_types = ("gpt_neox",)
    marker = "query_key_value"

    def layout(self) -> AttentionLayout:
        c = self.config
        heads = c.num_attention_heads
        head_dim = c.hidden_size // heads
        rope = getattr(c, "rope_parameters", None) or {}
        factor = rope.get("partial_rotary_factor", getattr(c, "rotary_pct", 1.0))
        return AttentionLayout(
            family=self.family,
            mechanism="mha",
            num_layers=len(self.attention_modules()),
            num_heads=heads,
            num_kv_heads=heads,
            head_dim=head_dim,
            value_head_dim=head_dim,
            hidden_size=c.hidden_size,
            rope=RopeLayout("half", rotary_dim=int(head_dim * factor)),
        )

    @cached_property
    def fused(self) -> FusedLayout:
        """Where each head's q, k and v sit among ``query_key_value``'s output features."""
        c = self.config
        return FusedLayout.per_head(c.num_attention_heads, c.hidden_size // c.num_attention_heads)

    def taps(self, attention: Any) -> list[Tap]:
        return [Tap(attention.query_key_value, "qkv")]

    def split(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        qkv = parts["qkv"]
        return {"key": self.fused.take(qkv, "k"), "value": self.fused.take(qkv, "v")}

    def head_projections(self, attention: Any) -> HeadProjections:
        f, c = self.fused, self.config
        heads = c.num_attention_heads
        return HeadProjections(
            q=HeadSlices(attention.query_key_value, f.q),
            k=HeadSlices(attention.query_key_value, f.k),
            v=HeadSlices(attention.query_key_value, f.v),
            o=HeadSlices(attention.dense, head_index(heads, c.hidden_size // heads)),
        )
