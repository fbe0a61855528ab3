"""allocate(): the exact knapsack against brute force, and every number against evaluate (float64)."""

from __future__ import annotations

import itertools
import math
import random
import re
import warnings

import pytest
import torch

from headwidget.analysis.allocation import choose_per_layer
from headwidget.analysis.variants import parse_variant
from headwidget.errors import ArgumentError, BudgetError, GroupCountError, MechanismSpecError
from headwidget.evaluation import allocate, allocate_frontier, evaluate
from tiny_models import ragged_batches, three_layer_llama

F64 = torch.float64


def brute_force(damage, cost, budget):
    best = None
    for choice in itertools.product(*(range(len(row)) for row in damage)):
        spend = sum(cost[layer][c] for layer, c in enumerate(choice))
        if spend > budget:
            continue
        total = math.fsum(damage[layer][c] for layer, c in enumerate(choice))
        if best is None or total < best[0]:
            best = (total, choice)
    return best


@pytest.mark.parametrize("seed", range(12))
def test_the_knapsack_equals_brute_force(seed: int) -> None:
    rng = random.Random(seed)
    layers, options = rng.randint(1, 5), rng.randint(1, 4)
    steps = [1, 0.5, 0.125, 3]  # whole and fractional byte counts, as the quantizers give
    cost = [[rng.randint(0, 12) * rng.choice(steps) for _ in range(options)] for _ in range(layers)]
    damage = [[rng.random() for _ in range(options)] for _ in range(layers)]
    low, high = sum(min(r) for r in cost), sum(max(r) for r in cost)
    budget = rng.uniform(low, high + 1)
    choice = choose_per_layer(damage, cost, budget)
    total, _ = brute_force(damage, cost, budget)
    assert sum(cost[layer][c] for layer, c in enumerate(choice)) <= budget
    assert math.fsum(damage[layer][c] for layer, c in enumerate(choice)) == pytest.approx(total, abs=1e-12)
    assert choose_per_layer(damage, cost, budget) == choice  # deterministic


def test_a_budget_below_the_cheapest_choice_says_the_least() -> None:
    with pytest.raises(BudgetError, match=r"below the cheapest choice, 3 "):
        choose_per_layer([[0, 1], [0, 1]], [[4, 2], [3, 1]], 2.5)
    with pytest.raises(BudgetError, match=r"finite"):
        choose_per_layer([[math.nan]], [[1]], 2)


@pytest.fixture(scope="module")
def llama():
    return three_layer_llama(seed=1)


CANDIDATES = ["model", "mqa", "lrkv:4", "kv:int4", "kv:int2"]


@pytest.fixture(scope="module")
def allocation(llama):
    return allocate(
        llama, ragged_batches(seed=7), budget=0.4, candidates=CANDIDATES, refine=1, dtype=F64, progress=False
    )


def test_the_allocation_respects_the_budget_and_its_numbers_are_evaluate_s(llama, allocation) -> None:
    calibration = ragged_batches(seed=7)
    assert allocation.model_bytes == 3 * 2 * 2 * 16 * 8  # 3 layers, K and V, 2 KV heads × 16, float64
    assert allocation.budget == pytest.approx(0.4 * allocation.model_bytes)
    assert allocation.kv_bytes_per_token <= allocation.budget
    assert parse_variant(allocation.spec).text == allocation.spec
    first = allocation.rounds[0]
    by_layer = [allocation.damage[c][layer] for layer, c in enumerate(_choice_of(allocation, first.spec))]
    assert first.predicted == pytest.approx(math.fsum(by_layer), abs=1e-12)
    with pytest.warns(UserWarning, match=r"\(on 100% of them\) was chosen by headwidget.allocate on these"):
        report = evaluate(llama, calibration, [first.spec], dtype=F64, progress=False)
    assert report.kl[first.spec] == pytest.approx(first.measured, rel=1e-9, abs=1e-12)
    assert report.kv_bytes_per_token[first.spec] == first.kv_bytes_per_token
    assert report.chosen_on_these_tokens == [first.spec] and "† chosen by allocate" in report.table()
    held_out = evaluate(llama, ragged_batches(seed=8), [allocation.spec], dtype=F64, progress=False)
    assert held_out.chosen_on_these_tokens == []
    assert min(r.measured for r in allocation.rounds) == pytest.approx(
        evaluate(llama, calibration, [allocation.spec], dtype=F64, progress=False).kl[allocation.spec],
        rel=1e-9,
        abs=1e-12,
    )


def _choice_of(allocation, spec):
    parsed = parse_variant(spec)
    return [getattr(parsed, "spec_at", lambda layer: parsed)(layer).text for layer in range(3)]


