"""allocate over three axes: the span solver against brute force over every choice (float64, exact sums,
the documented ties), and cross-layer candidates (share, merge, xkv) chosen, measured and refined with
every number equal to evaluate's."""

from __future__ import annotations

import itertools
import math
import random
import warnings
from fractions import Fraction

import pytest
import torch

from headwidget.analysis.allocation import Span, cheapest_spans, choose_per_layer, choose_spans
from headwidget.errors import ArgumentError, BudgetError, UnsupportedConversionError
from headwidget.evaluation import EvaluationReport, allocate, evaluate
from headwidget.evaluation._chosen import per_layer_specs
from tiny_models import three_layer_llama

F64 = torch.float64


def covers(spans: list[Span], num_layers: int, at: int = 0) -> list[list[int]]:
    """Every choice of span indices that covers layers ``at..num_layers − 1`` once, in layer order."""
    if at == num_layers:
        return [[]]
    return [
        [i, *rest] for i, s in enumerate(spans) if s.start == at for rest in covers(spans, num_layers, s.stop)
    ]


def brute_force(spans: list[Span], num_layers: int, budget: float) -> list[int] | None:
    """The least exact damage within the budget; among equals the least spend, then (the solver's ties)
    the smallest (start, index) of the chosen spans read from the last layer backwards."""
    feasible = [
        c for c in covers(spans, num_layers) if sum(Fraction(spans[i].cost) for i in c) <= Fraction(budget)
    ]
    if not feasible:
        return None

    def key(c: list[int]) -> tuple[object, ...]:
        damage = sum(Fraction(spans[i].damage) for i in c)
        spend = sum(Fraction(spans[i].cost) for i in c)
        return damage, spend, [(spans[i].start, i) for i in reversed(c)]

    return min(feasible, key=key)


def random_spans(rng: random.Random, num_layers: int, *, coarse: bool = False) -> list[Span]:
    """Spans of one to three layers; ``coarse``: damages and costs from a few values, so that many
    choices tie (damage and spend)."""
    steps = [1, 0.5, 0.125, 3]  # whole and fractional byte counts
    spans = []
    for start in range(num_layers):
        for length in (1, 1, 1, 2, 3):
            if start + length <= num_layers and rng.random() < (0.9 if length == 1 else 0.6):
                if coarse:
                    damage, cost = rng.choice([0.0, 0.25, 0.5]) * length, float(rng.choice([1, 2]) * length)
                else:  # dyadic damages: every sum is exact in float64
                    damage, cost = rng.randint(-8, 40) / 16, rng.randint(0, 10) * rng.choice(steps)
                spans.append(Span(start, length, damage, cost))
    for layer in range(num_layers):  # every layer coverable
        if not any(s.start == layer and s.length == 1 for s in spans):
            spans.append(Span(layer, 1, rng.randint(0, 40) / 16, rng.randint(0, 10)))
    rng.shuffle(spans)
    return spans


@pytest.mark.parametrize("coarse", [False, True])
@pytest.mark.parametrize("seed", range(30))
def test_the_span_solver_equals_brute_force_with_its_ties(seed: int, coarse: bool) -> None:
    rng = random.Random(seed)
    num_layers = rng.randint(1, 6)
    spans = random_spans(rng, num_layers, coarse=coarse)
    least = cheapest_spans(spans, num_layers)
    dearest = max(sum(spans[i].cost for i in c) for c in covers(spans, num_layers))
    budget = least + rng.random() * (dearest - least + 1)
    want = brute_force(spans, num_layers, budget)
    got = choose_spans(spans, num_layers, budget)
    assert got == want
    assert sum(Fraction(spans[i].cost) for i in got) <= Fraction(budget)
    assert math.fsum(spans[i].damage for i in got) == sum(Fraction(spans[i].damage) for i in want)


