"""A timeline folder cannot be turned against its owner: planted symlinks (a snapshot, ``timeline.json``) are
neither read nor written through, names that leave the folder are refused, every snapshot must be of the
timeline's model, and bad logs, paths and checkpoints get a headwidget error that says what to do."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import headwidget
from headwidget import KVStats, Timeline, Tracker
from headwidget.errors import ArgumentError, StatsFileError, TimelineFileError, TrackingError
from headwidget.tracking._store import INDEX, snapshot_name
from tiny_models import VOCAB

PROBE = torch.randint(1, VOCAB, (3, 20), generator=torch.Generator().manual_seed(99))


def llama(kv_heads: int = 2, seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
    )
    return LlamaForCausalLM(config).eval()


def gpt2() -> GPT2LMHeadModel:
    torch.manual_seed(0)
    return GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4)).eval()


def capture(model: torch.nn.Module) -> KVStats:
    return headwidget.capture(
        model, PROBE, rope="both" if isinstance(model, LlamaForCausalLM) else "pre", progress=False
    )


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    """A GQA Llama's timeline folder with the snapshots of steps 0 and 1."""
    path = tmp_path / "run.track"
    tracker = Tracker(PROBE, every=1, path=path)
    model = llama()
    for step in (0, 1):
        tracker.snapshot(model, step)
    return path


@pytest.fixture
def outside(tmp_path: Path) -> Path:
    """A folder beside the run folder, with a file of its user's in it."""
    path = tmp_path / "home"
    path.mkdir()
    (path / "victim.txt").write_text("precious")
    return path


# ---------------------------------------------------------------------- planted links
def test_a_snapshot_that_is_a_link_to_statistics_outside_is_not_read(folder: Path, tmp_path: Path) -> None:
    """A statistics file elsewhere (here of the very same model: nothing else gives it away) linked in as a
    snapshot is refused by every reader of the folder, never taken for the step."""
    elsewhere = capture(llama(seed=5)).save(tmp_path / "elsewhere.safetensors")
    planted = folder / snapshot_name(1)
    planted.unlink()
    planted.symlink_to(elsewhere)
    timeline = Timeline.load(folder)
    assert timeline.steps == [0, 1] and timeline[0].tokens == PROBE.numel()
    with pytest.raises(StatsFileError, match=r"step-000000001\.safetensors is a symlink \(to .*elsewhere"):
        timeline[1]
    with pytest.raises(StatsFileError, match="is a symlink"):
        timeline.summary()


def test_the_tracker_never_writes_a_snapshot_through_a_planted_link(folder: Path, outside: Path) -> None:
    """``step-20`` planted as a link to a file of the user's: the snapshot of step 20 would overwrite it."""
    victim = outside / "victim.txt"
    planted = folder / snapshot_name(20)
    planted.symlink_to(victim)
    tracker = Tracker(PROBE, every=1, path=folder)
    with pytest.raises(
        StatsFileError, match=r"step-000000020\.safetensors is a symlink \(to .*victim\.txt\)"
    ):
        tracker.snapshot(llama(), 20)
    assert victim.read_text() == "precious" and planted.is_symlink()
    assert Timeline.load(folder).steps == [0, 1] and tracker.timeline.steps == [0, 1]
    dangling = folder / snapshot_name(21)
    dangling.symlink_to(outside / "new.txt")  # a link to a file that does not exist yet: not created
    with pytest.raises(StatsFileError, match="is a symlink"):
        tracker.snapshot(llama(), 21)
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]


