"""The exact multiple-choice knapsack behind :func:`headwidget.allocate`: one option per layer, the least
summed damage within a byte budget.

Every layer ``ℓ`` has options ``c`` with a damage ``d[ℓ][c]`` and a cost ``w[ℓ][c]`` (K/V bytes per
token). :func:`choose_per_layer` returns the choice ``c_ℓ`` per layer that minimises ``Σ d[ℓ][c_ℓ]``
subject to ``Σ w[ℓ][c_ℓ] ≤ budget``, exactly: the costs are read as exact fractions (a float is a
binary fraction), scaled to whole units by their common denominator and greatest common divisor, and
a dynamic programme over units ``0..budget`` keeps, per layer, the least damage reachable at each
spend. Ties go to the lower option index, then the lower spend, so the choice is deterministic.

Example:
    >>> damage = [[0.0, 0.3, 0.9], [0.0, 0.1, 0.2]]   # per layer: model, a mild and a harsh option
    >>> cost = [[4, 2, 1], [4, 2, 1]]
    >>> choose_per_layer(damage, cost, budget=5)        # 2 + 2 = 4 would cost 0.4; 4 + 1 costs 0.2
    [0, 2]
    >>> choose_per_layer(damage, cost, budget=3.5)
    [1, 2]
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from fractions import Fraction

import numpy as np

from headwidget.errors import BudgetError

__all__ = ["MAX_UNITS", "BudgetError", "cheapest", "choose_per_layer"]

#: The most budget units the dynamic programme holds per layer (beyond it the costs are too fine-grained
#: for the budget; no K/V byte count of a real model comes near it).
MAX_UNITS = 2**24


def cheapest(cost: Sequence[Sequence[float]]) -> float:
    """The least total cost any choice has: the cheapest option of every layer.

    >>> cheapest([[4, 2], [3, 1]])
    3
    """
    return sum(min(row) for row in cost)


def check_budget(cost: Sequence[Sequence[float]], budget: float) -> None:
    """Refuse a budget below :func:`cheapest` (:class:`BudgetError` saying the least possible).

    >>> check_budget([[4, 2], [3, 1]], 2.5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.BudgetError: a budget of 2.5 bytes per token is below the cheapest choice, 3 ...
    """
    least = cheapest(cost)
    if budget < least:
        raise BudgetError(
            f"a budget of {budget:g} bytes per token is below the cheapest choice, {least:g} (the cheapest "
            "candidate at every layer); raise the budget or add a cheaper candidate"
        )


def _units(cost: Sequence[Sequence[float]], budget: float) -> tuple[list[list[int]], int]:
    exact = [[Fraction(w) for w in row] for row in cost]
    scale = math.lcm(*(w.denominator for row in exact for w in row), Fraction(budget).denominator)
    whole = [[int(w * scale) for w in row] for row in exact]
    step = math.gcd(*(w for row in whole for w in row)) or 1
    units = [[w // step for w in row] for row in whole]
    return units, int(Fraction(budget) * scale // step)


def choose_per_layer(
    damage: Sequence[Sequence[float]], cost: Sequence[Sequence[float]], budget: float
) -> list[int]:
    """The option per layer with the least summed damage whose summed cost is at most ``budget``
    (see the module docstring).

    Raises:
        BudgetError: ``budget`` below :func:`cheapest` (the message says the least possible), a negative
            or non-finite cost or damage, or costs too fine-grained for the budget (over
            :data:`MAX_UNITS` units).
    """
    if len(damage) != len(cost) or any(len(d) != len(w) for d, w in zip(damage, cost, strict=True)):
        raise ValueError("damage and cost must have one row per layer and one entry per option")
    values = [float(x) for row in (*damage, *cost) for x in row]
    if not all(math.isfinite(x) for x in values) or any(w < 0 for row in cost for w in row):
        raise BudgetError("every damage must be finite and every cost finite and ≥ 0")
    check_budget(cost, budget)
    units, top = _units(cost, budget)
    top = min(top, sum(max(row) for row in units))  # spending more than everything at its dearest is moot
    if top > MAX_UNITS:
        raise BudgetError(
            f"the costs are too fine-grained for this budget ({top} units of their common step); round "
            "the budget, or use candidates whose bytes per token share a coarser step"
        )
    best = np.full(top + 1, np.inf)
    best[0] = 0.0
    picks = []
    for d_row, w_row in zip(damage, units, strict=True):
        new = np.full(top + 1, np.inf)
        pick = np.full(top + 1, -1, dtype=np.int64)
        for option, (d, w) in enumerate(zip(d_row, w_row, strict=True)):
            if w > top:
                continue
            reached = np.full(top + 1, np.inf)
            reached[w:] = best[: top + 1 - w] + float(d)
            better = reached < new  # strict: the lower option index wins a tie
            new[better] = reached[better]
            pick[better] = option
        best = new
        picks.append(pick)
    spend = int(np.argmin(best))  # the least damage; argmin takes the lowest spend among equals
    choice = []
    for layer in range(len(damage) - 1, -1, -1):
        option = int(picks[layer][spend])
        choice.append(option)
        spend -= units[layer][option]
    return choice[::-1]