def test_the_ties_go_to_the_earliest_start_then_the_first_given() -> None:
    # a group [0, 1] and two single layers: equal damage and cost; the group starts earlier at the end
    spans = [Span(0, 1, 0.5, 1), Span(1, 1, 0.5, 1), Span(0, 2, 1.0, 2)]
    assert choose_spans(spans, 2, 2) == [2]
    spans = [Span(0, 1, 0.5, 1), Span(0, 1, 0.5, 1), Span(1, 1, 0.0, 1)]
    assert choose_spans(spans, 2, 2) == [0, 2]  # equal options of one layer: the first given
    spans = [Span(0, 1, 0.0, 2), Span(0, 1, 0.0, 1)]
    assert choose_spans(spans, 1, 2) == [1]  # equal damage: the lower spend


@pytest.mark.parametrize("seed", range(12))
def test_with_spans_of_one_layer_it_is_the_per_layer_knapsack(seed: int) -> None:
    rng = random.Random(100 + seed)
    layers, options = rng.randint(1, 5), rng.randint(1, 4)
    damage = [[rng.randint(0, 30) / 8 for _ in range(options)] for _ in range(layers)]
    cost = [[rng.randint(0, 12) * rng.choice([1, 0.5, 0.125]) for _ in range(options)] for _ in range(layers)]
    budget = sum(min(r) for r in cost) + rng.random() * 10
    spans = [
        Span(layer, 1, damage[layer][o], cost[layer][o]) for layer in range(layers) for o in range(options)
    ]
    picked = choose_spans(spans, layers, budget)
    assert [i % options for i in picked] == choose_per_layer(damage, cost, budget)


def test_bad_spans_are_refused() -> None:
    with pytest.raises(BudgetError, match=r"below the cheapest choice, 5 "):
        choose_spans([Span(0, 1, 0.0, 4), Span(1, 1, 0.0, 3), Span(0, 2, 0.0, 5)], 2, 4.5)
    with pytest.raises(ValueError, match=r"look at layer 2"):
        choose_spans([Span(0, 2, 0.0, 1)], 3, 10)
    with pytest.raises(ValueError, match=r"not a run of layers"):
        choose_spans([Span(1, 2, 0.0, 1)], 2, 10)
    with pytest.raises(BudgetError, match=r"finite"):
        choose_spans([Span(0, 1, math.nan, 1)], 1, 10)


def exact_least(
    choices: list[list[int]], damage: list[float], exact: list[Fraction], budget: Fraction
) -> Fraction:
    """The least damage of the ``choices`` (each a list of option indices) whose ``exact`` cost is within
    ``budget``."""
    return min(sum(Fraction(damage[i]) for i in c) for c in choices if sum(exact[i] for i in c) <= budget)


@pytest.mark.parametrize("seed", range(20))
def test_costs_that_are_thirds_fifths_or_sevenths_are_solved_exactly(seed: int) -> None:
    """Bytes per token such as r·C/P over P = 24 prefilled tokens are not binary fractions: at a budget
    equal to any choice's exact cost (given as the nearest float), that choice is within reach and the
    least damage is found (read on a grid of 1/8 byte, rounded up, such a budget could refuse or miss
    it). Spans, and options of one layer each for the per-layer knapsack."""
    rng = random.Random(200 + seed)
    num_layers = rng.randint(1, 5)
    spans, exact = [], []
    for start in range(num_layers):
        for length in (1, 1, 2, 3):
            if start + length <= num_layers and (length == 1 or rng.random() < 0.6):
                cost = Fraction(rng.randint(0, 60), rng.choice([3, 5, 7, 24]))
                spans.append(Span(start, length, rng.randint(0, 40) / 16, float(cost)))
                exact.append(cost)
    damage = [x.damage for x in spans]
    choices = covers(spans, num_layers)
    for total in {sum(exact[i] for i in c) for c in choices}:
        got = choose_spans(spans, num_layers, float(total))
        assert sum(exact[i] for i in got) <= total
        assert sum(Fraction(damage[i]) for i in got) == exact_least(choices, damage, exact, total)
    rows = [
        [i for i, x in enumerate(spans) if x.start == layer and x.length == 1] for layer in range(num_layers)
    ]
    per_layer = [list(c) for c in itertools.product(*rows)]
    for total in {sum(exact[i] for i in c) for c in per_layer}:
        picked = choose_per_layer(
            [[damage[i] for i in row] for row in rows],
            [[spans[i].cost for i in row] for row in rows],
            float(total),
        )
        got = [row[o] for row, o in zip(rows, picked, strict=True)]
        assert sum(exact[i] for i in got) <= total
        assert sum(Fraction(damage[i]) for i in got) == exact_least(per_layer, damage, exact, total)


