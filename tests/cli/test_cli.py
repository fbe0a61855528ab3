"""The command line, run as a user would (a subprocess of the installed console script)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys

import pytest
import torch

from headwidget import KVStats
from headwidget.cli import main


def test_help_lists_every_option(capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(["demo", "--help"])
    assert exit_info.value.code == 0
    out = capsys.readouterr().out
    for option in (
        "--out",
        "--max-tokens",
        "--max-length",
        "--batch-size",
        "--device",
        "--models",
        "--no-progress",
        "--evaluation-tokens",
        "--sweep-tokens",
        "--full",
        "--no-figures",
        "--no-evaluation",
    ):
        assert option in out
    said = " ".join(out.split())  # argparse wraps the text
    assert "The K/V quantizers are a reduced run by default" in said and "--full runs them in full" in said
    assert "CQ codebooks fitted on all 2048 sampled rows" in said


def test_evaluate_help_names_every_variant_form(capsys):
    from headwidget.analysis.variants import VARIANT_FORMS

    with pytest.raises(SystemExit) as exit_info:
        main(["evaluate", "--help"])
    assert exit_info.value.code == 0
    said = " ".join(capsys.readouterr().out.split())  # argparse wraps the text
    for form in VARIANT_FORMS.split(", "):
        assert form in said
    assert "kv:int{b}/g{n}" in said and "kv:cq{c}c{b}b" in said


@pytest.mark.parametrize("flags", [[], ["--full"]])
def test_full_reaches_the_demo(tmp_path, monkeypatch, flags):
    import headwidget.demo

    seen: dict = {}
    monkeypatch.setattr(headwidget.demo, "run_demo", lambda out, **kwargs: seen.update(kwargs))
    assert main(["demo", "--out", str(tmp_path / "d"), *flags]) == 0
    assert seen["full"] is bool(flags)
    # token counts not given are the run's own (quick, or with --full the full run's)
    assert seen["evaluation_tokens"] is None and seen["sweep_tokens"] is None


@pytest.mark.parametrize(
    ("flags", "figures", "evaluation"),
    [([], True, True), (["--no-figures"], False, True), (["--no-evaluation", "--no-figures"], False, False)],
)
def test_the_parts_of_the_demo_reach_it(tmp_path, monkeypatch, flags, figures, evaluation):
    import headwidget.demo

    seen: dict = {}
    monkeypatch.setattr(headwidget.demo, "run_demo", lambda out, **kwargs: seen.update(kwargs))
    assert main(["demo", "--out", str(tmp_path / "d"), *flags]) == 0
    assert (seen["figures"], seen["evaluation"]) == (figures, evaluation)


def test_the_quick_runs_token_counts_and_the_full_runs():
    from headwidget.demo import (
        EVALUATION_TOKENS,
        FULL_EVALUATION_TOKENS,
        FULL_SWEEP_TOKENS,
        SWEEP_TOKENS,
        quick_run_note,
    )

    assert (EVALUATION_TOKENS, SWEEP_TOKENS) == (512, 64)
    assert (FULL_EVALUATION_TOKENS, FULL_SWEEP_TOKENS) == (1024, 128)
    note = quick_run_note(None, None, full=False)
    assert "512 held-out tokens" in note and "sweep on 64" in note and "--full` uses 1024 and 128" in note
    assert quick_run_note(None, 16, full=False) == (
        "A quick run: the variants on 512 held-out tokens; `headwidget demo --full` uses 1024."
    )
    assert quick_run_note(64, 16, full=False) == quick_run_note(None, None, full=True) == ""


def test_unknown_model_is_a_usage_error(capsys):
    assert main(["demo", "--models", "gpt-17"]) == 2
    assert "unknown model" in capsys.readouterr().err


def run_demo_command(out, model: str, *extra: str) -> subprocess.CompletedProcess[str]:
    """``headwidget demo`` on one embedded model, on 300 calibration tokens (a reduced run), as a user
    runs it: the installed console script in a subprocess."""
    exe = shutil.which("headwidget") or f"{sys.prefix}/bin/headwidget"
    flags = [
        "--out",
        str(out),
        "--models",
        model,
        "--max-tokens",
        "300",
        "--max-length",
        "64",
        "--no-progress",
    ]
    result = subprocess.run(
        [exe, "demo", *flags, *extra], capture_output=True, text=True, timeout=1700, check=False
    )
    assert result.returncode == 0, result.stderr
    assert "pydoc_data.topics" in result.stdout
    return result


def section_names(stdout: str) -> list[str]:
    """The sections of the demo's closing "time per section" table, in order."""
    timings = stdout.split("time per section:\n", 1)[1].splitlines()
    return [re.fullmatch(r"  (.+?) +\d+\.\d s", line).group(1) for line in timings]


