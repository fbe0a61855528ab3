"""GPT-BigCode (StarCoder): ``c_attn`` is [Q | K | V] with one shared K/V head when multi-query.

Without multi-query, ``c_attn`` is laid out per head as [q | k | v] (how the model views it).
"""

from __future__ import annotations

from functools import cached_property

from headwidget.adapters._heads import FusedLayout
from headwidget.adapters.fused import FusedQKVAdapter
from headwidget.core.layout import AttentionLayout


class GPTBigCodeAdapter(FusedQKVAdapter):
    family = "gpt_bigcode"
    mlp_width_field, mlp_width_default = "n_inner", 4  # n_inner None: 4 × n_embd
    model_types = ("gpt_bigcode",)
    marker = "c_attn"
    qkv_module = "c_attn"
    out_module = "c_proj"

    def layout(self) -> AttentionLayout:
        c = self.config
        heads = c.n_head
        kv = 1 if c.multi_query else heads
        return self.heads_layout(heads, kv, c.n_embd // heads, c.n_embd)

    @cached_property
    def fused(self) -> FusedLayout:
        """Where each head's q, k and v sit among ``c_attn``'s output features."""
        c = self.config
        head_dim = c.n_embd // c.n_head
        if c.multi_query:
            return FusedLayout.blocks(c.n_head, 1, head_dim)
        return FusedLayout.per_head(c.n_head, head_dim)
