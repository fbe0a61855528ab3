"""Healing-run files: a real run survives its own save and load (a BERT run too), every crafted file is
refused naming the field (as statistics files are), a symlinked or NUL-byte path is refused, and the file
``headwidget heal`` writes loads through the one public loader, ``HealingRun.load_all``."""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch

import headwidget
from cli_runs import char_tokenizer, run
from headwidget.errors import ReportFileError
from headwidget.healing import HealingRun
from headwidget.healing._run import save_runs
from healing_cases import family, llama, small_heal
from tiny_models import make_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def lm_run() -> HealingRun:
    """A tiny Llama healed 4 steps of 4 × 16 tokens, a point every 2 steps, per-layer errors measured."""
    model = llama()
    return small_heal(headwidget.apply(model, "mqa"), model, per_layer=True)


@pytest.fixture(scope="module")
def bert_run() -> HealingRun:
    bert = family("bert")
    return small_heal(headwidget.apply(bert, "mqa"), bert, per_layer=True)


def as_tree(run: HealingRun, tmp_path: Path) -> dict[str, Any]:
    return json.loads(run.save(tmp_path / "good.json").read_text())


def refused(tree: object, tmp_path: Path) -> str:
    path = tmp_path / "crafted.json"
    path.write_text(json.dumps(tree, allow_nan=True))
    with pytest.raises(ReportFileError) as info:
        HealingRun.load(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message, message
    return message


# ---------------------------------------------------------------------- round trips
@pytest.mark.parametrize("which", ["lm_run", "bert_run"])
def test_a_run_equals_itself_saved_and_loaded(
    which: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """A BERT run's reference NLL was NaN (an encoder predicts no tokens), so a loaded run never equalled
    the saved one (NaN != NaN); it is None now, in memory and in the file."""
    healed = request.getfixturevalue(which)
    loaded = HealingRun.load(healed.save(tmp_path / "run.json"))
    assert loaded == healed and loaded.model is None
    assert HealingRun.load_all(save_runs({"mqa": healed}, tmp_path / "runs.json")) == {"mqa": healed}
    if which == "bert_run":
        assert healed.kind == "encoder" and healed.reference_nll is None
        assert json.loads((tmp_path / "run.json").read_text())["reference_nll"] is None
    else:
        assert healed.reference_nll is not None and math.isfinite(healed.reference_nll)


def test_an_encoder_run_file_with_a_nan_reference_still_loads(bert_run: HealingRun, tmp_path: Path) -> None:
    tree = as_tree(bert_run, tmp_path)
    tree["reference_nll"] = math.nan  # as files were written before
    path = tmp_path / "old.json"
    path.write_text(json.dumps(tree, allow_nan=True))
    assert HealingRun.load(path) == bert_run


# ---------------------------------------------------------------------- crafted files
Edit = Callable[[dict[str, Any]], None]


def put(name: str, value: Any) -> Edit:
    return lambda tree: tree.__setitem__(name, value)


def row(i: int, name: str, value: Any) -> Edit:
    return lambda tree: tree["curve"][i].__setitem__(name, value)


def one_more_step(tree: dict[str, Any]) -> None:
    """A step past what ``tokens`` plans, with every count that depends on it kept consistent."""
    per_step = tree["batch_size"] * tree["max_length"]
    tree["steps"] += 1
    tree["losses"].append(0.1)
    tree["tokens_seen"] += per_step


def a_row_past_the_last_step(tree: dict[str, Any]) -> None:
    per_step = tree["batch_size"] * tree["max_length"]
    extra = copy.deepcopy(tree["curve"][-1])
    extra.update(step=tree["steps"] + 2, tokens=(tree["steps"] + 2) * per_step)
    tree["curve"].append(extra)
    tree["per_layer"].append(tree["per_layer"][-1])


def a_row_past_the_tokens_seen(tree: dict[str, Any]) -> None:
    tree["curve"][-1]["tokens"] = tree["tokens_seen"] + 1


def two_million_losses(tree: dict[str, Any]) -> None:
    """A loss for each of two million steps, the step count agreeing: what ``tokens`` plans does not."""
    tree["losses"] = [0.5] * 2_000_000
    tree["steps"] = 2_000_000


def shifted_first_row(tree: dict[str, Any]) -> None:
    tree["curve"][0]["tokens"] = tree["curve"][1]["tokens"] // 2


#: Each crafted file: what is changed, and the words that name the field. The first 17 are the classes the
#: hardening issue lists (its "negative tokens_seen ... a 2 M-element losses array").
CRAFTED: list[tuple[str, Edit, str]] = [
    ("negative tokens_seen", put("tokens_seen", -64), r"tokens_seen is -64, outside the allowed >= 0"),
    ("NaN kv_bytes_per_token", put("kv_bytes_per_token", math.nan), r"kv_bytes_per_token is nan; it must be"),
    ("inf kv_bytes_per_token", put("kv_bytes_per_token", math.inf), r"kv_bytes_per_token is inf; it must be"),
    ("negative kv_bytes_per_token", put("kv_bytes_per_token", -1.0), r"kv_bytes_per_token is -1\.0, outside"),
    ("NaN reference_nll", put("reference_nll", math.nan), r"reference_nll is nan; it must be a finite"),
    ("inf reference_nll", put("reference_nll", math.inf), r"reference_nll is inf; it must be a finite"),
    ("negative reference_nll", put("reference_nll", -0.5), r"reference_nll is -0\.5, outside the allowed"),
    ("repeated layers", put("layers", [0, 0, 1]), r"layers lists layer 0 twice"),
    ("NaN loss", lambda t: t["losses"].__setitem__(1, math.nan), r"losses\[1\] is nan; it must be a finite"),
    (
        "unknown trainable",
        put("trainable", "everything"),
        r'trainable is the string "everything"; it must be',
    ),
    ("unknown spec", put("spec", "banana"), r'spec is "banana", which is not a variant spec'),
    (
        "an integer dtype",
        put("dtype", "torch.int8"),
        r'dtype is the string "torch\.int8"; it must name a torch',
    ),
    ("a curve row past the last step", a_row_past_the_last_step, r'curve\[3\]\["step"\] is 6, past the run'),
    ("a curve row past the tokens seen", a_row_past_the_tokens_seen, r'curve\[2\]\["tokens"\] is 257, but 4'),
    ("a first row not at 0 tokens", shifted_first_row, r"curve\[0\] is at step 0, 64 tokens; a curve starts"),
    (
        "delta_nll not nll - reference_nll",
        row(1, "delta_nll", 0.0),
        r'curve\[1\]\["delta_nll"\] is 0\.0, but nll',
    ),
    (
        "a 2M-element losses array",
        two_million_losses,
        r"steps is 2000000, but tokens = 256 at batch_size × max_length = 64 a step plan 4 steps",
    ),
    # beyond the list
    (
        "a fullwidth LoRA rank",
        put("trainable", "lora:８"),
        r'trainable is the string "lora:\\uff18"[;,] ',
    ),
    ("a spec spelled otherwise", put("spec", "MQA"), r'spec is "MQA", not a spec as evaluate writes it'),
    ("inf loss", lambda t: t["losses"].__setitem__(0, math.inf), r"losses\[0\] is inf; it must be a finite"),
    (
        "negative loss",
        lambda t: t["losses"].__setitem__(0, -1.0),
        r"losses\[0\] is -1\.0, outside the allowed",
    ),
    ("zero learning rate", put("lr", 0.0), r"lr is 0\.0; a learning rate is > 0"),
    ("NaN learning rate", put("lr", math.nan), r"lr is nan; it must be a finite number"),
    ("tokens_seen not the steps' tokens", put("tokens_seen", 255), r"tokens_seen is 255, but 4 steps of 64"),
    (
        "more steps than tokens plans",
        one_more_step,
        r"steps is 5, but tokens = 256 at batch_size × max_length",
    ),
    (
        "fewer steps, not stopped early",
        lambda t: t.update(steps=3, losses=t["losses"][:3], tokens_seen=192),
        r"steps is 3, but tokens = 256 .* plan 4 steps \(fewer only in a run stopped early\)",
    ),
    ("a loss its method does not minimise", put("loss", "lm"), r"loss is the string \"lm\", but method 'kd'"),
    ("an unknown method", put("method", "rl"), r"method is the string \"rl\"; a causal-lm model is healed"),
    ("an unknown kind", put("kind", "seq2seq"), r"kind is 'seq2seq'; it must be one of"),
    ("a negative layer", put("layers", [-1, 0, 1]), r"layers\[0\] is -1, outside the allowed >= 0"),
    ("no layer", lambda t: t.update(layers=[], per_layer=None), r"layers is \[\]; a run converts at least"),
    ("layers out of order", put("layers", [0, 2, 1]), r"layers is \[0, 2, 1\]; a run .* increasing order"),
    ("a language model without its NLL", put("reference_nll", None), r"reference_nll is null, but it is"),
    (
        "a curve step twice",
        lambda t: t["curve"].insert(1, t["curve"][1]),
        r'curve\[2\]\["step"\] is 2, not after',
    ),
    ("a curve row without a measure", lambda t: t["curve"][1].pop("kl"), r'curve\[1\]\["kl"\] is missing'),
    ("a curve row with an extra entry", row(1, "bleu", 0.5), r'curve\[1\] has unknown fields "bleu"'),
    (
        "a curve KL below zero",
        row(2, "kl", -0.5),
        r'curve\[2\]\["kl"\] is -0\.5, outside the allowed >= -1e-05',
    ),
    (
        "a top-1 above one",
        row(2, "top1", 1.5),
        r'curve\[2\]\["top1"\] is 1\.5, outside the allowed 0\.0\.\.1\.0',
    ),
    ("a per-layer row too short", lambda t: t["per_layer"][1].pop(), r"per_layer\[1\] has 2 entries for 3"),
    (
        "a negative per-layer error",
        lambda t: t["per_layer"][0].__setitem__(0, -0.1),
        r"per_layer\[0\]\[0\] is",
    ),
    ("a fingerprint that is markup", put("healing_fingerprint", "<b>x</b>"), r"healing_fingerprint is the"),
    (
        "no evaluation tokens",
        put("evaluation_tokens", 0),
        r"evaluation_tokens is 0, outside the allowed >= 1",
    ),
    ("a zero batch", put("batch_size", 0), r"batch_size is 0, outside the allowed 1\.\.1048576"),
    ("a float step count", put("steps", 4.0), r"steps must be an integer, not the number 4\.0"),
    ("an unknown field", put("comment", "hi"), r'the file has unknown fields "comment"'),
    ("a missing field", lambda t: t.pop("losses"), r"losses is missing"),
]


@pytest.mark.parametrize(("what", "edit", "message"), CRAFTED, ids=[c[0] for c in CRAFTED])
def test_a_crafted_run_file_is_refused_naming_the_field(
    what: str, edit: Edit, message: str, lm_run: HealingRun, tmp_path: Path
) -> None:
    assert (lm_run.steps, lm_run.batch_size * lm_run.max_length, len(lm_run.layers)) == (4, 64, 3)
    tree = as_tree(lm_run, tmp_path)
    edit(tree)
    got = refused(tree, tmp_path)
    assert re.search(message, got), got


def test_the_crafted_classes_are_counted() -> None:
    assert len(CRAFTED) >= 23 and len({what for what, _, _ in CRAFTED}) == len(CRAFTED)


def test_what_cannot_be_loaded_cannot_be_saved(lm_run: HealingRun, tmp_path: Path) -> None:
    bad = copy.copy(lm_run)
    bad.tokens_seen = -64
    with pytest.raises(ReportFileError, match=r"cannot save the healing run to .*tokens_seen is -64"):
        bad.save(tmp_path / "bad.json")
    with pytest.raises(ReportFileError, match=r"tokens_seen is -64"):
        save_runs({"mqa": bad}, tmp_path / "bad-runs.json")
    assert list(tmp_path.iterdir()) == []


def test_runs_that_heal_gives_load_stopped_early_included(tmp_path: Path) -> None:
    """A run stopped by a callback after its first step, and one of a LoRA on all parts: real runs load."""
    from transformers import TrainerCallback

    class StopAfterOne(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):  # type: ignore[no-untyped-def]
            control.should_training_stop = True

    model = llama()
    stopped = small_heal(headwidget.apply(model, "gqa:1"), model, callbacks=[StopAfterOne()])
    lora = small_heal(headwidget.apply(model, "mla:8"), model, trainable="lora:2", per_layer=False)
    assert stopped.stopped_early and stopped.steps == 1 and lora.trainable == "lora:2"
    for healed in (stopped, lora):
        assert HealingRun.load(healed.save(tmp_path / "run.json")) == healed


# ---------------------------------------------------------------------- paths
def test_a_symlinked_run_file_is_neither_read_nor_written_through(lm_run: HealingRun, tmp_path: Path) -> None:
    outside = lm_run.save(tmp_path / "outside.json")
    before = outside.read_bytes()
    link = tmp_path / "shared" / "heal.json"
    link.parent.mkdir()
    link.symlink_to(outside)
    for attempt in (lambda: HealingRun.load(link), lambda: HealingRun.load_all(link)):
        with pytest.raises(ReportFileError, match=r"heal\.json is a symlink \(to .*outside\.json\)"):
            attempt()
    for attempt in (lambda: lm_run.save(link), lambda: save_runs({"mqa": lm_run}, link)):
        with pytest.raises(ReportFileError, match=r"heal\.json is a symlink"):
            attempt()
    assert link.is_symlink() and outside.read_bytes() == before


def test_a_nul_byte_in_a_run_path_is_a_run_error(lm_run: HealingRun, tmp_path: Path) -> None:
    bad = str(tmp_path / "heal\x00.json")
    attempts = (
        lambda: lm_run.save(bad),
        lambda: HealingRun.load(bad),
        lambda: save_runs({"mqa": lm_run}, bad),
        lambda: HealingRun.load_all(bad),
    )
    for attempt in attempts:
        with pytest.raises(ReportFileError, match=r"holds a NUL byte, which no file name may; remove it"):
            attempt()
    assert list(tmp_path.iterdir()) == []


# ---------------------------------------------------------------------- the command's file
@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("heal") / "llama_gqa"
    make_model("llama_gqa", dtype=torch.float32).save_pretrained(root)
    char_tokenizer().save_pretrained(root)
    return root


def test_the_file_headwidget_heal_writes_loads_through_the_public_loader(
    model_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "heal.json"
    small = ["--tokens", "256", "--batch-size", "4", "--max-length", "32", "--eval-tokens", "64"]
    small += ["--eval-every", "128", "--calibration-tokens", "128", "--no-progress", "--lr", "0.001"]
    code, _, err = run(
        capfd, ["heal", "--model", str(model_dir), "--variants", "mqa,gqa:1", *small, "--out", str(out)]
    )
    assert code == 0, err
    runs = headwidget.HealingRun.load_all(out)
    assert list(runs) == ["mqa", "gqa:1"] and all(isinstance(r, HealingRun) for r in runs.values())
    assert [r["tokens"] for r in runs["mqa"].curve] == [0, 128, 256]
    view = headwidget.HealingView(runs)
    assert [s.name for s in view.grid.charts[0].series] == ["mqa", "gqa:1"]
    with pytest.raises(
        ReportFileError, match=r"holds 2 healing run\(s\) \(\"mqa\", \"gqa:1\"\), as `headwidget heal`"
    ):
        HealingRun.load(out)
    code, stdout, _ = run(capfd, ["heal", "--help"])
    assert code == 0 and "headwidget.HealingRun.load_all" in " ".join(stdout.split())


def test_an_out_path_that_is_a_symlink_is_refused_before_any_work(
    model_dir: Path, tmp_path: Path, capfd: pytest.CaptureFixture[str]
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    link = tmp_path / "heal.json"
    link.symlink_to(victim)
    code, _, err = run(capfd, ["heal", "--model", str(model_dir), "--variants", "mqa", "--out", str(link)])
    assert code == 2 and err.count("\n") == 1 and f"--out {link}: is a symlink" in err, err
    assert victim.read_text() == "precious" and link.is_symlink()
