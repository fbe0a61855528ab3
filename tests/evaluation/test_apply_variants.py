"""apply(): converted copies against models whose K/V weights are replaced by hand, in float64."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import headwidget
from headwidget.analysis.conversions import convert
from headwidget.analysis.weights import head_weights
from headwidget.errors import (
    GroupCountError,
    MechanismSpecError,
    MissingStatisticsError,
    RankRangeError,
    StatsMismatchError,
    UnsupportedConversionError,
)
from headwidget.evaluation import apply
from tiny_models import FACTORIES, HEADS, make_model, ragged_batches

F64 = torch.float64
IDS = torch.randint(1, 96, (3, 11), generator=torch.Generator().manual_seed(7))


def logits(model: torch.nn.Module, ids: torch.Tensor = IDS) -> torch.Tensor:
    with torch.no_grad():
        out = model(ids)
    return out.logits if hasattr(out, "logits") else out.last_hidden_state


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def np_low_rank(w: np.ndarray, rank: int) -> np.ndarray:
    """Best rank-``rank`` approximation (Frobenius) of w by numpy's SVD."""
    u, s, vt = np.linalg.svd(w, full_matrices=False)
    return (u[:, :rank] * s[:rank]) @ vt[:rank]


def hand_llama(
    model: LlamaForCausalLM,
    kv_heads: int,
    k: dict[int, torch.Tensor],
    v: dict[int, torch.Tensor],
    kb: dict[int, torch.Tensor] | None = None,
    vb: dict[int, torch.Tensor] | None = None,
):
    """A fresh Llama with ``kv_heads`` KV heads: the original's weights, K/V (and biases) replaced."""
    cfg = LlamaConfig(**{**model.config.to_dict(), "num_key_value_heads": kv_heads})
    built = LlamaForCausalLM(cfg).to(F64).eval()
    sd = model.state_dict()
    for layer in k:
        pre = f"model.layers.{layer}.self_attn."
        sd[pre + "k_proj.weight"] = k[layer].reshape(-1, k[layer].shape[-1])
        sd[pre + "v_proj.weight"] = v[layer].reshape(-1, v[layer].shape[-1])
        if kb is not None:
            sd[pre + "k_proj.bias"] = kb[layer].reshape(-1)
            sd[pre + "v_proj.bias"] = vb[layer].reshape(-1)  # type: ignore[index]
    built.load_state_dict(sd)
    return built


@pytest.fixture(scope="module")
def llama_mha():
    return make_model("llama_mha")


@pytest.fixture(scope="module")
def llama_gqa():
    return make_model("llama_gqa")


@pytest.fixture(scope="module")
def gqa_stats(llama_gqa):
    return headwidget.capture(llama_gqa, ragged_batches(seed=3), progress=False, inputs=True)


def test_gqa_equals_a_hand_built_model_with_fewer_kv_heads(llama_mha) -> None:
    before = state(llama_mha)
    out = apply(llama_mha, "gqa:2")
    k, v = {}, {}
    for layer, block in enumerate(llama_mha.model.layers):
        wk = block.self_attn.k_proj.weight.detach().reshape(4, 12, 48)
        wv = block.self_attn.v_proj.weight.detach().reshape(4, 12, 48)
        k[layer] = torch.stack([wk[0:2].mean(0), wk[2:4].mean(0)])
        v[layer] = torch.stack([wv[0:2].mean(0), wv[2:4].mean(0)])
    hand = hand_llama(llama_mha, 2, k, v)
    torch.testing.assert_close(logits(out), logits(hand), atol=1e-12, rtol=0)
    assert out.config.num_key_value_heads == 2 and llama_mha.config.num_key_value_heads == 4
    assert all(torch.equal(before[n], t) for n, t in llama_mha.state_dict().items())


