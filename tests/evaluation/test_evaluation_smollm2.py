"""apply() and evaluate() on the real SmolLM2-135M (GQA: 9 query heads, 3 KV heads, d_h 64, 30 layers)."""

from __future__ import annotations

import pytest
import torch
from torch.nn.functional import cross_entropy
from transformers import LlamaForCausalLM

import headwidget
from headwidget.evaluation import apply, evaluate
from headwidget.texts import english_sample

pytestmark = pytest.mark.slow

VARIANTS = ["model", "mqa", "mqa+align", "lrkv:16", "mla:128", "mla:96+rope:8"]


@pytest.fixture(scope="module")
def calibrated(smollm2):
    model, tok = smollm2
    stats = headwidget.capture(
        model,
        english_sample(split="calibration"),
        tokenizer=tok,
        inputs=True,
        rope="both",
        max_tokens=512,
        max_length=256,
        progress=False,
    )
    return model, tok, stats


def test_mqa_is_a_real_model_with_one_kv_head(smollm2, tmp_path) -> None:
    model, tok = smollm2  # "mqa" is data-free: no calibration statistics
    mqa = apply(model, "mqa")
    assert mqa.config.num_key_value_heads == 1 and model.config.num_key_value_heads == 3
    ids = tok(english_sample(split="evaluation")[0], return_tensors="pt")["input_ids"][:, :64]
    mqa.save_pretrained(tmp_path)
    loaded = LlamaForCausalLM.from_pretrained(tmp_path, dtype=torch.float32).eval()
    with torch.no_grad():
        a, b = mqa(ids, use_cache=True), loaded(ids, use_cache=True)
        original = model(ids, use_cache=True)
    torch.testing.assert_close(a.logits, b.logits, atol=1e-4, rtol=0)

    def cache_bytes(out) -> int:
        return sum(
            t.numel() * t.element_size() for layer in out.cache.layers for t in (layer.keys, layer.values)
        )

    assert cache_bytes(b) * 3 == cache_bytes(original)
    assert cache_bytes(b) == ids.numel() * mqa.headwidget_variant.kv_bytes_per_token(torch.float32)


def test_evaluation_table(calibrated) -> None:
    model, tok, stats = calibrated
    before = {k: v.clone() for k, v in model.state_dict().items()}
    texts = english_sample(split="evaluation")
    report = evaluate(
        model,
        texts,
        VARIANTS,
        tokenizer=tok,
        stats=stats,
        dtype=torch.float32,
        batch_size=4,
        max_length=128,
        max_tokens=64,  # the variants' fits over 30 layers are the point; a forward costs per token
        progress=False,
    )
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert report.tokens >= 60 and report.variants == VARIANTS
    # model NLL by hand on the same first 64 tokens
    total = count = 0.0
    left = 64
    with torch.no_grad():
        for text in texts:
            ids = tok(text, truncation=True, max_length=128, return_tensors="pt")["input_ids"][:, :left]
            left -= ids.shape[1]
            logits = model(ids).logits[0, :-1]
            total += float(cross_entropy(logits, ids[0, 1:], reduction="sum"))
            count += ids.shape[1] - 1
            if left <= 0:
                break
    assert report.nll["model"] == pytest.approx(total / count, rel=1e-4)
    assert 1.0 < report.perplexity["model"] < 100.0
    per_layer_elements = {
        "model": 3 * 128,
        "mqa": 128,
        "mqa+align": 128,
        "lrkv:16": 128 + 2 * 3 * 16,  # each of the 3 KV heads caches its rank-16 coordinates
        "mla:128": 128,
        "mla:96+rope:8": 96 + 3 * 16,
    }
    assert report.kv_bytes_per_token == {v: 30 * 4 * e for v, e in per_layer_elements.items()}
    for spec in VARIANTS[1:]:
        assert report.kl[spec] > 0 and 0.0 < report.top1[spec] < 1.0
        assert report.nll[spec] > report.nll["model"]
