"""evaluate(): measures against losses computed by hand from the models' own outputs (float64)."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch.nn.functional import cross_entropy

import headwidget
from headwidget.errors import (
    EncoderMeasureError,
    EvaluationInputError,
    NonFiniteLogitsError,
    ReportFileError,
    UnsupportedConversionError,
)
from headwidget.evaluation import EvaluationReport, apply, evaluate
from tiny_models import make_model, qk_norm_model, ragged_batches

F64 = torch.float64


def left_padded(batches: list[dict]) -> list[dict]:
    out = []
    for b in batches:
        ids, mask = b["input_ids"].clone(), b["attention_mask"].clone()
        for i in range(ids.shape[0]):
            n = int(mask[i].sum())
            ids[i] = torch.cat([torch.zeros(ids.shape[1] - n, dtype=ids.dtype), b["input_ids"][i, :n]])
            mask[i] = torch.cat(
                [torch.zeros(ids.shape[1] - n, dtype=mask.dtype), torch.ones(n, dtype=mask.dtype)]
            )
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def hand_rows(model: torch.nn.Module, batches: list[dict]) -> tuple[torch.Tensor, torch.Tensor]:
    """Logits of every predicted position (right-padded batches) and their targets, by hand."""
    rows, targets = [], []
    with torch.no_grad():
        for b in batches:
            out = model(input_ids=b["input_ids"], attention_mask=b["attention_mask"]).logits
            m = b["attention_mask"].bool()
            keep = m[:, :-1] & m[:, 1:]
            rows.append(out[:, :-1][keep])
            targets.append(b["input_ids"][:, 1:][keep])
    return torch.cat(rows), torch.cat(targets)


def hand_nll(model: torch.nn.Module, batches: list[dict]) -> float:
    rows, targets = hand_rows(model, batches)
    return float(cross_entropy(rows, targets))


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


@pytest.fixture(scope="module")
def llama():
    return make_model("llama_gqa")


@pytest.fixture(scope="module")
def batches():
    return ragged_batches(seed=5)


def test_model_variant_is_the_models_own_loss(llama, batches) -> None:
    before = state(llama)
    report = evaluate(llama, batches, ["model"], dtype=F64, progress=False)
    rows, targets = hand_rows(llama, batches)
    assert report.tokens == len(targets) == sum(n - 1 for n in (13, 7, 10, 9, 12))
    assert report.nll["model"] == pytest.approx(float(cross_entropy(rows, targets)), rel=1e-13)  # float64
    assert report.perplexity["model"] == pytest.approx(np.exp(report.nll["model"]), rel=1e-12)
    assert report.kl["model"] == 0.0 and report.top1["model"] == 1.0
    assert report.kv_bytes_per_token["model"] == 2 * 2 * (8 + 8) * 8
    # every layer converted by default; one layer of two: half of the original's cache
    assert (report.num_layers, report.layers, report.converted_kv_bytes) == (2, [0, 1], 2 * 2 * (8 + 8) * 8)
    one = evaluate(llama, batches, ["mqa"], layers=[1], dtype=F64, progress=False)
    assert (one.num_layers, one.layers, one.converted_kv_bytes) == (2, [1], 2 * (8 + 8) * 8)
    assert all(torch.equal(before[n], t) for n, t in llama.state_dict().items())


def test_variant_measures_by_hand(llama, batches) -> None:
    report = evaluate(llama, batches, ["model", "mqa", "lrkv:2"], dtype=F64, progress=False)
    ref, targets = hand_rows(llama, batches)
    p = torch.log_softmax(ref, -1)
    for spec in ("mqa", "lrkv:2"):
        rows, _ = hand_rows(apply(llama, spec), batches)
        q = torch.log_softmax(rows, -1)
        # dtype=float64 is float64 throughout: the measures agree with the float64 hand loss to its rounding
        assert report.nll[spec] == pytest.approx(float(cross_entropy(rows, targets)), rel=1e-13)
        want_kl = float((p.exp() * (p - q)).sum(-1).mean())
        assert report.kl[spec] == pytest.approx(want_kl, rel=1e-10, abs=1e-15)
        assert report.top1[spec] == pytest.approx(float((p.argmax(-1) == q.argmax(-1)).double().mean()))
        assert report.kl[spec] > 0
    assert report.kv_bytes_per_token["mqa"] == 2 * (8 + 8) * 8


def test_left_padding_gives_the_numbers_of_right_padding(llama, batches) -> None:
    right = evaluate(llama, batches, ["model", "mqa"], dtype=F64, progress=False)
    left = evaluate(llama, left_padded(batches), ["model", "mqa"], dtype=F64, progress=False)
    assert left.fingerprint == right.fingerprint and left.tokens == right.tokens
    for spec in ("model", "mqa"):
        assert left.nll[spec] == pytest.approx(right.nll[spec], rel=1e-9)
        assert left.kl[spec] == pytest.approx(right.kl[spec], rel=1e-5, abs=1e-12)
        assert left.top1[spec] == right.top1[spec]


def first_real(batches: list[dict], length: int) -> list[dict]:
    """Each row's first ``length`` real tokens, right-padded to ``length`` columns (cut by hand)."""
    out = []
    for b in batches:
        ids = torch.zeros(b["input_ids"].shape[0], length, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for i, (row, real) in enumerate(zip(b["input_ids"], b["attention_mask"].bool(), strict=True)):
            kept = row[real][:length]
            ids[i, : len(kept)], mask[i, : len(kept)] = kept, 1
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


@pytest.mark.parametrize("protocol", ["documents", "prefill:3"])
def test_max_length_keeps_each_rows_first_real_tokens_padded_left_or_right(llama, batches, protocol) -> None:
    """Rows of 7 to 13 tokens cut at 8 columns: a left-padded row keeps its first 8 real tokens, as a
    right-padded one does (a cut by column kept a left-padded row's padding and lost real tokens)."""
    options = {"max_length": 8, "protocol": protocol, "dtype": F64, "progress": False}
    by_hand = evaluate(llama, first_real(batches, 8), ["model", "mqa"], **options)
    for padded in (batches, left_padded(batches)):
        cut = evaluate(llama, padded, ["model", "mqa"], **options)
        assert cut.tokens == by_hand.tokens and cut.sequences == by_hand.sequences
        for spec in ("model", "mqa"):
            assert cut.nll[spec] == pytest.approx(by_hand.nll[spec], rel=1e-12)


def test_a_key_norm_over_every_kv_head_refuses_another_head_count_before_any_forward() -> None:
    """OLMo2's k_norm spans all its KV heads' channels: mha, gqa:1, mqa (and mqa+share:2) would leave it
    without a norm to take, and are refused before any forward, saying what keeps its heads (they
    raised a bare shape error after a few forwards); gqa:2, its own count, mla and share run, and
    Qwen3's per-head norm takes mqa."""
    olmo2, ids = (
        qk_norm_model("olmo2"),
        torch.randint(1, 96, (2, 12), generator=torch.Generator().manual_seed(4)),
    )
    forwards = []
    hook = olmo2.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        for spec in ("mha", "gqa:1", "mqa", "mqa+share:2"):
            with pytest.raises(
                UnsupportedConversionError, match=r"normalises all its KV heads together.*keep its heads"
            ):
                evaluate(olmo2, ids, ["model", spec], dtype=F64, progress=False)
            with pytest.raises(UnsupportedConversionError, match=r"normalises all its KV heads together"):
                apply(olmo2, spec)
        assert not forwards
    finally:
        hook.remove()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in olmo2.modules())
    report = evaluate(olmo2, ids, ["model", "gqa:2", "mla:8", "share:2"], dtype=F64, progress=False)
    assert report.nll["gqa:2"] == pytest.approx(report.nll["model"], rel=1e-12)
    qwen3 = qk_norm_model("qwen3")
    assert math.isfinite(evaluate(qwen3, ids, ["mqa"], dtype=F64, progress=False).nll["mqa"])


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2", "falcon_new", "gpt_neox", "bigcode_mha"])
def test_per_layer_delta_equals_a_full_forward_with_that_layer_replaced(name: str) -> None:
    model = make_model(name)
    batches = ragged_batches(seed=5)
    stats = headwidget.capture(model, ragged_batches(seed=3), progress=False, inputs=True)
    specs = ["model", "mqa", "mqa+align", "mla:16"]
    report = evaluate(model, batches, specs, stats=stats, per_layer=True, dtype=F64, progress=False)
    base = hand_nll(model, batches)
    assert report.per_layer is not None and report.per_layer_measure == "delta_nll"
    assert report.per_layer["model"] == [0.0, 0.0]
    for spec in specs[1:]:
        for layer in range(2):
            want = hand_nll(apply(model, spec, stats=stats, layers=[layer]), batches) - base
            assert report.per_layer[spec][layer] == pytest.approx(want, abs=1e-11)  # float64 throughout
        assert report.per_layer[spec] != [0.0, 0.0]