def test_a_budget_equal_to_the_cheapest_choice_is_not_refused_for_a_float_above_it() -> None:
    """Three layers at 116/3 bytes each (4-bit keys in groups of 48 channels), each given as a float one
    unit in the last place above 116/3, as a float sum of byte counts can be: a budget of 116 reaches
    them (read as binary fractions, their sum is over 116)."""
    third = math.nextafter(116 / 3, math.inf)
    assert 3 * Fraction(third) > 116
    assert choose_per_layer([[0.0, 1.0]] * 3, [[512.0, third]] * 3, 116) == [1, 1, 1]
    assert choose_spans([Span(layer, 1, 0.0, third) for layer in range(3)], 3, 116) == [0, 1, 2]


def test_costs_too_fine_to_read_exactly_are_read_on_a_grid_of_an_eighth_of_a_byte() -> None:
    """Costs whose common denominator is too large for exact units (here 1/65521 and 1/65519 of a byte,
    primes) are read rounded up to a multiple of 1/8 and the budget rounded down: the choice never
    exceeds the budget, and is the least damage among the choices whose rounded costs fit; a budget
    that reaches none once rounded says so."""
    fine = [9 + Fraction(1, 65521), 5 + Fraction(1, 65519)]
    spans = [Span(0, 1, 0.0, float(fine[0])), Span(0, 1, 1.0, 2.0), Span(1, 1, 0.0, float(fine[1]))]
    spans += [Span(1, 1, 0.5, 3.0), Span(0, 2, 0.25, 12.0)]
    rounded = [Span(x.start, x.length, x.damage, math.ceil(x.cost * 8) / 8) for x in spans]
    # rounded up: 9.125, 2, 5.125, 3 and 12; the budget rounded down to a multiple of 1/8
    for budget, on_grid, want in ((14.2, 14.125, [4]), (14.3, 14.25, [0, 2]), (12.0, 12.0, [4])):
        assert choose_spans(spans, 2, budget) == brute_force(rounded, 2, on_grid) == want
    with pytest.raises(BudgetError, match=r"reaches no choice once the costs are read rounded up"):
        choose_per_layer([[0.0], [0.0]], [[float(fine[0])], [float(fine[1])]], float(sum(fine)) + 0.01)


# ------------------------------------------------------------------------------ allocate with groups

PREFILL = "prefill:32"
CROSS = ["share:2", "mqa+share:2", "merge:2", "xkv:8/2"]
CANDIDATES = ["model", "mqa", *CROSS]


@pytest.fixture(scope="module")
def llama():
    return three_layer_llama(seed=1)


@pytest.fixture(scope="module")
def ids() -> torch.Tensor:
    return torch.randint(1, 96, (6, 48), generator=torch.Generator().manual_seed(5))


@pytest.fixture(scope="module")
def allocation(llama, ids):
    return allocate(
        llama, ids, budget=0.5, candidates=CANDIDATES, refine=1, protocol=PREFILL, dtype=F64, progress=False
    )


