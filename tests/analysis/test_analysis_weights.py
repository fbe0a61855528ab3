"""``head_weights`` for every family, checked against the tensors the real forward pass computes.

The cases are the hand-made variants below (biases, both DeepSeek query paths) plus every tiny model
of the test factory, so a new family is checked as soon as it has a factory entry.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import torch
from transformers import (
    BertConfig,
    BertModel,
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

import headwidget
from headwidget.analysis.weights import HeadWeights, head_weights
from headwidget.errors import LayerIndexError, UnsupportedModelError
from tiny_models import FACTORIES, attention_modules, make_model

F64 = torch.float64


def linearise_attention_norms(model: Any) -> Any:
    """Norms inside the attention (DeepSeek's latent RMSNorms) become ``x · γ``, as ``head_weights``
    reads them, so the linearised weights are exact for this model."""
    for attn in attention_modules(model):
        for norm in attn.modules():
            if "Norm" in type(norm).__name__:
                norm.forward = lambda x, norm=norm: x * norm.weight
    return model


def deepseek(q_lora: int | None, bias: bool = False) -> Any:
    cfg = DeepseekV3Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=q_lora,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=12,
        first_k_dense_replace=1,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
        attention_bias=bias,
    )
    return DeepseekV3ForCausalLM(cfg)


BUILDERS: dict[str, Callable[[], Any]] = {
    "llama-gqa": lambda: LlamaForCausalLM(
        LlamaConfig(
            vocab_size=64,
            hidden_size=64,
            intermediate_size=96,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_key_value_heads=2,
            attention_bias=True,
        )
    ),
    "gpt2": lambda: GPT2LMHeadModel(
        GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=64)
    ),
    "neox": lambda: GPTNeoXForCausalLM(
        GPTNeoXConfig(
            vocab_size=64,
            hidden_size=32,
            intermediate_size=64,
            num_hidden_layers=1,
            num_attention_heads=4,
            rotary_pct=0.5,
        )
    ),
    "falcon-new": lambda: FalconForCausalLM(
        FalconConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            num_kv_heads=2,
            new_decoder_architecture=True,
            bias=True,
        )
    ),
    "falcon-mqa": lambda: FalconForCausalLM(
        FalconConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, multi_query=True
        )
    ),
    "falcon-mha": lambda: FalconForCausalLM(
        FalconConfig(
            vocab_size=64,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=4,
            multi_query=False,
            bias=True,
        )
    ),
    "bigcode-mqa": lambda: GPTBigCodeForCausalLM(
        GPTBigCodeConfig(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=64, multi_query=True)
    ),
    "bigcode-mha": lambda: GPTBigCodeForCausalLM(
        GPTBigCodeConfig(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=64, multi_query=False)
    ),
    "bert": lambda: BertModel(
        BertConfig(
            vocab_size=64, hidden_size=32, num_hidden_layers=1, num_attention_heads=4, intermediate_size=64
        )
    ),
    "deepseek-qlora": lambda: deepseek(32),
    "deepseek-qproj": lambda: deepseek(None),
    "deepseek-bias": lambda: deepseek(32, bias=True),
}

CASES: dict[str, Callable[[], Any]] = {
    **BUILDERS,
    **{f"tiny-{n}": lambda n=n: make_model(n) for n in FACTORIES},
}


#: Cases whose attention rounds the rotary key part to float32 whatever the model's dtype.
FLOAT32_ROPE = {"tiny-deepseek_v2"}


def build(name: str) -> Any:
    torch.manual_seed(0)
    return linearise_attention_norms(CASES[name]().eval().double())


@contextmanager
def record_attention(model: Any) -> Iterator[dict[int, tuple[torch.Tensor, ...]]]:
    """The (query, key, value) each attention module hands to the attention function."""
    from transformers.modeling_utils import AttentionInterface

    mapping = AttentionInterface._global_mapping
    impl = model.config._attn_implementation
    original = mapping[impl]
    seen: dict[int, tuple[torch.Tensor, ...]] = {}

    def watched(module: Any, q: Any, k: Any, v: Any, *args: Any, **kwargs: Any) -> Any:
        seen[id(module)] = (q.detach(), k.detach(), v.detach())
        return original(module, q, k, v, *args, **kwargs)

    mapping[impl] = watched
    try:
        yield seen
    finally:
        mapping[impl] = original


def project(w: torch.Tensor, b: torch.Tensor | None, x: torch.Tensor) -> torch.Tensor:
    """(n, m, d) heads applied to x (B, T, d) → (B, n, T, m)."""
    y = torch.einsum("nmd,btd->bntm", w, x)
    return y if b is None else y + b[None, :, None, :]


def output_module(model: Any, attn: Any) -> Any:
    """The projection that applies W_O, from the model's structure: the last Linear/Conv1D inside the
    attention module, or inside its wrapper when the attention is wrapped (``BertAttention``)."""
    parents = {c: m for m in model.modules() for c in m.children()}
    scope = parents[attn] if type(parents[attn]).__name__.endswith("Attention") else attn
    linears = [m for m in scope.modules() if isinstance(m, torch.nn.Linear) or type(m).__name__ == "Conv1D"]
    return linears[-1]


def falcon_split(config: Any, fused: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Falcon's fused ``query_key_value`` output (B, T, F) split into q, k, v (B, heads, T, d_h) by hand, from
    the layouts its config names (written here, not read from transformers' private helpers)."""
    heads = config.num_attention_heads
    d = config.hidden_size // heads
    b, t = fused.shape[:2]
    if config.new_decoder_architecture:  # per KV group: its queries, then one key and one value
        g = fused.reshape(b, t, config.num_kv_heads, heads // config.num_kv_heads + 2, d)
        q, k, v = g[..., :-2, :].reshape(b, t, heads, d), g[..., -2, :], g[..., -1, :]
    elif config.multi_query:  # all queries, then the one shared key and value
        g = fused.reshape(b, t, heads + 2, d)
        q, k, v = g[:, :, :heads], g[:, :, heads : heads + 1], g[:, :, heads + 1 :]
    else:  # per head: its query, key and value
        g = fused.reshape(b, t, heads, 3, d)
        q, k, v = g[..., 0, :], g[..., 1, :], g[..., 2, :]
    return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)


@pytest.mark.parametrize("name", list(CASES))
def test_weights_reproduce_the_forward_pass(name: str) -> None:
    model = build(name)
    adapter = headwidget.adapters.adapter_for(model)
    attn = adapter.attention_modules()[0]
    w = head_weights(model, 0)
    assert isinstance(w, HeadWeights)
    ids = torch.randint(0, 64, (2, 12))
    pos = torch.zeros_like(ids)  # RoPE is the identity at position 0, so pre- and post-RoPE agree
    inputs: list[torch.Tensor] = []
    outs: list[tuple[torch.Tensor, torch.Tensor]] = []
    in_module = adapter.input_tap(attn).module
    h1 = in_module.register_forward_pre_hook(lambda m, a: inputs.append(a[0].detach()))
    out_mod = output_module(model, attn)
    h2 = out_mod.register_forward_hook(lambda m, a, o: outs.append((a[0].detach(), o.detach())))
    fused: list[torch.Tensor] = []
    hooks = [h1, h2]
    if not adapter.routes_through_interface:  # Falcon: read q/k/v off the fused output as it splits it
        hooks.append(attn.query_key_value.register_forward_hook(lambda m, a, o: fused.append(o.detach())))
    with record_attention(model) as seen, torch.no_grad():
        model(ids, position_ids=pos)
    for h in hooks:
        h.remove()
    x = inputs[0]
    q, k, v = project(w.q, w.q_bias, x), project(w.k, w.k_bias, x), project(w.v, w.v_bias, x)
    if not adapter.routes_through_interface:
        rq, rk, rv = falcon_split(attn.config, fused[0])
        torch.testing.assert_close(q, rq, atol=1e-10, rtol=0)
        kv = w.kv_of if rk.shape[1] == w.num_heads else torch.arange(w.num_kv_heads)
        torch.testing.assert_close(k[:, kv], rk, atol=1e-10, rtol=0)
        torch.testing.assert_close(v[:, kv], rv, atol=1e-10, rtol=0)
    else:
        rq, rk, rv = seen[id(attn)]
        kv = w.kv_of if rk.shape[1] == w.num_heads else torch.arange(w.num_kv_heads)
        logits = q @ k[:, w.kv_of].transpose(-2, -1)
        want = rq @ rk[:, torch.arange(w.num_heads) // (w.num_heads // rk.shape[1])].transpose(-2, -1)
        # DeepSeek-V2 applies its rotary embedding in complex float32 (`xq.float()`), even at position 0.
        atol = 1e-7 * float(want.abs().max()) if name in FLOAT32_ROPE else 1e-10
        torch.testing.assert_close(logits, want, atol=atol, rtol=0)
        torch.testing.assert_close(v[:, kv], rv, atol=1e-10, rtol=0)
    heads_in, out = outs[0]
    per_head = heads_in.reshape(*heads_in.shape[:2], w.num_heads, -1)
    recon = torch.einsum("hdv,bthv->btd", w.o, per_head) + (0 if w.o_bias is None else w.o_bias)
    torch.testing.assert_close(recon, out, atol=1e-10, rtol=0)


@pytest.mark.parametrize("name", list(CASES))
def test_key_and_value_means_match_capture(name: str) -> None:
    """The captured K/V means equal the weights applied to the captured input mean (both are linear)."""
    model = build(name)
    stats = headwidget.capture(model, torch.randint(0, 64, (2, 16)), progress=False, inputs=True)
    w = head_weights(model, 0)
    mu = torch.as_tensor(stats.mean(0, "input"))
    for kind, weight, bias in (("key", w.k, w.k_bias), ("value", w.v, w.v_bias)):
        want = weight @ mu + (0 if bias is None else bias)
        torch.testing.assert_close(want.reshape(-1), torch.as_tensor(stats.mean(0, kind)), atol=1e-9, rtol=0)


def test_mechanism_facts_and_errors() -> None:
    w = head_weights(BUILDERS["deepseek-qlora"](), 0)
    assert (w.mechanism, w.rope_dim, w.latent_dim, w.kv_elements()) == ("mla", 8, 16, 24)
    g = head_weights(BUILDERS["llama-gqa"](), 0)
    assert (g.mechanism, g.kv_elements(), g.kv_of.tolist()) == ("gqa", 2 * 2 * 16, [0, 0, 1, 1])
    with pytest.raises(LayerIndexError, match="1 layers"):
        head_weights(BUILDERS["gpt2"](), 3)
    with pytest.raises(UnsupportedModelError):
        head_weights(torch.nn.Linear(2, 2), 0)
