"""``allocate(model, texts, budget=...)``: a mixed spec that spends a K/V byte budget where it hurts least.

Method:

1. **Sweep.** Every candidate is fitted once, for every layer (from ``stats``), and the per-layer sweep
   (:func:`~headwidget.evaluation._sweep.layer_sweep`, which replays the original model's hidden states
   entering each layer) gives each (layer, candidate) its damage on ``texts`` with only that layer
   changed: mean KL(model ‖ variant) per predicted token (``objective="kl"``) or ΔNLL
   (``objective="nll"``). ``model`` costs nothing. Each (layer, candidate) also has its K/V bytes per
   token (:class:`~headwidget.evaluation._plan.VariantPlan`).
2. **Solve.** An exact multiple-choice knapsack (:func:`~headwidget.analysis.allocation.choose_per_layer`)
   picks one candidate per layer with the least summed damage whose summed bytes are within the budget.
   The sum is a prediction: damage is not additive, so the chosen mixed spec is then **measured** whole
   on ``texts`` (one evaluation), and so is every uniform candidate within the budget: one that
   measures better becomes the allocation (a round of its own in ``rounds``), so on ``texts`` an
   allocation is never worse than the best uniform candidate it could have been.
3. **Refine** (``refine`` rounds). With the current allocation applied to every other layer, every
   layer's candidates are measured again, each as the whole model with that one layer swapped, against
   the original, in one sweep around the allocation
   (:func:`~headwidget.evaluation._sweep.swap_sweep`: the allocation's hidden states entering the
   swapped layer are replayed); their damages, less the current allocation's, are the new per-layer
   costs; the knapsack is solved again and the new spec measured. The better measured spec
   is kept. ``rounds`` records each round's predicted and measured damage and its spec, so the
   non-additivity is visible.

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
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace
from typing import Any, TypeVar

import torch
from torch import nn

from headwidget.adapters import adapter_for
from headwidget.analysis.allocation import check_budget, choose_per_layer
from headwidget.analysis.variants import MixedSpec, layer_ranges, parse_variant
from headwidget.capture.inputs import Batch
from headwidget.checks import flag, model_with_weights, number, whole_number
from headwidget.errors import ArgumentError
from headwidget.evaluation._arguments import check_evaluate_arguments, check_token_ids
from headwidget.evaluation._chosen import remember, token_pieces
from headwidget.evaluation._distributed import Ranks
from headwidget.evaluation._evaluate import Progress, _working_copy, prefilling, protocol_batches, runner_for
from headwidget.evaluation._inputs import fingerprint, parse_protocol, predicted_count
from headwidget.evaluation._model_facts import check_stats
from headwidget.evaluation._outputs import OutputRunner
from headwidget.evaluation._plan import VariantPlan, plan_variant
from headwidget.evaluation._sweep import layer_sweep, swap_sweep
from headwidget.evaluation.measures import PredictionTotals
from headwidget.stats import KVStats

__all__ = ["DEFAULT_CANDIDATES", "Allocation", "AllocationRound", "allocate", "allocate_frontier"]

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
    """What :func:`allocate` chose (see the module docstring)."""

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

    def table(self) -> str:
        """A Markdown table of the rounds and the chosen spec per layer."""
        title = (
            f"allocation within {self.budget:g} of {self.model_bytes:g} K/V bytes per token "
            f"({self.objective}, chosen on {self.tokens} tokens)"
        )
        lines = [title, "", "| round | predicted | measured | bytes/token | spec |", "|---|---|---|---|---|"]
        for i, r in enumerate(self.rounds):
            lines.append(
                f"| {i} | {r.predicted:.4f} | {r.measured:.4f} | {r.kv_bytes_per_token:g} | `{r.spec}` |"
            )
        lines += ["", "| layer | chosen |", "|---|---|"]
        lines += [f"| {layer} | {c} |" for layer, c in enumerate(self.choice)]
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
        if parsed.cross is not None:
            raise ArgumentError(
                f"candidate {parsed.text!r} acts on groups of layers, and allocate chooses one candidate per "
                "layer; evaluate cross-layer specs with headwidget.evaluate"
            )
        out.append(parsed.text)
    return list(dict.fromkeys(out))


class _Scorer:
    """Whole-model damage of plans on fixed batches against the original's outputs."""

    def __init__(
        self,
        base: nn.Module,
        batches: list[Batch],
        runner: OutputRunner,
        objective: str,
        tick: Progress,
        ranks: Ranks,
    ):
        self.base, self.batches, self.runner, self.objective = base, batches, runner, objective
        self.tick, self.ranks = tick, ranks
        self.reference = []
        for batch in batches:
            self.reference.append(runner(base, batch))
            tick(1)
        self.model_nll = math.nan
        if objective == "nll":  # the original's own NLL, what a variant's is measured against
            model = PredictionTotals()
            for ref in self.reference:
                assert ref.targets is not None
                model.add_rows(ref.values, ref.values, ref.targets)
            ranks.merge([model])
            self.model_nll = model.nll

    def of(self, totals: PredictionTotals) -> float:
        """The objective from a plan's totals: its mean KL, or its NLL less the original's."""
        return totals.kl if self.objective == "kl" else totals.nll - self.model_nll

    def damage(self, plan: VariantPlan) -> float:
        """One plan, full forwards."""
        totals = PredictionTotals()
        self.tick.grow(len(self.batches))
        with plan.running(self.base, prefill=prefilling(self.runner)) as variant:
            for ref, batch in zip(self.reference, self.batches, strict=True):
                out = self.runner(variant, batch)
                assert out.targets is not None
                totals.add_rows(ref.values, out.values, out.targets)
                self.tick(1)
        self.ranks.merge([totals])
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