def test_mqa_merges_biases_too(llama_gqa) -> None:
    out = apply(llama_gqa, "mqa")
    k, v, kb, vb = {}, {}, {}, {}
    for layer, block in enumerate(llama_gqa.model.layers):
        a = block.self_attn
        k[layer] = a.k_proj.weight.detach().reshape(2, 8, 48).mean(0, keepdim=True)
        v[layer] = a.v_proj.weight.detach().reshape(2, 8, 48).mean(0, keepdim=True)
        kb[layer] = a.k_proj.bias.detach().reshape(2, 8).mean(0)
        vb[layer] = a.v_proj.bias.detach().reshape(2, 8).mean(0)
    torch.testing.assert_close(
        logits(out), logits(hand_llama(llama_gqa, 1, k, v, kb, vb)), atol=1e-12, rtol=0
    )


@pytest.mark.parametrize("rank", [1, 3])
def test_lrkv_weight_space_equals_hand_built(llama_mha, rank: int) -> None:
    out = apply(llama_mha, f"lrkv:{rank}")
    k, v = {}, {}
    for layer, block in enumerate(llama_mha.model.layers):
        for proj, sink in ((block.self_attn.k_proj, k), (block.self_attn.v_proj, v)):
            w = proj.weight.detach().numpy().reshape(4, 12, 48)
            shared = w.mean(0)
            sink[layer] = torch.from_numpy(np.stack([shared + np_low_rank(h - shared, rank) for h in w]))
    torch.testing.assert_close(logits(out), logits(hand_llama(llama_mha, 4, k, v)), atol=1e-11, rtol=0)
    factors = out.headwidget_variant.factors[0]
    recon = factors["k_shared"] + factors["k_up"] @ factors["k_down"]
    torch.testing.assert_close(recon, k[0], atol=1e-12, rtol=0)


def test_mla_weight_space_equals_hand_built(llama_mha) -> None:
    out = apply(llama_mha, "mla:20")
    k, v = {}, {}
    for layer, block in enumerate(llama_mha.model.layers):
        stacked = np.concatenate(
            [block.self_attn.k_proj.weight.detach().numpy(), block.self_attn.v_proj.weight.detach().numpy()]
        )
        approx = torch.from_numpy(np_low_rank(stacked, 20))
        k[layer], v[layer] = approx[:48].reshape(4, 12, 48), approx[48:].reshape(4, 12, 48)
    torch.testing.assert_close(logits(out), logits(hand_llama(llama_mha, 4, k, v)), atol=1e-11, rtol=0)
    assert out.headwidget_variant.kv_bytes_per_token(torch.bfloat16) == 2 * 20 * 2
    f = out.headwidget_variant.factors[1]
    torch.testing.assert_close(
        f["k_up"].reshape(48, 20) @ f["down"], k[1].reshape(48, 48), atol=1e-11, rtol=0
    )


def test_fused_gpt2_lrkv_equals_hand_built() -> None:
    gpt2 = make_model("gpt2")
    out = apply(gpt2, "lrkv:2")
    hand = make_model("gpt2")
    with torch.no_grad():
        for block in hand.transformer.h:
            w = block.attn.c_attn.weight  # Conv1D: (in, out) = (48, 144), out = [Q | K | V]
            for start in (48, 96):
                heads = w[:, start : start + 48].T.numpy().reshape(4, 12, 48)
                shared = heads.mean(0)
                new = np.stack([shared + np_low_rank(h - shared, 2) for h in heads]).reshape(48, 48)
                w[:, start : start + 48] = torch.from_numpy(new).T
    torch.testing.assert_close(logits(out), logits(hand), atol=1e-11, rtol=0)


