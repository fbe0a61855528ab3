"""DeepSeek-V2/V3 multi-head latent attention (MLA).

Per token the model caches a latent ``c = norm(W^DKV x)`` (``kv_lora_rank`` wide) and one shared
rotary key part ``k^R`` (``qk_rope_head_dim``). Each head's key is ``[W^UK_h c | k^R]`` and its value
``W^UV_h c``, both from ``kv_b_proj``. headwidget records the per-head K (nope part, then the shared
pre-RoPE rope part), the per-head V, and the latent as kind ``"latent"``.

Per-head weights are linearised: the latent RMSNorms are taken as their per-channel weight ``γ`` only
(the per-token 1/rms scale dropped), so ``k_h = [W^UK_h diag(γ) W^DKV ; W^KR]`` (nope dims, then the
shared decoupled RoPE key), ``v_h = W^UV_h diag(γ) W^DKV``.

Rotations: the nope dims of each head's key (rows of ``kv_b_proj`` and the matching query rows) and
each head's value (rows of ``kv_b_proj`` and columns of ``o_proj``) rotate per head exactly, because
they act after the latent norm. The rotary key dims are one key ``k^R`` shared by all heads (one
projection, ``kv_a_proj_with_mqa``), so a per-head rotation must leave them fixed
(:meth:`DeepseekAdapter.shared_key_dims`).
"""

from __future__ import annotations

from typing import Any

import torch

from headwidget.adapters._heads import HeadProjections, HeadSlices, head_index, weight_rows
from headwidget.adapters.base import Adapter, Tap
from headwidget.core.layout import AttentionLayout, RopeLayout
from headwidget.core.weights import HeadWeights
from headwidget.errors import StatsMismatchError, UnsupportedAlignmentError

F64 = torch.float64


def _cpu64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to("cpu", F64)


def _linear(module: Any) -> tuple[torch.Tensor, torch.Tensor | None]:
    bias = getattr(module, "bias", None)
    return _cpu64(weight_rows(module)), None if bias is None else _cpu64(bias)


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

    def conversion_blocker(self) -> str | None:
        return (
            "its attention is already multi-head latent attention (a latent plus a shared rotary key); "
            "only the 'model' variant is available for it"
        )

    def input_tap(self, attention: Any) -> Tap:
        return Tap(attention.kv_a_proj_with_mqa, "input", on_input=True)

    def split(self, parts: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        c = self.config
        heads, nope, rope, v = (
            c.num_attention_heads,
            c.qk_nope_head_dim,
            c.qk_rope_head_dim,
            c.v_head_dim,
        )
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

    def _query(self, attention: Any) -> Any:
        return attention.q_proj if getattr(attention, "q_proj", None) is not None else attention.q_b_proj

    def head_projections(self, attention: Any) -> HeadProjections:
        """The per-head part of the layer: query and key nope dims, values, output columns.

        The shared rotary key (``kv_a_proj_with_mqa``) and the latent path are not per head.
        """
        c = self.config
        heads, nope, rope, v = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        return HeadProjections(
            q=HeadSlices(self._query(attention), head_index(heads, nope, stride=nope + rope)),
            k=HeadSlices(attention.kv_b_proj, head_index(heads, nope, stride=nope + v)),
            v=HeadSlices(attention.kv_b_proj, head_index(heads, v, start=nope, stride=nope + v)),
            o=HeadSlices(attention.o_proj, head_index(heads, v)),
        )

    def read_head_weights(self, attention: Any) -> HeadWeights:
        c = self.config
        heads, lora, nope = c.num_attention_heads, c.kv_lora_rank, c.qk_nope_head_dim
        if getattr(attention, "q_proj", None) is not None:
            q, q_bias = _linear(attention.q_proj)
        else:
            q_a, q_a_bias = _linear(attention.q_a_proj)
            q_b, _ = _linear(attention.q_b_proj)
            q_b = q_b * _cpu64(attention.q_a_layernorm.weight)
            q, q_bias = q_b @ q_a, None if q_a_bias is None else q_b @ q_a_bias
        a, a_bias = _linear(attention.kv_a_proj_with_mqa)
        gamma = _cpu64(attention.kv_a_layernorm.weight)
        up = _cpu64(weight_rows(attention.kv_b_proj)).reshape(heads, nope + c.v_head_dim, lora) * gamma
        k_rope = a[lora:]
        k = torch.cat([up[:, :nope] @ a[:lora], k_rope.expand(heads, -1, -1)], dim=1)
        v = up[:, nope:] @ a[:lora]
        k_bias = v_bias = None
        if a_bias is not None:
            latent_bias = up @ a_bias[:lora]  # (heads, nope + d_v)
            k_bias = torch.cat([latent_bias[:, :nope], a_bias[lora:].expand(heads, -1)], dim=1)
            v_bias = latent_bias[:, nope:]
        o, o_bias = _linear(attention.o_proj)
        return HeadWeights(
            q=q.reshape(heads, -1, q.shape[-1]),
            k=k,
            v=v,
            o=o.reshape(o.shape[0], heads, -1).permute(1, 0, 2).contiguous(),
            q_bias=None if q_bias is None else q_bias.reshape(heads, -1),
            k_bias=k_bias,
            v_bias=v_bias,
            o_bias=o_bias,
            mechanism="mla",
            rope_dim=int(k_rope.shape[0]),
            latent_dim=int(lora),
        )

    def shared_key_dims(self) -> tuple[int, ...]:
        nope = self.config.qk_nope_head_dim
        return tuple(range(nope, nope + self.config.qk_rope_head_dim))

    def fold_rotations(self, layer: int, key_rotations: torch.Tensor, value_rotations: torch.Tensor) -> None:
        """As :meth:`Adapter.fold_rotations`, but key rotations must leave the shared rotary dims fixed.

        Raises:
            UnsupportedAlignmentError: a key rotation moves the shared rotary key dims.
            StatsMismatchError: the rotations do not have one ``d × d`` block per head.
        """
        c = self.config
        heads, nope = c.num_attention_heads, c.qk_nope_head_dim
        d = nope + c.qk_rope_head_dim
        if tuple(key_rotations.shape) != (heads, d, d):
            raise StatsMismatchError(
                f"key rotations have shape {tuple(key_rotations.shape)}; this layer needs "
                f"({heads}, {d}, {d}) (one per head): fit them on statistics of this model"
            )
        r = key_rotations.to(F64)
        eye = torch.eye(d, dtype=F64, device=r.device)
        gap = torch.cat([(r[:, :, nope:] - eye[:, nope:]).reshape(-1), r[:, nope:, :nope].reshape(-1)])
        moved = float(gap.abs().max()) if gap.numel() else 0.0
        if moved > 1e-9:
            raise UnsupportedAlignmentError(
                f"key dims {nope}..{d - 1} are DeepSeek's decoupled rotary key, one vector shared by all "
                "heads (kv_a_proj_with_mqa): a per-head rotation cannot be folded there. Rotate only the "
                f"first {nope} (no-RoPE) dims and keep the identity on the rest"
            )
        super().fold_rotations(layer, key_rotations[:, :nope, :nope].contiguous(), value_rotations)
