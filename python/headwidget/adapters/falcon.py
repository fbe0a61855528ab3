"""Falcon: fused ``query_key_value`` in one of three layouts (new decoder, multi-query, per-head MHA).

- new decoder architecture: per KV group ``[q … q | k | v]`` (GQA);
- multi-query: ``[Q | k | v]``, one shared K/V head (the same layout with one group);
- otherwise: per head ``[q | k | v]`` (MHA).

Falcon's attention calls ``transformers.AttentionInterface`` in recent transformers releases (5.25
does) and computed attention itself in earlier 5.x ones: whether post-RoPE keys can be captured and
K/V quantizers run is read from the installed ``FalconAttention`` (:func:`calls_attention_interface`).
Rotations fold exactly under RoPE and under ALiBi alike (ALiBi adds a bias to the scores that does not
depend on q or k).
"""

from __future__ import annotations

from functools import cached_property

from torch import nn

from headwidget.adapters._heads import FusedLayout
from headwidget.adapters.base import calls_attention_interface, config_get
from headwidget.adapters.fused import FusedQKVAdapter
from headwidget.core.layout import AttentionLayout, RopeLayout


class FalconAdapter(FusedQKVAdapter):
    family = "falcon"
    mlp_width_field, mlp_width_default = "ffn_hidden_size", 4  # None: 4 × hidden_size
    model_types = ("falcon",)
    marker = "query_key_value"
    qkv_module = "query_key_value"
    out_module = "dense"

    def __init__(self, model: nn.Module) -> None:
        super().__init__(model)
        attentions = self.attention_modules()
        self.routes_through_interface = bool(attentions) and calls_attention_interface(type(attentions[0]))

    def _kv_heads(self) -> int:
        c = self.config
        if c.new_decoder_architecture:
            return config_get(c, "num_kv_heads", default=c.num_attention_heads)
        return 1 if c.multi_query else c.num_attention_heads

    def layout(self) -> AttentionLayout:
        c = self.config
        heads = c.num_attention_heads
        head_dim = c.hidden_size // heads
        kv = self._kv_heads()
        rope = RopeLayout() if c.alibi else RopeLayout("half", rotary_dim=head_dim)
        return self.heads_layout(heads, kv, head_dim, c.hidden_size, rope)

    @cached_property
    def fused(self) -> FusedLayout:
        """Where each head's q, k and v sit among ``query_key_value``'s output features."""
        c = self.config
        heads = c.num_attention_heads
        head_dim = c.hidden_size // heads
        if c.new_decoder_architecture or c.multi_query:
            return FusedLayout.grouped(heads, self._kv_heads(), head_dim)
        return FusedLayout.per_head(heads, head_dim)