def test_evaluating_in_another_dtype_leaves_the_model_alone(llama, batches) -> None:
    before = state(llama)
    report = evaluate(llama, batches, ["model", "mqa"], dtype=torch.float32, per_layer=True, progress=False)
    assert all(t.dtype == F64 and torch.equal(before[n], t) for n, t in llama.state_dict().items())
    assert report.nll["model"] == pytest.approx(hand_nll(llama, batches), rel=1e-5)
    assert report.kv_bytes_per_token["mqa"] == 2 * 16 * 4


def test_encoder_measures_by_hand() -> None:
    bert = make_model("bert")
    batches = ragged_batches(seed=5)
    report = evaluate(bert, batches, ["model", "mqa"], per_layer=True, dtype=F64, progress=False)
    variant = apply(bert, "mqa")
    diff = ref = cos = 0.0
    count = 0
    with torch.no_grad():
        for b in batches:
            h = bert(**b).last_hidden_state
            g = variant(**b).last_hidden_state
            for i in range(h.shape[0]):
                n = int(b["attention_mask"][i].sum())
                a, c = h[i, :n].numpy(), g[i, :n].numpy()
                diff += ((a - c) ** 2).sum()
                ref += (a**2).sum()
                ma, mc = a.mean(0), c.mean(0)
                cos += ma @ mc / np.linalg.norm(ma) / np.linalg.norm(mc)
                count += 1
    assert report.kind == "encoder"
    assert report.hidden_rel_error["mqa"] == pytest.approx(np.sqrt(diff / ref), rel=1e-9)
    assert report.embedding_cosine["mqa"] == pytest.approx(cos / count, rel=1e-12)
    assert report.hidden_rel_error["model"] == 0.0
    with pytest.raises(EncoderMeasureError, match="perplexity is not measured for an encoder"):
        _ = report.perplexity
    one = apply(bert, "mqa", layers=[1])
    with torch.no_grad():
        h = torch.cat([bert(**b).last_hidden_state[b["attention_mask"].bool()] for b in batches])
        g = torch.cat([one(**b).last_hidden_state[b["attention_mask"].bool()] for b in batches])
    assert report.per_layer is not None
    assert report.per_layer["mqa"][1] == pytest.approx(float((g - h).norm() / h.norm()), rel=1e-9)


