"""DeepSeek-V2/V3 multi-head latent attention (MLA).

Per token the model caches a latent ``c = norm(W^DKV x)`` (``kv_lora_rank`` wide) and one shared
rotary key part ``k^R`` (``qk_rope_head_dim``). Each head's key is ``[W^UK_h c | k^R]`` and its value
``W^UV_h c``, both from ``kv_b_proj``. headwidget records the per-head K (nope part, then the shared
pre-RoPE rope part), the per-head V, and the latent as kind ``"latent"``.
"""

from __future__ import annotations

from typing import Any

import torch

from headwidget.adapters.base import Adapter, Tap
from headwidget.core.layout import AttentionLayout, RopeLayout


class DeepseekAdapter(Adapter):
    family = "deepseek"
    model_types = ("deepseek_v2", "deepseek_v3")
    marker = "kv_b_proj"

    def layout(self) -> AttentionLayout:
        c = self.config
        nope, rope, v = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        if c.model_type == "deepseek_v2":
            rope_layout = RopeLayout("interleaved", rotary_dim=rope, offset=nope)
        elif getattr(c, "rope_interleave", True):
            # V3 rotates the interleaved pairs and writes them out de-interleaved (rotate_half order).
            rope_layout = RopeLayout("interleaved", rotary_dim=rope, offset=nope, post_pairing="half")
        else:
            rope_layout = RopeLayout("half", rotary_dim=rope, offset=nope)
        return AttentionLayout(
            family=self.family,
            mechanism="mla",
            num_layers=len(self.attention_modules()),
            num_heads=c.num_attention_heads,
            num_kv_heads=c.num_attention_heads,
            head_dim=nope + rope,
            value_head_dim=v,
            hidden_size=c.hidden_size,
            rope=rope_layout,
            latent_dim=c.kv_lora_rank,
        )

    def taps(self, attention: Any) -> list[Tap]:
        return [
            Tap(attention.kv_a_proj_with_mqa, "compressed"),
            Tap(attention.kv_a_layernorm, "latent"),
            Tap(attention.kv_b_proj, "expanded"),
        ]

    def input_tap(self, attention: Any) -> Tap:
        return Tap(attention.kv_a_proj_with_mqa, "input", on_input=True)

    def split(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        c = self.config
        heads, nope, rope, v = (
            c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim,
        )  # fmt: skip
        compressed = parts["compressed"]
        b, t = compressed.shape[:2]
        k_rope = compressed[..., c.kv_lora_rank :]
        expanded = parts["expanded"].reshape(b, t, heads, nope + v)
        k_nope, value = expanded[..., :nope], expanded[..., nope:]
        key = torch.cat([k_nope, k_rope.reshape(b, t, 1, rope).expand(b, t, heads, rope)], dim=-1)
        out = {
            "key": key.reshape(b, t, -1),
            "value": value.reshape(b, t, -1),
            "latent": parts["latent"].reshape(b, t, -1),
        }
        return out
