"""``allocate(model, texts, budget=...)``: a mixed spec that spends a K/V byte budget where it hurts least.

Method:

1. **Sweep.** Every candidate is fitted once, for every layer (from ``stats``), and the per-layer sweep
   (:func:`~headwidget.evaluation._sweep.layer_sweep`, which replays the original model's hidden states
   entering each layer) gives each **cell** its damage on ``texts`` with only that cell changed: mean
   KL(model ‖ variant) per predicted token (``objective="kl"``) or ΔNLL (``objective="nll"``). A cell
   of a per-layer candidate is one layer; a cell of a cross-layer candidate (``share:g``, ``mqa+share:2``,
   and under ``prefill:P`` ``merge:2`` and ``xkv:r/g``) is one group of its ``g`` adjacent layers,
   starting at any layer where ``g`` layers remain (the groups overlap: ``share:2`` has cells 0-1, 1-2,
   ...). ``model`` costs nothing. Each cell also has its K/V bytes per token
   (:class:`~headwidget.evaluation._plan.VariantPlan`: a ``share`` reader's are 0, a merge's count the
   retention its sweep saw, an xKV basis is spread over the P prefill tokens).
2. **Solve.** The least summed damage whose summed bytes are within the budget, exactly: with per-layer
   candidates only, the multiple-choice knapsack (:func:`~headwidget.analysis.allocation.choose_per_layer`,
   one candidate per layer); with cross-layer ones, the cells that cover every layer once
   (:func:`~headwidget.analysis.allocation.choose_spans`): a dynamic programme over layer positions whose
   state is the first layer not yet covered and the bytes spent — a per-layer cell moves it on by one
   layer, a group by ``g``, so a group's readers never need a state of their own. Bytes are read as the
   fractions they stand for (an xKV basis spread over P tokens: r·C/P); where their common step is too fine
   (a merge's count the share of tokens it retained), on a grid of 1/8 byte, rounded up
   (:mod:`headwidget.analysis.allocation`). The sum is a prediction: damage is not additive, so the chosen
   mixed spec is then **measured** whole on ``texts`` (one evaluation), and so is every uniform candidate
   within the budget (a cross-layer one in groups from layer 0, a layer left over under its within-layer
   conversion when that is a candidate; xKV's as its own spec does, the layers left over a shorter group,
   which is also a cell of the sweep): one that measures better becomes the allocation (a round of its own
   in ``rounds``), so on ``texts`` an allocation is never worse than the best uniform candidate it could
   have been. A measured allocation whose bytes exceed the budget (a merge that retained more states than
   in its sweep) is solved again with the budget lowered by the excess, up to 4 times.
3. **Refine** (``refine`` rounds). With the current allocation applied elsewhere, every cell is
   measured again, each as the whole model with that cell swapped in, against the original, in one
   sweep around the allocation (:func:`~headwidget.evaluation._sweep.swap_sweep`: the allocation's
   hidden states entering the first changed layer are replayed). A cell that cuts into a group of the
   allocation breaks it: the group's other layers keep its within-layer conversion
   (:func:`~headwidget.analysis.cross_layer.within_layer`; ``model`` for ``share:2``) and the swap
   starts at the group's first layer. Their damages, less the current allocation's, are the new costs;
   the solver runs again and the new spec is measured. The better measured spec is kept. ``rounds``
   records each round's predicted and measured damage and its spec, so the non-additivity is visible.

Choosing never sees the evaluation text: :attr:`Allocation.fingerprint` is the fingerprint of the
tokens it chose on, and :func:`~headwidget.evaluation.evaluate` flags an allocated spec measured on
those tokens, however the spec is written, whatever protocol cut the tokens, however often they repeat
and whatever other text is beside them (runs of 32 tokens shared with the chosen-on text:
:mod:`headwidget.evaluation._chosen`).

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=64, intermediate_size=64,
    ...     num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> ids = torch.randint(0, 64, (4, 24), generator=torch.Generator().manual_seed(0))
    >>> alloc = allocate(model, ids, budget=0.5, candidates=["model", "mqa", "kv:int4"], refine=0,
    ...                  dtype=torch.float32, progress=False)
    >>> alloc.model_bytes, alloc.budget, alloc.kv_bytes_per_token <= alloc.budget
    (768.0, 384.0, True)
    >>> len(alloc.choice), alloc.rounds[0].spec == alloc.spec
    (3, True)
    >>> frontier = allocate_frontier(model, ids, budgets=[0.25, 0.5], candidates=["model", "mqa", "kv:int4"],
    ...                              refine=0, dtype=torch.float32, progress=False)
    >>> [a.kv_bytes_per_token <= a.budget for a in frontier], frontier[1].spec == alloc.spec
    ([True, True], True)
    >>> grouped = allocate(model, ids, budget=0.4, candidates=["model", "mqa", "mqa+share:2"], refine=0,
    ...                    dtype=torch.float32, progress=False)  # 307.2 bytes: 3 × mqa (384) is too dear
    >>> grouped.kv_bytes_per_token, sorted(n for _, n, _ in grouped.cells)  # one MQA + CLA pair, one MQA
    (256, [1, 2])
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, NamedTuple, TypeVar

import torch
from torch import nn

from headwidget.adapters import Adapter, adapter_for
from headwidget.analysis.allocation import (
    Span,
    cheapest_spans,
    check_span_budget,
    choose_per_layer,
    choose_spans,
    exact_bytes,
)
from headwidget.analysis.cross_layer import within_layer
from headwidget.analysis.variant_fits import LayerFit
from headwidget.analysis.variants import MixedSpec, VariantSpec, layer_ranges, parse_variant
from headwidget.capture.inputs import Batch
from headwidget.capture.memory import refuse_host_over_budget, refuse_over_budget
from headwidget.checks import flag, model_with_weights, number, optional_whole_number, whole_number
from headwidget.errors import ArgumentError
from headwidget.evaluation import running
from headwidget.evaluation._apply import KeptFits, fit_parts
from headwidget.evaluation._arguments import check_evaluate_arguments, check_token_ids
from headwidget.evaluation._chosen import per_layer_specs, remember, token_pieces
from headwidget.evaluation._cross_layer import cross_layer_parts, refuse_cache_transforms
from headwidget.evaluation._distributed import Ranks
from headwidget.evaluation._inputs import fingerprint, parse_protocol, predicted_count
from headwidget.evaluation._memory import HOST_ADVICE, conversion_sizes, estimated_part
from headwidget.evaluation._model_facts import check_stats, output_vocab
from headwidget.evaluation._outputs import OutputRunner
from headwidget.evaluation._plan import GroupCell, VariantPlan, plan_variant
from headwidget.evaluation._quantize import KVQuantizer
from headwidget.evaluation._report import bytes_text
from headwidget.evaluation._sweep import RECORD_BUDGET, layer_sweep, swap_sweep
from headwidget.evaluation.measures import PredictionTotals, measure_work_bytes, predicted_positions
from headwidget.stats import KVStats

__all__ = [
    "DEFAULT_CANDIDATES",
    "Allocation",
    "AllocationMemory",
    "AllocationRound",
    "allocate",
    "allocate_frontier",
    "estimate_allocation",
]

#: The candidates of :func:`allocate` when none are given.
DEFAULT_CANDIDATES = ("model", "gqa:1", "mqa+align", "lrkv:8", "mla:64", "mla:128", "kv:int4", "kv:int2")
OBJECTIVES = ("kl", "nll")
K = TypeVar("K")


@dataclass(frozen=True)
class AllocationRound:
    """One round: the spec solved for, its predicted damage (the sum of per-layer damages) and the
    damage measured with the whole spec applied."""

    spec: str
    predicted: float
    measured: float
    kv_bytes_per_token: float


@dataclass
class Allocation:
    """What :func:`allocate` chose (see the module docstring).

    ``choice``: per layer, the candidate it is under (a cross-layer candidate for every layer of its
    group); ``cells``: the chosen (first layer, layers, candidate) in layer order (a per-layer candidate
    on one layer, a cross-layer one on its group). ``damage`` and ``layer_bytes``: per candidate and
    layer, the sweep's damage and the bytes per token of the candidate's cell that starts at that layer
    (the layer; a cross-layer candidate's group of ``g`` from there, NaN where no group starts).
    """

    spec: str
    choice: list[str]
    kv_bytes_per_token: float
    budget: float
    model_bytes: float
    objective: str
    candidates: list[str]
    damage: dict[str, list[float]] = field(repr=False)
    layer_bytes: dict[str, list[float]] = field(repr=False)
    rounds: list[AllocationRound] = field(default_factory=list)
    fingerprint: str = ""
    tokens: int = 0
    cells: list[tuple[int, int, str]] = field(default_factory=list)

    def table(self) -> str:
        """A Markdown table of the rounds and the chosen spec per layer."""
        title = (
            f"allocation within {bytes_text(self.budget)} of {bytes_text(self.model_bytes)} K/V bytes per "
            f"token ({self.objective}, chosen on {self.tokens} tokens)"
        )
        lines = [title, "", "| round | predicted | measured | bytes/token | spec |", "|---|---|---|---|---|"]
        for i, r in enumerate(self.rounds):
            lines.append(
                f"| {i} | {r.predicted:.4f} | {r.measured:.4f} | {bytes_text(r.kv_bytes_per_token)} | "
                f"`{r.spec}` |"
            )
        lines += ["", "| layers | chosen |", "|---|---|"]
        cells = self.cells or [(layer, 1, c) for layer, c in enumerate(self.choice)]
        lines += [f"| {layer_ranges(range(a, a + n))} | {c} |" for a, n, c in cells]
        return "\n".join(lines)


def _budget_bytes(budget: Any, model_bytes: float) -> float:
    """A budget in bytes per token: an integer (numpy's too) is bytes, any other real a fraction."""
    hint = "a fraction of the model's K/V bytes as a float in (0, 1], or bytes per token as an int"
    budget = number("budget", budget, hint=hint)
    if isinstance(budget, float):
        if not 0 < budget <= 1:
            raise ArgumentError(
                f"a float budget is a fraction of the model's {model_bytes:g} K/V bytes per token, in "
                f"(0, 1]; got {budget!r} (give bytes per token as an int)"
            )
        return budget * model_bytes
    if budget < 1:
        raise ArgumentError(f"a budget in bytes per token must be ≥ 1, got {budget}")
    return float(budget)


def _check_candidates(candidates: Any) -> list[str]:
    if isinstance(candidates, str) or not isinstance(candidates, Sequence) or not candidates:
        raise ArgumentError(
            f"candidates must be a non-empty list of variant specs such as ['model', 'mqa', 'kv:int4'], got "
            f"{candidates!r}"
        )
    out = []
    for spec in candidates:
        parsed = parse_variant(spec)
        if isinstance(parsed, MixedSpec):
            raise ArgumentError(
                f"candidate {parsed.text!r} is a mixed spec; candidates are uniform specs, and allocate "
                "mixes them per layer"
            )
        out.append(parsed.text)
    return list(dict.fromkeys(out))


class _Cell(NamedTuple):
    """One span of a choice: ``length`` adjacent layers from ``start`` under ``spec`` (a per-layer spec
    on one layer, or a cross-layer spec on one group of its ``g`` layers)."""

    start: int
    length: int
    spec: str

    @property
    def stop(self) -> int:
        return self.start + self.length


#: A choice: cells covering every layer once, in layer order.
Choice = tuple[_Cell, ...]


def _per_layer(choice: Choice) -> list[str]:
    """The spec of the cell each layer is in."""
    return [cell.spec for cell in choice for _ in range(cell.length)]


@dataclass
class _Candidates:
    """Every candidate fitted once for every layer: per spec, its fits and quantizers (a cross-layer
    candidate's fits are those of its within-layer conversion, kept under that conversion's spec too);
    per cross-layer candidate, its group size and its within-layer spec; ``short_end``: the cross-layer
    candidates that act on a shorter last group too (xKV's, whose layer left over is compressed alone)."""

    adapter: Adapter
    specs: list[str]
    elements: dict[int, int]
    fits: dict[str, dict[int, LayerFit]] = field(default_factory=dict)
    quantizers: dict[str, list[KVQuantizer]] = field(default_factory=dict)
    group: dict[str, int] = field(default_factory=dict)
    within: dict[str, str] = field(default_factory=dict)
    short_end: set[str] = field(default_factory=set)

    @property
    def num_layers(self) -> int:
        return len(self.elements)

    def options(self) -> list[_Cell]:
        """Every cell a choice can hold: each per-layer candidate at each layer, each cross-layer
        candidate's group at each layer where it fits (and, for one in ``short_end``, the shorter group
        of the layers left at the end, as its uniform spec leaves them); by first layer, then in the
        candidates' order."""
        out, n = [], self.num_layers
        for start in range(n):
            for spec in self.specs:
                length = self.group.get(spec, 1)
                if start + length <= n:
                    out.append(_Cell(start, length, spec))
                elif spec in self.short_end and start == n - n % length:
                    out.append(_Cell(start, n - start, spec))
        return out

    def plan(self, cells: Sequence[_Cell]) -> VariantPlan:
        """The plan of ``cells`` (the other layers left as they are), composed from the fits: the same
        plan :func:`~headwidget.evaluation._plan.plan_variant` makes of its spec, with no fit made again."""
        layers_of: dict[str, list[int]] = {}
        for cell in cells:
            layers_of.setdefault(cell.spec, []).extend(range(cell.start, cell.stop))
        ordered = sorted(layers_of.items(), key=lambda item: min(item[1]))
        parsed = parse_variant(";".join(f"{spec}@{layer_ranges(ls)}" for spec, ls in ordered))
        fits: dict[int, LayerFit] = {}
        quantizers = []
        for spec, ls in layers_of.items():
            fits.update({layer: self.fits[spec][layer] for layer in ls if layer in self.fits.get(spec, {})})
            for q in self.quantizers.get(spec, []):
                quantizers.append(replace(q, layers=[x for x in q.layers if x in ls]))
        cross = cross_layer_parts(self.adapter, parsed, range(self.num_layers), fits)  # readers: 0 bytes
        return VariantPlan(parsed.text, fits, [q for q in quantizers if q.layers], self.elements, cross)

    def group_cell(self, cell: _Cell) -> tuple[GroupCell, VariantPlan]:
        """The sweep's cell of one cross-layer group alone, and its plan (which shares its merge, so that
        the plan's bytes count the retention the sweep saw)."""
        plan = self.plan([cell])
        layers = list(range(cell.start, cell.stop))
        fits = {layer: plan.fits[layer] for layer in layers if layer in plan.fits}
        return GroupCell(layers, fits, list(plan.cross.sharing), list(plan.cross.caches)), plan

    def uniform(self, spec: str) -> Choice | None:
        """A candidate on every layer as a choice (a cross-layer candidate's groups from layer 0, the last
        layers left over in a shorter group of their own for one in ``short_end``, else under its
        within-layer conversion when that is a candidate; else None)."""
        g = self.group.get(spec, 1)
        whole = self.num_layers - self.num_layers % g
        cells = [_Cell(start, g, spec) for start in range(0, whole, g)]
        if whole < self.num_layers and spec in self.short_end:
            return (*cells, _Cell(whole, self.num_layers - whole, spec))
        rest = self.within.get(spec, spec)
        if whole < self.num_layers and rest not in self.specs:
            return None
        return tuple(cells + [_Cell(layer, 1, rest) for layer in range(whole, self.num_layers)])

    def swapped(self, choice: Choice, cell: _Cell) -> tuple[Choice, int]:
        """``choice`` with ``cell`` in place of what covered its layers, and the first layer that differs.
        A group that ``cell`` cuts into keeps its other layers under its within-layer conversion, and
        differs from its first layer on."""
        out = [cell]
        first = cell.start
        for old in choice:
            if old.stop <= cell.start or old.start >= cell.stop:
                out.append(old)
            elif old.start < cell.start or old.stop > cell.stop:
                first = min(first, old.start)
                spare = [x for x in range(old.start, old.stop) if not cell.start <= x < cell.stop]
                out += [_Cell(x, 1, self.within[old.spec]) for x in spare]
        return tuple(sorted(out)), first


def _fit_candidates(
    adapter: Adapter,
    specs: list[str],
    stats: KVStats | None,
    layers: list[int],
    weight_dtype: torch.dtype,
    elements: dict[int, int],
) -> tuple[_Candidates, dict[str, VariantPlan]]:
    """:class:`_Candidates`, and the plans of the per-layer candidates (for the sweep's cells)."""
    found = _Candidates(adapter, specs, elements)
    plans = {}
    kept: KeptFits = {}  # a cross-layer candidate's within-layer fits are a per-layer candidate's
    for spec in specs:
        parsed = parse_variant(spec)
        assert isinstance(parsed, VariantSpec)
        if parsed.cross is None:
            if spec != "model":
                plans[spec] = plan_variant(
                    adapter, parsed, stats, layers, weight_dtype=weight_dtype, kept=kept
                )
                found.fits[spec], found.quantizers[spec] = plans[spec].fits, plans[spec].quantizers
            continue
        if parsed.cross.group > len(layers):
            raise ArgumentError(
                f"candidate {spec!r} acts on groups of {parsed.cross.group} adjacent layers, and the model "
                f"has {len(layers)}; give a group size of at most {len(layers)}"
            )
        found.group[spec] = parsed.cross.group
        found.within[spec] = within_layer(parsed)
        if parsed.cross.smallest_group < parsed.cross.group:
            found.short_end.add(spec)
        found.fits[spec], _ = fit_parts(adapter, parsed, stats, layers, weight_dtype=weight_dtype, kept=kept)
        if found.within[spec] != "model":  # what a layer of a broken group keeps
            found.fits.setdefault(found.within[spec], found.fits[spec])
    return found, plans


class _Scorer:
    """Whole-model damage of plans on fixed batches against the original's outputs."""

    def __init__(
        self,
        base: nn.Module,
        batches: list[Batch],
        runner: OutputRunner,
        objective: str,
        tick: running.Progress,
        ranks: Ranks,
    ):
        self.base, self.batches, self.runner, self.objective = base, batches, runner, objective
        self.tick, self.ranks = tick, ranks
        totals, kept = running.reference_pass(base, batches, runner, ranks, tick=tick)
        assert isinstance(totals, PredictionTotals) and kept is not None
        self.reference = kept
        self.model_nll = totals.nll  # the original's own NLL, what a variant's is measured against

    def of(self, totals: PredictionTotals) -> float:
        """The objective from a plan's totals: its mean KL, or its NLL less the original's."""
        return totals.kl if self.objective == "kl" else totals.nll - self.model_nll

    def damage(self, plan: VariantPlan) -> float:
        """One plan, full forwards (a merge's retention counted over them, on every rank)."""
        self.tick.grow(len(self.batches))
        running.reset_retention([plan])
        with plan.running(self.base, prefill=running.prefilling(self.runner)) as variant:
            totals = running.measure(
                self.base, variant, self.batches, self.reference, self.runner, self.ranks, tick=self.tick
            )
        running.sum_retention([plan], self.ranks)
        assert isinstance(totals, PredictionTotals)
        return self.of(totals)

    def swapped(
        self, current: VariantPlan, swaps: dict[K, tuple[int, VariantPlan]]
    ) -> tuple[float, dict[K, float]]:
        """``current`` and plans that differ from it from their layer on (:func:`swap_sweep`)."""
        self.tick.grow(len(self.batches) * (1 + len(swaps)))
        whole, totals = swap_sweep(
            self.base,
            self.batches,
            self.reference,
            current,
            swaps,
            self.runner,
            tick=self.tick,
            ranks=self.ranks,
        )
        return self.of(whole), {key: self.of(t) for key, t in totals.items()}


#: Relative slack on a measured allocation's bytes against its budget (float sums of byte counts).
_BYTES_SLACK = 1e-12


@dataclass
class _Search:
    """Steps 2 and 3 of the module docstring for one budget, from the sweep's damage of every cell."""

    candidates: _Candidates
    damage: dict[_Cell, float]
    cost: dict[_Cell, float]
    scorer: _Scorer
    dtype: torch.dtype
    prefill: int | None

    @property
    def grouped(self) -> bool:
        """Whether any cell is a cross-layer candidate's group (the span solver then chooses)."""
        return any(cell.spec in self.candidates.group for cell in self.cost)

    def solve(self, costs: dict[_Cell, float], limit: float) -> tuple[Choice, float]:
        """The exact least-damage choice within ``limit`` bytes and its predicted (summed) damage: the
        per-layer knapsack when every cell is one layer, else the span solver."""
        options = self.candidates.options()
        if not self.grouped:
            specs, layers = self.candidates.specs, range(self.candidates.num_layers)
            picked = choose_per_layer(
                [[costs[_Cell(layer, 1, s)] for s in specs] for layer in layers],
                [[self.cost[_Cell(layer, 1, s)] for s in specs] for layer in layers],
                limit,
            )
            choice = tuple(_Cell(layer, 1, specs[i]) for layer, i in enumerate(picked))
        else:
            spans = [Span(c.start, c.length, costs[c], self.cost[c]) for c in options]
            choice = tuple(options[i] for i in choose_spans(spans, self.candidates.num_layers, limit))
        return choice, math.fsum(costs[cell] for cell in choice)

    def measured(self, choice: Choice, predicted: float) -> AllocationRound:
        plan = self.candidates.plan(choice)
        damage = self.scorer.damage(plan)
        return AllocationRound(
            plan.spec, predicted, damage, plan.kv_bytes_per_token(self.dtype, self.prefill)
        )

    def within(self, limit: float, refine: int) -> tuple[AllocationRound, Choice, list[AllocationRound]]:
        """The best measured round within ``limit`` bytes, its choice, and every round."""
        tried: list[tuple[AllocationRound, Choice]] = []

        def fits(r: AllocationRound) -> bool:
            return r.kv_bytes_per_token <= limit * (1 + _BYTES_SLACK)

        least = cheapest_spans(
            [Span(c.start, c.length, 0.0, self.cost[c]) for c in self.cost], self.candidates.num_layers
        )
        lowered = limit
        for _ in range(_RESOLVES):  # a merge may retain more than in its sweep: solved again below the budget
            choice, predicted = self.solve(self.damage, lowered)
            tried.append((self.measured(choice, predicted), choice))
            excess = tried[-1][0].kv_bytes_per_token - limit
            if fits(tried[-1][0]) or lowered - excess < least:
                break
            lowered -= excess
        best = next(((r, c) for r, c in tried if fits(r)), None)
        for spec in self.candidates.specs:  # a uniform candidate within the budget that measures better
            uniform = self.candidates.uniform(spec)
            if uniform is None or any(uniform == c for _, c in tried):
                continue
            if exact_bytes(math.fsum(self.cost[cell] for cell in uniform)) > exact_bytes(limit):
                continue
            candidate = self.measured(uniform, math.fsum(self.damage[cell] for cell in uniform))
            if fits(candidate) and (best is None or candidate.measured < best[0].measured):
                best = candidate, uniform
                tried.append(best)
        if best is None:  # every measured choice over the budget (merges): the one over it least
            best = min(tried, key=lambda rc: rc[0].kv_bytes_per_token)
            refine = 0
        for _ in range(refine):
            current_choice = best[1]
            options = self.candidates.options()
            swaps = {}
            for cell in options:
                if cell not in current_choice:
                    swapped, first = self.candidates.swapped(current_choice, cell)
                    swaps[cell] = (first, self.candidates.plan(swapped))
            current, swept = self.scorer.swapped(self.candidates.plan(current_choice), swaps)
            costs = {cell: swept[cell] - current if cell in swept else 0.0 for cell in options}
            choice, predicted = self.solve(costs, limit)
            if choice == current_choice:  # no better spec found: another round would solve the same costs
                tried.append((replace(best[0], predicted=current + predicted, measured=current), choice))
                break
            tried.append((self.measured(choice, current + predicted), choice))
            if not (fits(tried[-1][0]) and tried[-1][0].measured < best[0].measured):
                break
            best = tried[-1]
        return best[0], best[1], [r for r, _ in tried]


#: Solves of one budget when a measured allocation's bytes exceed it (a merge retaining more than in the
#: sweep): each solves again with the budget lowered by the excess.
_RESOLVES = 4


@dataclass(frozen=True)
class AllocationMemory:
    """The parts (bytes) of an allocation's peak on the model's device (for a model on another device than
    the CPU, ``fits`` and the fitting are the host's: ``host``, as for
    :class:`~headwidget.evaluation._memory.EvaluationMemory`):

    - ``copy``: the working copy in ``dtype``, when the model is held in another;
    - ``fits``: every conversion candidate's fitted attention weights, for every layer, in ``dtype``, in
      the candidate's own shape (:func:`~headwidget.evaluation._memory.conversion_sizes`);
    - ``work``: the largest of the fitting (one candidate's float64 fits of every layer, or of all but one
      and the work of fitting that one: its attention weights read in float64, its keys and values
      repeated per query head and their group means), the sweep (the recorded layer outputs of one chunk
      of batches, at most :data:`~headwidget.evaluation._sweep.RECORD_BUDGET` bytes but always one
      batch's, and the original's predicted-row logits of those batches) and the search (the original's
      predicted-row logits of every batch, kept while the allocations are measured and refined, and the
      recorded layer outputs of one chunk, and the converted attention of the plan measured, each layer
      as large as a candidate makes it, beside the sweep's last cell, which may still await the cycle
      collector), each with one forward of a variant (its working memory, its
      whole logits and the rows picked from them, or its logits and the measures' work on one chunk:
      :func:`~headwidget.evaluation.measures.measure_work_bytes`).

    Example:
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
        >>> need = AllocationMemory.of(model, ["model", "mqa"], [(4, 16, 60)], dtype=torch.float32)
        >>> sorted(need.parts), need.total == sum(need.parts.values())
        (['copy', 'fits', 'work'], True)
    """

    parts: dict[str, int]
    device: torch.device
    host: dict[str, int] = field(default_factory=dict)

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @classmethod
    def of(
        cls,
        model: nn.Module,
        specs: Sequence[str],
        shapes: Sequence[tuple[int, int, int]],
        *,
        dtype: torch.dtype,
        record_budget: int = RECORD_BUDGET,
        adapter: Adapter | None = None,
    ) -> AllocationMemory:
        """``shapes``: per batch (rows, length, predicted tokens); ``adapter``: ``model``'s, when known."""
        adapter = adapter or adapter_for(model)
        lay = adapter.layout()
        b = dtype.itemsize
        own = next((p.dtype for p in model.parameters() if p.is_floating_point()), dtype)
        numel = sum(t.numel() for t in {id(t): t for t in (*model.parameters(), *model.buffers())}.values())
        copy = 0 if own == dtype else numel * b
        attention = {
            id(t): t for layer in range(lay.num_layers) for t in adapter.attention_at(layer).parameters()
        }
        conversions = conversion_sizes(adapter, [parse_variant(s) for s in specs], range(lay.num_layers))
        weights = sum(t.numel() for t in attention.values())
        fits = sum(sum(c.fitted) for c in conversions) * b
        # one candidate's float64 fits of every layer (or of all but one and the work of fitting that one),
        # beside the other candidates' fits in dtype
        fitting = max((c.fitting_bytes(b) for c in conversions), default=0)
        # a plan's converted attention: per layer, the largest a candidate makes it
        widest = [max(deltas) for deltas in zip(*(c.delta for c in conversions), strict=True)]
        converted = (weights + sum(widest)) * b if conversions else 0
        vocab = output_vocab(model)
        impl = str(getattr(getattr(model, "config", None), "_attn_implementation", None) or "eager")
        kept = [predicted * vocab * b for _, _, predicted in shapes]
        forward = 0
        for rows, length, predicted in shapes:
            logits = predicted * vocab * b  # the head computes the predicted rows alone
            measures = measure_work_bytes(predicted, vocab, b)
            padded = predicted < rows * (length - 1)
            work = running.forward_working_bytes(
                model, rows, length, b, scores=impl == "eager" or padded, adapter=adapter
            )
            forward = max(forward, work + 2 * logits, predicted * vocab * b + measures)
        recorded = [rows * length * lay.hidden_size * lay.num_layers * b for rows, length, _ in shapes]
        chunks: list[list[int]] = [[]]  # the batches of each chunk, as the sweeps form them
        used = 0
        for i, size in enumerate(recorded):
            if chunks[-1] and used + size > record_budget:
                chunks.append([])
                used = 0
            chunks[-1].append(i)
            used += size
        # a sweep's cell holds one layer's converted attention, a measured plan (search) every layer's, and
        # the sweep's last cell can still be alive then (a module copy is freed by the cycle collector)
        cell = converted // lay.num_layers
        sweep = max(sum(recorded[i] + kept[i] for i in c) for c in chunks) + forward + cell
        search = sum(kept) + max(sum(recorded[i] for i in c) for c in chunks) + forward + converted + cell
        device = next(model.parameters()).device
        if device.type != "cpu":  # the fits are the host's
            return cls({"copy": copy, "work": max(sweep, search)}, device, {"fits": fits, "fitting": fitting})
        return cls({"copy": copy, "fits": fits, "work": max(sweep, search, fitting)}, device)


def _shapes(batches: Sequence[Batch]) -> list[tuple[int, int, int]]:
    """(rows, length, predicted tokens) of each batch."""
    return [(*b.input_ids.shape, int(predicted_positions(b.attention_mask, b.scored).sum())) for b in batches]


def check_allocation_budget(need: AllocationMemory, max_memory: int | None) -> None:
    """Refuse ``need`` over ``max_memory`` (default: the device's default budget) with
    :class:`MemoryBudgetError`, naming what to change; and its host parts over the host's budget."""
    refuse_host_over_budget("allocate", need.host, HOST_ADVICE)
    refuse_over_budget(
        "allocate",
        need.total,
        need.device,
        max_memory,
        "Use a smaller batch_size or max_length (one forward's logits are batch_size × max_length × "
        "vocabulary), fewer max_tokens (the original's logits of every calibration token are kept while "
        "allocations are measured), fewer candidates, or raise max_memory= (bytes) if the memory is there.",
        need.parts,
    )


def estimate_allocation(
    model: nn.Module,
    texts: Any = None,
    *,
    candidates: Sequence[str] = DEFAULT_CANDIDATES,
    tokenizer: Any = None,
    dtype: torch.dtype | str = torch.bfloat16,
    batch_size: int = 8,
    max_length: int = 512,
    max_tokens: int | None = None,
    protocol: str = "documents",
    where: str = "device",
    **ignored: Any,
) -> int:
    """Peak bytes :func:`allocate` (or :func:`allocate_frontier`) with these arguments allocates on the
    model's device (:class:`AllocationMemory`: the bound it checks against ``max_memory``), or with
    ``where="host"`` in the host's memory (the fits of a model off the CPU, checked apart).

    Takes the call's arguments (``budget``, ``stats``, ``refine`` and the others the memory does not depend
    on are accepted and ignored). With ``texts`` the estimate reads their batches as the call would;
    without, ``max_tokens`` gives full batches of ``batch_size × max_length``.

    >>> import torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=8192, n_embd=32, n_layer=2, n_head=4))
    >>> small = estimate_allocation(gpt2, candidates=["model", "mqa"], dtype=torch.float32, max_tokens=1024,
    ...                             batch_size=2, max_length=128)
    >>> large = estimate_allocation(gpt2, candidates=["model", "mqa"], dtype=torch.float32, max_tokens=8192,
    ...                             batch_size=8, max_length=512)
    >>> large > 8192 * 8191 * 4 > small  # the original's logits of every calibration token
    True
    """
    adapter = adapter_for(model)
    specs = _check_candidates(candidates)
    _, _, _, _, dtype, batch_size, max_length, max_tokens, _ = check_evaluate_arguments(
        adapter, specs, None, None, False, dtype, batch_size, max_length, max_tokens, False
    )
    reading = parse_protocol(protocol)
    length = max_length if reading.window is None else reading.window
    if texts is not None:
        batches = running.protocol_batches(
            model,
            texts,
            tokenizer,
            reading,
            batch_size=batch_size,
            max_length=length,
            max_tokens=max_tokens,
            min_tokens=2,
        )
        shapes = _shapes(batches)
    elif max_tokens is not None:
        full, rest = divmod(max_tokens, batch_size * length)
        shapes = [(batch_size, length, batch_size * (length - 1))] * full
        if rest:
            rows = -(-rest // length)
            shapes.append((rows, length, rows * (length - 1)))
    else:
        raise ArgumentError(
            "estimate_allocation needs the calibration texts (as allocate takes them) or max_tokens, to know "
            "how many tokens' logits the allocation keeps"
        )
    need = AllocationMemory.of(model, specs, shapes, dtype=dtype)
    return estimated_part(need.total, need.host, where)


def allocate(model: nn.Module, texts: Any, *, budget: float | int, **options: Any) -> Allocation:
    """Choose a candidate per layer within ``budget`` K/V bytes per token (see the module docstring).

    Args:
        model: a supported causal language model.
        texts: calibration text, as :func:`~headwidget.evaluation.evaluate` takes it; never the text
            the allocation is then evaluated on.
        budget: a float in (0, 1]: a fraction of the model's own K/V bytes per token in ``dtype``; an
            int: bytes per token.
        options: ``candidates``, ``tokenizer``, ``stats``, ``objective``, ``refine``,
            ``allow_other_weights``, ``dtype``, ``batch_size``, ``max_length``, ``max_tokens``,
            ``protocol``, ``distributed``, ``max_memory``, ``progress``: see :func:`allocate_frontier`.
    """
    return allocate_frontier(model, texts, budgets=[budget], **options)[0]


def allocate_frontier(
    model: nn.Module,
    texts: Any,
    *,
    budgets: Sequence[float | int],
    candidates: Sequence[str] = DEFAULT_CANDIDATES,
    tokenizer: Any = None,
    stats: KVStats | None = None,
    objective: str = "kl",
    refine: int = 1,
    allow_other_weights: bool = False,
    dtype: torch.dtype | str = torch.bfloat16,
    batch_size: int = 8,
    max_length: int = 512,
    max_tokens: int | None = None,
    protocol: str = "documents",
    distributed: bool = False,
    max_memory: int | None = None,
    progress: bool = True,
) -> list[Allocation]:
    """One :class:`Allocation` per budget, all from one sweep of the candidates (module docstring).

    Args:
        model: a supported causal language model.
        texts: calibration text, as :func:`~headwidget.evaluation.evaluate` takes it; never the text
            the allocation is then evaluated on.
        budgets: each a float in (0, 1]: a fraction of the model's own K/V bytes per token in ``dtype``,
            or an int: bytes per token.
        candidates: uniform variant specs (``model`` included for "leave this layer as it is"), per-layer
            ones and cross-layer ones (``share:g``, ``mqa+share:2``; under ``prefill:P`` also ``merge:2``
            and ``xkv:r/g``), each chosen for whole groups of its ``g`` adjacent layers.
        stats: statistics of ``model`` for the candidates that need them (``+align``, data-aware
            LRKV/MLA, ``kv:cq``), as :func:`~headwidget.evaluation.evaluate` takes them.
        objective: ``"kl"`` (mean KL(model ‖ variant) per predicted token) or ``"nll"`` (ΔNLL).
        refine: refine rounds after the first solve (each: a sweep of every other cell — a candidate at a
            layer, or a cross-layer candidate's group — with the current allocation elsewhere).
        dtype, batch_size, max_length, max_tokens, protocol: as for :func:`~headwidget.evaluation.evaluate`
            (choose with the protocol you will evaluate with).
        distributed: share the sweeps and measures over the ranks of ``torch.distributed``, as
            :func:`~headwidget.evaluation.evaluate` does; every rank returns the same allocations.
        max_memory: bytes the allocation may allocate on the model's device (default: the device's
            default budget, :func:`~headwidget.capture.memory.default_budget`); the estimate
            (:class:`AllocationMemory`, :func:`estimate_allocation`) is checked before any fit or forward.
        progress: show a progress bar (in forwards; each measure and refine round adds to its total).

    Raises:
        BudgetError: a budget below the cheapest candidate at every layer or group (the message gives the
            least).
        ArgumentError: a budget or ``candidates`` of the wrong type, a mixed spec as a candidate, an
            unknown objective, a ``refine`` that is not a whole number in 0..16, candidates whose groups
            cannot cover every layer (no per-layer candidate), a group larger than the model.
        UnsupportedConversionError: a ``merge``/``xkv`` candidate under a protocol without a prefill.
        And what :func:`~headwidget.evaluation.evaluate` raises for a candidate the model cannot take.
    """
    if isinstance(budgets, (str, bytes)) or not isinstance(budgets, Iterable):
        raise ArgumentError(
            f"budgets must be a non-empty list of budgets such as [0.5, 0.25], got {budgets!r}"
        )
    budgets = list(budgets)  # a numpy array too
    if not budgets:
        raise ArgumentError("budgets is empty; give a list of budgets such as [0.5, 0.25]")
    adapter = adapter_for(model)
    model_with_weights("model", model)
    specs = _check_candidates(candidates)
    if objective not in OBJECTIVES:
        raise ArgumentError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    refine = whole_number("refine", refine, minimum=0, maximum=16, hint="refine rounds")
    progress = flag("progress", progress)
    ranks = Ranks.of(distributed)
    _, stats, _, _, dtype, batch_size, max_length, max_tokens, _ = check_evaluate_arguments(
        adapter, specs, stats, None, False, dtype, batch_size, max_length, max_tokens, False
    )
    reading = parse_protocol(protocol)
    if reading.prefill is None:
        refuse_cache_transforms([parse_variant(s) for s in specs], reading.text)
    runner = running.runner_for(model, reading, adapter)
    if runner.kind != "causal-lm":
        raise ArgumentError(
            f"allocate measures next-token damage, so it takes a causal LM, not {runner.kind}"
        )
    check_stats(model, adapter, stats, allow_other_weights=allow_other_weights)
    num_layers = adapter.layout().num_layers
    layers = list(range(num_layers))
    length = max_length if reading.window is None else reading.window
    batches = running.protocol_batches(
        model,
        texts,
        tokenizer,
        reading,
        batch_size=batch_size,
        max_length=length,
        max_tokens=max_tokens,
        min_tokens=2,
    )
    check_token_ids(model, batches)
    ranks.agree(
        "allocate",
        lambda: {
            "candidates": specs,
            "budgets": list(budgets),
            "objective": objective,
            "refine": refine,
            "protocol": reading.text,
            "dtype": str(dtype),
            "batch_size": batch_size,
            "max_length": max_length,
            "max_tokens": max_tokens,
            **running.call_facts(adapter, batches, stats),
        },
    )
    every, batches = batches, ranks.shard(batches)
    max_memory = optional_whole_number("max_memory", max_memory, minimum=1, hint="bytes")
    check_allocation_budget(
        AllocationMemory.of(model, specs, _shapes(batches), dtype=dtype, adapter=adapter), max_memory
    )
    base = running.working_copy(model, dtype, adapter)
    weight_dtype = next(base.parameters()).dtype
    model_plan = plan_variant(adapter, parse_variant("model"), None, layers)
    fitted, plans = _fit_candidates(adapter, specs, stats, layers, weight_dtype, model_plan.layer_elements)
    options = fitted.options()
    groups = {cell: fitted.group_cell(cell) for cell in options if cell.spec in fitted.group}
    model_bytes = math.fsum(model_plan.layer_bytes(dtype))
    per_layer = {
        s: (plans[s] if s != "model" else model_plan).layer_bytes(dtype, reading.prefill)
        for s in plans.keys() | {"model"}
    }

    def cell_bytes(cell: _Cell) -> float:
        if cell not in groups:
            return per_layer[cell.spec][cell.start]
        plan = groups[cell][1]
        return math.fsum(plan.layer_bytes(dtype, reading.prefill)[cell.start : cell.stop])

    limits = [_budget_bytes(b, model_bytes) for b in budgets]
    _check_cover(fitted, [Span(c.start, c.length, 0.0, cell_bytes(c)) for c in options], limits)
    cells: dict[str, dict[int, LayerFit | KVQuantizer | GroupCell | None]] = {
        s: {layer: plan.cell(layer) for layer in layers} for s, plan in plans.items()
    }
    for cell, (group, _) in groups.items():
        cells.setdefault(cell.spec, {})[cell.start] = group
    tick = running.Progress(
        len(batches) * (2 + sum(c is not None for row in cells.values() for c in row.values())),
        progress,
        desc="allocate",
    )
    try:
        swept = layer_sweep(
            base,
            batches,
            cells,
            layers,
            runner,
            tick=tick,
            ranks=ranks,
            measure="kl" if objective == "kl" else "delta_nll",
        )
        running.sum_retention([plan for _, plan in groups.values()], ranks)  # the sweep's merges: their bytes
        damage = {cell: 0.0 if cell.spec == "model" else swept[cell.spec][cell.start] for cell in options}
        cost = {cell: cell_bytes(cell) for cell in options}
        scorer = _Scorer(base, batches, runner, objective, tick, ranks)
        search = _Search(fitted, damage, cost, scorer, dtype, reading.prefill)
        found = [search.within(limit, refine) for limit in limits]
    finally:
        tick.close()
    tokens_seen = fingerprint(every)
    pieces = token_pieces(every, stream=reading.kind != "documents").pieces
    tokens = predicted_count(every)
    out = []
    for limit, (best, best_choice, rounds) in zip(limits, found, strict=True):
        chosen = per_layer_specs(best.spec, num_layers)
        assert chosen is not None
        remember(chosen, tokens_seen, pieces)
        out.append(
            Allocation(
                spec=best.spec,
                choice=_per_layer(best_choice),
                kv_bytes_per_token=best.kv_bytes_per_token,
                budget=limit,
                model_bytes=model_bytes,
                objective=objective,
                candidates=specs,
                damage=_by_start(damage, specs, num_layers),
                layer_bytes=_by_start(cost, specs, num_layers),
                rounds=rounds,
                fingerprint=tokens_seen,
                tokens=tokens,
                cells=[(cell.start, cell.length, cell.spec) for cell in best_choice],
            )
        )
    return out


def _by_start(values: dict[_Cell, float], specs: list[str], num_layers: int) -> dict[str, list[float]]:
    """Per candidate, per layer: the value of its cell that starts there (NaN where none does)."""
    out = {s: [math.nan] * num_layers for s in specs}
    for cell, value in values.items():
        out[cell.spec][cell.start] = value
    return out


def _check_cover(candidates: _Candidates, spans: list[Span], limits: list[float]) -> None:
    """Refuse candidates that cannot cover every layer, and a budget below the cheapest cover (a merge
    counted with nothing retained, its least), before any forward."""
    try:
        cheapest_spans(spans, candidates.num_layers)
    except ValueError:
        raise ArgumentError(
            f"the candidates {candidates.specs} cannot cover all {candidates.num_layers} layers (their "
            "groups leave a layer over); add a per-layer candidate such as 'model'"
        ) from None
    for limit in limits:
        check_span_budget(spans, candidates.num_layers, limit)
