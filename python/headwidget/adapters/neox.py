"""GPT-NeoX / Pythia: fused ``query_key_value`` laid out per head as [q | k | v]; partial rotary."""

from __future__ import annotations

from typing import Any

import torch

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

    def taps(self, attention: Any) -> list[Tap]:
        return [Tap(attention.query_key_value, "qkv")]

    def split(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        c = self.config
        heads = c.num_attention_heads
        qkv = parts["qkv"]
        b, t = qkv.shape[:2]
        per_head = qkv.reshape(b, t, heads, 3, -1)
        out = {
            "key": per_head[:, :, :, 1].reshape(b, t, -1),
            "value": per_head[:, :, :, 2].reshape(b, t, -1),
        }
        return out