# The demo runs as five tests that xdist runs side by side: as subprocesses of the console script,
# SmolLM2's statistics and reference figures (--no-evaluation) and MiniLM; in this process, SmolLM2's
# evaluation (--no-figures) in three parts: its variants' table, its per-layer sweep, its K/V
# quantizers. Together they check everything the whole demo writes.
def check_smollm2_statistics(result: subprocess.CompletedProcess[str], out) -> None:
    """What every SmolLM2 run prints and saves: the layout, the statistics and their summary table."""
    assert "llama/gqa, 30 layers, H=9 G=3 d_h=64" in result.stdout
    smol = KVStats.load(out / "smollm2-135m.safetensors")
    assert smol.tokens == 300
    assert "key_post" in smol.kinds
    assert smol.samples(0, "key_post").shape == (300, 192)
    # the printed table shows the saved numbers
    first_row = f"{0:>5d}  {smol.summary()[0]['key_abs_corr']:>10.3f}"
    assert first_row in result.stdout


@pytest.mark.slow
def test_demo_on_smollm2_writes_statistics_and_the_reference_figures(tmp_path):
    result = run_demo_command(tmp_path, "smollm2-135m", "--no-evaluation")
    check_smollm2_statistics(result, tmp_path)
    for name in ("channel_correlation", "head_alignment"):
        assert (tmp_path / f"{name}.png").read_bytes().startswith(b"\x89PNG")
        assert (tmp_path / f"{name}.pdf").read_bytes().startswith(b"%PDF")
    assert 'id="headwidget-data"' in (tmp_path / "explorer.html").read_text()
    report = (tmp_path / "report.md").read_text()
    assert "| key | rope |" in report
    # nothing of the evaluation: no files, no tables, no time, no word of a quick run
    for name in ("evaluation.json", "quantization.json", "tradeoff.png", "quantization.png"):
        assert not (tmp_path / name).exists()
    assert "## What each variant does" not in report and "## K/V quantizers" not in report
    assert "A quick run" not in report and "A quick run" not in result.stdout
    assert section_names(result.stdout) == [
        "smollm2-135m: load and capture",
        "figures, explorer and report",
        "total",
    ]


#: What the evaluation tests give the demo: SmolLM2 alone, 300 calibration tokens in windows of 64, the
#: variants on 16 held-out tokens and the sweep on 8 (both given: not a quick run), no figures.
EVALUATION_RUN = (
    "--max-tokens",
    "300",
    "--max-length",
    "64",
    "--evaluation-tokens",
    "16",
    "--sweep-tokens",
    "8",
)


