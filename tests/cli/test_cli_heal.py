"""``headwidget heal``: the runs it writes are what ``headwidget.heal`` gives for the same inputs, and every
mistake is one line on stderr and exit 1 or 2, before the work it would spoil."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
from transformers import AutoTokenizer, LlamaForCausalLM

import headwidget
from cli_runs import char_tokenizer, run
from headwidget.healing._run import load_runs
from headwidget.texts import english_sample
from tiny_models import make_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

SMALL = [
    "--tokens",
    "512",
    "--batch-size",
    "4",
    "--max-length",
    "64",
    "--eval-tokens",
    "128",
    "--eval-every",
    "256",
    "--calibration-tokens",
    "256",
    "--lr",
    "0.001",
    "--no-progress",
]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("heal") / "llama_gqa"
    make_model("llama_gqa", dtype=torch.float32).save_pretrained(root)
    char_tokenizer().save_pretrained(root)
    return root


def test_the_json_runs_are_heal_called_directly(model_dir: Path, tmp_path: Path, capfd) -> None:
    out = tmp_path / "heal.json"
    code, stdout, err = run(
        capfd, ["heal", "--model", str(model_dir), "--variants", "mqa,mla:16", *SMALL, "--out", str(out)]
    )
    assert code == 0, err
    runs = load_runs(out)
    assert list(runs) == ["mqa", "mla:16"]
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(model_dir)
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
    for spec, got in runs.items():
        want = headwidget.heal(
            headwidget.apply(model, spec, stats),
            model,
            tokenizer=tok,
            tokens=512,
            batch_size=4,
            max_length=64,
            eval_tokens=128,
            eval_every=256,
            lr=1e-3,
            progress=False,
        )
        assert got == want, spec
    assert [r["tokens"] for r in runs["mqa"].curve] == [0, 256, 512]
    assert "| variant | KV bytes/token | ΔNLL at 0 tokens |" in stdout and f"saved {out}" in stdout


def test_markdown_output(model_dir: Path, tmp_path: Path, capfd) -> None:
    out = tmp_path / "heal.md"
    code, _, err = run(
        capfd,
        [
            "heal",
            "--model",
            str(model_dir),
            "--variants",
            "gqa:1",
            *SMALL,
            "--no-per-layer",
            "--out",
            str(out),
        ],
    )
    assert code == 0, err
    text = out.read_text(encoding="utf-8")
    assert text.startswith("| variant | KV bytes/token |") and "## gqa:1" in text


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (["--variants", "kv:int4", "--out", "x.json"], 2, r"kv:int4: a kv: quantizer fits no weight"),
        (["--variants", "model", "--out", "x.json"], 2, r"give at least one conversion to heal"),
        (["--variants", "mqa", "--out", "x.png"], 2, r"the extension must be \.json or \.md"),
        (["--variants", "mqa", "--trainable", "q", "--out", "x.json"], 2, r"--trainable q: trainable='q'"),
        (["--variants", "mqa", "--tokens", "100", "--out", "x.json"], 1, r"tokens=100 is below one batch"),
    ],
)
def test_mistakes_are_one_line_and_write_nothing(
    model_dir: Path, tmp_path: Path, capfd, extra, code, message
):
    argv = ["heal", "--model", str(model_dir), *SMALL, *extra]
    argv = [a if a not in ("x.json", "x.png") else str(tmp_path / a) for a in argv]
    got, _, err = run(capfd, argv)
    assert got == code
    assert err.startswith("headwidget heal: ") and err.count("\n") == 1
    assert re.search(message, err), err
    assert not any(tmp_path.iterdir())
