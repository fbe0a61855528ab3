"""allocate over three axes: the span solver against brute force over every choice (float64, exact sums,
the documented ties), and cross-layer candidates (share, merge, xkv) chosen, measured and refined with
every number equal to evaluate's."""

from __future__ import annotations

import math
import random
from fractions import Fraction

import pytest

from headwidget.analysis.allocation import Span, cheapest_spans, choose_per_layer, choose_spans
from headwidget.errors import BudgetError


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
