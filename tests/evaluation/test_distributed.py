"""evaluate and allocate under torch.distributed (gloo, two CPU processes) equal one process on all texts."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

import headwidget
from headwidget.errors import ArgumentError, StatsMismatchError
from headwidget.evaluation import EvaluationReport, allocate, evaluate
from ports import free_port, run_ranks
from tiny_models import ragged_batches, three_layer_llama

F64 = torch.float64
#: Three batches, so the two ranks' shards differ in size (batches 0 and 2, and batch 1).
LENGTHS = ((13, 7, 10), (9, 12), (11, 5))
VARIANTS = ["model", "mqa", "kv:int4", "mqa@0;kv:int4@2"]
CANDIDATES = ["model", "mqa", "lrkv:4", "kv:int4", "kv:int2"]


def _run(distributed: bool) -> tuple[EvaluationReport, dict]:
    model = three_layer_llama(seed=1)
    texts = ragged_batches(seed=7, lengths=LENGTHS)
    report = evaluate(
        model, texts, VARIANTS, dtype=F64, per_layer=True, distributed=distributed, progress=False
    )
    alloc = allocate(
        model,
        ragged_batches(seed=9, lengths=LENGTHS),
        budget=0.4,
        candidates=CANDIDATES,
        refine=1,
        dtype=F64,
        distributed=distributed,
        progress=False,
    )
    grouped = allocate(  # cross-layer groups: a merge's bytes count its retention on every rank's prefills
        model,
        ragged_batches(seed=9, lengths=LENGTHS),
        budget=0.6,
        candidates=["model", "mqa", "share:2", "merge:2"],
        refine=1,
        protocol="prefill:8",
        batch_size=2,
        dtype=F64,
        distributed=distributed,
        progress=False,
    )
    rounds = [
        [r.spec, r.predicted, r.measured, r.kv_bytes_per_token] for a in (alloc, grouped) for r in a.rounds
    ]
    return report, {
        "spec": alloc.spec,
        "rounds": rounds,
        "damage": {**alloc.damage, **{f"{k} grouped": v for k, v in grouped.damage.items()}},
        "bytes": grouped.layer_bytes,
        "tokens": alloc.tokens,
    }


def _worker(rank: int, world: int, port: int, out: str) -> None:
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        report, alloc = _run(distributed=True)
        report.save(Path(out) / f"report{rank}.json")
        (Path(out) / f"alloc{rank}.json").write_text(json.dumps(alloc), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def test_two_ranks_give_the_report_and_allocation_of_one_process(tmp_path: Path) -> None:
    run_ranks(_worker, (2, free_port(), str(tmp_path)))
    single, single_alloc = _run(distributed=False)
    for rank in (0, 1):
        report = EvaluationReport.load(tmp_path / f"report{rank}.json")
        assert (report.tokens, report.sequences, report.fingerprint) == (
            single.tokens,
            single.sequences,
            single.fingerprint,
        )
        for spec in VARIANTS:
            for name, value in single.measures[spec].items():
                assert report.measures[spec][name] == pytest.approx(value, rel=1e-12, abs=1e-15), (spec, name)
        assert single.per_layer is not None and report.per_layer is not None
        for spec, row in single.per_layer.items():
            assert report.per_layer[spec] == pytest.approx(row, rel=1e-10, abs=1e-14), spec
        alloc = json.loads((tmp_path / f"alloc{rank}.json").read_text(encoding="utf-8"))
        assert alloc["spec"] == single_alloc["spec"] and alloc["tokens"] == single_alloc["tokens"]
        for got, want in zip(alloc["rounds"], single_alloc["rounds"], strict=True):
            assert got[0] == want[0] and got[3] == want[3]
            assert got[1:3] == pytest.approx(want[1:3], rel=1e-10, abs=1e-14)
        for spec, row in single_alloc["damage"].items():
            assert alloc["damage"][spec] == pytest.approx(row, rel=1e-10, abs=1e-14, nan_ok=True), spec
        for spec, row in single_alloc["bytes"].items():
            assert alloc["bytes"][spec] == pytest.approx(row, rel=1e-12, nan_ok=True), spec


def test_distributed_without_a_process_group_says_what_to_do() -> None:
    model = three_layer_llama(seed=1)
    texts = ragged_batches(seed=7)
    with pytest.raises(ArgumentError, match=r"no process group is initialized: run under torchrun"):
        evaluate(model, texts, ["model"], dtype=F64, distributed=True, progress=False)
    with pytest.raises(ArgumentError, match=r"distributed must be True or False, got the string 'yes'"):
        evaluate(model, texts, ["model"], dtype=F64, distributed="yes", progress=False)
    with pytest.raises(ArgumentError, match=r"no process group is initialized"):
        allocate(
            model, texts, budget=0.5, candidates=["model", "mqa"], dtype=F64, distributed=True, progress=False
        )


def _mismatched_worker(rank: int, world: int, port: int, out: str) -> None:
    """Each rank gives a call one argument of its own; every rank writes the error it raised."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    model = three_layer_llama(seed=1)
    texts = ragged_batches(seed=7, lengths=LENGTHS)
    calls = {
        "variants": lambda: evaluate(
            model, texts, ["model", ["mqa", "share:2"][rank]], dtype=F64, progress=False, distributed=True
        ),
        "protocol": lambda: evaluate(
            model,
            texts,
            ["model"],
            protocol=f"prefill:{5 + rank}",
            dtype=F64,
            progress=False,
            distributed=True,
        ),
        "texts": lambda: evaluate(
            model,
            ragged_batches(seed=7 + rank, lengths=LENGTHS),
            ["model"],
            dtype=F64,
            progress=False,
            distributed=True,
        ),
        "budgets": lambda: allocate(
            model,
            texts,
            budget=[0.4, 0.5][rank],
            candidates=["model", "mqa"],
            dtype=F64,
            progress=False,
            distributed=True,
        ),
        "stats layout": lambda: headwidget.capture(
            model, texts, rope=["pre", "post"][rank], progress=False
        ).all_reduce(),
    }
    said = {}
    try:
        for name, call in calls.items():
            try:
                call()
                said[name] = "returned"
            except (ArgumentError, StatsMismatchError) as err:
                said[name] = str(err)
        (Path(out) / f"said{rank}.json").write_text(json.dumps(said), encoding="utf-8")
    finally:
        dist.destroy_process_group()


def test_ranks_given_different_calls_are_refused_on_every_rank(tmp_path: Path) -> None:
    """Each rank computes its share of one call: ranks given other variants, protocols, texts or budgets,
    or statistics of other captures (keys before RoPE on one, after on the other), once summed their
    shares into numbers of no call, or waited on each other. Now every rank refuses, naming what
    differs."""
    run_ranks(_mismatched_worker, (2, free_port(), str(tmp_path)))
    expected = {
        "variants": r"evaluate\(distributed=True\).*they differ: variants: rank 0 \['model', 'mqa'\], rank 1",
        "protocol": r"they differ: protocol: rank 0 'prefill:5', rank 1 'prefill:6'",
        "texts": r"they differ: texts: rank 0 '",
        "budgets": r"allocate\(distributed=True\).*they differ: budgets",
        "stats layout": r"cannot all_reduce statistics of different captures: kinds: rank 0",
    }
    for rank in (0, 1):
        said = json.loads((tmp_path / f"said{rank}.json").read_text(encoding="utf-8"))
        for name, pattern in expected.items():
            assert re.search(pattern, said[name]), (rank, name, said[name])
