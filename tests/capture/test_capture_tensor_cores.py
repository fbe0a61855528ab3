"""The capture's tensor-core path, run on the CPU: a bfloat16 model's rows staged in bfloat16 and folded
from two bfloat16 parts (products emulated exactly), against float64 statistics of the model's own K/V.

On a CUDA GPU the same path runs with ``torch.baddbmm(..., out_dtype=torch.float32)``; it is chosen for
16-bit models there (``CapturePlan.gram_mode``) and exercised by ``bench/gpu_check.py``.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import headwidget
from headwidget.capture.plan import CapturePlan
from references import head_metric

VOCAB = 128


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=3,
        num_attention_heads=8,
        num_key_value_heads=4,
        head_dim=32,
    )
    return LlamaForCausalLM(config).to(torch.bfloat16).eval()


def own_rows(model: torch.nn.Module, ids: torch.Tensor) -> dict[tuple[int, str], np.ndarray]:
    """Every layer's key and value projection outputs, as the model computed them, in float64."""
    seen: dict[tuple[int, str], np.ndarray] = {}
    hooks = []
    for layer, block in enumerate(model.model.layers):
        for kind, proj in (("key", block.self_attn.k_proj), ("value", block.self_attn.v_proj)):

            def keep(module, args, out, key=(layer, kind)):
                seen[key] = out.detach().reshape(-1, out.shape[-1]).double().numpy()

            hooks.append(proj.register_forward_hook(keep))
    try:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)
    finally:
        for hook in hooks:
            hook.remove()
    return seen


@pytest.mark.parametrize("mode", ["split", "exact"])
def test_a_bfloat16_models_statistics_are_float64_accurate(model, monkeypatch, mode):
    if mode == "split":  # what a CUDA device chooses for a 16-bit model
        monkeypatch.setattr(CapturePlan, "gram_mode", lambda self, device: "split")
    ids = torch.randint(0, VOCAB, (4, 96), generator=torch.Generator().manual_seed(2))
    stats = headwidget.capture(model, ids, batch_size=2, max_length=96, progress=False)
    reference = own_rows(model, ids)
    # the split forms the normalised Grams from one bfloat16 part of the centred unit rows: each of the
    # N·d_h products in a mean cosine is off by up to 2⁻⁸ of itself, mostly at random, so the mean by
    # a few 2⁻⁸/√(N·d_h) (3.5e-5 here, 5e-6 for 4096 tokens of heads of 128); float32 products by 1e-7
    tokens = ids.numel()
    cosine_tolerance = 8 * 2**-8 / np.sqrt(tokens * 32) if mode == "split" else 1e-6
    for (layer, kind), x in reference.items():
        np.testing.assert_allclose(stats.channel_corr(layer, kind), np.corrcoef(x.T), rtol=0, atol=1e-5)
        np.testing.assert_allclose(stats.mean(layer, kind), x.mean(0), rtol=0, atol=1e-6)
        cos = head_metric(x, 32, "token_cosine")
        np.testing.assert_allclose(stats.head_similarity(layer, kind), cos, rtol=0, atol=cosine_tolerance)