def quietly(llama, texts, specs, **options) -> EvaluationReport:
    """evaluate under the test's protocol, its chosen-on warning silenced (measuring on the tokens an
    allocation chose on is the point here)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        return evaluate(llama, texts, specs, protocol=PREFILL, dtype=F64, progress=False, **options)


def test_each_group_s_damage_and_bytes_are_evaluate_s_of_that_group_alone(llama, ids, allocation) -> None:
    alone = {(c, s): f"{c}@{s}-{s + 1}" for c in CROSS for s in (0, 1)}
    alone[("xkv:8/2", 2)] = "xkv:8/2@2"  # (xKV's last layer left over: a group of its own)
    report = quietly(llama, ids, ["model", *alone.values()])
    for (c, s), spec in alone.items():
        assert allocation.damage[c][s] == pytest.approx(report.kl[spec], rel=1e-9, abs=1e-13), spec
        size = 1 if s == 2 else 2
        other = (
            report.kv_bytes_per_token["model"] * (3 - size) / 3
        )  # the layers outside, as the model has them
        assert allocation.layer_bytes[c][s] == pytest.approx(
            report.kv_bytes_per_token[spec] - other, rel=1e-12
        )
        if c != "xkv:8/2":
            assert math.isnan(allocation.damage[c][2]) and math.isnan(allocation.layer_bytes[c][2])
    assert allocation.damage["mqa"][1] == pytest.approx(quietly(llama, ids, ["mqa@1"]).kl["mqa@1"], rel=1e-9)


def test_the_chosen_groups_are_measured_as_evaluate_measures_their_spec(llama, ids, allocation) -> None:
    assert any(n > 1 for _, n, _ in allocation.cells), allocation.table()  # the third axis is chosen
    assert allocation.kv_bytes_per_token <= allocation.budget == 0.5 * 1536
    assert allocation.choice == [c for _, n, c in allocation.cells for _ in range(n)]
    first = allocation.rounds[0]  # the first solve: its prediction is the sum of its cells' damage
    assert first.spec == allocation.spec and first.predicted == pytest.approx(
        math.fsum(allocation.damage[c][a] for a, _, c in allocation.cells), abs=1e-12
    )
    report = quietly(llama, ids, [r.spec for r in allocation.rounds])
    for r in allocation.rounds:
        assert r.measured == pytest.approx(report.kl[r.spec], rel=1e-9, abs=1e-13), r.spec
        assert r.kv_bytes_per_token == pytest.approx(report.kv_bytes_per_token[r.spec], rel=1e-12), r.spec
    best = min(r.measured for r in allocation.rounds if r.kv_bytes_per_token <= allocation.budget)
    assert report.kl[allocation.spec] == pytest.approx(best, rel=1e-9, abs=1e-13)
    uniform = quietly(llama, ids, ["mqa", "mqa+share:2", "share:2"])  # no better uniform candidate fits
    for spec in ("mqa", "mqa+share:2", "share:2"):
        if uniform.kv_bytes_per_token[spec] <= allocation.budget:
            assert best <= uniform.kl[spec] * (1 + 1e-9) + 1e-15, spec


def test_the_refine_sweep_with_groups_equals_evaluate_of_every_swapped_spec(llama, ids) -> None:
    """Around an allocation with a group, every other cell swapped in (groups broken where a cell cuts
    into them, their other layers keeping the within-layer conversion): swap_sweep's totals of each
    swapped spec equal evaluate's, with the groups before the swapped layer replayed."""
    from headwidget.adapters import adapter_for
    from headwidget.evaluation._allocate import _Cell, _fit_candidates
    from headwidget.evaluation._inputs import parse_protocol
    from headwidget.evaluation._model_facts import layer_kv_elements
    from headwidget.evaluation._prefill import PrefillRunner
    from headwidget.evaluation._sweep import swap_sweep
    from headwidget.evaluation.running import protocol_batches

    adapter = adapter_for(llama)
    elements = {layer: layer_kv_elements(adapter, layer) for layer in range(3)}
    fitted, _ = _fit_candidates(adapter, CANDIDATES, None, [0, 1, 2], F64, elements)
    reading = parse_protocol(PREFILL)
    batches = protocol_batches(
        llama, ids, None, reading, batch_size=8, max_length=512, max_tokens=None, min_tokens=2
    )
    runner = PrefillRunner.for_model(llama, 32)
    references = [runner(llama, b) for b in batches]
    for current in [
        (_Cell(0, 2, "mqa+share:2"), _Cell(2, 1, "mqa")),
        (_Cell(0, 1, "model"), _Cell(1, 2, "merge:2")),
    ]:
        swaps = {}
        for cell in fitted.options():
            if cell not in current:
                swapped, first = fitted.swapped(current, cell)
                assert sorted(x for c in swapped for x in range(c.start, c.stop)) == [0, 1, 2]
                swaps[cell] = (first, fitted.plan(swapped))
        assert swaps[_Cell(1, 1, "mqa")][0] == (0 if current[0].length == 2 else 1)  # a broken group
        whole, totals = swap_sweep(llama, batches, references, fitted.plan(current), swaps, runner)
        specs = [fitted.plan(current).spec, *(plan.spec for _, plan in swaps.values())]
        report = quietly(llama, ids, specs)
        for spec, got in [(specs[0], whole), *((plan.spec, totals[k]) for k, (_, plan) in swaps.items())]:
            assert got.kl == pytest.approx(report.kl[spec], rel=1e-9, abs=1e-13), spec
            assert got.tokens == report.tokens
    # the merge of layers 1-2 cut at layer 2: layer 1 keeps its within-layer spec, and differs from 1 on
    assert fitted.swapped(current, _Cell(2, 1, "mqa")) == (
        (_Cell(0, 1, "model"), _Cell(1, 1, "model"), _Cell(2, 1, "mqa")),
        1,
    )