def _compose(choice: Sequence[str], plans: dict[str, VariantPlan], elements: dict[int, int]) -> VariantPlan:
    """The plan of a per-layer choice: each layer's fit or quantizer taken from its candidate's plan."""
    parts: dict[str, list[int]] = {}
    for layer, spec in enumerate(choice):
        parts.setdefault(spec, []).append(layer)
    text = ";".join(f"{spec}@{layer_ranges(ls)}" for spec, ls in sorted(parts.items(), key=lambda x: x[1][0]))
    text = parse_variant(text).text
    fits = {}
    quantizers = []
    for spec, layers in parts.items():
        if spec == "model":
            continue
        plan = plans[spec]
        fits.update({layer: plan.fits[layer] for layer in layers if layer in plan.fits})
        quantizers += [replace(q, layers=[x for x in q.layers if x in layers]) for q in plan.quantizers]
    return VariantPlan(text, fits, [q for q in quantizers if q.layers], elements)


@dataclass
class _Search:
    """Steps 2 and 3 of the module docstring for one budget, from the sweep's per-layer ``damage``."""

    specs: list[str]
    plans: dict[str, VariantPlan]
    elements: dict[int, int]
    layer_bytes: dict[str, list[float]]
    damage: dict[str, list[float]]
    scorer: _Scorer
    dtype: torch.dtype

    def solve(self, costs: dict[str, list[float]], limit: float) -> tuple[list[str], float]:
        """The knapsack's choice per layer and its predicted (summed) damage."""
        layers = range(len(self.elements))
        picked = choose_per_layer(
            [[costs[s][layer] for s in self.specs] for layer in layers],
            [[self.layer_bytes[s][layer] for s in self.specs] for layer in layers],
            limit,
        )
        choice = [self.specs[i] for i in picked]
        return choice, math.fsum(costs[c][layer] for layer, c in enumerate(choice))

    def plan(self, choice: Sequence[str]) -> VariantPlan:
        return _compose(choice, self.plans, self.elements)

    def measured(
        self, choice: Sequence[str], predicted: float, damage: float | None = None
    ) -> AllocationRound:
        plan = self.plan(choice)
        damage = self.scorer.damage(plan) if damage is None else damage
        return AllocationRound(plan.spec, predicted, damage, plan.kv_bytes_per_token(self.dtype))

    def within(self, limit: float, refine: int) -> tuple[AllocationRound, list[str], list[AllocationRound]]:
        """The best measured round within ``limit`` bytes, its choice, and every round."""
        num_layers = len(self.elements)
        choice, predicted = self.solve(self.damage, limit)
        rounds = [self.measured(choice, predicted)]
        best, best_choice = rounds[0], choice
        for (
            s
        ) in self.specs:  # a uniform candidate within the budget that measures better is the start instead
            uniform = [s] * num_layers
            if uniform == choice or math.fsum(self.layer_bytes[s]) > limit:
                continue
            candidate = self.measured(uniform, math.fsum(self.damage[s]))
            if candidate.measured < best.measured:
                best, best_choice = candidate, uniform
                rounds.append(candidate)
        for _ in range(refine):
            swaps = {
                (layer, s): (layer, self.plan(_swap(best_choice, layer, s)))
                for layer in range(num_layers)
                for s in self.specs
                if s != best_choice[layer]
            }
            current, swept = self.scorer.swapped(self.plan(best_choice), swaps)
            costs: dict[str, list[float]] = {s: [0.0] * num_layers for s in self.specs}
            for (layer, s), value in swept.items():
                costs[s][layer] = value - current
            choice, predicted = self.solve(costs, limit)
            rounds.append(
                self.measured(choice, current + predicted, current if choice == best_choice else None)
            )
            if rounds[-1].measured < best.measured:
                best, best_choice = rounds[-1], choice
            else:
                break  # no better spec found: another round would solve the same costs
        return best, best_choice, rounds


