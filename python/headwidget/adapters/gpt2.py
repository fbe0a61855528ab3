"""GPT-2: one fused Conv1D ``c_attn`` producing [Q | K | V], each ``hidden_size`` wide, heads contiguous."""

from __future__ import annotations

from functools import cached_property

from headwidget.adapters._heads import FusedLayout
from headwidget.adapters.fused import FusedQKVAdapter
from headwidget.core.layout import AttentionLayout


class GPT2Adapter(FusedQKVAdapter):
    family = "gpt2"
    mlp_width_field, mlp_width_default = "n_inner", 4  # n_inner None: 4 × n_embd
    model_types = ("gpt2",)
    marker = "c_attn"
    qkv_module = "c_attn"
    out_module = "c_proj"

    def layout(self) -> AttentionLayout:
        c = self.config
        return self.heads_layout(c.n_head, c.n_head, c.n_embd // c.n_head, c.n_embd)

    @cached_property
    def fused(self) -> FusedLayout:
        """Where each head's q, k and v sit among ``c_attn``'s output features."""
        c = self.config
        return FusedLayout.blocks(c.n_head, c.n_head, c.n_embd // c.n_head)
