"""heal(): the untrained point is evaluate's, exactly the mechanism's parameters change, the healed model
keeps its structure, healing lowers held-out KL, seeds fix the run, and model and variant are untouched."""

from __future__ import annotations

import math

import pytest
import torch

import headwidget
from headwidget.adapters import adapter_for
from headwidget.evaluation._inputs import evaluation_batches, forward_kwargs
from healing_cases import F64, family, held_out, llama, small_heal

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def test_the_untrained_point_is_what_evaluate_gives_for_the_spec() -> None:
    model = llama()
    run = small_heal(headwidget.apply(model, "mqa"), model)
    report = headwidget.evaluate(
        model,
        held_out(),
        ["model", "mqa"],
        dtype=F64,
        batch_size=4,
        max_length=16,
        max_tokens=120,
        progress=False,
    )
    first = run.curve[0]
    assert (first["tokens"], first["step"]) == (0, 0)
    for name in ("nll", "kl", "top1"):
        assert first[name] == pytest.approx(report.measures["mqa"][name], rel=1e-12, abs=1e-15), name
    assert run.reference_nll == pytest.approx(report.measures["model"]["nll"], rel=1e-12)
    gap = report.measures["mqa"]["nll"] - report.measures["model"]["nll"]
    assert first["delta_nll"] == pytest.approx(gap, rel=1e-10, abs=1e-14)
    assert run.kv_bytes_per_token == report.kv_bytes_per_token["mqa"]  # both in float64
    assert run.evaluation_fingerprint == report.fingerprint


def test_healing_lowers_held_out_kl_and_the_curve_has_its_points() -> None:
    model = llama()
    run = small_heal(headwidget.apply(model, "mqa"), model)
    assert [r["tokens"] for r in run.curve] == [0, 128, 256]
    assert [r["step"] for r in run.curve] == [0, 2, 4]
    assert run.steps == 4 and run.tokens_seen == 256 and len(run.losses) == 4
    assert run.curve[-1]["kl"] < run.curve[0]["kl"]
    assert run.per_layer is not None and len(run.per_layer) == 3 and all(len(r) == 3 for r in run.per_layer)
    assert run.per_layer[-1] != run.per_layer[0]  # KD lowers the KL; a layer's own error need not fall
    assert not run.stopped_early


def test_exactly_the_kv_rows_of_the_converted_layers_change_in_a_fused_projection() -> None:
    model = family("gpt2")
    variant = headwidget.apply(model, "mqa", layers=[1])
    before = _state(variant)
    healed = small_heal(variant, model).model
    after = _state(healed)
    assert after.keys() == before.keys()
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    assert changed == {"transformer.h.1.attn.c_attn.weight", "transformer.h.1.attn.c_attn.bias"}
    adapter = adapter_for(healed)
    p = adapter.head_projections(adapter.attention_at(1))
    rows_before, rows_after = (
        before["transformer.h.1.attn.c_attn.weight"].T,
        after["transformer.h.1.attn.c_attn.weight"].T,
    )
    q = p.q.index.reshape(-1)
    assert torch.equal(rows_before[q], rows_after[q])  # the query rows of the fused projection
    kv = torch.cat([p.k.index.reshape(-1), p.v.index.reshape(-1)])
    assert not torch.equal(rows_before[kv], rows_after[kv])
    w = adapter.head_weights(1)  # MQA written as copies: the copies stay equal
    assert all(torch.equal(w.k[0], w.k[g]) and torch.equal(w.v[0], w.v[g]) for g in range(w.num_kv_heads))
    assert all(torch.equal(w.k_bias[0], w.k_bias[g]) for g in range(w.num_kv_heads))


@pytest.mark.parametrize("trainable", ["attention", "lora:2"])
def test_wider_trainable_sets_change_only_the_converted_attention(trainable: str) -> None:
    model = llama()
    variant = headwidget.apply(model, "gqa:1", layers=[0, 2])
    before = _state(variant)
    after = _state(small_heal(variant, model, trainable=trainable).model)
    changed = {n for n in before if not torch.equal(before[n], after[n])}
    attention = {f"model.layers.{i}.self_attn.{p}_proj.weight" for i in (0, 2) for p in "qkvo"}
    assert changed == attention


def test_all_trains_every_layer_but_keeps_the_merged_heads() -> None:
    model = llama()
    run = small_heal(headwidget.apply(model, "mqa", layers=[1]), model, trainable="all", lr=1e-3)
    healed = run.model
    assert not torch.equal(healed.model.embed_tokens.weight, model.model.embed_tokens.weight)
    assert not torch.equal(
        healed.model.layers[0].self_attn.k_proj.weight, model.model.layers[0].self_attn.k_proj.weight
    )
    assert healed.model.layers[1].self_attn.k_proj.out_features == 16
    assert healed.model.layers[0].self_attn.k_proj.out_features == 32


def test_the_healed_gqa_model_keeps_its_kv_heads() -> None:
    model = family("llama_gqa")  # 6 query heads over 2 KV heads, with biases
    run = small_heal(headwidget.apply(model, "mqa"), model)
    healed = run.model
    assert healed.config.num_key_value_heads == 1
    assert type(healed) is type(model)
    for layer in healed.model.layers:
        assert layer.self_attn.k_proj.out_features == layer.self_attn.head_dim
        assert type(layer.self_attn.k_proj) is torch.nn.Linear  # no parametrization left
    ids = held_out()
    assert torch.isfinite(healed(ids).logits).all()


