"""The exact solvers behind :func:`headwidget.allocate`: the least summed damage within a byte budget, one
option per layer (:func:`choose_per_layer`) or options that span several adjacent layers
(:func:`choose_spans`: cross-layer groups beside per-layer options).

Every layer ``ℓ`` has options ``c`` with a damage ``d[ℓ][c]`` and a cost ``w[ℓ][c]`` (K/V bytes per
token). :func:`choose_per_layer` returns the choice ``c_ℓ`` per layer that minimises ``Σ d[ℓ][c_ℓ]``
subject to ``Σ w[ℓ][c_ℓ] ≤ budget``, exactly: the costs and the budget are read as the fractions they
stand for (:func:`exact_bytes`: K/V bytes per token are ratios of small whole numbers, such as 116/3
for 4-bit keys in groups of 48 channels, or a basis spread over P prefilled tokens), scaled to whole
units by their common denominator and greatest common divisor, and a dynamic programme over units
``0..budget`` keeps, per layer, the least damage reachable at each spend. Ties go to the lower option
index, then the lower spend, so the choice is deterministic. Costs whose common step is too fine for
:data:`MAX_UNITS` units (a merge's bytes count the share of tokens it retained: any fraction) are read
rounded up to a multiple of 1/:data:`BYTE_GRID` byte and the budget rounded down to one: the choice
then never exceeds the budget, and is exact for the costs so rounded.

**Spans.** A cross-layer option (``share:g``, ``merge:2``, ``xkv:r/g`` over a group of ``g`` adjacent
layers) is chosen for its whole group at once, so the choice is no longer one independent option per
layer. :func:`choose_spans` takes options as :class:`Span` s — layers ``start .. start + length − 1``
taken together at one damage and one cost (a per-layer option is a span of one layer) — and returns
spans that cover every layer exactly once with the least summed damage within the budget. It is a
dynamic programme over layer positions: its state is the first layer not yet covered and the units
spent so far. From position ``p`` a span that starts at ``p`` leads to ``p + length`` (a group of ``g``
layers jumps ``g`` positions, so no state has to remember a group chosen earlier: its readers are
covered by the jump). Positions are processed in order, the spans of one position in the order given,
and a later arrival at a (position, spend) replaces an earlier one only when its damage is strictly
less. So ties go, comparing the chosen spans from the last layer backwards, to the span that starts
earliest (the longer one), then to the one given first; among choices of equal least damage, to the
lower spend. With spans of one layer only, given layer by layer, it makes the choice of
:func:`choose_per_layer`.

Example:
    >>> damage = [[0.0, 0.3, 0.9], [0.0, 0.1, 0.2]]   # per layer: model, a mild and a harsh option
    >>> cost = [[4, 2, 1], [4, 2, 1]]
    >>> choose_per_layer(damage, cost, budget=5)        # 2 + 2 = 4 would cost 0.4; 4 + 1 costs 0.2
    [0, 2]
    >>> choose_per_layer(damage, cost, budget=3.5)
    [1, 2]
    >>> spans = [Span(0, 1, 0.0, 4), Span(0, 1, 0.3, 2), Span(1, 1, 0.0, 4), Span(1, 1, 0.1, 2),
    ...          Span(0, 2, 0.15, 4)]                 # the last: both layers as one group, 4 in all
    >>> choose_spans(spans, 2, budget=5)
    [4]
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from fractions import Fraction

import numpy as np

from headwidget.errors import BudgetError

__all__ = [
    "BYTE_GRID",
    "MAX_DENOMINATOR",
    "MAX_UNITS",
    "BudgetError",
    "Span",
    "cheapest",
    "cheapest_spans",
    "check_span_budget",
    "choose_per_layer",
    "choose_spans",
    "exact_bytes",
]

#: The most budget units the dynamic programme holds per layer (beyond it the costs are read on the
#: grid of :data:`BYTE_GRID`).
MAX_UNITS = 2**24
#: The largest denominator :func:`exact_bytes` reads a cost with.
MAX_DENOMINATOR = 2**16
#: Costs too fine for :data:`MAX_UNITS` exact units are read rounded up to multiples of 1/BYTE_GRID byte.
BYTE_GRID = 8
#: How near a float must be to the fraction :func:`exact_bytes` reads it as, relative to its size.
_NEAR = 1e-12


def exact_bytes(value: float) -> Fraction:
    """The fraction ``value`` stands for: the simplest with a denominator up to :data:`MAX_DENOMINATOR`
    within a relative 1e-12 of it (float arithmetic leaves a ratio of whole numbers a few units in the
    last place off), else its exact binary value.

    >>> exact_bytes(116 / 3), exact_bytes(3 * (116 / 3)), exact_bytes(0.1), exact_bytes(2.0**-30)
    (Fraction(116, 3), Fraction(116, 1), Fraction(1, 10), Fraction(1, 1073741824))
    """
    binary = Fraction(value)
    near = binary.limit_denominator(MAX_DENOMINATOR)
    return near if abs(near - binary) <= abs(binary) * _NEAR else binary


def cheapest(cost: Sequence[Sequence[float]]) -> float:
    """The least total cost any choice has: the cheapest option of every layer.

    >>> cheapest([[4, 2], [3, 1]])
    3
    """
    return sum(min(row) for row in cost)


def check_budget(cost: Sequence[Sequence[float]], budget: float) -> None:
    """Refuse a budget below :func:`cheapest` (:class:`BudgetError` saying the least possible), both
    read by :func:`exact_bytes`.

    >>> check_budget([[4, 2], [3, 1]], 2.5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.BudgetError: a budget of 2.5 bytes per token is below the cheapest choice, 3 ...
    >>> import math
    >>> check_budget([[math.nextafter(116 / 3, 117)]] * 3, 116)  # (each a unit in the last place over)
    """
    _refuse_below(budget, sum((exact_bytes(min(row)) for row in cost), Fraction(0)), "layer")


def _refuse_below(budget: float, least: Fraction, where: str) -> None:
    if exact_bytes(budget) < least:
        raise BudgetError(
            f"a budget of {budget:g} bytes per token is below the cheapest choice, {float(least):g} (the "
            f"cheapest candidate at every {where}); raise the budget or add a cheaper candidate"
        )


def _units(
    cost: Sequence[Sequence[float]], budget: float, dearest: Callable[[list[list[int]]], int]
) -> tuple[list[list[int]], int]:
    """The costs in whole units of their common step, and the budget's units (at most ``dearest`` of
    the units: what the dearest choice spends): exact (:func:`exact_bytes`) where that takes at most
    :data:`MAX_UNITS` units, else on the grid of :data:`BYTE_GRID` (costs rounded up, the budget down)."""
    exact = [[exact_bytes(w) for w in row] for row in cost]
    limit = exact_bytes(budget)
    for grid in (None, BYTE_GRID):
        if grid is not None:
            exact = [[Fraction(math.ceil(w * grid), grid) for w in row] for row in exact]
            limit = Fraction(math.floor(limit * grid), grid)
        scale = math.lcm(*(w.denominator for row in exact for w in row), limit.denominator)
        whole = [[int(w * scale) for w in row] for row in exact]
        step = math.gcd(*(w for row in whole for w in row)) or 1
        units = [[w // step for w in row] for row in whole]
        top = min(int(limit * scale // step), dearest(units))
        if top <= MAX_UNITS:
            return units, top
    raise BudgetError(
        f"this budget spans {top} units of {step}/{BYTE_GRID} byte, more than the {MAX_UNITS} the solver "
        "holds; use candidates whose bytes per token share a coarser step"
    )


def _unreached(budget: float) -> BudgetError:
    """The error of a budget that reaches no choice once the costs are read on the grid."""
    return BudgetError(
        f"a budget of {budget:g} bytes per token reaches no choice once the costs are read rounded up to "
        f"a multiple of 1/{BYTE_GRID} byte (their common step is too fine to be read exactly at this "
        "budget); raise the budget by 1/{BYTE_GRID} byte per layer"
    )


def choose_per_layer(
    damage: Sequence[Sequence[float]], cost: Sequence[Sequence[float]], budget: float
) -> list[int]:
    """The option per layer with the least summed damage whose summed cost is at most ``budget``
    (see the module docstring).

    Raises:
        BudgetError: ``budget`` below :func:`cheapest` (the message says the least possible), a negative
            or non-finite cost or damage, a budget of more than :data:`MAX_UNITS` units even on the grid
            of :data:`BYTE_GRID`, or one that reaches no choice on that grid.
    """
    if len(damage) != len(cost) or any(len(d) != len(w) for d, w in zip(damage, cost, strict=True)):
        raise ValueError("damage and cost must have one row per layer and one entry per option")
    values = [float(x) for row in (*damage, *cost) for x in row]
    if not all(math.isfinite(x) for x in values) or any(w < 0 for row in cost for w in row):
        raise BudgetError("every damage must be finite and every cost finite and ≥ 0")
    check_budget(cost, budget)
    # (spending more than everything at its dearest is moot)
    units, top = _units(cost, budget, lambda units: sum(max(row) for row in units))
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
    if not np.isfinite(best).any():
        raise _unreached(budget)
    spend = int(np.argmin(best))  # the least damage; argmin takes the lowest spend among equals
    choice = []
    for layer in range(len(damage) - 1, -1, -1):
        option = int(picks[layer][spend])
        choice.append(option)
        spend -= units[layer][option]
    return choice[::-1]


@dataclass(frozen=True)
class Span:
    """One option of :func:`choose_spans`: layers ``start .. start + length − 1`` taken together, at a
    ``damage`` and a ``cost`` (bytes per token)."""

    start: int
    length: int
    damage: float
    cost: float

    @property
    def stop(self) -> int:
        """The first layer after the span."""
        return self.start + self.length


def _check_spans(spans: Sequence[Span], num_layers: int) -> None:
    for span in spans:
        if span.length < 1 or span.start < 0 or span.stop > num_layers:
            raise ValueError(f"{span} is not a run of layers within 0..{num_layers - 1}")
    values = [float(x) for span in spans for x in (span.damage, span.cost)]
    if not all(math.isfinite(x) for x in values) or any(span.cost < 0 for span in spans):
        raise BudgetError("every damage must be finite and every cost finite and ≥ 0")


def _least_cover(spans: Sequence[Span], num_layers: int, worst: bool = False) -> Fraction | None:
    """The least (``worst``: the greatest) exact total cost of spans covering every layer once; None when
    no choice of spans covers them."""
    reach: list[Fraction | None] = [Fraction(0)] + [None] * num_layers
    for p in range(num_layers):
        here = reach[p]
        if here is None:
            continue
        for span in spans:
            if span.start == p:
                total = here + exact_bytes(span.cost)
                there = reach[span.stop]
                if there is None or (total > there if worst else total < there):
                    reach[span.stop] = total
    return reach[num_layers]


def cheapest_spans(spans: Sequence[Span], num_layers: int) -> float:
    """The least total cost of spans covering each of ``num_layers`` layers once.

    >>> cheapest_spans([Span(0, 1, 0.0, 4), Span(1, 1, 0.0, 3), Span(0, 2, 0.0, 5)], 2)
    5.0

    Raises:
        ValueError: no choice of ``spans`` covers every layer (the message names the first one missed).
    """
    return float(_cheapest_cover(spans, num_layers))


def _cheapest_cover(spans: Sequence[Span], num_layers: int) -> Fraction:
    _check_spans(spans, num_layers)
    least = _least_cover(spans, num_layers)
    if least is None:
        covered = {layer for span in spans for layer in range(span.start, span.stop)}
        missed = next((x for x in range(num_layers) if x not in covered), num_layers - 1)
        raise ValueError(f"no choice of spans covers every layer once (look at layer {missed})")
    return least


def check_span_budget(spans: Sequence[Span], num_layers: int, budget: float) -> None:
    """Refuse a budget below :func:`cheapest_spans` (:class:`BudgetError` saying the least possible),
    both read by :func:`exact_bytes`.

    >>> check_span_budget([Span(0, 1, 0.0, 4), Span(1, 1, 0.0, 3), Span(0, 2, 0.0, 5)], 2, 4.5)
    Traceback (most recent call last):
    ...
    headwidget.errors.BudgetError: a budget of 4.5 bytes per token is below the cheapest choice, 5 (the \
cheapest candidate at every layer or group); raise the budget or add a cheaper candidate

    Raises:
        ValueError: no choice of ``spans`` covers every layer.
    """
    _refuse_below(budget, _cheapest_cover(spans, num_layers), "layer or group")


def choose_spans(spans: Sequence[Span], num_layers: int, budget: float) -> list[int]:
    """The indices, in layer order, of the spans that cover each of ``num_layers`` layers exactly once with
    the least summed damage whose summed cost is at most ``budget`` (see the module docstring; costs are
    read as :func:`choose_per_layer` reads them).

    Raises:
        BudgetError: ``budget`` below :func:`cheapest_spans` (the message says the least possible), a
            negative or non-finite cost or damage, a budget of more than :data:`MAX_UNITS` units even on
            the grid of :data:`BYTE_GRID`, or one that reaches no choice on that grid.
        ValueError: a span outside the layers, or no choice of spans that covers every layer.
    """
    check_span_budget(spans, num_layers, budget)

    def dearest(units: list[list[int]]) -> int:  # (spending more than the dearest cover is moot)
        covers = [Span(x.start, x.length, 0.0, w) for x, w in zip(spans, units[0], strict=True)]
        return int(_least_cover(covers, num_layers, True) or 0)

    units, top = _units([[span.cost for span in spans]], budget, dearest)
    cost = units[0]
    best = np.full((num_layers + 1, top + 1), np.inf)
    best[0, 0] = 0.0
    pick = np.full((num_layers + 1, top + 1), -1, dtype=np.int32)
    order = sorted(range(len(spans)), key=lambda i: spans[i].start)  # stable: given order within a start
    for i in order:
        span, w = spans[i], cost[i]
        if w > top:
            continue
        reached = best[span.start, : top + 1 - w] + float(span.damage)
        there = best[span.stop, w:]
        better = reached < there  # strict: the span processed first keeps a tie
        there[better] = reached[better]
        pick[span.stop, w:][better] = i
    if not np.isfinite(best[num_layers]).any():
        raise _unreached(budget)
    spend = int(np.argmin(best[num_layers]))  # the least damage; argmin takes the lowest spend among equals
    chosen = []
    position = num_layers
    while position > 0:
        i = int(pick[position, spend])
        chosen.append(i)
        spend -= cost[i]
        position = spans[i].start
    return chosen[::-1]
