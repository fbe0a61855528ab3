"""Align-then-merge and partial RoPE, against brute-force float64 references."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

import headwidget
from headwidget.analysis.variant_fits import aligned_heads
from headwidget.analysis.weights import head_weights
from headwidget.evaluation import apply
from tiny_models import make_model, ragged_batches, record_attention_inputs, reference_activations, rope_half

F64 = torch.float64
IDS = torch.randint(1, 96, (3, 13), generator=torch.Generator().manual_seed(11))


def logits(model: torch.nn.Module, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        return model(ids).logits


def tiny(model_type: str) -> torch.nn.Module:
    config = AutoConfig.for_model(
        model_type,
        vocab_size=96,
        hidden_size=48,
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
    return AutoModelForCausalLM.from_config(config).to(F64).eval()


@pytest.fixture(scope="module", params=["llama_mha", "llama_gqa", "gpt2"])
def aligned_case(request: pytest.FixtureRequest) -> dict:
    model = make_model(request.param)
    stats = headwidget.capture(model, ragged_batches(seed=3), progress=False, inputs=True)
    return {"name": request.param, "model": model, "stats": stats}


def _groups(kv: int) -> list[list[int]]:
    return [[0, 1]] if kv == 2 else [[0, 2], [1, 3]]


def test_aligned_heads_leave_the_function_unchanged(aligned_case: dict) -> None:
    model, stats = aligned_case["model"], aligned_case["stats"]
    adapter = headwidget.adapters.adapter_for(model)
    rotated = copy.deepcopy(model)
    target = headwidget.adapters.adapter_for(rotated)
    planes = adapter.layout().rope.planes()
    for layer in range(2):
        w = head_weights(model, layer)
        new = aligned_heads(w, stats, layer, _groups(w.num_kv_heads), planes)
        assert not torch.allclose(new.k, w.k)  # the rotations are not the identity
        target.write_head_weights(target.attention_at(layer), new)
    torch.testing.assert_close(logits(rotated), logits(model), atol=1e-10, rtol=0)


def test_alignment_raises_the_token_cosine_of_grouped_heads(aligned_case: dict) -> None:
    """Brute force on the captured tokens: mean per-token cosine of the two heads of a group."""
    model, stats, name = aligned_case["model"], aligned_case["stats"], aligned_case["name"]
    acts = reference_activations(name, model, ragged_batches(seed=3), layers=[0])[0]
    w = head_weights(model, 0)
    groups = _groups(w.num_kv_heads)
    new = aligned_heads(w, stats, 0, groups, headwidget.adapters.adapter_for(model).layout().rope.planes())
    x = torch.from_numpy(acts["input"])
    d = int(w.k.shape[1])

    def mean_cos(k: torch.Tensor, i: int, j: int) -> float:
        a, b = k[:, i * d : (i + 1) * d], k[:, j * d : (j + 1) * d]
        return float(torch.nn.functional.cosine_similarity(a, b, dim=-1).mean())

    before = torch.from_numpy(acts["key"])
    bias = torch.zeros(new.k.shape[:2], dtype=F64) if new.k_bias is None else new.k_bias
    after = torch.einsum("td,ged->tge", x, new.k).reshape(len(x), -1) + bias.reshape(-1)
    i, j = groups[0]
    assert mean_cos(after, 0, 1) > mean_cos(before, i, j) + 1e-3  # heads 0, 1 after regrouping


def test_align_then_merge_is_the_mean_of_aligned_heads_and_differs_from_the_plain_merge(aligned_case) -> None:
    model, stats = aligned_case["model"], aligned_case["stats"]
    w0 = head_weights(model, 0)
    spec = "mqa" if w0.num_kv_heads == 2 else "gqa:2"
    merged = apply(model, f"{spec}+align", stats=stats)
    plain = apply(model, spec)
    for layer in range(2):
        fit = merged.headwidget_variant.fits[layer]
        aligned = aligned_heads(
            head_weights(model, layer),
            stats,
            layer,
            fit.groups,
            headwidget.adapters.adapter_for(model).layout().rope.planes(),
        )
        got = head_weights(merged, layer)
        per = aligned.num_kv_heads // (1 if spec == "mqa" else 2)
        means = aligned.k.reshape(-1, per, *aligned.k.shape[1:]).mean(1)
        reads = torch.arange(w0.num_heads) // (w0.num_heads // len(means))
        torch.testing.assert_close(got.k[got.kv_of], means[reads], atol=1e-12, rtol=0)
    assert (logits(merged) - logits(plain)).abs().max() > 1e-6
    assert merged.headwidget_variant.kv_bytes_per_token(F64) == plain.headwidget_variant.kv_bytes_per_token(
        F64
    )


@pytest.mark.parametrize("model_type", ["llama", "mistral", "qwen2"])
def test_keeping_every_rotary_pair_is_the_original_model(model_type: str) -> None:
    model = tiny(model_type)
    stats = headwidget.capture(model, torch.randint(1, 96, (2, 20)), progress=False, inputs=True)
    out = apply(model, "rope:4", stats=stats)
    assert type(out.model.layers[0].self_attn).__name__.startswith("PartialRope")
    torch.testing.assert_close(logits(out), logits(model), atol=1e-12, rtol=0)


def _plane_scores_by_brute_force(model, batches, layer: int) -> np.ndarray:
    """MHA2MLA's 2-norm scores: the token mean over real tokens of every query/key plane norm, from the
    projections applied by hand, key head's times the sum over its query heads."""
    xs = record_attention_inputs(model, batches)[layer]
    rows = [
        x[i, : int(b["attention_mask"][i].sum())]
        for x, b in zip(xs, batches, strict=True)
        for i in range(x.shape[0])
    ]
    x = torch.cat(rows).double()
    attn = model.model.layers[layer].self_attn
    q = (x @ attn.q_proj.weight.detach().T + attn.q_proj.bias.detach()).reshape(len(x), 6, 8)
    k = (x @ attn.k_proj.weight.detach().T + attn.k_proj.bias.detach()).reshape(len(x), 2, 8)

    def mean_norm(t: torch.Tensor) -> torch.Tensor:  # (heads, 4 planes (m, m + 4))
        return (t[..., :4] ** 2 + t[..., 4:] ** 2).sqrt().mean(0)

    q_mean, k_mean = mean_norm(q), mean_norm(k)
    return (k_mean * torch.stack([q_mean[0:3].sum(0), q_mean[3:6].sum(0)])).numpy()