def run_demo_evaluation(out, smollm2, monkeypatch, capsys, *, narrow: str) -> tuple[str, str, dict]:
    """``headwidget demo --no-figures`` with :data:`EVALUATION_RUN`, in this process (the console script is
    run by the tests above) on the session's SmolLM2, its stdout and report.

    The evaluation section is checked in three parts, one a test: the variants' table, the per-layer
    sweep and the K/V quantizers. Here the part ``narrow`` names (``"table"`` or ``"sweep"``) converts
    layer 0 alone, and the quantizers are not run: what the demo gives them is returned (with the calls
    of ``evaluate``), and they say what the last test checks."""
    import headwidget.demo
    from headwidget.demo import EVALUATION_VARIANTS, SWEEP_VARIANTS

    monkeypatch.setitem(headwidget.demo.MODELS, "smollm2-135m", lambda device=None: smollm2)
    given: dict = {"evaluate": []}
    real_evaluate = headwidget.demo.evaluate

    def evaluate(model, texts, variants, **options):
        given["evaluate"].append({"variants": variants, **options})
        if options.get("per_layer", False) == (narrow == "sweep"):
            options["layers"] = [0]
        return real_evaluate(model, texts, variants, **options)

    def quantizers(out, model, texts, stats, echo, **options):
        given["quantizers"] = {"out": out, "model": model, "texts": texts, "stats": stats, **options}
        echo("QUANTIZERS RAN")
        return ["QUANTIZER LINE"]

    monkeypatch.setattr(headwidget.demo, "evaluate", evaluate)
    monkeypatch.setattr(headwidget.demo, "quantizer_lines", quantizers)
    flags = ["demo", "--out", str(out), "--models", "smollm2-135m", "--no-progress", "--no-figures"]
    assert main([*flags, *EVALUATION_RUN]) == 0
    stdout = capsys.readouterr().out
    assert "pydoc_data.topics" in stdout
    check_smollm2_statistics(subprocess.CompletedProcess([], 0, stdout, ""), out)
    report = (out / "report.md").read_text()
    # no reference figures, no explorer, none of their tables
    for name in ("channel_correlation.png", "head_alignment.pdf", "explorer.html"):
        assert not (out / name).exists()
    assert "| key | rope |" not in report and "Open the figures" not in stdout
    # the time of every section; 300 sampled rows and 16 tokens are below the default run's reduction
    smol_sections = [
        "load and capture",
        "6 variants",
        "per-layer sweep",
        "channel coupling",
        "K/V quantizers",
    ]
    assert section_names(stdout) == [*(f"smollm2-135m: {s}" for s in smol_sections), "report", "total"]
    assert "A reduced run" not in stdout
    assert "A quick run" not in report and "A quick run" not in stdout  # both counts were given
    # what the variants' table, the sweep and the quantizers are given: the run's statistics and options
    table, sweep = given["evaluate"]
    options = {"dtype": torch.float32, "batch_size": 8, "max_length": 64, "progress": False}
    for call, variants, tokens in ((table, EVALUATION_VARIANTS, 16), (sweep, SWEEP_VARIANTS, 8)):
        assert call["variants"] == variants and call["max_tokens"] == tokens
        assert {k: call[k] for k in options} == options and call["stats"].tokens == 300
    assert sweep["per_layer"] is True and "per_layer" not in table
    return stdout, report, given


