"""``headwidget evaluate``: the report it writes is what ``headwidget.evaluate`` gives for the same
inputs, and every mistake is one line on stderr and exit 1 or 2, found before the work it would spoil."""

from __future__ import annotations

import importlib
import json
import re
from pathlib import Path
from typing import Any

import pytest
import torch
from transformers import AutoTokenizer

import headwidget
from cli_runs import TINY, char_tokenizer, run
from headwidget import cli
from headwidget.evaluation import EvaluationReport, evaluate
from headwidget.texts import english_sample
from tiny_models import VOCAB, make_model

VARIANTS = "mqa,mqa+align,lrkv:2,mla:16,rope:2,mla:12+rope:2"
CAPTURE = importlib.import_module("headwidget.capture")  # the module (headwidget.capture is the function)


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory) -> dict[str, Path]:
    """Saved tiny random-init Llama models (GQA: 6 query heads over 2 KV heads; MHA) with a tokenizer."""
    root = tmp_path_factory.mktemp("evaluate")
    dirs = {}
    for name in ("llama_gqa", "llama_mha"):
        make_model(name, dtype=torch.float32).save_pretrained(root / name)
        char_tokenizer().save_pretrained(root / name)
        dirs[name] = root / name
    return dirs


def direct(
    path: Path, specs: list[str], *, inputs: bool, per_layer: bool, protocol: str = "documents"
) -> EvaluationReport:
    """``headwidget.evaluate`` called as the command line calls it, on the model saved at ``path``."""
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    stats = headwidget.capture(
        model,
        english_sample(split="calibration"),
        tokenizer=tok,
        inputs=inputs,
        max_tokens=256,
        max_length=64,
        batch_size=4,
        progress=False,
    )
    return evaluate(
        model,
        english_sample(split="evaluation"),
        specs,
        tokenizer=tok,
        stats=stats,
        per_layer=per_layer,
        dtype=torch.float32,
        batch_size=4,
        max_length=64,
        max_tokens=128,
        protocol=protocol,
        progress=False,
    )


def test_the_json_report_is_evaluate_called_directly(model_dirs, tmp_path, capfd):
    out = tmp_path / "report.json"
    argv = [
        "evaluate",
        "--model",
        str(model_dirs["llama_gqa"]),
        "--variants",
        VARIANTS,
        "--per-layer",
        *TINY,
        "--out",
        str(out),
        "--no-progress",
    ]
    code, stdout, err = run(capfd, argv)
    assert code == 0, err
    report = EvaluationReport.load(out)
    specs = ["model", *VARIANTS.split(",")]
    assert report.variants == specs
    expected = direct(model_dirs["llama_gqa"], specs, inputs=True, per_layer=True)
    assert report.to_json() == json.loads(json.dumps(expected.to_json()))
    assert report.kl["model"] == 0.0 and report.top1["model"] == 1.0
    assert report.per_layer is not None and len(report.per_layer["mqa"]) == 2
    assert report.table() in stdout and f"saved {out}" in stdout
    assert err == ""