def test_partial_rope_keeps_the_pairs_with_the_largest_norm_products() -> None:
    model = make_model("llama_gqa")
    batches = ragged_batches(seed=3)
    stats = headwidget.capture(model, batches, progress=False, inputs=True)
    out = apply(model, "rope:2", stats=stats)
    for layer in range(2):
        scores = _plane_scores_by_brute_force(model, batches, layer)
        want = np.sort(np.argsort(-scores, axis=1, kind="stable")[:, :2], axis=1)
        assert out.headwidget_variant.fits[layer].kept_planes.tolist() == want.tolist()


def test_partial_rope_attention_equals_a_hand_computed_attention() -> None:
    model = make_model("llama_gqa")
    stats = headwidget.capture(model, ragged_batches(seed=3), progress=False, inputs=True)
    out = apply(model, "rope:1", stats=stats)
    keep = out.headwidget_variant.fits[0].rope_keep  # (2, 8)
    seen: list[torch.Tensor] = []
    hook = out.model.layers[0].self_attn.register_forward_hook(lambda m, a, o: seen.append(o[0]))
    with torch.no_grad():
        out(IDS[:1])
    hook.remove()
    attn = model.model.layers[0].self_attn
    x = model.model.layers[0].input_layernorm(model.model.embed_tokens(IDS[:1]))[0].detach()
    t = x.shape[0]
    pos = torch.arange(t)
    q = (x @ attn.q_proj.weight.detach().T + attn.q_proj.bias.detach()).reshape(t, 6, 8)
    k = (x @ attn.k_proj.weight.detach().T + attn.k_proj.bias.detach()).reshape(t, 2, 8)
    v = (x @ attn.v_proj.weight.detach().T + attn.v_proj.bias.detach()).reshape(t, 2, 8)
    # The model's own cos/sin tables (computed in float32, as it does), RoPE applied here by hand.
    cos, sin = (c[0][:, None, :] for c in model.model.rotary_emb(x[None], pos[None]))

    def rotate(t: torch.Tensor) -> torch.Tensor:
        return t * cos + torch.cat([-t[..., 4:], t[..., :4]], -1) * sin

    assert torch.allclose(rotate(k), rope_half(k, pos, 8, 10000.0), atol=1e-6)
    q = torch.where(keep.repeat_interleave(3, 0), rotate(q), q)
    k = torch.where(keep, rotate(k), k)
    heads = []
    for h in range(6):
        scores = q[:, h] @ k[:, h // 3].T / math.sqrt(8)
        scores = scores.masked_fill(torch.triu(torch.ones(t, t, dtype=torch.bool), 1), -math.inf)
        heads.append(torch.softmax(scores, -1) @ v[:, h // 3])
    want = torch.cat(heads, -1) @ attn.o_proj.weight.detach().T
    torch.testing.assert_close(seen[0][0], want, atol=1e-12, rtol=0)
    assert int(keep.sum()) == 2 * 2 * 1  # two KV heads, one plane (two dims) each
    assert not torch.allclose(logits(out), logits(model))


def test_mla_with_decoupled_rope() -> None:
    model = make_model("llama_gqa")
    stats = headwidget.capture(model, ragged_batches(seed=3), progress=False, inputs=True)
    rope = apply(model, "rope:2", stats=stats)
    out = apply(model, "mla:10+rope:2", stats=stats)
    fit = out.headwidget_variant.fits[0]
    assert fit.kv_elements == 10 + 2 * 2 * 2  # d_c + G·2r
    assert out.headwidget_variant.kv_bytes_per_token(torch.bfloat16) == 2 * 2 * (10 + 8)
    w, got = head_weights(model, 0), head_weights(out, 0)
    keep = fit.rope_keep
    assert torch.equal(got.k[keep], w.k[keep])  # the rotary rows stay outside the latent
    torch.testing.assert_close(
        fit.factors["k_up"] @ fit.factors["down"] * (~keep)[..., None],
        got.k * (~keep)[..., None],
        atol=1e-12,
        rtol=0,
    )
    full = apply(model, "mla:24+rope:2", stats=stats)  # d_c = all 8 + 16 rows: the latent is exact
    torch.testing.assert_close(logits(full), logits(rope), atol=1e-10, rtol=0)
