"""Mechanism conversions: exact cases, monotone errors, data-aware optimality and bytes by hand."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import headwidget
from headwidget.analysis.conversions import convert, mechanism_sweep
from headwidget.analysis.weights import head_weights
from headwidget.errors import GroupCountError, MechanismSpecError, RankRangeError

F64 = torch.float64


@pytest.fixture(scope="module", params=[4, 2], ids=["mha", "gqa"])
def run(request: pytest.FixtureRequest) -> dict:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=request.param,
    )
    model = LlamaForCausalLM(cfg).eval().double()
    ids = torch.randint(0, 64, (4, 48), generator=torch.Generator().manual_seed(1))
    xs: list[torch.Tensor] = []
    hook = model.model.layers[0].self_attn.k_proj.register_forward_pre_hook(lambda m, a: xs.append(a[0]))
    with torch.no_grad():
        model(ids)
    hook.remove()
    stats = headwidget.capture(model, ids, progress=False, inputs=True)
    attn = model.model.layers[0].self_attn
    kv = request.param
    k = attn.k_proj.weight.detach().reshape(kv, 16, 64)[torch.arange(4) // (4 // kv)]
    v = attn.v_proj.weight.detach().reshape(kv, 16, 64)[torch.arange(4) // (4 // kv)]
    return {"model": model, "stats": stats, "x": xs[0].reshape(-1, 64), "k": k, "v": v, "kv": kv}


def data_error(w: torch.Tensor, w_hat: torch.Tensor, x: torch.Tensor) -> float:
    """‖(W − Ŵ) Xᵀ‖_F / ‖W Xᵀ‖_F on the materialised attention inputs X (N, d)."""
    return float(
        torch.linalg.norm((w - w_hat).reshape(-1, 64) @ x.T) / torch.linalg.norm(w.reshape(-1, 64) @ x.T)
    )


@pytest.mark.parametrize("spec", ["mha", "gqa:4", "model"])
def test_identity_conversions_reproduce_weights(run: dict, spec: str) -> None:
    c = convert(run["model"], 0, spec, run["stats"])
    assert torch.equal(c.k_weight, run["k"])
    assert torch.equal(c.v_weight, run["v"])
    assert c.reconstruction_error == {"key": 0.0, "value": 0.0}
    assert c.weighting == "data-aware"


def test_group_means_and_mqa(run: dict) -> None:
    k = run["k"]
    c = convert(run["model"], 0, "gqa:2")
    want = torch.stack([k[0:2].mean(0), k[0:2].mean(0), k[2:4].mean(0), k[2:4].mean(0)])
    torch.testing.assert_close(c.k_weight, want, atol=1e-15, rtol=0)
    mqa = convert(run["model"], 0, "mqa", run["stats"])
    torch.testing.assert_close(mqa.k_weight, k.mean(0).expand(4, -1, -1), atol=1e-15, rtol=0)
    assert mqa.reconstruction_error["key"] == pytest.approx(data_error(k, mqa.k_weight, run["x"]), abs=1e-9)
    assert convert(run["model"], 0, "lrkv:0").k_weight.allclose(mqa.k_weight, atol=1e-14)


@pytest.mark.parametrize("with_stats", [False, True])
def test_full_rank_conversions_are_exact(run: dict, with_stats: bool) -> None:
    stats = run["stats"] if with_stats else None
    for spec in ("lrkv:16", f"mla:{2 * run['kv'] * 16}"):
        c = convert(run["model"], 0, spec, stats)
        torch.testing.assert_close(c.k_weight, run["k"], atol=1e-10, rtol=0)
        torch.testing.assert_close(c.v_weight, run["v"], atol=1e-10, rtol=0)
        assert max(c.reconstruction_error.values()) < 1e-10


@pytest.mark.parametrize("with_stats", [False, True])
def test_errors_fall_monotonically(run: dict, with_stats: bool) -> None:
    stats = run["stats"] if with_stats else None
    for specs in (
        [f"lrkv:{r}" for r in range(17)],
        [f"mla:{d}" for d in range(1, 2 * run["kv"] * 16 + 1, 3)],
    ):
        rows = mechanism_sweep(run["model"], 0, specs, stats)
        for kind in ("key_error", "value_error"):
            errs = np.array([row[kind] for row in rows])
            assert (np.diff(errs) <= 1e-12).all(), (specs[0], kind, errs)
        assert rows[0]["key_error"] > 0.01


def test_data_aware_fit_reaches_the_eckart_young_optimum(run: dict) -> None:
    x, k = run["x"], run["k"]
    c = convert(run["model"], 0, "lrkv:3", run["stats"])
    assert c.reconstruction_error["key"] == pytest.approx(data_error(k, c.k_weight, x), abs=1e-9)
    resid = k - k.mean(0)
    lost = sum(float((torch.linalg.svdvals(r @ x.T)[3:] ** 2).sum()) for r in resid)
    best = np.sqrt(lost) / float(torch.linalg.norm(k.reshape(-1, 64) @ x.T))
    assert c.reconstruction_error["key"] == pytest.approx(best, rel=1e-7)
    weight_space = convert(run["model"], 0, "lrkv:3")
    assert data_error(k, weight_space.k_weight, x) > best
    stacked = torch.cat([k.reshape(-1, 64), run["v"].reshape(-1, 64)])
    mla = convert(run["model"], 0, "mla:20", run["stats"])
    approx = torch.cat([mla.k_weight.reshape(-1, 64), mla.v_weight.reshape(-1, 64)])
    opt = float((torch.linalg.svdvals(stacked @ x.T)[20:] ** 2).sum())
    assert float(torch.linalg.norm((stacked - approx) @ x.T) ** 2) == pytest.approx(opt, rel=1e-7)


def test_kv_bytes_by_hand(run: dict) -> None:
    h, d_h, g = 4, 16, run["kv"]
    want = {
        "mha": 2 * h * d_h,
        "gqa:2": 2 * 2 * d_h,
        "mqa": 2 * d_h,
        "lrkv:4": 2 * (d_h + g * 4),  # rank-4 coordinates per KV head, not per query head
        "mla:24": 24,
        "model": 2 * g * d_h,
    }
    for spec, elements in want.items():
        c = convert(run["model"], 0, spec)
        assert c.kv_bytes_per_token() == 2 * elements
        assert c.kv_bytes_per_token(torch.float32) == 4 * elements
    assert mechanism_sweep(run["model"], 0, ["mha"])[0]["kv_bytes_per_token"] == 256


def cached_per_token(factors: dict[str, torch.Tensor], x: torch.Tensor, kind: str) -> list[torch.Tensor]:
    """What an LRKV cache holds for the token ``x`` (d,): the shared head ``shared @ x`` and the rank-r
    coordinates ``down_h @ x`` of each query head, each distinct tensor once (query heads that read one
    KV head share it)."""
    held = [factors[f"{kind}_shared"] @ x]
    for down in factors[f"{kind}_down"]:
        coords = down @ x
        if not any(t.shape == coords.shape and torch.equal(t, coords) for t in held[1:]):
            held.append(coords)
    return held


def hand_count(model: LlamaForCausalLM, spec: str) -> int:
    """The K/V elements per token of layer 0 of ``apply(model, spec)``, counted from the tensors its
    LRKV cache would hold for a random token, after checking that they give the keys and values the
    converted model computes."""
    variant = headwidget.apply(model, spec, layers=[0])
    factors = variant.headwidget_variant.factors[0]
    attn = variant.model.layers[0].self_attn
    heads, kv = model.config.num_attention_heads, model.config.num_key_value_heads
    x = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(3), dtype=F64)
    total = 0
    for kind, proj in zip(("k", "v"), (attn.k_proj, attn.v_proj), strict=True):
        held = cached_per_token(factors, x, kind)
        computed = (proj.weight.to(F64) @ x).reshape(kv, -1)  # what the converted model computes
        for h in range(heads):
            coords = factors[f"{kind}_down"][h] @ x
            rebuilt = held[0] + factors[f"{kind}_up"][h] @ coords
            torch.testing.assert_close(rebuilt, computed[h // (heads // kv)], rtol=1e-5, atol=1e-5)
        total += sum(t.numel() for t in held)
    assert variant.headwidget_variant.kv_elements[0] == total
    return total


@pytest.mark.parametrize("rank", [0, 3, 16])
def test_lrkv_bytes_are_what_the_converted_model_caches(run: dict, rank: int) -> None:
    model = run["model"]
    counted = hand_count(model, f"lrkv:{rank}")
    assert counted == 2 * (16 + run["kv"] * rank)
    c = convert(model, 0, f"lrkv:{rank}")
    assert c.kv_elements == counted
    assert c.kv_bytes_per_token() == 2 * counted


def test_smollm2_lrkv_8_caches_176_elements_per_layer(smollm2) -> None:
    model, _ = smollm2
    c = convert(model, 0, "lrkv:8")
    assert c.kv_elements == 2 * (64 + 3 * 8) == 176  # 3 KV heads; 272 would count the 9 query heads
    x = torch.randn(model.config.hidden_size, generator=torch.Generator().manual_seed(0), dtype=F64)
    held = [t for kind in ("k", "v") for t in cached_per_token(c.factors, x, kind)]
    assert [t.numel() for t in held] == [64, 8, 8, 8] * 2
    assert mechanism_sweep(model, 0, ["lrkv:8"])[0]["kv_bytes_per_token"] == 2 * 176


def test_real_mla_model_reads_as_it_is() -> None:
    from transformers import DeepseekV3Config, DeepseekV3ForCausalLM

    cfg = DeepseekV3Config(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        moe_intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        q_lora_rank=None,
        kv_lora_rank=16,
        qk_nope_head_dim=8,
        qk_rope_head_dim=8,
        v_head_dim=12,
        first_k_dense_replace=1,
    )
    c = convert(DeepseekV3ForCausalLM(cfg), 0, "model")
    assert (c.mechanism, c.kv_bytes_per_token()) == ("mla", 2 * (16 + 8))
    assert tuple(c.k_weight.shape) == (4, 16, 64)
    assert tuple(c.v_weight.shape) == (4, 12, 64)


def test_bad_specs_say_what_to_do(run: dict) -> None:
    w = head_weights(run["model"], 0)
    for spec in ("lrkv:abc", "gqa", "mha:2", "lrkv:-1", "flash", "mla:1.5"):
        with pytest.raises(MechanismSpecError, match="gqa:4"):
            convert(w, 0, spec)
    for spec in ("gqa:3", "gqa:5", "gqa:0"):
        with pytest.raises(GroupCountError, match="1, 2, 4"):
            convert(w, 0, spec)
    with pytest.raises(RankRangeError, match=r"0\.\.16"):
        convert(w, 0, "lrkv:17")
    for spec in ("mla:0", "mla:129"):
        with pytest.raises(RankRangeError, match=r"1\.\.128"):
            convert(w, 0, spec)


def test_statistics_of_another_model_are_refused_and_negative_layers_use_the_stats() -> None:
    import headwidget
    from headwidget.errors import StatsMismatchError

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    other_config = LlamaConfig(**{**config.to_dict(), "intermediate_size": 48})
    model, other = LlamaForCausalLM(config).eval(), LlamaForCausalLM(other_config).eval()
    ids = torch.randint(0, 64, (2, 24))
    stats = headwidget.capture(model, ids, inputs=True, progress=False)
    assert convert(model, -1, "mqa", stats).weighting == "data-aware"
    assert (
        convert(model, -1, "mqa", stats).reconstruction_error
        == convert(model, 1, "mqa", stats).reconstruction_error
    )
    with pytest.raises(StatsMismatchError, match="captured from LlamaForCausalLM with another config"):
        convert(other, 0, "mqa", stats)