def _stacked_kv(model: torch.nn.Module, layer: int, rows: torch.Tensor | None = None) -> torch.Tensor:
    w = adapter_for(model).head_weights(layer)
    keys = w.k if rows is None else w.k[~rows]
    return torch.cat([keys.reshape(-1, w.k.shape[-1]), w.v.reshape(-1, w.v.shape[-1])])


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2"])
def test_the_healed_mla_model_keeps_rank_d_c(name: str) -> None:
    model = family(name)
    variant = headwidget.apply(model, "mla:5")
    run = small_heal(variant, model)
    for layer in range(2):
        s = torch.linalg.svdvals(_stacked_kv(run.model, layer))
        assert float(s[5] / s[0]) < 1e-12, (layer, s[:7])
        assert not torch.allclose(_stacked_kv(run.model, layer), _stacked_kv(variant, layer))
    # the recorded factors are the trained ones: their product is the written weights
    w = adapter_for(run.model).head_weights(1)
    f = run.model.headwidget_variant.factors[1]
    kv_of = w.kv_of
    assert torch.allclose(f["k_up"] @ f["down"], w.k[kv_of], rtol=0, atol=1e-12)


def test_the_healed_lrkv_model_keeps_shared_plus_rank_r() -> None:
    model = llama()
    run = small_heal(headwidget.apply(model, "lrkv:2"), model)
    w = adapter_for(run.model).head_weights(0)
    f = run.model.headwidget_variant.factors[0]
    shared = f["k_shared"]
    for g in range(w.num_kv_heads):
        assert torch.linalg.matrix_rank(w.k[g] - shared, rtol=1e-10) <= 2
    assert not torch.equal(
        shared, headwidget.apply(model, "lrkv:2").headwidget_variant.factors[0]["k_shared"]
    )


def test_partial_rope_mla_keeps_its_mask_and_its_latent_rank() -> None:
    model = llama()
    stats = headwidget.capture(model, held_out(5, rows=8, length=24), inputs=True, progress=False)
    variant = headwidget.apply(model, "mla:6+rope:2", stats)
    run = small_heal(variant, model)
    from headwidget.adapters._partial_rope import partial_rope_mask

    for layer in range(3):
        keep = partial_rope_mask(adapter_for(run.model).attention_at(layer))
        assert keep is not None and torch.equal(
            keep, partial_rope_mask(adapter_for(variant).attention_at(layer))
        )
        s = torch.linalg.svdvals(_stacked_kv(run.model, layer, rows=keep))
        assert float(s[6] / s[0]) < 1e-12


def test_seeded_runs_are_bit_identical_and_model_and_variant_untouched() -> None:
    model = llama()
    variant = headwidget.apply(model, "mqa")
    model_state, variant_state = _state(model), _state(variant)
    a = small_heal(variant, model, trainable="lora:2", seed=4)
    b = small_heal(variant, model, trainable="lora:2", seed=4)
    assert a == b  # every recorded number
    for (n, x), (_, y) in zip(a.model.state_dict().items(), b.model.state_dict().items(), strict=True):
        assert torch.equal(x, y), n
    for n, t in model.state_dict().items():
        assert torch.equal(t, model_state[n]), n
    for n, t in variant.state_dict().items():
        assert torch.equal(t, variant_state[n]), n
    assert not model.training and type(variant.model.layers[0].self_attn.k_proj) is torch.nn.Linear
    c = small_heal(variant, model, trainable="lora:2", seed=5)
    assert c.curve[-1]["kl"] != a.curve[-1]["kl"]


def test_per_layer_errors_are_the_attention_error_of_a_single_layer_variant() -> None:
    """A variant converting only layer ℓ sees the original's hidden state at ℓ: its own forward gives
    attn_variant(h), an independent route to each layer's teacher-forced error."""
    model = llama()
    run = small_heal(headwidget.apply(model, "mqa"), model, tokens=64, eval_every=64)
    assert run.per_layer is not None
    batches = evaluation_batches(held_out(), batch_size=4, max_length=16, max_tokens=120)
    for layer in range(3):
        single = headwidget.apply(model, "mqa", layers=[layer])
        diff = ref = 0.0
        for batch in batches:
            outs = []
            for m in (model, single):
                got: list[torch.Tensor] = []
                keep = got.append
                hook = (
                    adapter_for(m)
                    .attention_at(layer)
                    .register_forward_hook(lambda _m, _a, o, keep=keep: keep(o[0]))
                )
                with torch.no_grad():
                    m(**forward_kwargs(m, batch, torch.device("cpu")))
                hook.remove()
                outs.append(got[0][batch.attention_mask.bool()])
            diff += float((outs[1] - outs[0]).square().sum())
            ref += float(outs[0].square().sum())
        assert run.per_layer[0][layer] == pytest.approx(math.sqrt(diff / ref), rel=1e-9), layer


def test_lm_healing_and_an_encoder_healed_on_its_hidden_states() -> None:
    model = llama()
    run = small_heal(headwidget.apply(model, "mqa"), model, method="lm")
    assert run.loss == "lm" and all(math.isfinite(x) for x in run.losses)
    bert = family("bert")
    enc = small_heal(headwidget.apply(bert, "mqa"), bert, per_layer=True)
    assert enc.kind == "encoder" and enc.loss == "hidden_mse"
    report = headwidget.evaluate(
        bert, held_out(), ["mqa"], dtype=F64, batch_size=4, max_length=16, max_tokens=120, progress=False
    )
    assert enc.curve[0]["hidden_rel_error"] == pytest.approx(
        report.measures["mqa"]["hidden_rel_error"], rel=1e-12
    )
    assert enc.curve[-1]["hidden_rel_error"] < enc.curve[0]["hidden_rel_error"]