def test_an_allocation_with_groups_is_flagged_on_its_own_tokens_however_written(llama, ids) -> None:
    alloc = allocate(
        llama,
        ids,
        budget=0.35,
        candidates=["mqa", "mqa+share:2"],
        refine=0,
        protocol=PREFILL,
        dtype=F64,
        progress=False,
    )
    assert alloc.kv_bytes_per_token == 512 and "mqa+share:2" in alloc.spec
    with pytest.warns(UserWarning, match=r"\(on 100% of them\) was chosen by headwidget.allocate"):
        report = evaluate(llama, ids, [alloc.spec], protocol=PREFILL, dtype=F64, progress=False)
    assert report.chosen_on_these_tokens == [alloc.spec]
    if alloc.cells[0][1] == 2:  # mqa+share:2@0-1;mqa@2 is what uniform mqa+share:2 does on 3 layers
        with pytest.warns(UserWarning, match=r"chosen by headwidget.allocate"):
            evaluate(llama, ids, ["mqa+share:2"], protocol=PREFILL, dtype=F64, progress=False)
    other = torch.randint(1, 96, (6, 48), generator=torch.Generator().manual_seed(6))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        held_out = evaluate(llama, other, [alloc.spec], protocol=PREFILL, dtype=F64, progress=False)
    assert held_out.chosen_on_these_tokens == []


def test_a_layer_alone_in_its_group_is_its_within_layer_spec_to_the_leak_flag() -> None:
    assert per_layer_specs("mqa+share:2", 3) == per_layer_specs("mqa+share:2@0-1;mqa@2", 3)
    assert per_layer_specs("share:2@0-2", 3) == per_layer_specs("share:2@0-1", 3)
    assert per_layer_specs("share:2@1-2", 3) != per_layer_specs("share:2@0-1", 3)
    assert per_layer_specs("merge:2", 4) == ("merge:2",) * 4
    # xKV compresses a layer left over by its own SVD, as its authors do: it is that layer's xkv:r/1
    assert per_layer_specs("xkv:4/2", 3) == per_layer_specs("xkv:4/2@0-1;xkv:4/1@2", 3)
    assert per_layer_specs("xkv:4/2", 3) != per_layer_specs("xkv:4/2@0-1", 3)


def test_cross_layer_candidates_say_what_they_need(llama, ids) -> None:
    common = {"dtype": F64, "progress": False, "refine": 0}
    with pytest.raises(UnsupportedConversionError, match=r"merge:2 transforms the KV cache a prefill built"):
        allocate(llama, ids, budget=0.5, candidates=["model", "merge:2"], **common)
    with pytest.raises(ArgumentError, match=r"cannot cover all 3 layers"):
        allocate(llama, ids, budget=0.5, candidates=["share:2"], **common)
    with pytest.raises(ArgumentError, match=r"groups of 4 adjacent layers, and the model has 3"):
        allocate(llama, ids, budget=0.5, candidates=["model", "share:4"], **common)
    forwards = []
    handle = llama.register_forward_pre_hook(lambda *_: forwards.append(1))
    try:
        with pytest.raises(BudgetError, match=r"below the cheapest choice, 512 "):  # mqa+share:2 + mqa
            allocate(llama, ids, budget=500, candidates=["mqa", "mqa+share:2"], **common)
    finally:
        handle.remove()
    assert forwards == []


