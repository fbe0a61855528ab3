"""The embedded real trained models: statistics against float64 references from their own weights."""

from __future__ import annotations

import numpy as np
import pytest

import headwidget
from references import head_metric
from tiny_models import reference_activations

pytestmark = pytest.mark.slow


def _batches(tokenizer, texts, max_length=64):
    enc = [tokenizer(t, truncation=True, max_length=max_length)["input_ids"] for t in texts]
    batches = []
    for start in range(0, len(enc), 3):
        rows = enc[start : start + 3]
        width = max(len(r) for r in rows)
        import torch

        ids = torch.zeros(len(rows), width, dtype=torch.long)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, r in enumerate(rows):
            ids[i, : len(r)] = torch.tensor(r)
            mask[i, : len(r)] = 1
        batches.append({"input_ids": ids, "attention_mask": mask})
    return batches


def test_smollm2_gqa_statistics_match_reference(smollm2, english_texts):
    model, tokenizer = smollm2
    lay = headwidget.adapters.adapter_for(model).layout()
    assert (lay.family, lay.mechanism, lay.num_layers, lay.num_heads, lay.num_kv_heads, lay.head_dim) == (
        "llama",
        "gqa",
        30,
        9,
        3,
        64,
    )
    batches = _batches(tokenizer, english_texts[:6])
    stats = headwidget.capture(model, batches, layers=[0, 29], rope="both", progress=False)
    ref = reference_activations("llama_gqa", model, batches, layers=[0, 29])
    for layer in (0, 29):
        for kind in ("key", "value"):
            x = ref[layer][kind]
            np.testing.assert_allclose(stats.channel_corr(layer, kind), np.corrcoef(x.T), atol=2e-5)
        sim = stats.head_similarity(layer, "key", "token_cosine")
        assert sim.shape == (3, 3)
        np.testing.assert_allclose(sim, head_metric(ref[layer]["key"], 64, "token_cosine"), atol=1e-5)
        # post-RoPE keys: with rope base 1e5 the fast-rotating first channels decorrelate
        np.testing.assert_allclose(
            stats.channel_corr(layer, "key_post"), np.corrcoef(ref[layer]["key_post"].T), atol=1e-4
        )


def test_capture_from_strings_with_tokenizer(smollm2, english_texts):
    model, tokenizer = smollm2
    stats = headwidget.capture(
        model, english_texts[:4], tokenizer=tokenizer, layers=[3], max_length=32, progress=False
    )
    expected = sum(min(len(tokenizer(t)["input_ids"]), 32) for t in english_texts[:4])
    assert stats.tokens == expected


def test_minilm_bert_statistics_match_reference(minilm, english_texts):
    model, tokenizer = minilm
    batches = _batches(tokenizer, english_texts[:6])
    stats = headwidget.capture(model, batches, progress=False)
    assert stats.meta.layout.num_heads == 12 and stats.meta.layout.head_dim == 32
    ref = reference_activations("bert", model, batches)
    for layer in (0, 5):
        for kind in ("key", "value"):
            np.testing.assert_allclose(
                stats.channel_corr(layer, kind), np.corrcoef(ref[layer][kind].T), atol=2e-5
            )
            for metric in ("pearson", "cka"):
                np.testing.assert_allclose(
                    stats.head_similarity(layer, kind, metric),
                    head_metric(ref[layer][kind], 32, metric),
                    atol=1e-5,
                )
