"""Every family's statistics against K/V recomputed independently from the weights (float64)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headwidget
from headwidget.adapters import adapter_for
from references import head_metric
from tiny_models import (
    FACTORIES,
    HEADS,
    ROPE_FAMILIES,
    attention_modules,
    make_model,
    ragged_batches,
    reference_activations,
)

METRICS = ("token_cosine", "cosine", "pearson", "cka")


@pytest.fixture(scope="module", params=sorted(FACTORIES))
def family_case(request):
    name = request.param
    model = make_model(name)
    batches = ragged_batches()
    rope = "both" if name in ROPE_FAMILIES else "pre"
    stats = headwidget.capture(model, batches, rope=rope, inputs=True, progress=False)
    return name, model, stats, reference_activations(name, model, batches)


def test_token_count_excludes_padding(family_case):
    _, _, stats, ref = family_case
    assert stats.tokens == 13 + 7 + 10 + 9 + 12
    assert ref[0]["key"].shape[0] == stats.tokens


def _atol(name: str, kind: str) -> float:
    # transformers builds its RoPE cos/sin tables in float32 even in a float64 model, so the keys the
    # attention receives carry float32 rounding that the float64 reference does not.
    # DeepSeek's RMSNorm on the latent also computes in float32.
    rounded = kind == "key_post" or (name.startswith("deepseek") and kind != "input")
    return 1e-6 if rounded else 1e-8


def test_channel_corr_and_covariance_match_numpy(family_case):
    name, _, stats, ref = family_case
    for layer in stats.layers:
        for kind in stats.kinds:
            x = ref[layer][kind]
            atol = _atol(name, kind)
            np.testing.assert_allclose(stats.covariance(layer, kind), np.cov(x.T), atol=atol, rtol=1e-6)
            np.testing.assert_allclose(stats.channel_corr(layer, kind), np.corrcoef(x.T), atol=atol)
            np.testing.assert_allclose(stats.mean(layer, kind), x.mean(0), atol=atol / 10, rtol=1e-9)


def test_channel_window_is_a_sub_block(family_case):
    name, _, stats, ref = family_case
    x = ref[1]["value"]
    window = slice(2, 9)
    atol = _atol(name, "value")  # DeepSeek's float32 RMSNorm rounds by kernel (AVX-512, AVX2, plain)
    np.testing.assert_allclose(
        stats.channel_corr(1, "value", channels=window), np.corrcoef(x[:, 2:9].T), atol=atol
    )
    picked = [0, 5, 3]
    np.testing.assert_allclose(
        stats.channel_corr(1, "value", channels=picked), np.corrcoef(x[:, picked].T), atol=atol
    )


@pytest.mark.parametrize("metric", METRICS)
def test_head_similarity_matches_brute_force(family_case, metric):
    name, _, stats, ref = family_case
    lay = stats.meta.layout
    for kind in [k for k in stats.kinds if lay.head_dim_of(k)]:
        sim = stats.head_similarity(0, kind, metric)
        assert sim.shape == (lay.num_kv_heads, lay.num_kv_heads)  # real KV heads, never GQA copies
        expected = head_metric(ref[0][kind], lay.head_dim_of(kind), metric)
        np.testing.assert_allclose(sim, expected, atol=_atol(name, kind))


def test_layout_matches_config(family_case):
    name, model, stats, _ = family_case
    lay = stats.meta.layout
    expected = HEADS[name]
    assert (lay.mechanism, lay.num_heads, lay.num_kv_heads) == expected
    assert stats.meta.model_class == type(model).__name__


def test_cross_layer_heads_match_concatenated_reference():
    model = make_model("llama_gqa")
    batches = ragged_batches()
    stats = headwidget.capture(model, batches, cross_layer=[0, 1], progress=False)
    ref = reference_activations("llama_gqa", model, batches)
    joint = np.concatenate([ref[0]["key"], ref[1]["key"]], axis=1)
    for metric in METRICS:
        np.testing.assert_allclose(
            stats.head_similarity([0, 1], "key", metric), head_metric(joint, 8, metric), atol=1e-9
        )
    # The within-layer blocks of the joint result agree with the per-layer statistics.
    np.testing.assert_allclose(
        stats.head_similarity([0, 1], "value", "cka")[2:, 2:],
        stats.head_similarity(1, "value", "cka"),
        atol=1e-12,
    )


def test_skip_first_token_drops_each_rows_first_real_token():
    model = make_model("gpt2")
    batches = ragged_batches()
    stats = headwidget.capture(model, batches, skip_first_token=True, progress=False)
    ref = reference_activations("gpt2", model, batches)
    starts = np.cumsum([0, 13, 7, 10, 9])  # first token of each row in the concatenated reference
    keep = np.setdiff1d(np.arange(ref[0]["key"].shape[0]), starts)
    assert stats.tokens == keep.size
    np.testing.assert_allclose(stats.channel_corr(0, "key"), np.corrcoef(ref[0]["key"][keep].T), atol=1e-8)


def test_max_tokens_counts_exactly():
    model = make_model("bert")
    stats = headwidget.capture(model, ragged_batches(), max_tokens=25, progress=False)
    assert stats.tokens == 25


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_a_budget_that_ends_inside_a_batch_computes_only_what_it_counts(name):
    """max_tokens=9 over rows of 5, 13 and 7 real tokens counts row 0 and row 1's first four: a causal
    model is run on those two rows up to position 5, a bidirectional one on the two rows whole (its
    tokens see the whole row), and the statistics are the float64 reference's first nine tokens."""
    model = make_model(name)
    batches = ragged_batches(lengths=((5, 13, 7),))
    shapes = []
    first = attention_modules(model)[0]
    hook = first.register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(
            tuple((args[0] if args else kwargs["hidden_states"]).shape[:2])
        ),
        with_kwargs=True,
    )
    try:
        stats = headwidget.capture(model, batches, max_tokens=9, progress=False)
    finally:
        hook.remove()
    assert stats.tokens == 9
    assert shapes == ([(2, 5)] if adapter_for(model).causal else [(2, 13)])
    ref = reference_activations(name, model, batches)
    for layer in stats.layers:
        for kind in stats.kinds:
            x = ref[layer][kind][:9]
            np.testing.assert_allclose(
                stats.covariance(layer, kind), np.cov(x.T), atol=_atol(name, kind), rtol=1e-6
            )