def test_the_index_is_never_rewritten_through_a_planted_link(folder: Path, outside: Path) -> None:
    victim = outside / "victim.txt"
    tracker = Tracker(PROBE, every=1, path=folder)
    index = folder / INDEX
    index.unlink()
    index.symlink_to(victim)  # planted while the tracker runs: the next snapshot rewrites the index
    with pytest.raises(TimelineFileError, match=r"timeline\.json is a symlink \(to .*victim\.txt\)"):
        tracker.snapshot(llama(), 2)
    with pytest.raises(TimelineFileError, match=r"timeline\.json is a symlink"):
        tracker.on_log(None, type("State", (), {"global_step": 2})(), None, logs={"loss": 1.0})
    assert victim.read_text() == "precious"
    for attempt in (lambda: Timeline.load(folder), lambda: Tracker(PROBE, path=folder)):
        with pytest.raises(TimelineFileError, match=r"timeline\.json is a symlink"):
            attempt()
    index.unlink()
    index.symlink_to(outside / "created.json")  # dangling: a new tracker would have created it
    with pytest.raises(TimelineFileError, match=r"timeline\.json is a symlink"):
        Tracker(PROBE, path=folder)
    assert sorted(p.name for p in outside.iterdir()) == ["victim.txt"]


def test_an_index_that_is_a_link_to_a_good_index_elsewhere_is_refused(folder: Path, tmp_path: Path) -> None:
    copy = tmp_path / "copy.track"
    copy.mkdir()
    (copy / INDEX).symlink_to(folder / INDEX)
    with pytest.raises(TimelineFileError, match=r"cannot read the timeline index: .*is a symlink"):
        Timeline.load(copy)


@pytest.mark.parametrize(
    "name",
    [
        "../../home/victim.txt",
        "/etc/passwd",
        "sub/step-000000001.safetensors",
        "step-000000001.safetensors/..",
    ],
)
def test_names_that_leave_the_folder_are_refused(folder: Path, name: str) -> None:
    index = json.loads((folder / INDEX).read_text())
    index["snapshots"][1]["file"] = name
    (folder / INDEX).write_text(json.dumps(index))
    with pytest.raises(
        TimelineFileError, match=r"snapshots\[1\]\.file must be 'step-000000001\.safetensors'"
    ):
        Timeline.load(folder)


# ---------------------------------------------------------------------- one model
@pytest.mark.parametrize("other", ["gpt2", "mha llama"])
def test_a_snapshot_of_another_model_is_refused_naming_the_step(folder: Path, other: str) -> None:
    """A GPT-2 or an MHA Llama snapshot put in a GQA Llama's folder (a regular file, its own checks pass)."""
    stranger = gpt2() if other == "gpt2" else llama(kv_heads=4)
    capture(stranger).save(folder / snapshot_name(1))
    timeline = Timeline.load(folder)
    assert timeline[0].meta.layout.num_kv_heads == 2
    wanted = "GPT2LMHeadModel" if other == "gpt2" else r"LlamaForCausalLM .*4 heads over 4 KV heads"
    message = rf"the snapshot of step 1 \(step-000000001\.safetensors\) is of {wanted}"
    message += r".*index says its snapshots are of LlamaForCausalLM .*2 KV heads"
    with pytest.raises(TimelineFileError, match=message):
        timeline[1]
    with pytest.raises(TimelineFileError, match="the snapshot of step 1"):
        timeline.summary()
    with pytest.raises(TimelineFileError, match="the snapshot of step 1"):
        Tracker(PROBE, path=folder).timeline[1]


def test_snapshots_in_memory_are_of_one_model() -> None:
    gqa, mha = capture(llama()), capture(llama(kv_heads=4))
    with pytest.raises(TrackingError, match=r"the snapshot of step 5 is of LlamaForCausalLM .*4 KV heads"):
        Timeline({0: gqa, 5: mha})
    with pytest.raises(TrackingError, match=r"the snapshot of step 10 is of GPT2LMHeadModel"):
        Timeline.from_checkpoints([llama(), gpt2()], [0, 10], PROBE)
    tracker = Tracker(PROBE, every=1)
    tracker.snapshot(llama(), 0)
    with pytest.raises(TrackingError, match=r"the snapshot of step 1 is of GPT2LMHeadModel"):
        tracker.snapshot(gpt2(), 1)
    assert tracker.timeline.steps == [0]


