"""The demo's K/V quantizer section: the default run is reduced (and says so), ``full`` is not.

On a tiny Llama with the reduction's sizes shrunk to its scale (and quantizers with small codebooks, the
figures not drawn: the demo test draws them), the section's saved report must equal ``evaluate`` called
by hand: on the first rows of the samples and the first tokens by default, on all of them with ``full``.
"""

from __future__ import annotations

import pytest
import torch

import headwidget
from headwidget.demo import _quantization
from headwidget.demo._quantization import first_rows, quantizer_lines
from headwidget.evaluation import EvaluationReport, evaluate, fit_codebooks, fit_quantizer
from tiny_models import make_model

OPTIONS = {"dtype": torch.float32, "batch_size": 4, "max_length": 64, "progress": False}
QUANTIZERS = ["kv:int2", "kv:cq4c3b", "kv:cq8c4b"]


@pytest.fixture(scope="module")
def setup():
    model = make_model("llama_gqa", dtype=torch.float32)  # C = 2 KV heads × 8 = 16 channels per kind
    gen = torch.Generator().manual_seed(5)
    stats = headwidget.capture(
        model, torch.randint(1, 96, (4, 30), generator=gen), rope="both", samples=60, progress=False
    )
    return model, stats, torch.randint(1, 96, (8, 12), generator=gen)


def by_hand(model, ids, stats, tokens):
    return evaluate(model, ids, ["model", *QUANTIZERS], stats=stats, max_tokens=tokens, **OPTIONS)


def test_first_rows_are_what_the_codebooks_are_fitted_on(setup) -> None:
    model, stats, _ = setup
    cut = first_rows(stats, 24)
    quantizer = fit_quantizer(model, "kv:cq4c3b", cut)
    for layer in stats.layers:
        for kind, source in (("key", "key_post"), ("value", "value")):
            own = fit_codebooks(stats.samples(layer, source)[:24], 4, 3)
            assert torch.equal(quantizer.codebooks[layer][kind].centroids, own.centroids)
    assert cut.meta.layout == stats.meta.layout and cut.tokens == stats.tokens


@pytest.mark.parametrize("full", [False, True])
def test_the_default_run_is_reduced_and_says_so_and_full_is_not(setup, tmp_path, monkeypatch, full) -> None:
    model, stats, ids = setup
    monkeypatch.setattr(_quantization, "CODEBOOK_ROWS", 24)  # of the 60 sampled rows
    monkeypatch.setattr(_quantization, "QUANTIZER_TOKENS", 40)  # of the 80 asked for
    monkeypatch.setattr(_quantization, "QUANTIZER_VARIANTS", QUANTIZERS)
    monkeypatch.setattr(_quantization, "save_all", lambda view, paths, **kw: paths)
    echoed: list[str] = []
    lines = quantizer_lines(tmp_path, model, ids, stats, echoed.append, max_tokens=80, full=full, **OPTIONS)
    saved = EvaluationReport.load(tmp_path / "quantization.json")
    rows, tokens = (60, 80) if full else (24, 40)
    expected = by_hand(model, ids, first_rows(stats, rows), tokens)
    assert saved.variants == expected.variants and saved.tokens == expected.tokens
    assert saved.fingerprint == expected.fingerprint and saved.measures == expected.measures
    assert (saved.tokens > 40) if full else (saved.tokens <= 40)
    said = "\n".join(echoed)
    assert f"(codebooks from {rows} calibration rows)" in said
    assert f"fitted by k-means on {rows} calibration samples per layer and kind" in lines[0]
    note = "A reduced run: codebooks from 24 of the 60 sampled rows, quantizers on at most 40 held-out tokens"
    if full:
        assert "reduced" not in said and "reduced" not in lines[0]
    else:
        assert note in said and note in lines[0] and "`headwidget demo --full`" in lines[0]