@pytest.mark.parametrize("name", [n for n in FACTORIES if not n.startswith("deepseek")])
@pytest.mark.parametrize("spec", ["mqa", "lrkv:2", "mla:16"])
def test_every_family_holds_the_mechanisms_weights(name: str, spec: str) -> None:
    """The converted model's own per-head weights, read back, are convert()'s effective weights."""
    model = make_model(name)
    out = apply(model, spec)
    for layer in range(2):
        want = convert(model, layer, spec)
        got = head_weights(out, layer)
        torch.testing.assert_close(got.k[got.kv_of], want.k_weight, atol=1e-12, rtol=0)
        torch.testing.assert_close(got.v[got.kv_of], want.v_weight, atol=1e-12, rtol=0)
    assert torch.isfinite(logits(out)).all()
    _, heads, kv = HEADS[name]
    d = 48 // heads
    per_layer = {"mqa": 2 * d, "lrkv:2": 2 * d + 2 * kv * 2, "mla:16": 16}[spec]  # rank 2 per KV head
    assert out.headwidget_variant.kv_bytes_per_token(torch.float32) == 2 * 4 * per_layer


def test_save_pretrained_round_trip_and_a_smaller_cache(llama_gqa, tmp_path) -> None:
    out = apply(llama_gqa, "mqa")
    out.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path, dtype=F64).eval()
    assert loaded.config.num_key_value_heads == 1
    saved = out.state_dict()
    assert all(torch.equal(t, saved[n]) for n, t in loaded.state_dict().items())  # bit-identical weights
    # Same function; loaded tensors sit at other memory offsets, so BLAS may round the last bit apart.
    torch.testing.assert_close(logits(loaded), logits(out), atol=1e-14, rtol=0)

    def cache_bytes(model: torch.nn.Module) -> int:
        with torch.no_grad():
            cache = model(IDS, use_cache=True).cache
        return sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))

    assert cache_bytes(loaded) * 2 == cache_bytes(llama_gqa)  # 1 KV head instead of 2
    assert cache_bytes(loaded) == IDS.numel() * out.headwidget_variant.kv_bytes_per_token(F64)


def test_subset_of_layers(llama_gqa) -> None:
    out = apply(llama_gqa, "mqa", layers=[-1])
    assert out.headwidget_variant.layers == [1]
    assert out.model.layers[0].self_attn.k_proj.out_features == 16
    assert out.model.layers[1].self_attn.k_proj.out_features == 8
    assert out.config.num_key_value_heads == 2  # the config cannot describe mixed layers
    whole = apply(llama_gqa, "mqa")
    hand = make_model("llama_gqa")
    hand.model.layers[1] = whole.model.layers[1]
    torch.testing.assert_close(logits(out), logits(hand), atol=1e-12, rtol=0)


def test_model_and_mha_reproduce_the_model(llama_gqa) -> None:
    assert torch.equal(logits(apply(llama_gqa, "model")), logits(llama_gqa))
    mha = apply(llama_gqa, "mha")
    assert mha.config.num_key_value_heads == 6
    torch.testing.assert_close(logits(mha), logits(llama_gqa), atol=1e-12, rtol=0)


def test_data_aware_fits_use_the_inputs(llama_gqa, gqa_stats) -> None:
    plain, aware = apply(llama_gqa, "mla:12"), apply(llama_gqa, "mla:12", stats=gqa_stats)
    assert plain.headwidget_variant.fits[0].weighting == "weight-space"
    assert aware.headwidget_variant.fits[0].weighting == "data-aware"
    want = convert(llama_gqa, 0, "mla:12", gqa_stats).k_weight
    got = head_weights(aware, 0)
    torch.testing.assert_close(got.k[got.kv_of], want, atol=1e-12, rtol=0)
    assert not torch.allclose(head_weights(plain, 0).k, got.k)


