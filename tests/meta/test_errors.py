"""Bad input gets a specific error that says what to do, and loses nothing."""

from __future__ import annotations

import pytest
import torch
from transformers import T5Config, T5Model

import headwidget
from headwidget import KVStats
from tiny_models import make_model, ragged_batches


@pytest.fixture(scope="module")
def model():
    return make_model("llama_gqa", dtype=torch.float32)


@pytest.fixture(scope="module")
def stats(model):
    return headwidget.capture(model, ragged_batches(), progress=False)


def no_hooks(model) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


@pytest.mark.parametrize("texts", [[], "", [""]])
def test_empty_texts(model, texts):
    class Tok:
        pad_token_id = 0

        def __call__(self, texts, **kw):
            return {"input_ids": [[] for _ in texts]}

    with pytest.raises(headwidget.CaptureInputError, match=r"empty|no real tokens"):
        headwidget.capture(model, texts, tokenizer=Tok(), progress=False)
    assert no_hooks(model)


def test_strings_without_tokenizer(model):
    with pytest.raises(headwidget.CaptureInputError, match="no tokenizer was given"):
        headwidget.capture(model, ["some text"], progress=False)


def test_all_padding_batch(model):
    batch = {"input_ids": torch.zeros(2, 5, dtype=torch.long), "attention_mask": torch.zeros(2, 5)}
    with pytest.raises(headwidget.CaptureInputError, match="batch 1 has no real tokens"):
        headwidget.capture(model, [ragged_batches()[0], batch], progress=False)
    assert no_hooks(model)


def test_wrong_batch_type(model):
    with pytest.raises(headwidget.CaptureInputError, match="must hold strings or dict batches"):
        headwidget.capture(model, [3, 4], progress=False)
    with pytest.raises(headwidget.CaptureInputError, match="integer tensor"):
        headwidget.capture(model, torch.rand(2, 4), progress=False)


@pytest.mark.parametrize("layers", [[2], [-3], [0, 7]])
def test_capture_layer_out_of_range(model, layers):
    with pytest.raises(headwidget.LayerIndexError, match=r"out of range.*2 layers"):
        headwidget.capture(model, ragged_batches(), layers=layers, progress=False)
    assert no_hooks(model)


def test_stats_layer_out_of_range_or_not_captured(model, stats):
    with pytest.raises(headwidget.LayerIndexError, match=r"out of range: the model has 2 layers"):
        stats.channel_corr(5)
    only_one = headwidget.capture(model, ragged_batches(), layers=[1], progress=False)
    with pytest.raises(headwidget.LayerIndexError, match=r"layer 0 was not captured.*layers=\[\.\.\., 0\]"):
        only_one.head_similarity(0)


def test_unknown_kind_and_metric(stats):
    with pytest.raises(headwidget.UnknownKindError, match="unknown kind 'keys'"):
        stats.channel_corr(0, "keys")
    with pytest.raises(headwidget.UnknownKindError, match="rope='post'"):
        stats.channel_corr(0, "key_post")
    with pytest.raises(headwidget.UnknownKindError, match="inputs=True"):
        stats.covariance(0, "input")
    with pytest.raises(headwidget.UnknownMetricError, match="choose one of token_cosine"):
        stats.head_similarity(0, "key", "euclid")


def test_unknown_rope_mode(model):
    with pytest.raises(headwidget.CaptureInputError, match="rope must be one of"):
        headwidget.capture(model, ragged_batches(), rope="after", progress=False)


def test_post_rope_on_models_without_rope():
    for name in ("gpt2", "bert"):
        with pytest.raises(headwidget.RopeCaptureError, match=r"no rotary embedding.*rope='pre'"):
            headwidget.capture(make_model(name), ragged_batches(), rope="post", progress=False)


def test_cross_layer_missing(stats):
    with pytest.raises(headwidget.CrossLayerMissingError, match=r"cross_layer=\[0, 1\]"):
        stats.head_similarity([0, 1], "key")


def test_merging_stats_of_different_models(stats):
    other = headwidget.capture(make_model("gpt2"), ragged_batches(), progress=False)
    with pytest.raises(headwidget.StatsMismatchError, match="model_class"):
        stats.merge(other)
    different_layers = headwidget.capture(
        make_model("llama_gqa", dtype=torch.float32), ragged_batches(), layers=[0], progress=False
    )
    with pytest.raises(headwidget.StatsMismatchError, match="layers"):
        stats + different_layers