@pytest.mark.slow
def test_demo_on_smollm2_evaluates_its_variants(tmp_path, smollm2, monkeypatch, capsys):
    """The variants' table (the sweep converts layer 0 alone), the coupling table, and what the quantizers
    are given and where their lines go."""
    from headwidget.demo import EVALUATION_VARIANTS
    from headwidget.texts import english_sample

    stdout, report, given = run_demo_evaluation(tmp_path, smollm2, monkeypatch, capsys, narrow="sweep")
    # the evaluation of SmolLM2's variants on held-out text
    assert "## What each variant does to SmolLM2's predictions (held-out text)" in report
    assert "| spec | KV bytes/token | NLL | perplexity | ΔNLL | KL | top-1 |" in report
    for spec in EVALUATION_VARIANTS:
        assert f"| {spec} | " in report
    assert "| model | 46080 | " in report and "| mla:96+rope:8 | 17280 | " in report  # 30 layers, float32
    # its chart: the trade-off
    assert (tmp_path / "tradeoff.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "tradeoff.pdf").read_bytes().startswith(b"%PDF")
    # the coupling table (from the 300 sampled rows)
    assert "## Channel coupling in bits (SmolLM2, layers [0, 1, 12, 13, 26, 27, 28, 29])" in report
    assert "| layer | K pre-RoPE c=2/16 bins | K pre-RoPE c=4/4 bins | K post-RoPE c=2/16 bins |" in report
    assert "from 300 sampled token rows per layer and kind" in report
    # the K/V quantizers: the run's model, statistics, held-out text and options; their lines under their
    # heading
    call = given["quantizers"]
    assert call["model"] is smollm2[0] and call["texts"] == english_sample(split="evaluation")
    assert call["stats"].tokens == 300 and call["stats"].samples(0, "key_post").shape == (300, 192)
    assert call["out"] == tmp_path and call["max_tokens"] == 16 and call["full"] is False
    assert (call["dtype"], call["batch_size"], call["max_length"]) == (torch.float32, 8, 64)
    heading = "## K/V quantizers: what 1–5 bits per channel do to SmolLM2 (held-out text)"
    assert f"{heading}\n\nQUANTIZER LINE" in report and "QUANTIZERS RAN" in stdout


@pytest.mark.slow
def test_demo_on_smollm2_sweeps_every_layer(tmp_path, smollm2, monkeypatch, capsys):
    """The per-layer sweep over all 30 layers, its table and damage map (the variants' table converts layer
    0 alone)."""
    from headwidget.evaluation import EvaluationReport

    _, report, _ = run_demo_evaluation(tmp_path, smollm2, monkeypatch, capsys, narrow="table")
    assert "| layer | ΔNLL mqa | ΔNLL mla:128 |" in report and "most fragile layers" in report
    sweep = EvaluationReport.load(tmp_path / "evaluation.json")
    assert sweep.variants == ["model", "mqa", "mla:128"] and sweep.layers == list(range(30))
    assert sweep.kl["model"] == 0.0 and sweep.top1["model"] == 1.0
    assert sweep.per_layer is not None and len(sweep.per_layer["mqa"]) == 30
    assert 0 < sweep.tokens <= 8 and sweep.calibration["tokens"] == 300
    assert (tmp_path / "damage_map.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "damage_map.pdf").read_bytes().startswith(b"%PDF")


@pytest.mark.slow
def test_demo_quantizers_on_smollm2(tmp_path, smollm2):
    """What the demo's K/V quantizer section writes and says, given what the demo gives it (the previous
    test checks that): statistics captured as the demo captures them, 16 held-out tokens."""
    from headwidget.demo import _capture, quantizer_lines
    from headwidget.demo._quantization import QUANTIZER_VARIANTS
    from headwidget.evaluation import EvaluationReport
    from headwidget.texts import english_sample

    model, tokenizer = smollm2
    calibration = english_sample(split="calibration")
    stats = _capture(
        "smollm2-135m",
        model,
        tokenizer,
        calibration,
        batch_size=8,
        max_length=64,
        max_tokens=300,
        progress=False,
    )
    said: list[str] = []
    options = {
        "tokenizer": tokenizer,
        "dtype": torch.float32,
        "batch_size": 8,
        "max_length": 64,
        "progress": False,
    }
    lines = quantizer_lines(
        tmp_path,
        model,
        english_sample(split="evaluation"),
        stats,
        said.append,
        max_tokens=16,
        full=False,
        **options,
    )
    report = "\n".join(lines)
    stdout = "\n".join(said)
    quant = EvaluationReport.load(tmp_path / "quantization.json")
    assert quant.variants == ["model", *QUANTIZER_VARIANTS]
    assert "| kv:int4 | 5.00 | 7200 | 0 |" in report  # 2·(192·4/8 + 4·192/32) per layer, 30 layers
    assert "| kv:cq4c8b | 2.00 | 2880 | " in report and "| kv:cq8c8b | 1.00 | 1440 | " in report
    assert quant.constant_bytes["kv:cq4c8b"] == 30 * 2 * 48 * 256 * 4 * 2  # fp16 codebooks, K and V
    assert (tmp_path / "quantization.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "quantization.pdf").read_bytes().startswith(b"%PDF")
    assert "(codebooks from 300 calibration rows)" in stdout and "A reduced run" not in stdout


def test_demo_without_figures_or_evaluation_only_captures(tmp_path):
    result = run_demo_command(tmp_path, "minilm-l6", "--no-figures", "--no-evaluation")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["minilm-l6.safetensors", "report.md"]
    assert "## minilm-l6: per-layer summary (300 tokens)" in (tmp_path / "report.md").read_text()
    assert section_names(result.stdout) == ["minilm-l6: load and capture", "report", "total"]


@pytest.mark.slow
def test_demo_on_minilm_writes_statistics_and_the_mechanisms_figure(tmp_path):
    result = run_demo_command(tmp_path, "minilm-l6")
    assert "bert/mha, 6 layers, H=12 G=12 d_h=32" in result.stdout
    for suffix, magic in ((".png", b"\x89PNG"), (".pdf", b"%PDF")):
        assert (tmp_path / f"mechanisms{suffix}").read_bytes().startswith(magic)
    report = (tmp_path / "report.md").read_text()
    assert "| mqa | 128 |" in report  # MiniLM layer 3 as MQA: one K and one V head of 32 channels, bf16
    # no token count given, but nothing of SmolLM2's evaluation ran: no "quick run" said anywhere
    assert "A quick run" not in report and "A quick run" not in result.stdout
    mini = KVStats.load(tmp_path / "minilm-l6.safetensors")
    assert mini.tokens == 300 and "input" in mini.kinds
    assert section_names(result.stdout) == [
        "minilm-l6: load and capture",
        "figures, explorer and report",
        "total",
    ]


@pytest.fixture(scope="module")
def text_file(tmp_path_factory):
    from headwidget.texts import english_sample

    path = tmp_path_factory.mktemp("texts") / "sample.txt"
    path.write_text("\n\n".join(english_sample(max_chars=4000)), encoding="utf-8")
    return path


@pytest.mark.slow
def test_capture_from_a_model_directory(tmp_path, text_file, minilm, capsys):
    model, tokenizer = minilm
    model.save_pretrained(tmp_path / "minilm")
    tokenizer.save_pretrained(tmp_path / "minilm")
    out = tmp_path / "stats" / "minilm.safetensors"
    out.parent.mkdir()  # --out's directory must exist: a typo in it fails before the capture
    code = main(
        [
            "capture",
            "--model",
            str(tmp_path / "minilm"),
            "--texts",
            str(text_file),
            "--out",
            str(out),
            "--layers",
            "0,5",
            "--max-tokens",
            "200",
            "--inputs",
            "--cross-layer",
            "all",
            "--no-progress",
        ]
    )
    assert code == 0, capsys.readouterr().err
    stats = KVStats.load(out)
    assert stats.layers == [0, 5] and stats.tokens == 200 and "input" in stats.kinds
    assert stats.head_similarity([0, 5], "key").shape == (24, 24)
    assert "saved KVStats(" in capsys.readouterr().out


def test_capture_usage_errors_exit_2(tmp_path, text_file, capsys):
    assert (
        main(["capture", "--model", str(tmp_path), "--texts", str(text_file), "--out", "x.safetensors"]) == 2
    )
    assert "not a model directory" in capsys.readouterr().err
    assert main(["capture", "--model", "minilm-l6", "--texts", str(tmp_path / "no.txt"), "--out", "x"]) == 2
    assert "no such file" in capsys.readouterr().err
    bad_layers = ["--layers", "a,b"]
    assert (
        main(["capture", "--model", "minilm-l6", "--texts", str(text_file), "--out", "x", *bad_layers]) == 2
    )
    assert "comma-separated integers" in capsys.readouterr().err


def test_headwidget_errors_exit_1(tmp_path, text_file, capsys):
    code = main(
        [
            "capture",
            "--model",
            "minilm-l6",
            "--texts",
            str(text_file),
            "--out",
            str(tmp_path / "s"),
            "--layers",
            "9",
            "--no-progress",
        ]
    )
    assert code == 1
    assert "layer 9 is out of range" in capsys.readouterr().err
    bad = tmp_path / "bad.safetensors"
    bad.write_bytes(b"junk")
    assert main(["figure", str(bad), "--out", str(tmp_path / "f.png")]) == 1
    assert "not a readable safetensors file" in capsys.readouterr().err


@pytest.mark.slow
def test_figure_from_saved_statistics(tmp_path, text_file, capsys):
    stats = tmp_path / "mini.safetensors"
    args = ["--texts", str(text_file), "--max-tokens", "200", "--no-progress", "--cross-layer", "0,1"]
    assert main(["capture", "--model", "minilm-l6", "--out", str(stats), *args]) == 0
    out = tmp_path / "fig.svg"
    assert (
        main(
            [
                "figure",
                str(stats),
                "--view",
                "channels",
                "--layers",
                "0,5",
                "--channels",
                "0:16",
                "--out",
                str(out),
            ]
        )
        == 0
    )
    svg = out.read_text()
    assert "Keys · layer 5" in svg and "Values · layer 0" in svg
    assert (
        main(
            ["figure", str(stats), "--view", "alignment", "--layers", "0,1", "--out", str(tmp_path / "a.png")]
        )
        == 0
    )
    assert (
        main(
            ["figure", str(stats), "--view", "alignment", "--layers", "0,2", "--out", str(tmp_path / "b.png")]
        )
        == 1
    )
    assert "cross_layer=[0, 2]" in capsys.readouterr().err
    assert main(["figure", str(stats), "--view", "mechanisms", "--out", str(tmp_path / "m.png")]) == 2
    assert "needs --model" in capsys.readouterr().err
    assert main(["figure", str(stats), "--out", str(tmp_path / "fig.jpg")]) == 2


def test_the_layer_view_figure_opens_on_a_cross_layer(tmp_path):
    """Statistics whose joint moments skip layer 0: the figure selects the first layer the layer view
    can (it selected layer 0, and the view refused it, asking for another capture)."""
    import headwidget
    from tiny_models import ragged_batches, three_layer_llama

    model = three_layer_llama(seed=1)
    path = tmp_path / "stats.safetensors"
    headwidget.capture(model, ragged_batches(seed=2), cross_layer=[1, 2], progress=False).save(path)
    out = tmp_path / "layers.svg"
    assert main(["figure", str(path), "--view", "layer_similarity", "--out", str(out)]) == 0
    assert "L1 × L2" in out.read_text()
