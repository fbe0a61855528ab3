"""``Tracker`` under torch.distributed (gloo, two CPU processes): each rank captures its share of the probe
batches, the snapshot is their sum, equal to one process's capture of all of them, only rank 0 writes,
every rank continues an existing folder at the same step, and a folder error on rank 0 is raised on every
rank as the same headwidget error."""

from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

from headwidget import Timeline, Tracker
from headwidget.tracking._store import INDEX, snapshot_name
from ports import free_port, run_ranks
from tiny_models import VOCAB

#: three probe batches of 2 rows of 16: the first 64 tokens (MAX_TOKENS) are batches 0 and 1, one a rank
PROBE = torch.randint(1, VOCAB, (6, 16), generator=torch.Generator().manual_seed(3))
MAX_TOKENS = 64


def _model() -> LlamaForCausalLM:
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaForCausalLM(config).eval()


def _tracker(path: Path | None = None) -> Tracker:
    return Tracker(PROBE, batch_size=2, every=1, path=path, rope="pre", max_tokens=MAX_TOKENS)


def _worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        tracker = _tracker(Path(out) / "run.track")
        assert tracker.timeline.steps == [0], (rank, tracker.timeline.steps)  # the folder's, on every rank
        tracker.snapshot(_model(), 1)
        assert tracker.timeline.steps == [0, 1]
    finally:
        dist.destroy_process_group()


def test_two_ranks_snapshot_what_one_process_captures(tmp_path: Path) -> None:
    _tracker(tmp_path / "run.track").snapshot(_model(), 0)  # an earlier run's folder
    run_ranks(_worker, (2, free_port(), str(tmp_path)))
    timeline = Timeline.load(tmp_path / "run.track")
    assert timeline.steps == [0, 1]
    merged, single = timeline[1], _tracker().snapshot(_model(), 1)
    assert merged.tokens == single.tokens == MAX_TOKENS  # the token budget is the probe's, not a rank's
    for layer in single.layers:
        for kind in single.kinds:
            a, b = merged.moments(layer, kind), single.moments(layer, kind)
            # the same float32 rows, summed in another order (each capture orders a batch's rows by its
            # own token split): float32 rounding apart, the same sums
            scale = float(b.m2.diagonal().max())
            torch.testing.assert_close(a.mean, b.mean, rtol=1e-6, atol=1e-6 * scale**0.5)
            torch.testing.assert_close(a.m2, b.m2, rtol=1e-5, atol=1e-5 * scale)
            torch.testing.assert_close(a.token_gram(), b.token_gram(), rtol=1e-5, atol=1e-5 * b.count)
    files = sorted(p.name for p in (tmp_path / "run.track").iterdir())
    assert files == ["step-000000000.safetensors", "step-000000001.safetensors", "timeline.json"]


def _failing_worker(rank: int, world: int, port: int, out: str) -> None:
    """Each folder error rank 0 meets, as every rank sees it (a rank left waiting would time out)."""
    torch.set_num_threads(1)
    timeout = timedelta(seconds=30)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, timeout=timeout
    )
    root, seen = Path(out), {}

    def plant_index_link() -> Tracker:
        tracker = _tracker(root / "logs.track")
        if rank == 0:  # while the run goes on, someone links the index to a file outside
            (root / "logs.track" / INDEX).unlink()
            (root / "logs.track" / INDEX).symlink_to(root / "victim.txt")
        dist.barrier()
        return tracker

    cases = {
        "a folder that is a file": lambda: _tracker(root / "victim.txt"),
        "a snapshot linked outside": lambda: _tracker(root / "run.track").snapshot(_model(), 1),
        "an index linked outside": lambda: plant_index_link().on_log(
            None, SimpleNamespace(global_step=3), None, logs={"loss": 1.0}
        ),
    }
    try:
        for case, attempt in cases.items():
            try:
                attempt()
                seen[case] = "no error"
            except Exception as err:
                seen[case] = f"{type(err).__module__}.{type(err).__name__}: {err}"
    finally:
        (root / f"rank{rank}.json").write_text(json.dumps(seen))
        dist.destroy_process_group()


def test_a_folder_error_on_rank_0_is_raised_on_every_rank(tmp_path: Path) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    _tracker(tmp_path / "run.track").snapshot(_model(), 0)
    (tmp_path / "run.track" / snapshot_name(1)).symlink_to(victim)
    run_ranks(_failing_worker, (2, free_port(), str(tmp_path)))
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert ranks[0] == ranks[1], ranks
    seen = ranks[0]
    assert seen["a folder that is a file"].startswith("headwidget.errors.TimelineFileError: ")
    assert "is a file; a timeline is a folder" in seen["a folder that is a file"]
    assert seen["a snapshot linked outside"].startswith("headwidget.errors.StatsFileError: ")
    assert "step-000000001.safetensors is a symlink" in seen["a snapshot linked outside"]
    assert seen["an index linked outside"].startswith("headwidget.errors.TimelineFileError: ")
    assert "timeline.json is a symlink" in seen["an index linked outside"]
    assert victim.read_text() == "precious" and os.path.islink(tmp_path / "run.track" / snapshot_name(1))