def test_not_a_safetensors_file(tmp_path):
    bad = tmp_path / "stats.safetensors"
    bad.write_bytes(b"this is not a safetensors file at all")
    with pytest.raises(headwidget.StatsFileError, match="not a readable safetensors file"):
        KVStats.load(bad)
    with pytest.raises(headwidget.StatsFileError, match="no statistics file"):
        KVStats.load(tmp_path / "missing.safetensors")


def test_foreign_or_corrupt_safetensors(stats, tmp_path):
    from safetensors.torch import load_file, save_file

    foreign = tmp_path / "foreign.safetensors"
    save_file({"w": torch.zeros(2)}, str(foreign))
    with pytest.raises(headwidget.StatsFileError, match="not written by headwidget"):
        KVStats.load(foreign)
    good = stats.save(tmp_path / "good.safetensors")
    truncated = tmp_path / "truncated.safetensors"
    truncated.write_bytes(good.read_bytes()[:-100])
    with pytest.raises(headwidget.StatsFileError):
        KVStats.load(truncated)
    tensors = load_file(str(good))
    del tensors["layer1.value.m2"]
    import json

    from safetensors import safe_open

    with safe_open(str(good), framework="pt") as fh:
        header = fh.metadata()
    incomplete = tmp_path / "incomplete.safetensors"
    save_file(tensors, str(incomplete), metadata=header)
    with pytest.raises(headwidget.StatsFileError, match=r"corrupt or incomplete.*layer1.value.m2"):
        KVStats.load(incomplete)
    assert json.loads(header["meta"])["tokens"] == stats.tokens
    KVStats.load(good)  # the good file is still readable


def test_request_over_max_memory(model):
    need = headwidget.estimate(model, cross_layer=True, batch_size=2, max_length=16)
    with pytest.raises(headwidget.MemoryBudgetError, match=r"max_memory.*layers=\[\.\.\.\]"):
        headwidget.capture(
            model,
            ragged_batches(),
            cross_layer=True,
            batch_size=2,
            max_length=16,
            max_memory=need // 2,
            progress=False,
        )
    assert no_hooks(model)
    headwidget.capture(
        model,
        ragged_batches(),
        cross_layer=True,
        batch_size=2,
        max_length=16,
        max_memory=need,
        progress=False,
    )


def test_estimate_grows_with_options(model):
    base = headwidget.estimate(model)
    assert headwidget.estimate(model, rope="both") > base
    assert headwidget.estimate(model, cross_layer=True) > base
    assert headwidget.estimate(model, layers=[0]) < base
    # accumulators: per layer K and V (C = 2·8 = 16 channels): mean + m2 + two normalised Grams
    accum = 2 * 2 * 8 * (16 + 3 * 16 * 16)
    # K and V of both layers staged as float32 rows of 1 token, the buffers that fold them (2 heads), a
    # kind's rows on their way into staging, and the forward
    from headwidget.capture.memory import ForwardShape, forward_peak_bytes
    from headwidget.moments import FoldWork

    staging = 4 * 1 * 16 * 4 + FoldWork.nbytes(4, rows=1, channels=16, head_dim=8, element=4)
    working = 2 * 1 * 16 * 4
    adapter = headwidget.adapters.adapter_for(model)
    shape = ForwardShape.of(model, adapter.layout(), adapter.mlp_width())
    need = accum + staging + working + forward_peak_bytes(shape, 1, 1)
    assert headwidget.estimate(model, batch_size=1, max_length=1) == need
    assert headwidget.estimate(model, batch_size=4, max_length=64) > headwidget.estimate(model, max_length=32)


def test_unsupported_model_names_class_and_families():
    t5 = T5Model(T5Config(vocab_size=32, d_model=16, d_kv=4, d_ff=32, num_layers=1, num_heads=4))
    with pytest.raises(
        headwidget.UnsupportedModelError, match=r"T5Model.*model_type='t5'.*llama.*gpt2.*deepseek"
    ):
        headwidget.capture(t5, torch.zeros(1, 4, dtype=torch.long), progress=False)
