"""``protocol="prefill:P"``: a prefill builds the cache, the rest is scored from it (float64 references)."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import DynamicCache

import headwidget
from headwidget.analysis.quantizers import quantize_int_keys, quantize_int_values
from headwidget.analysis.variants import parse_variant
from headwidget.capture.inputs import Batch
from headwidget.errors import ArgumentError, EvaluationInputError, UnsupportedConversionError
from headwidget.evaluation._outputs import OutputRunner
from headwidget.evaluation._prefill import PrefillRunner, prefill_batches
from tiny_models import make_model, ragged_batches, sliding_window_gemma2, three_layer_llama

F64 = torch.float64
P = 6


@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    return three_layer_llama(seed=5)


def ids(rows: int = 4, length: int = 20, seed: int = 0) -> torch.Tensor:
    return torch.randint(1, 96, (rows, length), generator=torch.Generator().manual_seed(seed))


def brute_measures(model: torch.nn.Module, variant: torch.nn.Module, x: torch.Tensor, first: int) -> dict:
    """NLL (of the variant), KL(model ‖ variant) and top-1 over the targets from ``first`` on, from one
    forward of each over the whole rows (the documents protocol), in float64."""
    with torch.no_grad():
        ref = torch.log_softmax(model(x).logits[:, first - 1 : -1].to(F64), -1)
        out = torch.log_softmax(variant(x).logits[:, first - 1 : -1].to(F64), -1)
    targets = x[:, first:]
    nll = float(-out.gather(-1, targets[..., None]).mean())
    kl = float((ref.exp() * (ref - out)).sum(-1).mean())
    top1 = float((ref.argmax(-1) == out.argmax(-1)).double().mean())
    return {"nll": nll, "kl": kl, "top1": top1, "tokens": targets.numel()}


def test_without_a_transform_it_is_the_documents_protocol_on_the_scored_tokens(
    llama: torch.nn.Module,
) -> None:
    x = ids()
    report = headwidget.evaluate(
        llama, x, ["model", "mqa", "share:2"], protocol="prefill:6", dtype=F64, progress=False
    )
    assert report.protocol == "prefill:6"
    assert report.tokens == 4 * (20 - P - 1)
    for spec in ("model", "mqa", "share:2"):
        want = brute_measures(llama, headwidget.apply(llama, spec), x, P + 1)
        assert report.nll[spec] == pytest.approx(want["nll"], abs=1e-12)
        assert report.kl[spec] == pytest.approx(want["kl"], abs=1e-12)
        assert report.top1[spec] == pytest.approx(want["top1"], abs=1e-12)


def test_the_runner_s_logits_are_the_whole_forward_s_for_ragged_rows(llama: torch.nn.Module) -> None:
    """Right-padded rows of different lengths (shorter than P + 2: left out), and a row given left-padded."""
    batches = [
        Batch(b["input_ids"], b["attention_mask"]) for b in ragged_batches(seed=2, lengths=((13, 7, 10),))
    ]
    left = torch.tensor([[0, 0, 5, 6, 7, 8, 9, 10, 11, 12, 13]])
    batches.append(Batch(left, (left > 0).long()))
    prefilled = prefill_batches(batches, P, batch_size=3)
    assert [int(m.sum()) for b in prefilled for m in b.attention_mask] == [13, 10, 9]
    runner = PrefillRunner.for_model(llama, P)
    for batch in prefilled:
        got = runner(llama, batch)
        whole = OutputRunner.for_model(llama)(llama, batch)
        torch.testing.assert_close(got.values, whole.values, atol=1e-12, rtol=0)
        assert torch.equal(got.targets, whole.targets)
        assert got.targets.numel() == sum(int(m.sum()) - P - 1 for m in batch.attention_mask)


@pytest.mark.parametrize(
    ("spec", "quantized"), [("kv:int3/g4", (4, 2)), ("kv:int3/g2r4", (4, 2)), ("kv:int3/g2", (6, 4))]
)
def test_kv_int_quantizes_the_prefilled_cache_only(
    llama: torch.nn.Module, spec: str, quantized: tuple[int, int]
) -> None:
    """The deployed reading, as KIVI's prefill (jy-yuan/KIVI, ``models/llama_kivi.py``) with residual R
    (``r{R}``, else the group size n): a cache built by hand from the prefill's K/V, keys per channel in
    whole groups of n tokens with the last P mod R kept exact, values per token with the last R exact
    (P = 6: R = 4 quantizes 4 keys and 2 values; R = 2, 6 and 4); the scored tokens' own K/V exact. It
    gives evaluate's numbers; the whole-forward reading differs."""
    x = ids(rows=2)
    bits, n = 3, parse_variant(spec).group
    report = headwidget.evaluate(llama, x, [spec], protocol="prefill:6", dtype=F64, progress=False)
    plain = f"kv:int{bits}/g{n}"  # whole forwards, which quantize every token (a residual is refused)
    whole = headwidget.evaluate(llama, x, [plain], dtype=F64, progress=False, max_tokens=None)
    keys, values = quantized
    cache = DynamicCache(config=llama.config)
    with torch.no_grad():
        llama(x[:, :P], cache=cache, use_cache=True)
        for entry in cache.layers:
            k, v = entry.keys, entry.values
            entry.keys = torch.cat([quantize_int_keys(k[:, :, :keys], bits, n), k[:, :, keys:]], 2)
            entry.values = torch.cat([quantize_int_values(v[:, :, :values], bits, n), v[:, :, values:]], 2)
        logits = llama(x[:, P:], cache=cache, use_cache=True, attention_mask=torch.ones_like(x)).logits
    out = torch.log_softmax(logits[:, :-1], -1)
    nll = float(-out.gather(-1, x[:, P + 1 :, None]).mean())
    assert report.nll[spec] == pytest.approx(nll, abs=1e-12)
    # bytes: what the cache of the P prefilled tokens holds, per token (its exact keys and values in
    # float64); the whole-forward count quantizes every token
    c = 2 * 16  # 2 KV heads of 16
    quantized_k, quantized_v = c * bits / 8 + 4 * c / n, c * bits / 8 + 4 * math.ceil(c / n)
    layer = (keys * quantized_k + (P - keys) * 8 * c + values * quantized_v + (P - values) * 8 * c) / P
    assert report.kv_bytes_per_token[spec] == pytest.approx(3 * layer, rel=1e-12)
    assert whole.kv_bytes_per_token[plain] == pytest.approx(3 * (quantized_k + quantized_v), rel=1e-12)
    assert not math.isclose(report.nll[spec], brute_measures(llama, llama, x, P + 1)["nll"], abs_tol=1e-9)


