"""Llama-family attention (Llama, Mistral, Qwen2/3, Gemma, SmolLM...): separate q/k/v/o_proj Linears.

Per-head query/key norms (Qwen3, OLMo2; ``q_norm``/``k_norm``) are left out of the per-head weights,
and they block rotations: a learned per-dim scale does not commute with a rotation. So does OLMo's
element-wise ``clip_qkv`` clamp.
"""

from __future__ import annotations

from typing import Any

import torch

from headwidget.adapters._heads import HeadProjections, HeadSlices, head_index
from headwidget.adapters.base import Adapter, Tap, config_get
from headwidget.core.layout import AttentionLayout, RopeLayout, mechanism_of


class LlamaAdapter(Adapter):
    family = "llama"
    model_types = (
        "llama", "mistral", "qwen2", "qwen3", "gemma", "gemma2", "olmo", "olmo2", "granite",
        "starcoder2", "cohere", "helium", "glm",
    )  # fmt: skip
    #: Families whose ``rotate_half`` pairs dims (2m, 2m+1) instead of (m, m + d/2).
    interleaved_rope = ("cohere", "helium", "glm")
    marker = "k_proj"

    def layout(self) -> AttentionLayout:
        c = self.config
        heads = c.num_attention_heads
        kv = config_get(c, "num_key_value_heads", default=heads)
        head_dim = config_get(c, "head_dim", default=c.hidden_size // heads)
        rope = getattr(c, "rope_parameters", None) or {}
        factor = rope.get("partial_rotary_factor", getattr(c, "partial_rotary_factor", 1.0))
        rotary = int(head_dim * factor)
        pairing = "interleaved" if c.model_type in self.interleaved_rope else "half"
        return AttentionLayout(
            family=self.family,
            mechanism=mechanism_of(heads, kv),
            num_layers=len(self.attention_modules()),
            num_heads=heads,
            num_kv_heads=kv,
            head_dim=head_dim,
            value_head_dim=head_dim,
            hidden_size=c.hidden_size,
            rope=RopeLayout(pairing, rotary_dim=rotary),
        )

    def taps(self, attention: Any) -> list[Tap]:
        # Qwen3-style models normalise each key head before RoPE: that normed key is the pre-RoPE key.
        key_module = getattr(attention, "k_norm", None) or attention.k_proj
        return [Tap(key_module, "key"), Tap(attention.v_proj, "value")]

    def input_tap(self, attention: Any) -> Tap:
        return Tap(attention.k_proj, "input", on_input=True)

    def split(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        key = parts["key"]
        return {
            "key": key.reshape(*key.shape[:2], -1),
            "value": parts["value"],
        }

    def head_projections(self, attention: Any) -> HeadProjections:
        lay = self.layout()
        heads, kv, d = lay.num_heads, lay.num_kv_heads, lay.head_dim
        return HeadProjections(
            q=HeadSlices(attention.q_proj, head_index(heads, d)),
            k=HeadSlices(attention.k_proj, head_index(kv, d)),
            v=HeadSlices(attention.v_proj, head_index(kv, d)),
            o=HeadSlices(attention.o_proj, head_index(heads, d)),
        )

    def fold_blocker(self, attention: Any) -> str | None:
        norms = [n for n in ("q_norm", "k_norm") if getattr(attention, n, None) is not None]
        if norms:
            return (
                f"it normalises its queries/keys ({'/'.join(norms)}) with a learned per-dim scale, which "
                "does not commute with rotations, so its heads cannot be rotated exactly; use align() to "
                "inspect its heads without changing the model"
            )
        if getattr(self.config, "clip_qkv", None) is not None:
            return (
                f"it clamps q/k/v element-wise (clip_qkv={self.config.clip_qkv}), which does not commute "
                "with rotations; use align() to inspect its heads without changing the model"
            )
        return super().fold_blocker(attention)
