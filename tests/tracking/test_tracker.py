"""``Tracker`` and ``Timeline``: a snapshot is exactly ``capture`` of the model at that step, taking it
leaves training bit-identical, the folder survives a kill between writes, and bad input is refused."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

import headwidget
from headwidget import Timeline, Tracker
from headwidget.errors import ArgumentError, StatsFileError, TimelineFileError, TrackingError
from headwidget.tracking import _store
from tiny_models import VOCAB

KINDS = ("key", "value", "key_post")


def tiny_llama(seed: int = 0, dropout: float = 0.2) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        attention_dropout=dropout,
    )
    return LlamaForCausalLM(config)


def ids(seed: int, rows: int = 4, length: int = 24) -> torch.Tensor:
    return torch.randint(1, VOCAB, (rows, length), generator=torch.Generator().manual_seed(seed))


PROBE = ids(99, rows=3, length=20)


def same_stats(a: headwidget.KVStats, b: headwidget.KVStats) -> None:
    assert a.tokens == b.tokens and a.kinds == b.kinds and a.layers == b.layers
    for layer in a.layers:
        for kind in a.kinds:
            ma, mb = a.moments(layer, kind), b.moments(layer, kind)
            assert torch.equal(ma.mean, mb.mean) and torch.equal(ma.m2, mb.m2)
            assert ma.norm_gram is not None and mb.norm_gram is not None
            assert torch.equal(ma.norm_gram, mb.norm_gram)


def train(model, steps: int, tracker: Tracker | None = None, copies: dict | None = None) -> list[float]:
    """A seeded hand loop (dropout on); with ``tracker``, a snapshot every ``tracker.every`` steps."""
    torch.manual_seed(1234)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model.train()
    losses = []
    for step in range(steps):
        if tracker is not None and step % tracker.every == 0:
            tracker.snapshot(model, step)
            if copies is not None:
                copies[step] = copy.deepcopy(model)
        batch = ids(step)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_snapshots_are_captures_of_the_model_at_their_step_and_leave_training_as_it_was() -> None:
    plain = train(tiny_llama(), 7)
    tracker, copies = Tracker(PROBE, every=3), {}
    tracked = train(tiny_llama(), 7, tracker, copies)
    assert tracked == plain  # bit-identical: dropout's random numbers and every flag untouched
    assert tracker.timeline.steps == [0, 3, 6]
    for step, model in copies.items():
        same_stats(tracker.timeline[step], headwidget.capture(model, PROBE, rope="both", progress=False))
    assert sorted(tracker.timeline[0].kinds) == sorted(KINDS)  # rope="auto": both, for a rotary model


class IdTokenizer:
    """A tokenizer for texts of space-separated token ids."""

    pad_token_id = 0

    def __call__(self, texts, truncation=False, max_length=None, padding=False, add_special_tokens=True):
        rows = [[int(w) for w in t.split()] for t in texts]
        return {"input_ids": [r[:max_length] if truncation and max_length else r for r in rows]}


def test_a_probe_of_strings_is_what_capture_makes_of_them() -> None:
    """Probe strings are batched by length (the first ``max_tokens`` in text order), as ``capture``
    batches them: a snapshot is the capture of the same texts with the same budget, bit for bit."""
    gen = torch.Generator().manual_seed(7)
    texts = [
        " ".join(map(str, torch.randint(1, VOCAB, (n,), generator=gen).tolist()))
        for n in (13, 3, 9, 2, 11, 5)
    ]
    model = tiny_llama(dropout=0.0).eval()
    tracker = Tracker(texts, tokenizer=IdTokenizer(), every=1, max_tokens=30, batch_size=2)
    tracker.snapshot(model, 0)
    want = headwidget.capture(
        model, texts, tokenizer=IdTokenizer(), max_tokens=30, batch_size=2, rope="both", progress=False
    )
    assert want.tokens == 30
    same_stats(tracker.timeline[0], want)  # bit for bit: the same batches


def test_the_trainer_callback_snapshots_at_0_every_and_the_end(tmp_path) -> None:
    model = tiny_llama(dropout=0.0)
    data = [{"input_ids": row, "labels": row} for row in ids(5, rows=10)]
    tracker = Tracker(PROBE, every=2, path=tmp_path / "run.track")
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        max_steps=5,
        per_device_train_batch_size=2,
        logging_steps=1,
        report_to=[],
        save_strategy="no",
        use_cpu=True,
        disable_tqdm=True,
        seed=0,
    )
    Trainer(model=model, args=args, train_dataset=data, callbacks=[tracker]).train()
    assert tracker.timeline.steps == [0, 2, 4, 5]
    same_stats(tracker.timeline[5], headwidget.capture(model, PROBE, rope="both", progress=False))
    loaded = Timeline.load(tmp_path / "run.track")
    assert loaded.steps == [0, 2, 4, 5]
    same_stats(loaded[5], tracker.timeline[5])
    assert sorted(loaded.logs) == [1, 2, 3, 4, 5] and all("loss" in loaded.logs[s] for s in range(1, 6))
    rows = loaded.summary()
    assert [(r["step"], r["layer"]) for r in rows] == [(s, layer) for s in (0, 2, 4, 5) for layer in (0, 1)]


def test_a_kill_between_writes_leaves_every_completed_snapshot(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "run.track"
    tracker = Tracker(PROBE, every=1, path=folder)
    model = tiny_llama(dropout=0.0).eval()
    for step in range(3):
        tracker.snapshot(model, step)

    def killed(self):  # the snapshot file is written, the index that would name it is not
        raise KeyboardInterrupt

    monkeypatch.setattr(_store.TimelineStore, "_write_index", killed)
    with pytest.raises(KeyboardInterrupt):
        tracker.snapshot(model, 3)
    monkeypatch.undo()
    assert (folder / _store.snapshot_name(3)).exists()  # complete, but not named by the index
    loaded = Timeline.load(folder)
    assert loaded.steps == [0, 1, 2]
    same_stats(loaded[2], tracker.timeline[2])
    again = Tracker(PROBE, every=1, path=folder)  # the run goes on in the same folder
    again.snapshot(model, 3)
    assert Timeline.load(folder).steps == [0, 1, 2, 3]


def test_a_folder_loads_lazily(tmp_path) -> None:
    folder = tmp_path / "run.track"
    tracker = Tracker(PROBE, every=1, path=folder)
    model = tiny_llama(dropout=0.0).eval()
    for step in range(3):
        tracker.snapshot(model, step)
    (folder / _store.snapshot_name(1)).unlink()
    loaded = Timeline.load(folder)  # reads the index only
    assert loaded.steps == [0, 1, 2] and loaded[2].tokens == PROBE.numel()
    with pytest.raises(StatsFileError):
        loaded[1]
    with pytest.raises(StatsFileError):  # the tracker's own timeline reads its folder too, holds nothing
        tracker.timeline[1]


def test_from_checkpoints_equals_a_capture_of_each(tmp_path) -> None:
    dirs = []
    for seed in (0, 1):
        tiny_llama(seed, dropout=0.0).save_pretrained(tmp_path / f"ckpt-{seed}")
        dirs.append(tmp_path / f"ckpt-{seed}")
    timeline = Timeline.from_checkpoints(dirs, [100, 200], PROBE, rope="both")
    for step, folder in zip((100, 200), dirs, strict=True):
        model = LlamaForCausalLM.from_pretrained(folder).eval()
        same_stats(timeline[step], headwidget.capture(model, PROBE, rope="both", progress=False))


def test_bad_input_is_refused_with_what_to_do(tmp_path) -> None:
    for every in (0, "5", 2.0, float("nan"), 2**70):
        with pytest.raises(ArgumentError, match="every"):
            Tracker(PROBE, every=every)
    with pytest.raises(ArgumentError, match="rope"):
        Tracker(PROBE, rope="late")
    with pytest.raises(TrackingError, match="no real token"):
        Tracker([{"input_ids": PROBE, "attention_mask": torch.zeros_like(PROBE)}])
    tracker = Tracker(PROBE, every=1, path=tmp_path / "a.track")
    model = tiny_llama(dropout=0.0).eval()
    tracker.snapshot(model, 4)
    with pytest.raises(TrackingError, match="not after the last snapshot's step 4"):
        tracker.snapshot(model, 4)
    with pytest.raises(TrackingError, match=r"step 7 is not in this timeline; its steps are 4"):
        tracker.timeline[7]
    wider = LlamaForCausalLM(
        LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=64,
            intermediate_size=64,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=2,
        )
    )  # another config, the same folder: refused
    with pytest.raises(TimelineFileError, match="holds snapshots of LlamaForCausalLM"):
        Tracker(PROBE, every=1, path=tmp_path / "a.track").snapshot(wider, 5)
    with pytest.raises(ArgumentError, match="steps must increase"):
        Timeline.from_checkpoints([model, model], [2, 1], PROBE)


def test_a_run_that_starts_before_the_last_snapshot_is_told(tmp_path) -> None:
    tracker = Tracker(PROBE, every=1)
    model = tiny_llama(dropout=0.0).eval()
    tracker.snapshot(model, 4)
    state = SimpleNamespace(global_step=0)
    with pytest.warns(UserWarning, match=r"snapshots up to step 4 and training starts at step 0"):
        tracker.on_train_begin(None, state, None, model=model)
    assert tracker.timeline.steps == [4]


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda ix: ix.update(format="other/9"), r"format must be 'headwidget-timeline/1'"),
        (lambda ix: ix["snapshots"].append({"step": 3, "file": "../../etc/passwd"}), r"\.file must be"),
        (
            lambda ix: ix["snapshots"].insert(0, {"step": 9, "file": _store.snapshot_name(9)}),
            r"does not follow",
        ),
        (
            lambda ix: ix["snapshots"].append({"step": -1, "file": "x"}),
            r"snapshots\[1\]\.step is -1, outside",
        ),
        (
            lambda ix: ix["logs"].update({"3": {"loss": "low"}}),
            r'logs\["3"\]\["loss"\] must be a number, not',
        ),
        (lambda ix: ix.update(extra=1), r'the file has unknown fields "extra"'),
        (lambda ix: ix["snapshots"].append({"step": 3, "file": "/etc/passwd"}), r"\.file must be"),
        (
            lambda ix: ix["snapshots"].append({"step": 3, "file": "sub/../step-000000003.safetensors"}),
            r"\.file",
        ),
        (lambda ix: ix.update(model=None), r"model is null, but the index names snapshots"),
        (lambda ix: ix["logs"].update({"3": {"loss": 10**120}}), r'logs\["3"\]\["loss"\] is a number of 121'),
        (lambda ix: ix["logs"].update({"x": {}}), r'logs\["x"\] must be keyed by a step'),
    ],
)
def test_a_crafted_index_is_refused_naming_the_field(change, message, tmp_path) -> None:
    folder = tmp_path / "run.track"
    tracker = Tracker(PROBE, every=1, path=folder)
    tracker.snapshot(tiny_llama(dropout=0.0).eval(), 2)
    index = json.loads((folder / _store.INDEX).read_text())
    change(index)
    (folder / _store.INDEX).write_text(json.dumps(index))
    with pytest.raises(TimelineFileError, match=message):
        Timeline.load(folder)
    with pytest.raises(TimelineFileError, match="not a timeline folder"):
        Timeline.load(tmp_path / "nowhere")