def test_the_leak_flag_follows_the_tokens_through_protocols_and_mixtures(llama) -> None:
    gen = torch.Generator().manual_seed(11)
    chosen_on = torch.randint(1, 96, (4, 60), generator=gen)
    other = torch.randint(1, 96, (4, 60), generator=gen)
    alloc = allocate(
        llama,
        chosen_on,
        budget=0.6,
        candidates=["model", "mqa", "kv:int4"],
        refine=0,
        dtype=F64,
        progress=False,
    )

    def share_flagged(texts, **options):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            report = evaluate(llama, texts, [alloc.spec], dtype=F64, progress=False, **options)
        said = [str(w.message) for w in caught if "chosen by headwidget.allocate" in str(w.message)]
        return report.chosen_on_these_tokens == [alloc.spec], said

    # the same rows cut into windows of 40 (one stream, the last partial window dropped): flagged
    flagged, said = share_flagged(chosen_on, protocol="chunks:40")
    assert flagged and len(said) == 1 and re.search(r"\(on (9\d|100)% of them\)", said[0]), said
    # half of them beside as much other text, rows reordered: flagged, on about half
    flagged, said = share_flagged(torch.cat([other[:2], chosen_on[2:], other[2:]])[[3, 0, 1, 2, 4, 5]])
    share = int(re.search(r"on (\d+)% of them", said[0]).group(1))
    assert flagged and 25 <= share <= 45, said  # 2 of 6 rows
    # other text only: not flagged
    flagged, said = share_flagged(other)
    assert not flagged and said == []
    # other text whose every row starts with one chosen-on row as a template: the template's tokens
    # were chosen on (59 of each row's 119 predicted tokens)
    templated = torch.cat([chosen_on[1:2].expand(4, 60), other], dim=1)
    flagged, said = share_flagged(templated)
    assert flagged and len(said) == 1 and "(on 50% of them)" in said[0], said


def test_each_layer_damage_is_the_whole_model_kl_with_that_layer_alone(llama, allocation) -> None:
    calibration = ragged_batches(seed=7)
    for spec, layer in [("mqa", 0), ("kv:int2", 2), ("lrkv:4", 1)]:
        alone = f"{spec}@{layer}"
        report = evaluate(llama, calibration, [alone], dtype=F64, progress=False)
        assert allocation.damage[spec][layer] == pytest.approx(report.kl[alone], rel=1e-9, abs=1e-13)
    assert allocation.damage["model"] == [0.0, 0.0, 0.0]
    layer_bytes = allocation.layer_bytes
    assert layer_bytes["kv:int4"][0] == 2 * (32 * 4 / 8 + 4 * 32 / 32)
    assert layer_bytes["mqa"][1] == 2 * 16 * 8


def test_bad_allocations_are_refused_with_what_to_do(llama) -> None:
    ids = ragged_batches(seed=7)
    common = {"dtype": F64, "progress": False, "refine": 0}
    with pytest.raises(BudgetError, match=r"below the cheapest choice"):
        allocate(llama, ids, budget=10, candidates=["model", "kv:int2"], **common)
    with pytest.raises(MechanismSpecError, match=r"cannot read variant spec 'banana'"):
        allocate(llama, ids, budget=0.5, candidates=["model", "banana"], **common)
    with pytest.raises(GroupCountError):
        allocate(llama, ids, budget=0.5, candidates=["model", "gqa:3"], **common)
    with pytest.raises(ArgumentError, match=r"mixed spec"):
        allocate(llama, ids, budget=0.5, candidates=["model", "mqa@0"], **common)
    for budget in ["0.5", math.nan, 0.0, 1.5, True, -3]:
        with pytest.raises(ArgumentError, match=r"budget"):
            allocate(llama, ids, budget=budget, candidates=["model", "mqa"], **common)
    with pytest.raises(ArgumentError, match=r"objective"):
        allocate(llama, ids, budget=0.5, candidates=["model", "mqa"], objective="ppl", **common)
    with pytest.raises(ArgumentError, match=r"candidates"):
        allocate(llama, ids, budget=0.5, candidates="mqa", **common)


def test_the_allocation_is_deterministic(llama, allocation) -> None:
    again = allocate(
        llama, ragged_batches(seed=7), budget=0.4, candidates=CANDIDATES, refine=1, dtype=F64, progress=False
    )
    assert again.spec == allocation.spec and again.rounds == allocation.rounds


def test_the_allocation_measures_no_worse_than_any_uniform_candidate_within_the_budget(llama) -> None:
    calibration = ragged_batches(seed=7)
    alloc = allocate(
        llama,
        calibration,
        budget=0.5,
        candidates=["model", "mqa", "kv:int4", "kv:int8"],
        refine=0,
        dtype=F64,
        progress=False,
    )
    best = min(r.measured for r in alloc.rounds)
    chosen = next(r for r in alloc.rounds if r.spec == alloc.spec)
    assert chosen.measured == best
    for spec in ["mqa", "kv:int4", "kv:int8"]:
        uniform = f"{spec}@0-2"
        report = evaluate(llama, calibration, [uniform], dtype=F64, progress=False)
        if report.kv_bytes_per_token[uniform] <= alloc.budget:
            assert best <= report.kl[uniform] * (1 + 1e-9) + 1e-15