def test_a_prefill_shorter_than_a_kv_int_group_is_kept_exact(llama: torch.nn.Module) -> None:
    """KIVI quantizes a key only once its group of n tokens is whole: a prefill of fewer than n tokens
    stays exact, so the deployed reading scores as the model does (the whole-forward reading does not)."""
    x = ids(rows=2)
    spec = "kv:int2/g8"
    report = headwidget.evaluate(llama, x, ["model", spec], protocol="prefill:6", dtype=F64, progress=False)
    assert report.nll[spec] == pytest.approx(report.nll["model"], abs=1e-12)
    whole = headwidget.evaluate(llama, x, ["model", spec], dtype=F64, progress=False, max_tokens=None)
    assert not math.isclose(whole.nll[spec], whole.nll["model"], abs_tol=1e-6)


@pytest.mark.parametrize("family", ["llama", "sliding-window gemma"])
def test_per_layer_cells_replay_both_forwards(llama: torch.nn.Module, family: str) -> None:
    """Each per-layer cell (layers before it replayed in the prefill and in the scored forward) equals
    the whole-model evaluation of that layer alone; also where sliding-window layers cache fewer tokens
    than the prefill (the replayed layers' stand-in caches hold what theirs would)."""
    alternating = ["sliding_attention", "full_attention", "sliding_attention"]
    model = llama if family == "llama" else sliding_window_gemma2(alternating)
    x = ids(rows=3)
    specs = ["mqa", "kv:int2/g4"]
    report = headwidget.evaluate(
        model, x, ["model", *specs], protocol="prefill:6", dtype=F64, progress=False, per_layer=True
    )
    for spec in specs:
        for layer in range(3):
            alone = f"{spec}@{layer}"
            one = headwidget.evaluate(model, x, [alone], protocol="prefill:6", dtype=F64, progress=False)
            assert report.per_layer[spec][layer] == pytest.approx(
                one.nll[alone] - report.nll["model"], abs=1e-12
            )


