"""The cross-layer variants on every family whose attention goes through ``AttentionInterface``."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from transformers import DynamicCache

import headwidget
from headwidget.adapters import adapter_for
from headwidget.errors import UnsupportedConversionError
from headwidget.evaluation._cache_transforms import PrefilledCache, transforming_prefill
from tiny_models import ROPE_FAMILIES, make_model, record_attention_inputs, reference_kv

F64 = torch.float64
CAUSAL = [
    "llama_gqa",
    "llama_mqa",
    "gpt2",
    "gpt_neox",
    "falcon_new",
    "falcon_mqa",
    "bigcode_mqa",
    "bigcode_mha",
]


def ids(rows: int = 2, length: int = 14) -> torch.Tensor:
    return torch.randint(1, 90, (rows, length), generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("name", CAUSAL)
def test_a_full_rank_xkv_is_the_model(name: str) -> None:
    """A rank that holds every prefilled key and value: the keys turned back before RoPE and again (half,
    partial rotary, no RoPE) and the SVD reconstruct the cache, so the scores are the model's."""
    model = make_model(name)
    full = 2 * 64  # ≥ the side-by-side channels of a pair of layers
    spec = f"xkv:{full}/2"
    report = headwidget.evaluate(
        model, ids(), ["model", spec], protocol="prefill:5", dtype=F64, progress=False
    )
    assert report.nll[spec] == pytest.approx(report.nll["model"], abs=1e-10)
    assert report.kl[spec] == pytest.approx(0.0, abs=1e-10)


@pytest.mark.parametrize("name", [n for n in CAUSAL if n in ROPE_FAMILIES or n == "gpt2"])
def test_cached_keys_turned_back_are_the_keys_before_rope(name: str) -> None:
    """What xkv compresses: each layer's cached keys turned back by the prefill's angles equal its keys
    before RoPE, recomputed from its attention input and weights (half pairing, GPT-NeoX's partial
    rotary, no RoPE)."""
    model = make_model(name)
    x = ids(rows=2, length=9)
    seen: dict[int, torch.Tensor] = {}

    class Probe:
        spec = "probe"
        layers = (0, 1)

        def transform(self, prefilled: PrefilledCache) -> None:
            for layer in self.layers:
                seen[layer] = prefilled.keys_before_rope(prefilled.kv(layer)[0])

    with torch.no_grad(), transforming_prefill(model, [Probe()]):
        model(x, cache=DynamicCache(config=model.config), use_cache=True)
    inputs = record_attention_inputs(model, [{"input_ids": x, "attention_mask": torch.ones_like(x)}])
    for layer in (0, 1):
        attention = adapter_for(model).attention_at(layer)
        for row in range(2):
            want = reference_kv(name, model, attention, inputs[layer][0][row])["key"]  # (T, G, d)
            torch.testing.assert_close(seen[layer][row], want.transpose(0, 1), atol=1e-12, rtol=0)


@pytest.mark.parametrize("name", [*CAUSAL, "bert"])
def test_a_reader_s_own_keys_and_values_are_never_read(name: str) -> None:
    """``share:2``: zeroing layer 1's own K/V weights changes nothing, while the variant differs from the
    model (it reads layer 0's)."""
    model = make_model(name)
    variant = headwidget.apply(model, "share:2")
    adapter = adapter_for(variant)
    attention = adapter.attention_at(1)
    w = adapter.read_head_weights(attention)
    x = ids()
    with torch.no_grad():
        before = variant(x)[0]
        adapter.write_head_weights(
            attention,
            replace(
                w,
                k=torch.zeros_like(w.k),
                v=torch.zeros_like(w.v),
                k_bias=None if w.k_bias is None else torch.zeros_like(w.k_bias),
                v_bias=None if w.v_bias is None else torch.zeros_like(w.v_bias),
            ),
        )
        after = variant(x)[0]
        plain = model(x)[0]
    torch.testing.assert_close(after, before, atol=1e-12, rtol=0)
    assert float((before - plain).abs().max()) > 1e-6


@pytest.mark.parametrize("name", ["deepseek_v2"])
def test_a_latent_cache_is_refused(name: str) -> None:
    model = make_model(name)
    for spec in ("share:2", "merge:2"):
        with pytest.raises(UnsupportedConversionError, match="latent"):
            headwidget.evaluate(model, ids(), [spec], protocol="prefill:5", progress=False)
