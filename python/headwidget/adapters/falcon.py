"""Falcon: fused ``query_key_value`` in one of three layouts (new decoder, multi-query, per-head MHA).

Falcon does not route its attention through ``transformers.AttentionInterface``, so post-RoPE keys are
not captured for it.
"""

from __future__ import annotations

from typing import Any

import torch

from headwidget.adapters.base import Adapter, Tap, config_get
from headwidget.core.layout import AttentionLayout, RopeLayout, mechanism_of


class FalconAdapter(Adapter):
    family = "falcon"
    model_types = ("falcon",)
    marker = "query_key_value"
    routes_through_interface = False

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
        return AttentionLayout(
            family=self.family,
            mechanism=mechanism_of(heads, kv),
            num_layers=len(self.attention_modules()),
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=head_dim,
            value_head_dim=head_dim,
            hidden_size=c.hidden_size,
            rope=rope,
        )

    def taps(self, attention: Any) -> list[Tap]:
        return [Tap(attention.query_key_value, "qkv")]

    def split(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        c = self.config
        heads = c.num_attention_heads
        head_dim = c.hidden_size // heads
        qkv = parts["qkv"]
        b, t = qkv.shape[:2]
        if c.new_decoder_architecture:
            kv = self._kv_heads()
            grouped = qkv.reshape(b, t, kv, heads // kv + 2, head_dim)
            key, value = grouped[:, :, :, -2], grouped[:, :, :, -1]
        elif c.multi_query:
            flat = qkv.reshape(b, t, heads + 2, head_dim)
            key, value = flat[:, :, -2], flat[:, :, -1]
        else:
            per_head = qkv.reshape(b, t, heads, 3, head_dim)
            key, value = per_head[:, :, :, 1], per_head[:, :, :, 2]
        out = {"key": key.reshape(b, t, -1), "value": value.reshape(b, t, -1)}
        return out
