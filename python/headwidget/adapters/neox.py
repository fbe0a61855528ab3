"""GPT-NeoX / Pythia: fused ``query_key_value`` laid out per head as [q | k | v]; partial rotary."""

from __future__ import annotations

from functools import cached_property

from headwidget.adapters._heads import FusedLayout
from headwidget.adapters.fused import FusedQKVAdapter
from headwidget.core.layout import AttentionLayout, RopeLayout


class GPTNeoXAdapter(FusedQKVAdapter):
    family = "gpt_neox"
    model_types = ("gpt_neox",)
    marker = "query_key_value"
    qkv_module = "query_key_value"
    out_module = "dense"

    def layout(self) -> AttentionLayout:
        c = self.config
        heads = c.num_attention_heads
        head_dim = c.hidden_size // heads
        rope = getattr(c, "rope_parameters", None) or {}
        factor = rope.get("partial_rotary_factor", getattr(c, "rotary_pct", 1.0))
        rope_layout = RopeLayout("half", rotary_dim=int(head_dim * factor))
        return self.heads_layout(heads, heads, head_dim, c.hidden_size, rope_layout)

    @cached_property
    def fused(self) -> FusedLayout:
        """Where each head's q, k and v sit among ``query_key_value``'s output features."""
        c = self.config
        return FusedLayout.per_head(c.num_attention_heads, c.hidden_size // c.num_attention_heads)