def test_the_refine_sweep_equals_evaluate_of_every_swapped_spec(llama) -> None:
    """swap_sweep replays the current allocation's hidden states up to the swapped layer: each swapped
    spec's KL, NLL and top-1 equal evaluate's full forwards of that spec (float64)."""
    from headwidget.adapters import adapter_for
    from headwidget.evaluation._inputs import parse_protocol
    from headwidget.evaluation._outputs import OutputRunner
    from headwidget.evaluation._plan import plan_variant
    from headwidget.evaluation._sweep import swap_sweep
    from headwidget.evaluation.running import protocol_batches

    calibration = ragged_batches(seed=7)
    batches = protocol_batches(
        llama,
        calibration,
        None,
        parse_protocol("documents"),
        batch_size=8,
        max_length=512,
        max_tokens=None,
        min_tokens=2,
    )
    runner = OutputRunner.for_model(llama)
    references = [runner(llama, b) for b in batches]
    layers = [0, 1, 2]

    def plan(spec):
        return plan_variant(adapter_for(llama), parse_variant(spec), None, layers)

    current = "mqa@0;kv:int4@1;lrkv:4@2"
    swapped = {
        (0, "model"): "kv:int4@1;lrkv:4@2",
        (0, "kv:int2"): "kv:int2@0;kv:int4@1;lrkv:4@2",
        (1, "model"): "mqa@0;lrkv:4@2",
        (1, "lrkv:4"): "mqa@0;lrkv:4@1-2",
        (2, "kv:int2"): "mqa@0;kv:int4@1;kv:int2@2",
        (2, "mqa"): "mqa@0;kv:int4@1;mqa@2",
    }
    swaps = {key: (key[0], plan(spec)) for key, spec in swapped.items()}
    whole, totals = swap_sweep(llama, batches, references, plan(current), swaps, runner)
    report = evaluate(llama, calibration, [current, *swapped.values()], dtype=F64, progress=False)
    for spec, got in [(current, whole), *((swapped[k], t) for k, t in totals.items())]:
        spec = parse_variant(spec).text
        assert got.kl == pytest.approx(report.kl[spec], rel=1e-9, abs=1e-13), spec
        assert got.nll == pytest.approx(report.measures[spec]["nll"], rel=1e-12), spec
        assert got.top1 == report.measures[spec]["top1"], spec
        assert got.tokens == report.tokens
    assert len({round(t.kl, 9) for t in totals.values()}) == len(totals)  # six different numbers


def test_the_nll_objective_measures_delta_nll_as_evaluate_does(llama) -> None:
    calibration = ragged_batches(seed=7)
    alloc = allocate(
        llama,
        calibration,
        budget=0.4,
        candidates=CANDIDATES,
        objective="nll",
        refine=1,
        dtype=F64,
        progress=False,
    )
    assert alloc.objective == "nll" and alloc.kv_bytes_per_token <= alloc.budget
    for r in alloc.rounds:
        with warnings.catch_warnings():  # the chosen spec on its own tokens is flagged: that is the point
            warnings.simplefilter("ignore", UserWarning)
            report = evaluate(llama, calibration, ["model", r.spec], dtype=F64, progress=False)
        delta = report.nll[r.spec] - report.nll["model"]
        assert r.measured == pytest.approx(delta, rel=1e-9, abs=1e-13), r.spec
    for spec, layer in [("mqa", 0), ("kv:int2", 2)]:
        alone = f"{spec}@{layer}"
        report = evaluate(llama, calibration, ["model", alone], dtype=F64, progress=False)
        assert alloc.damage[spec][layer] == pytest.approx(
            report.nll[alone] - report.nll["model"], rel=1e-9, abs=1e-13
        )


def test_numpy_budgets_are_budgets(llama) -> None:
    """An np.int64 is bytes per token and an np.float32 a fraction, as int and float are; a numpy array
    of budgets is a list of them."""
    import numpy as np

    ids = ragged_batches(seed=7)
    common = {"candidates": ["model", "mqa", "kv:int4"], "refine": 0, "dtype": F64, "progress": False}
    for given, plain in [(np.int64(700), 700), (np.float32(0.5), 0.5), (np.float64(0.25), 0.25)]:
        got, want = allocate(llama, ids, budget=given, **common), allocate(llama, ids, budget=plain, **common)
        assert type(got.budget) is float and got.budget == want.budget and got.spec == want.spec
    frontier = allocate_frontier(llama, ids, budgets=np.array([0.5, 0.25]), **common)
    assert [a.budget for a in frontier] == [0.5 * 1536, 0.25 * 1536]
    for bad in [np.bool_(True), np.float32("nan"), np.array(0.5), np.int64(0)]:
        with pytest.raises(ArgumentError, match=r"budget"):
            allocate(llama, ids, budget=bad, **common)