def test_markdown_report_and_plain_merges_capture_nothing(model_dirs, tmp_path, capfd, monkeypatch):
    def no_capture(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("plain merges need no statistics, yet a capture ran")

    monkeypatch.setattr(CAPTURE, "capture", no_capture)
    out = tmp_path / "report.md"
    argv = [
        "evaluate",
        "--model",
        str(model_dirs["llama_gqa"]),
        "--variants",
        "mqa,gqa:2",
        "--per-layer",
        *TINY,
        "--dtype",
        "bfloat16",
        "--out",
        str(out),
    ]
    code, stdout, err = run(capfd, argv)
    assert code == 0, err
    assert err == "", "progress bars only on a terminal"
    page = out.read_text(encoding="utf-8")
    assert page.startswith(f"# Attention variants of {model_dirs['llama_gqa']}\n")
    assert "- dtype: bfloat16" in page and "(fingerprint " in page
    assert "- calibration: none (no variant is fitted from statistics)" in page
    assert re.search(r"- evaluation: 12\d predicted tokens in \d sequences of the evaluation split", page)
    assert "| spec | KV bytes/token | NLL |" in page and "| mqa | 64 |" in page  # 2 layers × (8 + 8) × 2 B
    assert "ΔNLL with only one layer (or cross-layer group) converted:" in page
    assert "| layer | model | mqa | gqa:2 |" in page
    assert "| spec | KV bytes/token | NLL |" in stdout


def test_the_protocol_option_is_evaluate_s_protocol(model_dirs, tmp_path, capfd):
    out = tmp_path / "report.md"
    argv = [
        "evaluate",
        "--model",
        str(model_dirs["llama_gqa"]),
        "--variants",
        "mqa",
        *TINY,
        "--protocol",
        " Stride:32/16",
        "--out",
        str(out),
        "--no-progress",
    ]
    code, stdout, err = run(capfd, argv)
    assert code == 0, err
    expected = direct(
        model_dirs["llama_gqa"], ["model", "mqa"], inputs=False, per_layer=False, protocol="stride:32/16"
    )
    assert expected.protocol == "stride:32/16" and expected.table() in stdout
    assert "- protocol: stride:32/16\n" in out.read_text(encoding="utf-8")


def test_a_prefill_protocol_with_cross_layer_specs_is_evaluate_s(model_dirs, tmp_path, capfd):
    """--protocol prefill:P runs share, merge and xkv (alone and after a conversion) as evaluate does: the
    same table, the same numbers and the protocol in the report file; under documents merge is refused."""
    out = tmp_path / "report.json"
    specs = ["share:2", "merge:2", "mqa+merge:2", "xkv:4/2"]
    base = ["evaluate", "--model", str(model_dirs["llama_gqa"]), *TINY, "--no-progress"]
    argv = [*base, "--protocol", "prefill:16", *(a for spec in specs for a in ("--variant", spec))]
    argv += ["--out", str(out)]
    code, stdout, err = run(capfd, argv)
    assert code == 0, err
    expected = direct(
        model_dirs["llama_gqa"], ["model", *specs], inputs=False, per_layer=False, protocol="prefill:16"
    )
    assert expected.protocol == "prefill:16" and expected.table() in stdout
    saved = EvaluationReport.load(out)
    assert saved.protocol == "prefill:16" and saved.variants == expected.variants
    for spec in expected.variants:
        assert saved.kl[spec] == pytest.approx(expected.kl[spec], rel=1e-6, abs=1e-9)
        assert saved.kv_bytes_per_token[spec] == pytest.approx(expected.kv_bytes_per_token[spec], rel=1e-12)
    code, _, err = run(capfd, [*base, "--variant", "merge:2", "--out", str(tmp_path / "r.md")])
    assert code != 0 and "prefill:P" in err  # merge under documents: refused, saying which protocol


def test_saved_statistics_are_used_instead_of_a_capture(model_dirs, tmp_path, capfd):
    from transformers import LlamaForCausalLM

    path = model_dirs["llama_gqa"]
    model = LlamaForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(path)
    stats = headwidget.capture(
        model,
        english_sample(split="calibration"),
        tokenizer=tok,
        inputs=True,
        max_tokens=256,
        max_length=64,
        batch_size=4,
        progress=False,
    )
    saved = stats.save(tmp_path / "stats.safetensors")
    out = tmp_path / "report.json"
    argv = [
        "evaluate",
        "--model",
        str(path),
        "--variants",
        "lrkv:2",
        "--stats",
        str(saved),
        *TINY,
        "--out",
        str(out),
        "--no-progress",
    ]
    code, stdout, err = run(capfd, argv)
    assert code == 0, err
    expected = direct(path, ["model", "lrkv:2"], inputs=True, per_layer=False)
    assert EvaluationReport.load(out).measures == expected.measures
    assert f"read from --stats {saved}" in stdout


@pytest.fixture(scope="module")
def saved_stats(model_dirs, tmp_path_factory) -> dict[str, Path]:
    """Statistics without inputs of the GQA model, and statistics of the other (MHA) model."""
    from transformers import LlamaForCausalLM

    root = tmp_path_factory.mktemp("stats")
    out = {}
    for name, inputs in (("llama_gqa", False), ("llama_mha", True)):
        model = LlamaForCausalLM.from_pretrained(model_dirs[name], dtype=torch.float32).eval()
        ids = torch.randint(1, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))
        out[name] = headwidget.capture(model, ids, inputs=inputs, progress=False).save(root / f"{name}.st")
    return out