def test_float32_model_matches_float64_reference():
    model = make_model("llama_gqa", dtype=torch.float32)
    batches = ragged_batches()
    stats = headwidget.capture(model, batches, progress=False)
    ref = reference_activations("llama_gqa", model, batches)
    np.testing.assert_allclose(stats.channel_corr(1, "key"), np.corrcoef(ref[1]["key"].T), atol=1e-5)


#: The first projection of each family's MLP in a layer block (transformers' module names).
MLP_UP = {
    "llama": "mlp.up_proj",
    "gpt2": "mlp.c_fc",
    "gpt_neox": "mlp.dense_h_to_4h",
    "falcon": "mlp.dense_h_to_4h",
    "bigcode": "mlp.c_fc",
    "bert": "intermediate.dense",
    "deepseek": "mlp.up_proj",
}


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_mlp_width_is_the_width_of_the_mlps_first_projection(name):
    from headwidget.adapters import adapter_for

    model = make_model(name)
    block = next(m for n, m in model.named_modules() if n.endswith(("layers.0", "h.0", "layer.0")))
    up = block.get_submodule(next(v for k, v in MLP_UP.items() if name.startswith(k)))
    width = up.out_features if isinstance(up, torch.nn.Linear) else up.nf  # GPT-2's Conv1D
    assert adapter_for(model).mlp_width() == width


def test_an_encoder_is_measured_by_its_hidden_states_and_a_decoder_by_its_predictions():
    from headwidget.evaluation._outputs import OutputRunner

    assert OutputRunner.for_model(make_model("bert")).kind == "encoder"
    assert OutputRunner.for_model(make_model("gpt2")).kind == "causal-lm"


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_the_forward_ends_once_the_last_layers_kv_are_recorded(name):
    """The last layer's attention runs to its end only when post-RoPE keys are wanted (they are handed
    over inside it); otherwise the forward stops at its K/V projections."""
    model = make_model(name)
    finished: list[int] = []
    last = attention_modules(model)[-1]
    handle = last.register_forward_hook(lambda *_: finished.append(1))
    try:
        headwidget.capture(model, ragged_batches(), progress=False)
        assert finished == []
        if name in ROPE_FAMILIES:
            headwidget.capture(model, ragged_batches(), rope="both", progress=False)
            assert finished == [1, 1]  # one per batch
    finally:
        handle.remove()
