"""``headwidget heal``: the runs it writes are what ``headwidget.heal`` gives for the same inputs, and every
mistake is one line on stderr and exit 1 or 2, before the work it would spoil."""

from __future__ import annotations

import os
import re
import subprocess
import sys
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

    def healed(spec: str, **protocol: str) -> headwidget.HealingRun:  # heal as the command's SMALL runs it
        return headwidget.heal(
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
            **protocol,
        )

    for spec, got in runs.items():
        assert got == healed(spec), spec
    assert [r["tokens"] for r in runs["mqa"].curve] == [0, 256, 512]
    prefilled = tmp_path / "prefill.json"
    args = ["heal", "--model", str(model_dir), "--variants", "mqa", *SMALL, "--protocol", "prefill:8"]
    assert run(capfd, [*args, "--out", str(prefilled)])[0] == 0
    want = healed("mqa", protocol="prefill:8")
    assert load_runs(prefilled)["mqa"] == want and want.protocol == "prefill:8"
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


# ------------------------------------------------------------------------------- specs and numbers
@pytest.fixture(scope="module")
def other_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A GPT-2 (fused Conv1D projections, MHA only) and a Llama that has one KV head already."""
    out = {}
    for name in ("gpt2", "llama_mqa"):
        root = tmp_path_factory.mktemp("heal") / name
        make_model(name, dtype=torch.float32).save_pretrained(root)
        char_tokenizer().save_pretrained(root)
        out[name] = root
    return out


def test_lrkv_and_mixed_specs_with_an_lrkv_part_are_healed(model_dir: Path, tmp_path: Path, capfd) -> None:
    """``lrkv:`` holds ``kv:``: the spec is parsed, not searched for a substring."""
    out = tmp_path / "heal.json"
    variants = "lrkv:4,lrkv:4@0;mqa@1"
    code, stdout, err = run(
        capfd, ["heal", "--model", str(model_dir), "--variants", variants, *SMALL, "--out", str(out)]
    )
    assert code == 0, err
    runs = load_runs(out)
    assert list(runs) == ["lrkv:4", "lrkv:4@0;mqa@1"]
    assert [(r.steps, [p["tokens"] for p in r.curve]) for r in runs.values()] == [(2, [0, 256, 512])] * 2
    assert f"saved {out}" in stdout


def test_a_gpt2_directory_heals_mqa(other_dirs: dict[str, Path], tmp_path: Path, capfd) -> None:
    out = tmp_path / "heal.json"
    argv = ["heal", "--model", str(other_dirs["gpt2"]), "--variants", "mqa", *SMALL, "--out", str(out)]
    code, stdout, err = run(capfd, argv)
    assert code == 0, err
    assert list(load_runs(out)) == ["mqa"] and "mqa: healed on 512 tokens (2 steps)" in stdout


def test_a_seed_beyond_what_torch_took_before(model_dir: Path, tmp_path: Path, capfd) -> None:
    out = tmp_path / "heal.json"
    argv = ["heal", "--model", str(model_dir), "--variants", "gqa:1", *SMALL, "--no-per-layer"]
    code, _, err = run(capfd, [*argv, "--seed", "99999999999999999", "--out", str(out)])
    assert code == 0, err
    assert load_runs(out)["gqa:1"].seed == 99999999999999999


@pytest.mark.parametrize(
    ("extra", "code", "message"),
    [
        (["--variants", "mqa@0;kv:int4@1"], 2, r"--variants mqa@0;kv:int4@1: a kv: quantizer fits no weight"),
        (["--variants", "model@0-1"], 2, r"give at least one conversion to heal"),
        (
            ["--variants", "mqa", "--seed", "１"],
            2,
            r"--seed: takes a whole number in 0\.\.\d+ in ASCII",
        ),
        (["--variants", "mqa", "--seed", "-1"], 2, r"--seed: takes a whole number"),
        (
            ["--variants", "mqa", "--seed", str(2**63)],
            2,
            r"--seed: .* in 0\.\.9223372036854775807",
        ),
        (["--variants", "mqa", "--lr", "１e-3"], 2, r"--lr: takes a finite number in ASCII"),
        (["--variants", "mqa", "--lr", "nan"], 2, r"--lr: takes a finite number"),
        (["--variants", "mqa", "--trainable", "lora:８"], 2, r"--trainable lora:８: .* in ASCII digits"),
        (["--variants", "mqa", "--protocol", "chunks:8"], 1, r"protocol='documents' or 'prefill:P'"),
    ],
)
def test_more_mistakes_are_one_line_and_write_nothing(model_dir, tmp_path, capfd, extra, code, message):
    out = tmp_path / "x.json"
    got, _, err = run(capfd, ["heal", "--model", str(model_dir), *SMALL, *extra, "--out", str(out)])
    assert got == code, err
    assert err.startswith("headwidget heal: ") and err.count("\n") == 1
    assert re.search(message, err), err
    assert not any(tmp_path.iterdir())


def test_a_conversion_that_changes_nothing_is_an_error(other_dirs, tmp_path: Path, capfd) -> None:
    out = tmp_path / "heal.json"
    argv = ["heal", "--model", str(other_dirs["llama_mqa"]), "--variants", "mqa", *SMALL, "--out", str(out)]
    code, stdout, err = run(capfd, argv)
    assert code == 1 and err.count("\n") == 1
    assert "headwidget heal: the 'mqa' variant is the model itself" in err and "nothing to recover" in err
    assert not out.exists() and "saved" not in stdout


# ------------------------------------------------------------------------------------------- Ctrl-C
DRIVER = """
import os, signal, sys
from headwidget import cli
from headwidget.healing import _heal

