"""Llama-family attention (Llama, Mistral, Qwen2/3, Gemma, SmolLM...): separate q/k/v/o_proj Linears.

Per-head query/key norms (Qwen3, OLMo2; ``q_norm``/``k_norm``) are left out of the per-head weights,
and they block rotations: a learned per-dim scale does not commute with a rotation. So does OLMo's
element-wise ``clip_qkv`` clamp.

Conversions may give a layer another number of KV heads (its ``k_proj``/``v_proj`` are replaced and
``num_key_value_groups`` updated; ``config.num_key_value_heads`` when every layer changes), and the
model types in :data:`~headwidget.adapters._partial_rope.PARTIAL_ROPE_MODEL_TYPES` get partial RoPE.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from headwidget.adapters._heads import HeadProjections, HeadSlices, head_index
from headwidget.adapters._partial_rope import PARTIAL_ROPE_MODEL_TYPES, install_partial_rope
from headwidget.adapters.base import Adapter, Tap, config_get
from headwidget.core.layout import AttentionLayout, Pairing, RopeLayout
from headwidget.core.weights import HeadWeights
from headwidget.errors import UnsupportedConversionError


class LlamaAdapter(Adapter):
    family = "llama"
    model_types = (
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "gemma",
        "gemma2",
        "olmo",
        "olmo2",
        "granite",
        "starcoder2",
        "cohere",
        "helium",
        "glm",
    )
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
        pairing: Pairing = "interleaved" if c.model_type in self.interleaved_rope else "half"
        return self.heads_layout(heads, kv, head_dim, c.hidden_size, RopeLayout(pairing, rotary_dim=rotary))

    def taps(self, attention: Any) -> list[Tap]:
        # Qwen3-style models normalise each key head before RoPE: that normed key is the pre-RoPE key.
        key_module = getattr(attention, "k_norm", None) or attention.k_proj
        return [Tap(key_module, "key"), Tap(attention.v_proj, "value")]

    def input_tap(self, attention: Any) -> Tap:
        return Tap(attention.k_proj, "input", on_input=True)

    def query_taps(self, attention: Any) -> list[Tap] | None:
        # As for keys: a model that normalises its query heads (q_norm) rotates the normed queries.
        return [Tap(getattr(attention, "q_norm", None) or attention.q_proj, "query")]

    def split_queries(self, parts: dict[str, torch.Tensor]) -> torch.Tensor:
        query = parts["query"]
        return query.reshape(*query.shape[:2], -1)

    def split(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        key = parts["key"]
        return {
            "key": key.reshape(*key.shape[:2], -1),
            "value": parts["value"],
        }

    def head_projections(self, attention: Any) -> HeadProjections:
        lay = self.layout()
        heads, d = lay.num_heads, lay.head_dim
        kv = attention.k_proj.out_features // d  # a converted layer may hold another count
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

    # ------------------------------------------------------------------ conversions
    resizable_kv_heads = True

    def kv_heads_blocker(self) -> str | None:
        """A key norm over every KV head at once (OLMo2's ``k_norm``, over G·d_h channels, where Qwen3's
        is per head) ties the heads together: another number of heads has no norm to take."""
        norm = getattr(self.attention_at(0), "k_norm", None)
        width = getattr(norm, "weight", None)
        d = self.layout().head_dim
        if width is None or width.numel() == d:
            return None
        return (
            f"its key norm (k_norm) normalises all its KV heads together ({width.numel()} channels, not "
            f"one head's {d}) with a learned scale per channel, so another number of KV heads (mha, gqa:G, "
            "mqa) has no norm to take; mla, lrkv, the kv: quantizers and share/merge/xkv keep its heads"
        )

    def write_head_weights(self, attention: Any, weights: HeadWeights) -> None:
        """As :meth:`Adapter.write_head_weights`; another KV-head count replaces ``k_proj``/``v_proj``."""
        d = self.layout().head_dim
        if weights.num_kv_heads != attention.k_proj.out_features // d:
            for name in ("k_proj", "v_proj"):
                old = getattr(attention, name)
                new = nn.Linear(
                    old.in_features,
                    weights.num_kv_heads * d,
                    bias=old.bias is not None,
                    device=old.weight.device,
                    dtype=old.weight.dtype,
                )
                new.weight.requires_grad_(old.weight.requires_grad)
                setattr(attention, name, new)
            attention.num_key_value_groups = weights.num_heads // weights.num_kv_heads
        super().write_head_weights(attention, weights)

    def set_config_kv_heads(self, num_kv_heads: int) -> None:
        self.config.num_key_value_heads = int(num_kv_heads)

    def partial_rope_blocker(self) -> str | None:
        lay = self.layout()
        model_type = getattr(self.config, "model_type", "")
        if model_type not in PARTIAL_ROPE_MODEL_TYPES:
            return super().partial_rope_blocker()
        if lay.rope.pairing != "half" or lay.rope.rotary_dim != lay.head_dim:
            return (
                f"partial RoPE needs half-split RoPE on every dim of a head; this {model_type} model has "
                f"{lay.rope.pairing!r} pairing on {lay.rope.rotary_dim} of {lay.head_dim} dims"
            )
        return None

    def set_partial_rope(self, attention: Any, keep: torch.Tensor) -> None:
        reason = self.partial_rope_blocker()
        if reason is not None:
            raise UnsupportedConversionError(reason)
        d = self.layout().head_dim
        kv = attention.k_proj.out_features // d
        if tuple(keep.shape) != (kv, d):
            raise UnsupportedConversionError(
                f"the partial-RoPE mask has shape {tuple(keep.shape)}; this layer needs ({kv}, {d})"
            )
        install_partial_rope(attention, keep)