def test_share_is_allocated_in_the_documents_protocol_too(llama, ids) -> None:
    alloc = allocate(
        llama, ids, budget=0.5, candidates=["model", "mqa", "share:2"], refine=1, dtype=F64, progress=False
    )
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        report = evaluate(llama, ids, [r.spec for r in alloc.rounds], dtype=F64, progress=False)
    for r in alloc.rounds:
        assert r.measured == pytest.approx(report.kl[r.spec], rel=1e-9, abs=1e-13), r.spec
    again = allocate(
        llama, ids, budget=0.5, candidates=["model", "mqa", "share:2"], refine=1, dtype=F64, progress=False
    )
    assert again.rounds == alloc.rounds and again.cells == alloc.cells


def test_a_merge_measured_over_the_budget_is_solved_again_below_it(llama, ids, monkeypatch) -> None:
    """A merge's bytes are its sweep's retention; the allocation's own prefills may retain more. Here
    the sweep is made to see no retention at all: the first solve takes a merge that measures over the
    budget, and the solve below the budget by the excess is the allocation."""
    import headwidget.evaluation.running as module

    real, calls = module.sum_retention, []

    def sweep_sees_none(plans, ranks):
        real(plans, ranks)
        if not calls:  # the sweep's call
            for cache in module._merges(plans):
                cache.retained = {kind: [0, total] for kind, (_, total) in cache.retained.items()}
        calls.append(1)

    monkeypatch.setattr(module, "sum_retention", sweep_sees_none)
    alloc = allocate(
        llama,
        ids,
        budget=1100,
        candidates=["model", "mqa", "merge:2"],
        refine=0,
        protocol=PREFILL,
        dtype=F64,
        progress=False,
    )
    first, second = alloc.rounds[:2]
    assert first.kv_bytes_per_token > 1100  # merge:2@0-1;model@2: 576 + 512 = 1088 as the sweep saw it
    assert alloc.spec == second.spec == "merge:2@0-1;mqa@2" and alloc.kv_bytes_per_token <= 1100
    report = quietly(llama, ids, [first.spec, second.spec])
    assert report.kv_bytes_per_token[first.spec] == pytest.approx(first.kv_bytes_per_token, rel=1e-12)
    assert report.kl[second.spec] == pytest.approx(second.measured, rel=1e-9, abs=1e-13)


def test_single_layer_xkv_cells_are_evaluate_s_of_that_layer_alone(llama, ids) -> None:
    """``xkv:r/1`` (xKV's single-layer SVD) as a candidate beside ``xkv:r/2``: each of its cells is one
    layer, whose damage and bytes (the basis over the prefill included) are evaluate's of that layer
    alone, and the allocation measures as evaluate measures its spec."""
    alloc = allocate(
        llama,
        ids,
        budget=0.6,
        candidates=["model", "xkv:4/1", "xkv:4/2"],
        refine=0,
        protocol=PREFILL,
        dtype=F64,
        progress=False,
    )
    alone = {s: f"xkv:4/1@{s}" for s in range(3)}
    report = quietly(llama, ids, ["model", *alone.values(), alloc.spec])
    other = 2 * report.kv_bytes_per_token["model"] / 3  # the two layers left as the model has them
    for s, spec in alone.items():
        assert alloc.damage["xkv:4/1"][s] == pytest.approx(report.kl[spec], rel=1e-9, abs=1e-13), spec
        assert alloc.layer_bytes["xkv:4/1"][s] == pytest.approx(
            report.kv_bytes_per_token[spec] - other, rel=1e-12
        )
    assert alloc.layer_bytes["xkv:4/1"][0] == pytest.approx(8 * 2 * (4 + 4 * 32 / 32), rel=1e-12)  # r + r·C/P
    assert alloc.kv_bytes_per_token <= alloc.budget
    kept = next(r for r in alloc.rounds if r.spec == alloc.spec)
    assert kept.measured == pytest.approx(report.kl[alloc.spec], rel=1e-9, abs=1e-13)