def test_allocate_takes_the_protocol(llama: torch.nn.Module) -> None:
    x = ids(rows=3, seed=4)
    alloc = headwidget.allocate(
        llama,
        x,
        budget=0.5,
        candidates=["model", "mqa", "kv:int4"],
        objective="nll",
        refine=1,
        protocol="prefill:6",
        dtype=F64,
        progress=False,
    )
    report = headwidget.evaluate(
        llama, x, ["mqa", "kv:int4"], protocol="prefill:6", dtype=F64, progress=False, per_layer=True
    )
    for spec in ("mqa", "kv:int4"):
        assert alloc.damage[spec] == pytest.approx(report.per_layer[spec], abs=1e-12)
    with pytest.raises(UnsupportedConversionError, match="protocol='prefill:P'"):  # merge needs a prefill
        headwidget.allocate(llama, x, budget=0.5, candidates=["model", "merge:2"], progress=False)


def test_bad_prefills_are_refused(llama: torch.nn.Module) -> None:
    x = ids(rows=2, length=8)
    with pytest.raises(ArgumentError, match=r"needs max_length ≥ 12"):
        headwidget.evaluate(llama, x, ["model"], protocol="prefill:10", max_length=11, progress=False)
    with pytest.raises(EvaluationInputError, match="at least 9 tokens"):
        headwidget.evaluate(llama, x, ["model"], protocol="prefill:7", progress=False)
    with pytest.raises(ArgumentError, match="protocol must be"):
        headwidget.evaluate(llama, x, ["model"], protocol="prefill:0", progress=False)
    with pytest.raises(UnsupportedConversionError, match="protocol='prefill:P'"):
        headwidget.evaluate(llama, x, ["xkv:4/2"], protocol="chunks:4", progress=False)
    bert = make_model("bert")
    with pytest.raises(ArgumentError, match="makes none"):
        headwidget.evaluate(
            bert, torch.randint(1, 90, (2, 12)), ["model"], protocol="prefill:4", progress=False
        )


def test_a_kivi_residual_is_refused_where_no_prefilled_cache_keeps_it(llama: torch.nn.Module) -> None:
    """``r{R}`` is what a deployed cache keeps exact after a prefill: with whole-window forwards (the
    documents protocol, apply's model, allocate without a prefill) it would change nothing, so it is
    refused there, saying so; under prefill:P it is taken."""
    x = ids(rows=2)
    for call in (
        lambda: headwidget.evaluate(llama, x, ["kv:int4/g4r8"], dtype=F64, progress=False),
        lambda: headwidget.apply(llama, "kv:int4/g4r8"),
        lambda: headwidget.allocate(
            llama, x, budget=0.5, candidates=["model", "kv:int2/g4r8"], progress=False
        ),
    ):
        with pytest.raises(UnsupportedConversionError, match=r"r8 is KIVI's residual of a deployed cache"):
            call()
    report = headwidget.evaluate(llama, x, ["kv:int4/g4r8"], protocol="prefill:6", dtype=F64, progress=False)
    assert math.isfinite(report.nll["kv:int4/g4r8"])
