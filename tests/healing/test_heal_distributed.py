"""heal(distributed=True) under DistributedDataParallel (gloo, two CPU processes) trains the same weights as
one process on the same global batches, and every rank returns the run of all the evaluation text."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import headwidget
from healing_cases import llama, small_heal
from ports import free_port, run_ranks

SPEC = "mla:8"


def _heal(distributed: bool, micro_batch_size: int | None = None) -> headwidget.HealingRun:
    model = llama()
    return small_heal(
        headwidget.apply(model, SPEC), model, distributed=distributed, micro_batch_size=micro_batch_size
    )


def _worker(rank: int, world: int, port: int, out: str, micro_batch_size: int | None) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        run = _heal(distributed=True, micro_batch_size=micro_batch_size)
        run.save(Path(out) / f"run{rank}.json")
        torch.save(run.model.state_dict(), Path(out) / f"weights{rank}.pt")
    finally:
        dist.destroy_process_group()


def _each_rank_is_one_process(
    tmp_path: Path, single: headwidget.HealingRun, model: torch.nn.Module
) -> list[int]:
    """Assert that each rank's saved run and weights are ``single``'s (one process on the same global
    batches); the number of tensors each rank's healed model changed from ``model``'s."""
    weights = single.model.state_dict()
    counts = []
    for rank in (0, 1):
        run = headwidget.HealingRun.load(tmp_path / f"run{rank}.json")
        assert (run.steps, run.tokens_seen, run.evaluation_fingerprint) == (
            single.steps,
            single.tokens_seen,
            single.evaluation_fingerprint,
        )
        assert run.losses == pytest.approx(single.losses, rel=1e-9)
        for got, want in zip(run.curve, single.curve, strict=True):
            assert got == pytest.approx(want, rel=1e-6, abs=1e-9)
        assert run.per_layer is not None and single.per_layer is not None
        for got_row, want_row in zip(run.per_layer, single.per_layer, strict=True):
            assert got_row == pytest.approx(want_row, rel=1e-6)
        theirs = torch.load(tmp_path / f"weights{rank}.pt")
        assert theirs.keys() == weights.keys()
        changed = 0
        for name, value in weights.items():
            assert torch.allclose(theirs[name], value, rtol=0, atol=1e-6), name
            changed += not torch.equal(value, model.state_dict()[name])
        counts.append(changed)
    return counts


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize("micro_batch_size", [None, 1], ids=["whole", "micro-batches"])
def test_two_ranks_heal_the_weights_of_one_process(tmp_path: Path, micro_batch_size: int | None) -> None:
    """Also with each rank's 2 windows a step run one at a time (DDP reduces the gradients once, with
    the second)."""
    run_ranks(_worker, (2, free_port(), str(tmp_path), micro_batch_size))
    single = _heal(distributed=False)
    # k_proj and v_proj of the three layers
    assert _each_rank_is_one_process(tmp_path, single, llama()) == [6, 6]


def _untouched_worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = llama()
        with torch.no_grad():
            model.model.norm.weight.add_(rank)  # each rank's model its own (never DDP's to broadcast)
        before = {n: t.clone() for n, t in model.state_dict().items()}
        small_heal(headwidget.apply(model, SPEC), model, distributed=True, tokens=128)
        changed = [n for n, t in model.state_dict().items() if not torch.equal(t, before[n])]
        (Path(out) / f"changed{rank}.txt").write_text("\n".join(changed))
    finally:
        dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_ddp_leaves_each_ranks_model_as_it_was(tmp_path: Path) -> None:
    """The trained copy shares the model's frozen tensors: DDP must not broadcast rank 0's into them."""
    run_ranks(_untouched_worker, (2, free_port(), str(tmp_path)))
    assert [(tmp_path / f"changed{rank}.txt").read_text() for rank in (0, 1)] == ["", ""]


def _sharded_worker(rank: int, world: int, port: int, out: str, options: dict) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model = llama()
        run = small_heal(headwidget.apply(model, options.pop("spec")), model, distributed="fsdp", **options)
        run.save(Path(out) / f"run{rank}.json")
        torch.save(run.model.state_dict(), Path(out) / f"weights{rank}.pt")
    finally:
        dist.destroy_process_group()


@pytest.mark.filterwarnings("ignore::UserWarning")
@pytest.mark.parametrize(
    "options",
    [{"spec": "mla:8"}, {"spec": "mqa", "checkpoint": True, "method": "lm", "trainable": "lora:2"}],
    ids=["mla-kd", "mqa-lm-lora-checkpoint"],
)
def test_fsdp_shards_and_heals_the_weights_of_one_process(tmp_path: Path, options: dict) -> None:
    """FSDP2 over gloo: each rank holds a shard of the teacher and of the trained copy, trains on its half
    of every global batch, and gathers the trained factors at the end: the same weights, losses, curve and
    per-layer errors as one process on the same global batches."""
    run_ranks(_sharded_worker, (2, free_port(), str(tmp_path), dict(options)))
    model = llama()
    single = small_heal(
        headwidget.apply(model, options["spec"]), model, **{k: v for k, v in options.items() if k != "spec"}
    )
    changed = 12 if "trainable" in options else 6
    assert _each_rank_is_one_process(tmp_path, single, model) == [changed, changed]


def test_fsdp_without_a_process_group_and_an_unknown_distribution() -> None:
    model = llama()
    with pytest.raises(headwidget.ArgumentError, match="no process group is initialized"):
        small_heal(headwidget.apply(model, SPEC), model, distributed="fsdp")
    with pytest.raises(headwidget.ArgumentError, match="'fsdp'"):
        small_heal(headwidget.apply(model, SPEC), model, distributed="ddp")