def _swap(choice: Sequence[str], layer: int, spec: str) -> list[str]:
    """``choice`` with ``layer``'s candidate replaced by ``spec``."""
    out = list(choice)
    out[layer] = spec
    return out


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
            ``protocol``, ``distributed``, ``progress``: see :func:`allocate_frontier`.
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
    progress: bool = True,
) -> list[Allocation]:
    """One :class:`Allocation` per budget, all from one sweep of the candidates (module docstring).

    Args:
        model: a supported causal language model.
        texts: calibration text, as :func:`~headwidget.evaluation.evaluate` takes it; never the text
            the allocation is then evaluated on.
        budgets: each a float in (0, 1]: a fraction of the model's own K/V bytes per token in ``dtype``,
            or an int: bytes per token.
        candidates: uniform variant specs (``model`` included for "leave this layer as it is").
        stats: statistics of ``model`` for the candidates that need them (``+align``, data-aware
            LRKV/MLA, ``kv:cq``), as :func:`~headwidget.evaluation.evaluate` takes them.
        objective: ``"kl"`` (mean KL(model ‖ variant) per predicted token) or ``"nll"`` (ΔNLL).
        refine: refine rounds after the first solve (each: a sweep of every other candidate at every
            layer, with the current allocation elsewhere).
        dtype, batch_size, max_length, max_tokens, protocol: as for :func:`~headwidget.evaluation.evaluate`
            (choose with the protocol you will evaluate with).
        distributed: share the sweeps and measures over the ranks of ``torch.distributed``, as
            :func:`~headwidget.evaluation.evaluate` does; every rank returns the same allocations.
        progress: show a progress bar (in forwards; each measure and refine round adds to its total).

    Raises:
        BudgetError: a budget below the cheapest candidate at every layer (the message gives the least).
        ArgumentError: a budget or ``candidates`` of the wrong type, a mixed spec as a candidate, an
            unknown objective, a ``refine`` that is not a whole number in 0..16.
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
    runner = runner_for(model, reading)
    if runner.kind != "causal-lm":
        raise ArgumentError(
            f"allocate measures next-token damage, so it takes a causal LM, not {runner.kind}"
        )
    check_stats(model, adapter, stats, allow_other_weights=allow_other_weights)
    num_layers = adapter.layout().num_layers
    layers = list(range(num_layers))
    length = max_length if reading.window is None else reading.window
    batches = protocol_batches(
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
    every, batches = batches, ranks.shard(batches)
    base = _working_copy(model, dtype)
    weight_dtype = next(base.parameters()).dtype
    plans = {
        s: plan_variant(adapter, parse_variant(s), stats, layers, weight_dtype=weight_dtype)
        for s in specs
        if s != "model"
    }
    model_plan = plan_variant(adapter, parse_variant("model"), None, layers)
    elements = model_plan.layer_elements
    layer_bytes = {s: (plans[s] if s != "model" else model_plan).layer_bytes(dtype) for s in specs}
    model_bytes = math.fsum(model_plan.layer_bytes(dtype))
    limits = [_budget_bytes(b, model_bytes) for b in budgets]
    for limit in limits:  # every budget checked before any forward
        check_budget([[layer_bytes[s][layer] for s in specs] for layer in layers], limit)
    cells = {s: {layer: plan.cell(layer) for layer in layers} for s, plan in plans.items()}
    tick = Progress(
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
        damage = {s: [0.0] * num_layers if s == "model" else swept[s] for s in specs}
        scorer = _Scorer(base, batches, runner, objective, tick, ranks)
        search = _Search(specs, plans, elements, layer_bytes, damage, scorer, dtype)
        found = [search.within(limit, refine) for limit in limits]
    finally:
        tick.close()
    tokens_seen = fingerprint(every)
    pieces = token_pieces(every, stream=reading.kind != "documents").pieces
    tokens = predicted_count(every)
    out = []
    for limit, (best, best_choice, rounds) in zip(limits, found, strict=True):
        remember(best_choice, tokens_seen, pieces)
        out.append(
            Allocation(
                spec=best.spec,
                choice=best_choice,
                kv_bytes_per_token=best.kv_bytes_per_token,
                budget=limit,
                model_bytes=model_bytes,
                objective=objective,
                candidates=specs,
                damage=damage,
                layer_bytes=layer_bytes,
                rounds=rounds,
                fingerprint=tokens_seen,
                tokens=tokens,
            )
        )
    return out
