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
from headwidget.analysis.variants import MixedSpec, layer_ranges, parse_variant, uniform_parts
from headwidget.capture.inputs import Batch
from headwidget.capture.memory import default_budget, format_bytes
from headwidget.checks import flag, model_with_weights, number, optional_whole_number, whole_number
from headwidget.errors import ArgumentError, MemoryBudgetError
from headwidget.evaluation._arguments import check_evaluate_arguments, check_token_ids
from headwidget.evaluation._chosen import remember, token_pieces
from headwidget.evaluation._distributed import Ranks
from headwidget.evaluation._evaluate import Progress, _working_copy, prefilling, protocol_batches, runner_for
from headwidget.evaluation._inputs import fingerprint, parse_protocol, predicted_count
from headwidget.evaluation._model_facts import check_stats
from headwidget.evaluation._outputs import OutputRunner
from headwidget.evaluation._plan import VariantPlan, plan_variant
from headwidget.evaluation._sweep import RECORD_BUDGET, layer_sweep, swap_sweep
from headwidget.evaluation.measures import PredictionTotals, chunk_rows, predicted_positions
from headwidget.stats import KVStats

__all__ = [
    "DEFAULT_CANDIDATES",
    "Allocation",
    "AllocationMemory",
    "AllocationRound",
    "allocate",
    "allocate_frontier",
    "estimate_allocation",
    "forward_working_bytes",
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


def forward_working_bytes(model: nn.Module, rows: int, length: int, dtype_bytes: int, *, scores: bool) -> int:
    """The working memory of one forward of ``model``'s layers under ``no_grad`` (the head left out): about
    ``4·D + 3·F`` elements a token (hidden size D, MLP width F: one layer's residual, normed input and
    MLP activations at a time; ``5·F`` for a GELU written out in Python, GPT-2's ``gelu_new``), and with
    ``scores`` (eager attention, or ``sdpa`` given a padding mask) the (heads × length) attention scores
    and their softmax. Fitted to the CPU allocator's peak on Llama-family and GPT-2 models.

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=384,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    >>> forward_working_bytes(model, 4, 64, 4, scores=False)  # (4·128 + 3·384) × 4 bytes × 256 tokens
    1703936
    """
    adapter = adapter_for(model)
    lay = adapter.layout()
    config = getattr(model, "config", None)
    act = getattr(config, "activation_function", None) or getattr(config, "hidden_act", None)
    mlp = 5 if act in ("gelu_new", "gelu_fast", "quick_gelu") else 3
    per_token = (4 * lay.hidden_size + mlp * adapter.mlp_width()) * dtype_bytes
    if scores:
        per_token += 3 * lay.num_heads * length * max(dtype_bytes, 4) // 2
    return rows * length * per_token


@dataclass(frozen=True)
class AllocationMemory:
    """The parts (bytes) of an allocation's peak on the model's device:

    - ``copy``: the working copy in ``dtype``, when the model is held in another;
    - ``fits``: every conversion candidate's fitted attention weights, for every layer, in ``dtype``;
    - ``work``: the largest of the fitting (one candidate's float64 fits of every layer, before they are
      cast, and the work of fitting one layer: four query-sized matrices in float64), the sweep (the
      recorded layer outputs of one chunk of batches, at most
      :data:`~headwidget.evaluation._sweep.RECORD_BUDGET` bytes but always one batch's, and the
      original's predicted-row logits of those batches) and the search (the original's predicted-row
      logits of every batch, kept while the allocations are measured and refined, and the recorded layer
      outputs of one chunk, and the converted attention of the plan measured), each with one forward of a
      variant (its working memory, its whole logits and the rows picked from them, or the measures'
      float32 chunks).

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
    ) -> AllocationMemory:
        """``shapes``: per batch (rows, length, predicted tokens)."""
        adapter = adapter_for(model)
        lay = adapter.layout()
        b = torch.empty((), dtype=dtype).element_size()
        own = next((p.dtype for p in model.parameters() if p.is_floating_point()), dtype)
        numel = sum(t.numel() for t in {id(t): t for t in (*model.parameters(), *model.buffers())}.values())
        copy = 0 if own == dtype else numel * b
        attention = {
            id(t): t for layer in range(lay.num_layers) for t in adapter.attention_at(layer).parameters()
        }
        conversions = [
            s
            for s in specs
            if any(p.mechanism != "model" and not p.quantizer for p in uniform_parts(parse_variant(s)))
        ]
        weights = sum(t.numel() for t in attention.values())
        fits = len(conversions) * weights * b
        # one candidate's float64 fits of every layer before they are cast, and the fit of one layer at work
        # (its keys and values read in float64 and repeated per query head, their group means so too)
        work_of_one = 4 * lay.num_heads * lay.head_dim * lay.hidden_size
        fitting = (
            8 * (weights + work_of_one) - weights * b if conversions else 0
        )  # its own cast fits not yet made
        get_head = getattr(model, "get_output_embeddings", None)
        weight = getattr(get_head() if callable(get_head) else None, "weight", None)
        vocab = int(weight.shape[0]) if isinstance(weight, torch.Tensor) else 0
        impl = str(getattr(getattr(model, "config", None), "_attn_implementation", None) or "eager")
        kept = [predicted * vocab * b for _, _, predicted in shapes]
        forward = 0
        for rows, length, predicted in shapes:
            logits = predicted * vocab * b  # the head computes the predicted rows alone
            measures = 5 * min(predicted, chunk_rows(vocab)) * vocab * max(b, 4)
            padded = predicted < rows * (length - 1)
            work = forward_working_bytes(model, rows, length, b, scores=impl == "eager" or padded)
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
        # a sweep's cell holds one layer's converted attention, a measured plan (search) every layer's
        sweep = max(sum(recorded[i] + kept[i] for i in c) for c in chunks) + forward
        sweep += weights * b // lay.num_layers if conversions else 0
        search = sum(kept) + max(sum(recorded[i] for i in c) for c in chunks) + forward
        search += weights * b if conversions else 0
        device = next(model.parameters()).device
        return cls({"copy": copy, "fits": fits, "work": max(sweep, search, fitting)}, device)


def _shapes(batches: Sequence[Batch]) -> list[tuple[int, int, int]]:
    """(rows, length, predicted tokens) of each batch."""
    return [(*b.input_ids.shape, int(predicted_positions(b.attention_mask, b.scored).sum())) for b in batches]


def check_allocation_budget(need: AllocationMemory, max_memory: int | None) -> None:
    """Refuse ``need`` over ``max_memory`` (default: the device's default budget) with
    :class:`MemoryBudgetError`, naming what to change."""
    allowed = max_memory if max_memory is not None else default_budget(need.device)
    if need.total <= allowed:
        return
    source = "max_memory" if max_memory is not None else "the default budget"
    parts = ", ".join(f"{k} {format_bytes(v)}" for k, v in need.parts.items() if v)
    raise MemoryBudgetError(
        f"allocate would allocate {format_bytes(need.total)} on {need.device} ({parts}), over the "
        f"{format_bytes(allowed)} allowed ({source}). Use a smaller batch_size or max_length (one forward's "
        "logits are batch_size × max_length × vocabulary), fewer max_tokens (the original's logits of every "
        "calibration token are kept while allocations are measured), fewer candidates, or raise "
        "max_memory= (bytes) if the memory is there."
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
    **ignored: Any,
) -> int:
    """Peak bytes :func:`allocate` (or :func:`allocate_frontier`) with these arguments allocates on the
    model's device (:class:`AllocationMemory`: the bound it checks against ``max_memory``).

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
    return AllocationMemory.of(model, specs, shapes, dtype=dtype).total


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
        max_memory: bytes the allocation may allocate on the model's device (default: the device's
            default budget, :func:`~headwidget.capture.memory.default_budget`); the estimate
            (:class:`AllocationMemory`, :func:`estimate_allocation`) is checked before any fit or forward.
        progress: show a progress bar (in forwards; each measure and refine round adds to its total).

    Raises:
        BudgetError: a budget below the cheapest candidate at every layer (the message gives the least).
        ArgumentError: a budget or ``candidates`` of the wrong type, a mixed spec as a candidate, an
            unknown objective, a ``refine`` that is not a whole number in 0..16.
        MemoryBudgetError: the estimate is over ``max_memory``.
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
    max_memory = optional_whole_number("max_memory", max_memory, minimum=1, hint="bytes")
    check_allocation_budget(AllocationMemory.of(model, specs, _shapes(batches), dtype=dtype), max_memory)
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