def test_bad_specs_and_statistics(llama_gqa, gqa_stats) -> None:
    with pytest.raises(MechanismSpecError, match="cannot read variant spec"):
        apply(llama_gqa, "gqa")
    with pytest.raises(MechanismSpecError, match=r"'\+align' merges aligned heads"):
        apply(llama_gqa, "lrkv:2+align")
    with pytest.raises(GroupCountError, match="1, 2, 3, 6"):
        apply(llama_gqa, "gqa:4")
    with pytest.raises(GroupCountError, match=r"G must divide 2 \(possible: 1, 2\)"):
        apply(llama_gqa, "gqa:3+align", stats=gqa_stats)
    with pytest.raises(RankRangeError):
        apply(llama_gqa, "mla:100000")
    with pytest.raises(MissingStatisticsError, match="no statistics were given"):
        apply(llama_gqa, "mqa+align")
    no_inputs = headwidget.capture(llama_gqa, ragged_batches(seed=3), progress=False)
    with pytest.raises(MissingStatisticsError, match="inputs=True"):
        apply(llama_gqa, "lrkv:2", stats=no_inputs)
    with pytest.raises(MissingStatisticsError, match="inputs=True"):
        apply(llama_gqa, "rope:2", stats=no_inputs)
    other = make_model("llama_mha")
    with pytest.raises(StatsMismatchError, match="another config"):
        apply(other, "lrkv:2", stats=gqa_stats)
    with pytest.raises(UnsupportedConversionError, match="Llama-family models only"):
        apply(make_model("gpt2"), "rope:2")
    with pytest.raises(UnsupportedConversionError, match="already multi-head latent attention"):
        apply(make_model("deepseek_v2"), "mqa")
    with pytest.raises(UnsupportedConversionError, match="cannot hold 3"):
        apply(make_model("falcon_new"), "gqa:3")


def test_a_shared_variant_copies_only_the_converted_attention_and_the_containers_above_it() -> None:
    from headwidget.evaluation._apply import build_variant, fit_variant

    model = make_model("llama_gqa")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    variant = build_variant(model, "mqa", fit_variant(model, "mqa", None, [1]), share=True)
    layers, original = variant.model.layers, model.model.layers
    assert variant is not model and variant.model is not model.model and layers is not original
    assert variant.config is not model.config  # a converted copy may change its config
    assert layers[0] is original[0] and variant.lm_head is model.lm_head  # shared, not copied
    assert layers[1] is not original[1] and layers[1].self_attn is not original[1].self_attn
    assert layers[1].mlp is original[1].mlp and layers[1].input_layernorm is original[1].input_layernorm
    head_dim = model.config.hidden_size // model.config.num_attention_heads
    assert layers[1].self_attn.k_proj.out_features == head_dim  # one KV head
    assert original[1].self_attn.k_proj.out_features == HEADS["llama_gqa"][2] * head_dim
    layers[0] = torch.nn.Identity()  # what the sweep does to the copy's container
    assert isinstance(original[0], type(layers[1]))
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)


@pytest.mark.parametrize("name", [n for n in FACTORIES if not n.startswith("deepseek")])
def test_a_shared_variant_leaves_the_model_alone_and_equals_a_full_copy(name: str) -> None:
    """Every family: the shared copy owns what the conversion writes (BERT's output projection lies
    beside its attention module, not in it), shares the MLPs, and computes what a deep copy computes."""
    from headwidget.adapters import adapter_for
    from headwidget.evaluation._apply import build_variant, fit_variant
    from headwidget.evaluation._model_facts import converted_modules

    model = make_model(name)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    fits = fit_variant(model, "lrkv:2", None, [1])  # changes the K/V weights of layer 1
    fits[1].weights.o.mul_(0.5)  # and its output projection, to see where it is written
    shared = build_variant(model, "lrkv:2", fits, share=True)
    full = build_variant(model, "lrkv:2", fits)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before), "the model changed"
    torch.testing.assert_close(logits(shared), logits(full), atol=0, rtol=0)
    assert not torch.equal(logits(shared), logits(model))
    own = {id(p) for p in model.parameters()}
    copied = sum(p.numel() for p in shared.parameters() if id(p) not in own)
    written = {
        id(p): p
        for name in converted_modules(model, adapter_for(model), [1])
        for p in model.get_submodule(name).parameters()
    }
    assert copied == sum(p.numel() for p in written.values())
    block = next(b for b in model.modules() if isinstance(b, torch.nn.ModuleList))[1]
    assert copied < sum(p.numel() for p in block.parameters())  # the block's MLP is shared