#: (case, options changed or added, exit code, a phrase of the message, whether the model may load)
CASES: list[tuple[str, list[str], int, str, bool]] = [
    ("unknown spec", ["--variants", "mqa,banana"], 2, "cannot read variant spec 'banana'", False),
    ("no spec", ["--variants", " , "], 2, "give --variants (comma-separated variant specs", False),
    ("align on a spec that merges nothing", ["--variants", "lrkv:2+align"], 2, "goes with", False),
    ("out suffix", ["--out", "report.txt"], 2, "the extension must be .json or .md", False),
    ("protocol", ["--protocol", "stride:8"], 2, "--protocol stride:8: protocol must be 'documents'", False),
    ("protocol stride", ["--protocol", "stride:8/9"], 2, "needs W ≥ 2 and 1 ≤ S ≤ W", False),
    ("out directory missing", ["--out", "no/such/report.json"], 2, "does not exist; create it", False),
    ("out is a directory", ["--out", "folder.json"], 2, "folder.json: is a directory", False),
    ("evaluation tokens 0", ["--evaluation-tokens", "0"], 2, "whole number ≥ 1", False),
    ("calibration tokens not a number", ["--calibration-tokens", "many"], 2, "whole number ≥ 1", False),
    ("dtype float64", ["--dtype", "float64"], 2, "invalid choice", False),
    ("layers not integers", ["--layers", "a"], 2, "comma-separated integers", False),
    ("layers empty", ["--layers", ""], 2, "--layers is empty", False),
    ("batch size a float", ["--batch-size", "2.0"], 2, "--batch-size: takes a whole number ≥ 1", False),
    ("max length fullwidth", ["--max-length", "６４"], 2, "--max-length: takes a whole number ≥ 1", False),
    ("texts a directory", ["--texts", "folder.json"], 2, "--texts folder.json: is a directory", False),
    ("group size overflow", ["--variants", "kv:int4/g99999999999999999999"], 2, "1 ≤ n ≤ 1048576", False),
    ("fullwidth digit", ["--variants", "gqa:２"], 2, "ASCII digits 0-9, and '２' is not one", False),
    ("codebooks on too few tokens", ["--variants", "kv:cq2c12b"], 2, "need at least 4096", False),
    ("device meta", ["--device", "meta"], 2, "--device meta: meta tensors hold no values", True),
    ("texts missing", ["--texts", "no-such.txt"], 2, "--texts no-such.txt: no such file", False),
    ("stats missing", ["--stats", "no-such.safetensors"], 2, "no such statistics file", False),
    ("stats without inputs", ["--stats", "llama_gqa", "--variants", "mla:16"], 1, "kind 'input'", False),
    ("stats of another model", ["--stats", "llama_mha", "--variants", "mqa+align"], 1, "another", True),
    ("model missing", ["--model", "/no/such/model"], 2, "not a model directory", True),
    ("group count", ["--variants", "gqa:4"], 1, "gqa:4 needs a divisor of the 6 query heads", True),
    ("aligned group count", ["--variants", "gqa:4+align"], 1, "G must divide 2 (possible: 1, 2)", True),
    ("rank", ["--variants", "mqa,lrkv:99"], 1, "--variants: lrkv:99: r must lie in 0..8", True),
    ("latent", ["--variants", "mla:999+rope:2"], 1, "d_c must lie in", True),
    ("layers out of range", ["--layers", "7"], 1, "layer 7 is out of range", True),
]


