"""Per-head attention weights of one layer of a real model, split the way its forward pass splits them.

``head_weights(model, layer)`` returns float64 CPU tensors in one convention for every family:
``q`` (H, d_h, d), ``k`` (G, d_h, d), ``v`` (G, d_v, d) with ``k_head = W_K[g] x``, and ``o`` (H, d, d_v)
with the layer output ``Σ_h W_O[h] v_h``; biases ``q_bias`` (H, d_h), ``k_bias`` (G, d_h),
``v_bias`` (G, d_v), ``o_bias`` (d,), or None. Query head h reads KV head ``h // (H / G)``.

Fused projections are split exactly as the capture adapters split their outputs (GPT-2 ``[Q|K|V]``;
GPT-NeoX per-head ``[q|k|v]``; Falcon's three layouts; GPT-BigCode multi-query ``[Q|k|v]``).
DeepSeek MLA is linearised: the latent RMSNorm is taken as its per-channel weight only (its per-token
1/rms scale dropped), so ``k_h = [W^UK_h diag(γ) W^DKV ; W^KR]`` (nope dims, then the shared decoupled
RoPE key), ``v_h = W^UV_h diag(γ) W^DKV``. Per-head query/key norms (Qwen3, OLMo2) are ignored likewise.

Example:
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4))
    >>> w = head_weights(model, 0)
    >>> tuple(w.q.shape), tuple(w.k.shape), tuple(w.o.shape), w.mechanism
    ((4, 8, 32), (4, 8, 32), (4, 32, 8), 'mha')
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headwidget.adapters import adapter_for
from headwidget.errors import LayerIndexError, UnsupportedModelError

__all__ = ["HeadWeights", "head_weights"]

F64 = torch.float64


@dataclass(frozen=True)
class HeadWeights:
    """Per-head projections of one attention layer (see the module docstring for the convention)."""

    q: torch.Tensor
    k: torch.Tensor
    v: torch.Tensor
    o: torch.Tensor
    q_bias: torch.Tensor | None = None
    k_bias: torch.Tensor | None = None
    v_bias: torch.Tensor | None = None
    o_bias: torch.Tensor | None = None
    mechanism: str = "mha"
    rope_dim: int = 0
    latent_dim: int | None = None

    @property
    def num_heads(self) -> int:
        return int(self.q.shape[0])

    @property
    def num_kv_heads(self) -> int:
        return int(self.k.shape[0])

    @property
    def kv_of(self) -> torch.Tensor:
        """The KV head each query head reads, (H,).

        >>> z = torch.zeros
        >>> w = HeadWeights(q=z(4, 2, 8), k=z(2, 2, 8), v=z(2, 2, 8), o=z(4, 8, 2))
        >>> w.kv_of.tolist(), w.kv_elements()
        ([0, 0, 1, 1], 8)
        """
        return torch.arange(self.num_heads) // (self.num_heads // self.num_kv_heads)

    def kv_elements(self) -> int:
        """Cached K/V elements per token for this layer as the model stores them."""
        if self.mechanism == "mla" and self.latent_dim is not None:
            return self.latent_dim + self.rope_dim
        return self.num_kv_heads * (int(self.k.shape[1]) + int(self.v.shape[1]))


def _w(module: Any) -> torch.Tensor:
    return module.weight.detach().to("cpu", F64)


def _b(module: Any) -> torch.Tensor | None:
    bias = getattr(module, "bias", None)
    return None if bias is None else bias.detach().to("cpu", F64)


def _heads(rows: torch.Tensor, n: int) -> torch.Tensor:
    """(n·k, d) rows → (n, k, d)."""
    return rows.reshape(n, -1, rows.shape[-1])


def _heads_bias(bias: torch.Tensor | None, n: int) -> torch.Tensor | None:
    return None if bias is None else bias.reshape(n, -1)


def _out(weight: torch.Tensor, heads: int) -> torch.Tensor:
    """Linear-style output weight (d, H·d_v) → (H, d, d_v)."""
    return weight.reshape(weight.shape[0], heads, -1).permute(1, 0, 2).contiguous()


def _fused(
    w: torch.Tensor, b: torch.Tensor | None, family: str, cfg: Any, heads: int, kv: int
) -> list[tuple[Any, Any]]:
    """Split a fused (rows, d) QKV weight and its bias into [q, k, v] row blocks (each (n, d_h, ·))."""
    hd = w.shape[0] // (heads + 2 * kv)
    parts: list[list[torch.Tensor | None]] = []
    for t in (w, b):
        if t is None:
            parts.append([None, None, None])
            continue
        tail = t.shape[1:]
        if family == "gpt2" or (family == "gpt_bigcode" and kv == 1):
            q, k, v = t.split([heads * hd, kv * hd, kv * hd])
            parts.append([q.reshape(heads, hd, *tail), k.reshape(kv, hd, *tail), v.reshape(kv, hd, *tail)])
        elif family == "falcon" and getattr(cfg, "new_decoder_architecture", False):
            g = t.reshape(kv, heads // kv + 2, hd, *tail)
            parts.append([g[:, :-2].reshape(heads, hd, *tail), g[:, -2], g[:, -1]])
        elif family == "falcon" and getattr(cfg, "multi_query", False):
            f = t.reshape(heads + 2, hd, *tail)
            parts.append([f[:heads], f[heads : heads + 1], f[heads + 1 :]])
        else:  # per-head [q | k | v]: GPT-NeoX, Falcon MHA, GPT-BigCode MHA
            f = t.reshape(heads, 3, hd, *tail)
            parts.append([f[:, 0], f[:, 1], f[:, 2]])
    return [(parts[0][i], parts[1][i]) for i in range(3)]


def _bert_output(model: nn.Module, attention: nn.Module) -> Any:
    names = {id(m): n for n, m in model.named_modules()}
    parent: Any = model.get_submodule(names[id(attention)].rsplit(".", 1)[0])
    return parent.output.dense


def _deepseek(attn: Any, cfg: Any, heads: int) -> dict[str, Any]:
    lora, nope = cfg.kv_lora_rank, cfg.qk_nope_head_dim
    if getattr(attn, "q_proj", None) is not None:
        q = _w(attn.q_proj)
    else:
        q = _w(attn.q_b_proj) * _w(attn.q_a_layernorm) @ _w(attn.q_a_proj)
    a = _w(attn.kv_a_proj_with_mqa)
    down, k_rope = _w(attn.kv_a_layernorm)[:, None] * a[:lora], a[lora:]
    up = _heads(_w(attn.kv_b_proj), heads) @ down
    k = torch.cat([up[:, :nope], k_rope.expand(heads, -1, -1)], dim=1)
    return {"q": _heads(q, heads), "k": k, "v": up[:, nope:], "rope_dim": int(k_rope.shape[0]),
            "latent_dim": int(lora)}  # fmt: skip


def head_weights(model: nn.Module, layer: int) -> HeadWeights:
    """The per-head Q/K/V/O weights of ``layer`` of ``model`` (float64, CPU; see the module doc).

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> bert = BertModel(BertConfig(vocab_size=64, hidden_size=32, num_hidden_layers=2,
        ...                             num_attention_heads=4, intermediate_size=64))
        >>> w = head_weights(bert, -1)
        >>> tuple(w.v.shape), tuple(w.v_bias.shape), tuple(w.o_bias.shape)
        ((4, 8, 32), (4, 8), (32,))

    Raises:
        LayerIndexError: ``layer`` is not a layer of the model.
        UnsupportedModelError: the model's family has no adapter.
    """
    adapter = adapter_for(model)
    layout = adapter.layout()
    attns = adapter.attention_modules()
    if not -len(attns) <= layer < len(attns):
        raise LayerIndexError(f"layer {layer} is out of range: the model has {len(attns)} layers")
    attn: Any = attns[layer]
    cfg, family = adapter.config, adapter.family
    heads, kv = layout.num_heads, layout.num_kv_heads
    common: dict[str, Any] = {"mechanism": layout.mechanism}
    if family == "llama" or family == "bert":
        names = ("q_proj", "k_proj", "v_proj") if family == "llama" else ("query", "key", "value")
        mods = [getattr(attn, n) for n in names]
        out = attn.o_proj if family == "llama" else _bert_output(model, attn)
        q, k, v = (_heads(_w(m), n) for m, n in zip(mods, (heads, kv, kv), strict=True))
        qb, kb, vb = (_heads_bias(_b(m), n) for m, n in zip(mods, (heads, kv, kv), strict=True))
    elif family in ("gpt2", "gpt_neox", "falcon", "gpt_bigcode"):
        fused = {"gpt2": "c_attn", "gpt_bigcode": "c_attn"}.get(family, "query_key_value")
        out_name = {"gpt2": "c_proj", "gpt_bigcode": "c_proj"}.get(family, "dense")
        module, out = getattr(attn, fused), getattr(attn, out_name)
        weight, bias = _w(module), _b(module)
        if family == "gpt2":  # Conv1D stores (in, out)
            weight = weight.T
        (q, qb), (k, kb), (v, vb) = _fused(weight, bias, family, cfg, heads, kv)
    elif family == "deepseek":
        parts = _deepseek(attn, cfg, heads)
        q, k, v, out = parts.pop("q"), parts.pop("k"), parts.pop("v"), attn.o_proj
        qb = kb = vb = None
        common.update(parts)
    else:
        raise UnsupportedModelError(f"no weight reader for family {family!r}")
    o = _w(out).T if family == "gpt2" else _w(out)
    return HeadWeights(q=q, k=k, v=v, o=_out(o, heads), q_bias=qb, k_bias=kb, v_bias=vb,
                       o_bias=_b(out), **common)  # fmt: skip
