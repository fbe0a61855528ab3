"""Tiny random-init models of every supported family, and K/V computed independently of the adapters.

The reference K/V are recomputed from each layer's attention input and the raw weights, following each
architecture's published layout (and, for post-RoPE keys, applying RoPE here), so a bug in an adapter's
split cannot hide in the reference.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch
from torch import nn
from transformers import (
    BertConfig,
    BertModel,
    DeepseekV2Config,
    DeepseekV2ForCausalLM,
    DeepseekV3Config,
    DeepseekV3ForCausalLM,
    FalconConfig,
    FalconForCausalLM,
    GPT2Config,
    GPT2LMHeadModel,
    GPTBigCodeConfig,
    GPTBigCodeForCausalLM,
    GPTNeoXConfig,
    GPTNeoXForCausalLM,
    LlamaConfig,
    LlamaForCausalLM,
)

VOCAB = 96
D = 48


def _deepseek_kwargs() -> dict:
    return dict(  # noqa: C408
        vocab_size=VOCAB,
        hidden_size=D,
        intermediate_size=64,
        moe_intermediate_size=16,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
        kv_lora_rank=16,
        qk_rope_head_dim=4,
        qk_nope_head_dim=8,
        v_head_dim=6,
        n_routed_experts=4,
        num_experts_per_tok=2,
        first_k_dense_replace=2,  # dense MLPs: MoE kernels have no float64
    )


FACTORIES: dict[str, Callable[[], nn.Module]] = {
    "llama_gqa": lambda: LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=D,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_key_value_heads=2,
            attention_bias=True,
        )
    ),
    "llama_mha": lambda: LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=D,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
        )
    ),
    "llama_mqa": lambda: LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=D,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=1,
        )
    ),
    "gpt2": lambda: GPT2LMHeadModel(
        GPT2Config(vocab_size=VOCAB, n_embd=D, n_layer=2, n_head=4, bos_token_id=0, eos_token_id=0)
    ),
    "gpt_neox": lambda: GPTNeoXForCausalLM(
        GPTNeoXConfig(
            vocab_size=VOCAB,
            hidden_size=D,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            rotary_pct=0.5,
        )
    ),
    "falcon_new": lambda: FalconForCausalLM(
        FalconConfig(
            vocab_size=VOCAB,
            hidden_size=D,
            num_hidden_layers=2,
            num_attention_heads=6,
            num_kv_heads=2,
            new_decoder_architecture=True,
        )
    ),
    "falcon_mqa": lambda: FalconForCausalLM(
        FalconConfig(
            vocab_size=VOCAB, hidden_size=D, num_hidden_layers=2, num_attention_heads=4, multi_query=True
        )
    ),
    "falcon_mha": lambda: FalconForCausalLM(
        FalconConfig(
            vocab_size=VOCAB, hidden_size=D, num_hidden_layers=2, num_attention_heads=4, multi_query=False
        )
    ),
    "bigcode_mqa": lambda: GPTBigCodeForCausalLM(
        GPTBigCodeConfig(vocab_size=VOCAB, n_embd=D, n_layer=2, n_head=4, multi_query=True)
    ),
    "bigcode_mha": lambda: GPTBigCodeForCausalLM(
        GPTBigCodeConfig(vocab_size=VOCAB, n_embd=D, n_layer=2, n_head=4, multi_query=False)
    ),
    "bert": lambda: BertModel(
        BertConfig(
            vocab_size=VOCAB, hidden_size=D, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64
        )
    ),
    "deepseek_v2": lambda: DeepseekV2ForCausalLM(DeepseekV2Config(q_lora_rank=None, **_deepseek_kwargs())),
    "deepseek_v3": lambda: DeepseekV3ForCausalLM(
        DeepseekV3Config(q_lora_rank=12, n_group=2, topk_group=1, **_deepseek_kwargs())
    ),
}

#: What each tiny model's attention is, from its config by hand: (mechanism, query heads, KV heads).
HEADS: dict[str, tuple[str, int, int]] = {
    "llama_gqa": ("gqa", 6, 2),
    "llama_mha": ("mha", 4, 4),
    "llama_mqa": ("mqa", 4, 1),
    "gpt2": ("mha", 4, 4),
    "gpt_neox": ("mha", 4, 4),
    "falcon_new": ("gqa", 6, 2),
    "falcon_mqa": ("mqa", 4, 1),
    "falcon_mha": ("mha", 4, 4),
    "bigcode_mqa": ("mqa", 4, 1),
    "bigcode_mha": ("mha", 4, 4),
    "bert": ("mha", 4, 4),
    "deepseek_v2": ("mla", 4, 4),
    "deepseek_v3": ("mla", 4, 4),
}

#: The models that use RoPE and pass their keys through ``transformers.AttentionInterface`` (so their
#: post-RoPE keys can be captured; Falcon from the transformers release whose attention calls it).
ROPE_FAMILIES = (
    "llama_gqa",
    "llama_mha",
    "llama_mqa",
    "gpt_neox",
    "falcon_new",
    "falcon_mqa",
    "falcon_mha",
    "deepseek_v2",
    "deepseek_v3",
)


def make_model(name: str, dtype: torch.dtype = torch.float64, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    model = FACTORIES[name]()
    return model.to(dtype).eval()


def attention_modules(model: nn.Module) -> list[nn.Module]:
    """Self-attention modules by class name (independent of the adapters' marker attributes).

    A module counts when its class name ends in ``Attention`` and it holds no other such module
    (``BertAttention`` wraps ``BertSelfAttention``, which is the one that computes the attention).
    """

    def named_attention(m: nn.Module) -> bool:
        return type(m).__name__.endswith("Attention")

    return [
        m
        for m in model.modules()
        if named_attention(m) and not any(named_attention(c) for c in list(m.modules())[1:])
    ]


def record_attention_inputs(model: nn.Module, batches: list[dict]) -> list[list[torch.Tensor]]:
    """Run the model and return, per layer, the attention input of every batch: list[layer][batch]."""
    mods = attention_modules(model)
    seen: list[list[torch.Tensor]] = [[] for _ in mods]
    handles = []
    for i, m in enumerate(mods):

        def hook(module, args, kwargs, i=i):
            x = args[0] if args else kwargs["hidden_states"]
            seen[i].append(x.detach().clone())

        handles.append(m.register_forward_pre_hook(hook, with_kwargs=True))
    try:
        with torch.no_grad():
            for b in batches:
                model(input_ids=b["input_ids"], attention_mask=b["attention_mask"])
    finally:
        for h in handles:
            h.remove()
    return seen


def _linear(x: torch.Tensor, layer: nn.Module) -> torch.Tensor:
    w = layer.weight.detach().double()
    b = None if getattr(layer, "bias", None) is None else layer.bias.detach().double()
    # GPT-2's Conv1D computes y = x W + b with W (in, out); nn.Linear stores W (out, in).
    y = x @ w if type(layer).__name__ == "Conv1D" else x @ w.T
    return y if b is None else y + b


def _rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    eps = getattr(norm, "variance_epsilon", getattr(norm, "eps", 1e-6))
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * norm.weight.detach().double()


def rope_half(x: torch.Tensor, positions: torch.Tensor, rotary_dim: int, theta: float) -> torch.Tensor:
    """HF rotate_half RoPE on the first ``rotary_dim`` dims of (T, heads, d) with the given positions."""
    inv = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    ang = positions.double()[:, None] * inv[None, :]
    cos = torch.cat([ang.cos(), ang.cos()], -1)[:, None, :]
    sin = torch.cat([ang.sin(), ang.sin()], -1)[:, None, :]
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    half = rotary_dim // 2
    rotated = torch.cat([-rot[..., half:], rot[..., :half]], -1)
    return torch.cat([rot * cos + rotated * sin, rest], -1)


def rope_interleaved(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """GPT-J/DeepSeek-V2 RoPE on pairs (2m, 2m+1) of (T, heads, d)."""
    d = x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float64) / d)
    ang = positions.double()[:, None, None] * inv
    a, b = x[..., 0::2], x[..., 1::2]
    out = torch.empty_like(x)
    out[..., 0::2] = a * ang.cos() - b * ang.sin()
    out[..., 1::2] = b * ang.cos() + a * ang.sin()
    return out


def reference_kv(name: str, model: nn.Module, attn: nn.Module, x: torch.Tensor) -> dict[str, torch.Tensor]:
    """K (pre-RoPE), V and, for RoPE models, post-RoPE K as (T, G, d) float64 from one row x (T, d)."""
    c = model.config
    x = x.double()
    t = x.shape[0]
    pos = torch.arange(t)
    theta = (getattr(c, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    if name.startswith("llama"):
        g, hd = c.num_key_value_heads, c.hidden_size // c.num_attention_heads
        k = _linear(x, attn.k_proj).reshape(t, g, hd)
        v = _linear(x, attn.v_proj).reshape(t, g, hd)
        return {"key": k, "value": v, "key_post": rope_half(k, pos, hd, theta)}
    if name == "gpt2":
        w = _linear(x, attn.c_attn)
        h = c.n_head
        return {"key": w[:, D : 2 * D].reshape(t, h, -1), "value": w[:, 2 * D :].reshape(t, h, -1)}
    if name == "gpt_neox":
        h = c.num_attention_heads
        hd = D // h
        w = attn.query_key_value.weight.detach().double().reshape(h, 3, hd, D)
        bias = attn.query_key_value.bias.detach().double().reshape(h, 3, hd)
        k = torch.einsum("td,hed->the", x, w[:, 1]) + bias[:, 1]
        v = torch.einsum("td,hed->the", x, w[:, 2]) + bias[:, 2]
        return {"key": k, "value": v, "key_post": rope_half(k, pos, int(hd * 0.5), theta)}
    if name.startswith("falcon"):
        h = c.num_attention_heads
        hd = D // h
        w = attn.query_key_value.weight.detach().double()
        if c.new_decoder_architecture:
            g = c.num_kv_heads
            wg = w.reshape(g, h // g + 2, hd, D)
            wk, wv = wg[:, -2], wg[:, -1]
        elif c.multi_query:
            wk, wv = w[h * hd : (h + 1) * hd][None], w[(h + 1) * hd :][None]
        else:
            wh = w.reshape(h, 3, hd, D)
            wk, wv = wh[:, 1], wh[:, 2]
        k, v = torch.einsum("td,ged->tge", x, wk), torch.einsum("td,ged->tge", x, wv)
        return {"key": k, "value": v, "key_post": rope_half(k, pos, hd, theta)}
    if name.startswith("bigcode"):
        h, hd = c.n_head, D // c.n_head
        y = _linear(x, attn.c_attn)
        if c.multi_query:
            return {"key": y[:, D : D + hd][:, None], "value": y[:, D + hd :][:, None]}
        yh = y.reshape(t, h, 3, hd)
        return {"key": yh[:, :, 1], "value": yh[:, :, 2]}
    if name == "bert":
        h = c.num_attention_heads
        return {
            "key": _linear(x, attn.key).reshape(t, h, -1),
            "value": _linear(x, attn.value).reshape(t, h, -1),
        }
    if name.startswith("deepseek"):
        h, r = c.num_attention_heads, c.kv_lora_rank
        nope, rope, vd = c.qk_nope_head_dim, c.qk_rope_head_dim, c.v_head_dim
        comp = _linear(x, attn.kv_a_proj_with_mqa)
        latent = _rms_norm(comp[:, :r], attn.kv_a_layernorm)
        k_rope = comp[:, r:]
        up = _linear(latent, attn.kv_b_proj).reshape(t, h, nope + vd)
        k = torch.cat([up[..., :nope], k_rope[:, None, :].expand(t, h, rope)], -1)
        if name == "deepseek_v2":
            k_rope_post = rope_interleaved(k_rope[:, None, :], pos, theta)
        else:  # V3: interleaved pairs, written out de-interleaved
            rotated = rope_interleaved(k_rope[:, None, :], pos, theta)
            k_rope_post = torch.cat([rotated[..., 0::2], rotated[..., 1::2]], -1)
        k_post = torch.cat([up[..., :nope], k_rope_post.expand(t, h, rope)], -1)
        return {"key": k, "value": up[..., nope:], "latent": latent[:, None, :], "key_post": k_post}
    raise KeyError(name)


def ragged_batches(
    seed: int = 1, lengths: tuple[tuple[int, ...], ...] = ((13, 7, 10), (9, 12))
) -> list[dict]:
    """Right-padded batches of random ids with ragged lengths (padding id 0, mask 0)."""
    gen = torch.Generator().manual_seed(seed)
    batches = []
    for rows in lengths:
        width = max(rows)
        ids = torch.randint(1, VOCAB, (len(rows), width), generator=gen)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, n in enumerate(rows):
            mask[i, :n] = 1
            ids[i, n:] = 0
        batches.append({"input_ids": ids, "attention_mask": mask})
    return batches


def reference_activations(
    name: str, model: nn.Module, batches: list[dict], layers: list[int] | None = None
) -> dict[int, dict[str, np.ndarray]]:
    """Per layer, ``kind → (N, C)`` float64 arrays over all non-padding tokens of all batches."""
    inputs = record_attention_inputs(model, batches)
    mods = attention_modules(model)
    out: dict[int, dict[str, np.ndarray]] = {}
    for layer, attn in enumerate(mods):
        if layers is not None and layer not in layers:
            continue
        rows: dict[str, list[np.ndarray]] = {}
        for b, batch in enumerate(batches):
            x_b = inputs[layer][b]
            for i in range(x_b.shape[0]):
                n = int(batch["attention_mask"][i].sum())
                kv = reference_kv(name, model, attn, x_b[i, :n])
                for kind, tensor in kv.items():
                    rows.setdefault(kind, []).append(tensor.reshape(n, -1).numpy())
                rows.setdefault("input", []).append(x_b[i, :n].double().numpy())
        out[layer] = {k: np.concatenate(v) for k, v in rows.items()}
    return out


def three_layer_llama(seed: int) -> nn.Module:
    """A float64 Llama of three layers (4 query heads over 2 KV heads of 16 dims): a first, a middle and
    a last layer, for mixed specs and allocations."""
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaForCausalLM(config).to(torch.float64).eval()


def sliding_window_gemma2(layer_types: list[str], dtype: torch.dtype = torch.float64) -> nn.Module:
    """A Gemma 2 of ``len(layer_types)`` layers, each ``"sliding_attention"`` (a window of 4 tokens) or
    ``"full_attention"``: caches of different lengths in one model."""
    from transformers import Gemma2Config, Gemma2ForCausalLM

    torch.manual_seed(0)
    config = Gemma2Config(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=len(layer_types),
        num_attention_heads=4,
        num_key_value_heads=2,
        head_dim=8,
        sliding_window=4,
        layer_types=layer_types,
    )
    return Gemma2ForCausalLM(config).eval().to(dtype)


def qk_norm_model(model_type: str) -> nn.Module:
    """A tiny float64 Qwen3 (per-head q_norm/k_norm) or OLMo2 (q_norm/k_norm over all heads), GQA 6
    over 2, its norms' learned scales not all one (so that the norms matter)."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.for_model(
        model_type,
        vocab_size=VOCAB,
        hidden_size=D,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=8,
        pad_token_id=0,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config).to(torch.float64).eval()
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for layer in model.model.layers:
            for norm in (layer.self_attn.q_norm, layer.self_attn.k_norm):
                norm.weight.copy_(
                    0.5 + 1.5 * torch.rand(norm.weight.shape, generator=gen, dtype=torch.float64)
                )
    return model