def test_too_few_tokens(llama) -> None:
    single = {"input_ids": torch.tensor([[5, 0], [7, 0]]), "attention_mask": torch.tensor([[1, 0], [1, 0]])}
    with pytest.raises(EvaluationInputError, match="at least 2 tokens"):
        evaluate(llama, [single], ["model"], progress=False)


@pytest.mark.parametrize(
    ("dtype", "advice"),
    [(F64, r"It ran in float64, so this is not overflow"), (torch.bfloat16, r"Evaluate in a wider dtype")],
)
def test_a_non_finite_variant_names_itself_and_the_layer(llama, batches, monkeypatch, dtype, advice) -> None:
    """The first layer whose output is not finite is named; a wider dtype is advised only to a run in a
    narrow one."""
    import headwidget.evaluation._apply as ev

    real = ev.fits_for

    def poisoned(adapter, spec, stats, layers):
        fits = real(adapter, spec, stats, layers)
        w = fits[1].weights
        assert w is not None
        w.o[0, 0, 0] = float("inf")
        return fits

    monkeypatch.setattr(ev, "fits_for", poisoned)
    with pytest.raises(NonFiniteLogitsError, match=rf"variant 'mqa' .* output of layer 1\. {advice}"):
        evaluate(llama, batches, ["model", "mqa"], dtype=dtype, progress=False)


def test_max_tokens_and_fingerprints(llama, batches) -> None:
    small = evaluate(llama, batches, ["model"], dtype=F64, max_tokens=20, progress=False)
    assert small.tokens == 12 + 6  # 13 real tokens of row 1 then 7 of row 2, minus their first tokens
    other = evaluate(llama, ragged_batches(seed=6), ["model"], dtype=F64, progress=False)
    full = evaluate(llama, batches, ["model"], dtype=F64, progress=False)
    assert len({small.fingerprint, other.fingerprint, full.fingerprint}) == 3


def test_report_save_and_load(llama, batches, tmp_path) -> None:
    report = evaluate(llama, batches, ["model", "gqa:1"], dtype=F64, per_layer=True, progress=False)
    assert report.variants == ["model", "gqa:1"]
    path = report.save(tmp_path / "r.json")
    back = EvaluationReport.load(path)
    assert back == report
    assert json.loads(path.read_text())["format"] == "headwidget-evaluation-report"
    md = report.save(tmp_path / "r.md").read_text()
    assert "| gqa:1 | 256 |" in md and "ΔNLL with only one layer (or cross-layer group) converted" in md
    with pytest.raises(EncoderMeasureError):
        _ = report.hidden_rel_error
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ReportFileError, match="not a headwidget evaluation report"):
        EvaluationReport.load(tmp_path / "bad.json")