@pytest.mark.parametrize(("case", "changes", "code", "phrase", "loads"), CASES, ids=[c[0] for c in CASES])
def test_user_errors(
    model_dirs, saved_stats, tmp_path, capfd, monkeypatch, case, changes, code, phrase, loads
):
    calibrations: list[Any] = []
    real_capture, real_load = CAPTURE.capture, cli.load_model

    def capture(*args: Any, **kwargs: Any) -> Any:
        calibrations.append(kwargs.get("max_tokens"))
        return real_capture(*args, **kwargs)

    def load(*args: Any, **kwargs: Any) -> Any:
        assert loads, "the model was loaded before the options were checked"
        return real_load(*args, **kwargs)

    monkeypatch.setattr(CAPTURE, "capture", capture)
    monkeypatch.setattr(cli, "load_model", load)
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder.json").mkdir()
    options = {"--model": str(model_dirs["llama_gqa"]), "--variants": "mqa", "--out": "report.json"}
    extra = []
    for key, value in zip(changes[::2], changes[1::2], strict=True):
        value = str(saved_stats.get(value, value)) if key == "--stats" else value
        if key in options:
            options[key] = value
        else:
            extra += [key, value]
    argv = ["evaluate", *[x for kv in options.items() for x in kv], *extra, *TINY, "--no-progress"]
    exit_code, _, err = run(capfd, argv)
    assert exit_code == code, err
    assert "Traceback" not in err and err.count("\n") == 1, err
    assert err.startswith("headwidget evaluate: ") or err.startswith("headwidget evaluate: error:"), err
    assert phrase in err
    assert 256 not in calibrations, "the calibration capture ran before the variants were checked"
    assert not (tmp_path / "report.json").exists()


@pytest.mark.slow
def test_smollm2_report_equals_evaluate_called_directly(smollm2, tmp_path, capfd):
    """The real model, three of its 30 layers converted (the fits of every layer take minutes on 2 cores)."""
    out = tmp_path / "smollm2.json"
    argv = [
        "evaluate",
        "--model",
        "smollm2-135m",
        "--variants",
        "mqa,mqa+align,mla:128",
        "--no-progress",
        "--layers",
        "0,14,29",
        "--calibration-tokens",
        "256",
        "--evaluation-tokens",
        "128",
        "--max-length",
        "128",
        "--batch-size",
        "4",
        "--out",
        str(out),
    ]
    code, stdout, err = run(capfd, argv)
    assert code == 0, err
    report = EvaluationReport.load(out)
    model, tok = smollm2
    stats = headwidget.capture(
        model,
        english_sample(split="calibration"),
        tokenizer=tok,
        inputs=True,
        layers=[0, 14, 29],
        max_tokens=256,
        max_length=128,
        batch_size=4,
        progress=False,
    )
    expected = evaluate(
        model,
        english_sample(split="evaluation"),
        ["model", "mqa", "mqa+align", "mla:128"],
        tokenizer=tok,
        stats=stats,
        layers=[0, 14, 29],
        dtype=torch.float32,
        batch_size=4,
        max_length=128,
        max_tokens=128,
        progress=False,
    )
    assert report.variants == expected.variants and report.layers == [0, 14, 29]
    assert (report.tokens, report.fingerprint) == (expected.tokens, expected.fingerprint)
    merged = 4 * (27 * 384 + 3 * 128)  # float32: 27 layers of 3 KV heads × (64 + 64), 3 of 128 elements
    assert (
        report.kv_bytes_per_token
        == expected.kv_bytes_per_token
        == {"model": 4 * 30 * 384, "mqa": merged, "mqa+align": merged, "mla:128": merged}
    )
    for spec in report.variants:
        assert report.measures[spec] == pytest.approx(expected.measures[spec], rel=1e-6, abs=1e-9)
    assert report.kl["model"] == 0.0 and report.top1["model"] == 1.0
    assert report.nll["mqa"] > report.nll["model"]
    assert "SmolLM2-135M-Instruct" in stdout and report.table() in stdout