# Ctrl-C as a terminal's foreground process takes it, also where this test's runner ignores SIGINT (a
# job started in the background of a shell without job control: its children inherit the ignoring)
signal.signal(signal.SIGINT, signal.default_int_handler)
where, argv = sys.argv[1], sys.argv[2:]
if where == "step":  # a real SIGINT at the start of the first variant's second step
    step = _heal._Training.step
    calls = []

    def pressed(self, index):
        calls.append(index)
        if len(calls) == 2:
            os.kill(os.getpid(), signal.SIGINT)
        return step(self, index)

    _heal._Training.step = pressed
else:  # a real SIGINT while the model loads
    load = cli.load_model

    def pressed_load(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGINT)
        return load(*args, **kwargs)

    cli.load_model = pressed_load
raise SystemExit(cli.main(argv))
"""


def _interrupted(tmp_path: Path, model_dir: Path, where: str) -> subprocess.CompletedProcess[str]:
    driver = tmp_path / "driver.py"
    driver.write_text(DRIVER, encoding="utf-8")
    out = tmp_path / "heal.json"
    argv = ["heal", "--model", str(model_dir), "--variants", "mqa,gqa:1", *SMALL, "--tokens", "1024"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(driver), where, *argv, "--out", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
        env=env,
    )


def test_ctrl_c_stops_the_whole_command_and_writes_the_runs_so_far(model_dir: Path, tmp_path: Path) -> None:
    result = _interrupted(tmp_path, model_dir, "step")
    assert result.returncode == 130, result.stderr
    out = tmp_path / "heal.json"
    assert result.stderr.splitlines() == [
        f"headwidget heal: interrupted (Ctrl-C): wrote the runs so far to {out} (mqa); not healed in full: "
        "mqa, gqa:1"
    ]
    runs = load_runs(out)
    assert list(runs) == ["mqa"]  # gqa:1 was not started
    assert runs["mqa"].stopped_early and runs["mqa"].steps == 2 and runs["mqa"].curve[-1]["step"] == 2
    assert "mqa: healed on 512 tokens (2 steps)" in result.stdout and "gqa:1" not in result.stdout


def test_ctrl_c_before_any_healing_writes_nothing(model_dir: Path, tmp_path: Path) -> None:
    result = _interrupted(tmp_path, model_dir, "load")
    assert result.returncode == 130, result.stderr
    assert result.stderr.splitlines() == [
        "headwidget heal: interrupted (Ctrl-C): no variant was healed, nothing written; not healed in full: "
        "mqa, gqa:1"
    ]
    assert not (tmp_path / "heal.json").exists()


def test_micro_batches_and_checkpoints_reach_heal(model_dir: Path, tmp_path: Path, capfd) -> None:
    out = tmp_path / "heal.json"
    extra = ["--micro-batch-size", "2", "--checkpoint"]
    code, _, err = run(
        capfd, ["heal", "--model", str(model_dir), "--variants", "mqa", *SMALL, *extra, "--out", str(out)]
    )
    assert code == 0, err
    model = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    want = headwidget.heal(
        headwidget.apply(model, "mqa"),
        model,
        tokenizer=AutoTokenizer.from_pretrained(model_dir),
        tokens=512,
        batch_size=4,
        max_length=64,
        micro_batch_size=2,
        checkpoint=True,
        eval_tokens=128,
        eval_every=256,
        lr=1e-3,
        progress=False,
    )
    assert load_runs(out)["mqa"] == want