def test_an_xkv_candidate_covers_a_layer_left_over_as_evaluate_does(llama, ids) -> None:
    """On three layers ``xkv:4/2`` is a pair and the last layer compressed alone (as evaluate reads the
    spec): that shorter last group is a cell of the sweep, so the candidate alone covers the model, its
    uniform spec is within reach of the budget evaluate prices it at, and its bytes and damage are
    evaluate's of that layer alone."""
    report = quietly(llama, ids, ["model", "xkv:4/2", "xkv:4/2@2"])
    share = report.kv_bytes_per_token["xkv:4/2"] / report.kv_bytes_per_token["model"]
    alloc = allocate(
        llama,
        ids,
        budget=share,
        candidates=["xkv:4/2"],
        refine=0,
        protocol=PREFILL,
        dtype=F64,
        progress=False,
    )
    assert alloc.cells == [(0, 2, "xkv:4/2"), (2, 1, "xkv:4/2")]
    assert alloc.kv_bytes_per_token == pytest.approx(report.kv_bytes_per_token["xkv:4/2"], rel=1e-12)
    assert alloc.rounds[0].measured == pytest.approx(report.kl["xkv:4/2"], rel=1e-9, abs=1e-13)
    other = 2 * report.kv_bytes_per_token["model"] / 3
    assert alloc.layer_bytes["xkv:4/2"][2] == pytest.approx(
        report.kv_bytes_per_token["xkv:4/2@2"] - other, rel=1e-12
    )
    assert alloc.damage["xkv:4/2"][2] == pytest.approx(report.kl["xkv:4/2@2"], rel=1e-9, abs=1e-13)


def test_xkv_bytes_in_thirds_are_allocated_exactly(llama, ids) -> None:
    """Under ``prefill:24`` an xKV basis spread over 24 tokens gives bytes per token in thirds: a budget
    equal to the candidate's own bytes reaches it, and at a budget equal to each cover's bytes the
    least summed damage among the covers within it is chosen (brute force over the sweep's cells, their
    bytes read as multiples of 1/48)."""
    protocol, options = "prefill:24", {"refine": 0, "dtype": F64, "progress": False}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", UserWarning)
        report = evaluate(llama, ids, ["model", "xkv:4/2"], protocol=protocol, dtype=F64, progress=False)
        share = report.kv_bytes_per_token["xkv:4/2"] / report.kv_bytes_per_token["model"]
        alone = allocate(llama, ids, budget=share, candidates=["xkv:4/2"], protocol=protocol, **options)
        assert alone.kv_bytes_per_token == pytest.approx(report.kv_bytes_per_token["xkv:4/2"], rel=1e-12)
        first = allocate(
            llama, ids, budget=1.0, candidates=["model", "xkv:4/2"], protocol=protocol, **options
        )
        cells = [
            (start, length, spec)
            for spec in ("model", "xkv:4/2")
            for start, length in ((0, 1), (1, 1), (2, 1), (0, 2), (1, 2))
            if (spec == "model") == (length == 1) or (spec, start, length) == ("xkv:4/2", 2, 1)
        ]
        damage = {c: first.damage[c[2]][c[0]] for c in cells}
        cost = {c: Fraction(first.layer_bytes[c[2]][c[0]]).limit_denominator(48) for c in cells}
        assert any(x.denominator == 3 for x in cost.values())
        spans = [Span(start, length, 0.0, 0.0) for start, length, _ in cells]
        choices = [[cells[i] for i in c] for c in covers(spans, 3)]
        model_bytes = report.kv_bytes_per_token["model"]
        for total in sorted({sum(cost[c] for c in choice) for choice in choices}):
            alloc = allocate(
                llama,
                ids,
                budget=float(total) / model_bytes,
                candidates=["model", "xkv:4/2"],
                protocol=protocol,
                **options,
            )
            chosen = [tuple(c) for c in alloc.cells]
            least = min(
                sum(Fraction(damage[c]) for c in ch) for ch in choices if sum(cost[c] for c in ch) <= total
            )
            assert sum(cost[c] for c in chosen) <= total
            assert alloc.rounds[0].predicted == pytest.approx(float(least), rel=1e-12, abs=1e-15)