# ---------------------------------------------------------------------- logs, paths, checkpoints
def test_logs_are_finite_floats(folder: Path) -> None:
    huge = 10**400  # float() overflows
    with pytest.raises(
        ArgumentError, match=r"logs\[1\]\['loss'\] is an integer of 1329 bits; a logged number"
    ):
        Timeline({}, logs={1: {"loss": huge}})
    with pytest.raises(ArgumentError, match=r"logs\[2\]\['loss'\] is nan"):
        Timeline({}, logs={2: {"loss": float("nan")}})
    with pytest.raises(ArgumentError, match=r"a step of logs must be at least 0"):
        Timeline({}, logs={-1: {"loss": 1.0}})
    assert Timeline({}, logs={3: {"loss": 2}}).logs == {3: {"loss": 2.0}}
    tracker = Tracker(PROBE, every=1, path=folder)  # a trainer's log with a huge integer: not recorded
    tracker.on_log(None, type("State", (), {"global_step": 4})(), None, logs={"loss": huge, "lr": 0.5})
    assert tracker.timeline.logs[4] == {"lr": 0.5} and Timeline.load(folder).logs[4] == {"lr": 0.5}


def test_a_nul_byte_in_a_timeline_path_is_a_timeline_error(tmp_path: Path) -> None:
    bad = str(tmp_path / "run\x00.track")
    for attempt in (lambda: Timeline.load(bad), lambda: Tracker(PROBE, path=bad)):
        with pytest.raises(TimelineFileError, match=r"holds a NUL byte, which no file name may; remove it"):
            attempt()
    assert list(tmp_path.iterdir()) == []


def test_a_checkpoint_that_is_no_folder_says_so(tmp_path: Path) -> None:
    """A missing checkpoint folder was reported as a malformed Hub repo id."""
    missing = tmp_path / "checkpoint-500"
    with pytest.raises(ArgumentError, match=r"models_or_dirs\[1\] is '.*checkpoint-500', which is no folder"):
        Timeline.from_checkpoints([llama(), missing], [0, 500], PROBE)
    empty = tmp_path / "checkpoint-600"
    empty.mkdir()
    with pytest.raises(
        TrackingError, match=r"cannot load the checkpoint models_or_dirs\[0\] \(.*checkpoint-600\)"
    ):
        Timeline.from_checkpoints([empty], [600], PROBE)
    with pytest.raises(ArgumentError, match=r"models_or_dirs\[0\]: the path .* holds a NUL byte"):
        Timeline.from_checkpoints([str(tmp_path / "a\x00b")], [0], PROBE)
    assert os.listdir(tmp_path) == ["checkpoint-600"]


def test_an_index_that_cannot_be_written_leaves_the_step_untaken(tmp_path: Path, monkeypatch) -> None:
    """The snapshot file of step 1 is written, its index is not (a full disk): the tracker holds the
    steps the folder holds, and step 1 can be taken again (it was refused as already held, and a later
    index named it)."""
    import headwidget.files as files

    path = tmp_path / "run.track"
    tracker, model = Tracker(PROBE, every=1, path=path), llama()
    tracker.snapshot(model, 0)
    real, calls = os.replace, []

    def second_fails(*args: object, **kwargs: object) -> None:
        calls.append(args)
        if len(calls) == 2:  # the snapshot's file lands; the index's replace fails
            raise OSError(28, "No space left on device")
        real(*args, **kwargs)

    monkeypatch.setattr(files.os, "replace", second_fails)
    with pytest.raises(TimelineFileError, match="No space left"):
        tracker.snapshot(model, 1)
    monkeypatch.setattr(files.os, "replace", real)
    assert tracker.timeline.steps == Timeline.load(path).steps == [0]
    tracker.snapshot(model, 1)
    assert tracker.timeline.steps == Timeline.load(path).steps == [0, 1]


def test_the_probe_is_the_tracker_s_own_copy() -> None:
    """A caller's id tensor changed after the tracker was made (max_tokens=None keeps every token) does
    not change what the snapshots capture."""
    probe = PROBE.clone()
    tracker = Tracker(probe, every=1, max_tokens=None)
    probe[:, :8] = 1
    model = llama()
    snapshot, want = tracker.snapshot(model, 0), headwidget.capture(model, PROBE, rope="pre", progress=False)
    assert torch.equal(snapshot.moments(0, "key").m2, want.moments(0, "key").m2)
