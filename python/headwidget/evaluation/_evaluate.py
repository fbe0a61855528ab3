"""``evaluate(model, texts, variants)``: what each variant does to the model's predictions, and its cost.

The model is run once in ``dtype`` on the evaluation batches (the reference), then every variant: each
is fitted from the original weights (float64; see :func:`~headwidget.evaluation.apply`), built into a
copy that shares every unconverted parameter with the reference, and run on the same batches. The
reference's predicted-position logits are kept between variants when they fit :data:`LOGITS_BUDGET`
bytes and what ``max_memory`` leaves over, else recomputed. ``model`` itself is never changed and never
run: the reference is an eval-mode copy of its modules (sharing its weights when ``dtype`` is its own),
so other threads may use ``model`` meanwhile, even switch it to training mode, and every number stays
that of a lone run.

Measures (:mod:`headwidget.evaluation.measures`) are over every predicted token; padding never counts,
positions come from the attention mask, so left and right padding give the same numbers.

K/V quantizers (``kv:int{b}``, ``kv:int{b}/g{n}``, ``kv:cq{c}c{b}b``) change no weight: the reference
model itself runs (through a copy of its modules that shares every parameter) with the post-RoPE keys
and the values fake-quantized where the attention function receives them
(:mod:`headwidget.evaluation._quantize`). ``kv:int`` needs no statistics; ``kv:cq`` fits its codebooks
on the calibration samples of ``stats`` (``capture(..., rope="post", samples=R)``). Their KV bytes per
token count the quantized layers by the quantizer's formula and the others in ``dtype``; the CQ
codebooks are reported apart, in ``constant_bytes``. With ``per_layer`` they are swept like the
conversions (only layer ℓ quantized, the original's hidden states reused).

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> ids = torch.randint(0, 64, (4, 24), generator=torch.Generator().manual_seed(0))
    >>> report = evaluate(model, ids, ["model", "mqa", "lrkv:4"], dtype=torch.float32, progress=False)
    >>> report.kl["model"], report.top1["model"], report.kv_bytes_per_token
    (0.0, 1.0, {'model': 256, 'mqa': 128, 'lrkv:4': 256})
    >>> report.tokens, report.nll["mqa"] > report.nll["model"] - 1.0
    (92, True)
    >>> q = evaluate(model, ids, ["kv:int8", "kv:int2"], dtype=torch.float32, progress=False)
    >>> q.kv_bytes_per_token, q.kl["kv:int8"] < q.kl["kv:int2"]  # C = 16: a value group is partial
    ({'kv:int8': 76, 'kv:int2': 28}, True)
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable, Sequence
from typing import Any

import torch
from torch import nn

from headwidget.adapters import Adapter, adapter_for
from headwidget.analysis.variants import MixedSpec, Variant, parse_variant
from headwidget.capture.inputs import Batch
from headwidget.checks import model_with_weights, optional_whole_number
from headwidget.errors import ArgumentError
from headwidget.evaluation import running
from headwidget.evaluation._apply import KeptFits, refuse_layers_with_mixed
from headwidget.evaluation._arguments import EvaluateArguments, check_evaluate_arguments
from headwidget.evaluation._chosen import FLAG_SHARE, chosen_shares
from headwidget.evaluation._cross_layer import refuse_cache_transforms
from headwidget.evaluation._inputs import Protocol, check_window, parse_protocol, predicted_count
from headwidget.evaluation._memory import EvaluationMemory, check_evaluation_budget
from headwidget.evaluation._model_facts import check_stats, layer_kv_elements
from headwidget.evaluation._plan import VariantPlan, plan_variant
from headwidget.evaluation._report import EvaluationReport
from headwidget.evaluation._sweep import RECORD_BUDGET, layer_sweep
from headwidget.stats import KVStats

__all__ = ["LOGITS_BUDGET", "evaluate"]

#: Bytes of reference logits kept between variants (beyond it they are recomputed per variant).
LOGITS_BUDGET = 4 * 2**30


def evaluate(
    model: nn.Module,
    texts: Any,
    variants: Sequence[str],
    *,
    tokenizer: Any = None,
    stats: KVStats | None = None,
    allow_other_weights: bool = False,
    layers: Iterable[int] | None = None,
    per_layer: bool = False,
    dtype: torch.dtype | str = torch.bfloat16,
    batch_size: int = 8,
    max_length: int = 512,
    max_tokens: int | None = None,
    max_memory: int | None = None,
    protocol: str = "documents",
    distributed: bool = False,
    progress: bool = True,
) -> EvaluationReport:
    """Measure each variant of ``model`` on held-out ``texts`` (see the module docstring).

    Args:
        model: a supported transformers model (a causal LM, or a BERT-style encoder).
        texts: what :func:`headwidget.capture` accepts: a string, strings (with ``tokenizer``), a
            LongTensor of ids, or dicts with ``input_ids`` and ``attention_mask``. Use text the
            statistics were not captured on (``english_sample(split="evaluation")``).
        variants: variant specs (:func:`~headwidget.evaluation.apply`), e.g.
            ``["model", "mqa", "mqa+align", "lrkv:16", "mla:128", "mla:96+rope:8"]``, and K/V quantizers
            ``"kv:int4"``, ``"kv:int2/g64"``, ``"kv:cq4c8b"`` (see the module docstring).
        stats: statistics of ``model`` (``+align`` needs keys/values; ``rope:r`` and data-aware
            LRKV/MLA need ``inputs=True``; ``kv:cq`` needs ``rope="post"`` and ``samples=R``), captured
            on calibration text, not on ``texts``.
        allow_other_weights: use ``stats`` even when they were captured from other weights of the same
            architecture and config (a base model's statistics for its fine-tune); by default refused.
            ``model`` is checked as given, before the cast to ``dtype``.
        layers: the layers each variant converts or quantizes (default: all); with ``per_layer`` also the
            layers swept.
        per_layer: also measure each variant with only one layer converted (a cross-layer variant: one
            group, whose ΔNLL each of its layers is given), for every layer.
        dtype: the dtype the model and the variants run in; KV bytes are counted in it too: a floating
            torch dtype, or its name (``"float32"``, ``"float16"``, ``"bfloat16"``, ``"float64"``).
        max_tokens: use at most this many real tokens of ``texts``.
        protocol: ``"documents"``: each text its own sequences, up to ``max_length`` tokens;
            ``"chunks:W"``: the texts joined into one stream (strings by a blank line, token ids row
            after row without padding) and cut into non-overlapping windows of W tokens, each scored
            whole, a final partial window dropped (the WikiText-2 protocol of GPTQ, Palu, TransMLA and
            SVD-LLM, with W = 2048 in their tables); ``"stride:W/S"``: the same stream read by windows
            of W tokens starting every S tokens, each scoring only the tokens no earlier window reached
            (the sliding window of the transformers perplexity guide; every token but the first scored
            once, causal LMs only); ``max_length`` is then unused. ``"prefill:P"``: each document
            (up to ``max_length`` tokens, at least P + 2) prefills a KV cache with its first P tokens,
            the variant's cache transforms act on it (``merge``, ``xkv``, and the ``kv:`` quantizers,
            which then quantize the prefilled cache only, as a deployed cache does), and its tokens
            from P + 1 on are scored by one forward that reads it, their own K/V cached exactly
            (:mod:`headwidget.evaluation._prefill`; causal LMs only). ``merge`` and ``xkv`` run under
            this protocol only; without a transform it gives the ``documents`` numbers of the same
            predictions.
        max_memory: bytes the evaluation may allocate on the model's device (default: half its free
            memory); the estimate (:mod:`headwidget.evaluation._memory`) is checked before any work.
        distributed: share the work over the ranks of ``torch.distributed`` (under ``torchrun``, after
            ``init_process_group``; every rank calls ``evaluate`` with the same arguments): each rank
            measures its shard of the batches and the float64 totals are summed with ``all_reduce``
            (:mod:`headwidget.evaluation._distributed`), so every rank returns the report of all the
            texts.
        progress: show a progress bar (in forwards).

    Returns:
        :class:`~headwidget.evaluation.EvaluationReport`.

    Raises:
        MechanismSpecError, GroupCountError, RankRangeError, MissingStatisticsError,
        StatsMismatchError, UnsupportedConversionError: as :func:`~headwidget.evaluation.apply`, and
        as :func:`~headwidget.evaluation.fit_quantizer` for the quantizers (a family whose attention
        does not go through ``transformers.AttentionInterface`` is refused).
        ArgumentError: an argument of the wrong type or outside its range (a count given as a float or a
            string, ``variants`` given as one string, ``stats`` that are not a KVStats...).
        CaptureInputError: token ids outside the model's vocabulary (as :func:`headwidget.capture`).
        EvaluationInputError: texts with fewer than two tokens in every sequence.
        MemoryBudgetError: the estimate for ``batch_size × max_length`` is over ``max_memory``.
        NonFiniteLogitsError: a variant's outputs are not finite (the message names it and the layer).
    """
    adapter = adapter_for(model)
    args = check_evaluate_arguments(
        adapter, variants, stats, layers, per_layer, dtype, batch_size, max_length, max_tokens, progress
    )
    max_memory = optional_whole_number("max_memory", max_memory, minimum=1, hint="bytes")
    model_with_weights("model", model)
    ranks = running.Ranks.of(distributed)
    args, reading, parsed, runner = _checked(model, adapter, args, protocol, layers, allow_other_weights)
    need = EvaluationMemory.of(model, adapter, list(parsed.values()), args, reading)
    spare = check_evaluation_budget(need, max_memory)
    every = running.protocol_batches(
        model,
        texts,
        tokenizer,
        reading,
        batch_size=args.batch_size,
        max_length=args.max_length,
        max_tokens=args.max_tokens,
        min_tokens=2 if runner.kind == "causal-lm" else 1,
    )
    running.check_token_ids(model, every)
    ranks.agree(
        "evaluate",
        lambda: {
            "variants": list(parsed),
            "protocol": reading.text,
            "dtype": str(args.dtype),
            "layers": list(args.layers),
            "per_layer": args.per_layer,
            "batch_size": args.batch_size,
            "max_length": args.max_length,
            "max_tokens": args.max_tokens,
            **running.call_facts(adapter, every, args.stats),
        },
    )
    batches = ranks.shard(every)
    base = running.working_copy(model, args.dtype, adapter)
    weight_dtype = next(base.parameters()).dtype
    kept: KeptFits = {}  # a layer converted alike by several variants is fitted once
    plans = {
        s: plan_variant(adapter, p, args.stats, args.layers, weight_dtype=weight_dtype, kept=kept)
        for s, p in parsed.items()
        if s != "model"
    }
    cells = sum(len({id(c) for c in map(plan.cell, args.layers) if c is not None}) for plan in plans.values())
    tick = running.Progress(
        len(batches) * (1 + len(plans) + (1 + cells if args.per_layer else 0)), args.progress
    )
    try:
        measures, kv_bytes = _variants(
            base, plans, batches, runner, ranks, tick, min(LOGITS_BUDGET, spare), args, reading.prefill
        )
        sweep = None
        if args.per_layer:
            cell_of = {s: {layer: plan.cell(layer) for layer in args.layers} for s, plan in plans.items()}
            record = max(0, min(RECORD_BUDGET, spare))
            swept = layer_sweep(
                base, batches, cell_of, args.layers, runner, tick=tick, ranks=ranks, record_budget=record
            )
            sweep = {s: [0.0] * len(args.layers) if s == "model" else swept[s] for s in parsed}
    finally:
        tick.close()
    return _report(model, adapter, runner, args, reading, every, list(parsed), measures, kv_bytes, sweep)


def _checked(
    model: nn.Module, adapter: Adapter, args: EvaluateArguments, protocol: Any, given_layers: Any, other: bool
) -> tuple[EvaluateArguments, Protocol, dict[str, Variant], running.OutputRunner]:
    """The checks of evaluate's protocol and variants, before any work: the arguments (``max_length`` a
    window's under ``chunks``/``stride``), the protocol, the parsed variants by spec and the runner."""
    reading = parse_protocol(protocol)
    if reading.window is not None:
        check_window(reading, running.model_context(model))
        args = args._replace(max_length=reading.window)
    if reading.prefill is not None and reading.prefill + 2 > args.max_length:
        raise ArgumentError(
            f"protocol {reading.text} prefills {reading.prefill} tokens and scores from token "
            f"{reading.prefill + 1} on, so it needs max_length ≥ {reading.prefill + 2} "
            f"(got {args.max_length}); raise max_length or use a shorter prefill"
        )
    parsed = {p.text: p for p in (parse_variant(v) for v in args.variants)}
    if reading.prefill is None:
        refuse_cache_transforms(list(parsed.values()), reading.text)
    refuse_layers_with_mixed(list(parsed.values()), given_layers)
    check_stats(model, adapter, args.stats, allow_other_weights=other)
    for p in parsed.values():
        if isinstance(p, MixedSpec):
            p.check_layers(adapter.layout().num_layers)
    runner = running.runner_for(model, reading, adapter)
    if reading.kind in ("stride", "prefill") and runner.kind != "causal-lm":
        raise ArgumentError(
            f"protocol {reading.text} scores next-token predictions, and {type(model).__name__} makes none; "
            "evaluate an encoder with protocol='documents' or 'chunks:W'"
        )
    return args, reading, parsed, runner


def _variants(
    base: nn.Module,
    plans: dict[str, VariantPlan],
    batches: list[Batch],
    runner: running.OutputRunner,
    ranks: running.Ranks,
    tick: running.Progress,
    keep: int,
    args: EvaluateArguments,
    prefill: int | None,
) -> tuple[dict[str, dict[str, float]], dict[str, tuple[float, int | None]]]:
    """The reference pass (its outputs kept while they fit ``keep`` bytes), then each variant measured
    against it: the measures by spec (``"model"``: the reference's own), and each variant's KV bytes per
    token and constant bytes (a quantizer's; else None). A plan measured is dropped, but for the sweep."""
    reference, kept = running.reference_pass(base, batches, runner, ranks, keep=keep, tick=tick)
    measures, kv_bytes = {"model": running.summary(reference)}, {}
    for spec, plan in list(plans.items()):
        running.reset_retention([plan])  # a merge's bytes: the retention of these prefills, on every rank
        with plan.running(base, prefill=running.prefilling(runner)) as variant:
            named = (plan.spec, _changed(plan))
            totals = running.measure(base, variant, batches, kept, runner, ranks, tick=tick, named=named)
        running.sum_retention([plan], ranks)
        measures[spec] = running.summary(totals)
        kv_bytes[spec] = (
            plan.kv_bytes_per_token(args.dtype, prefill),
            plan.constant_bytes if plan.quantizers else None,
        )
        if not args.per_layer:
            del plans[spec]  # measured: only the sweep would need its fits again
    return measures, kv_bytes


def _report(
    model: nn.Module,
    adapter: Adapter,
    runner: running.OutputRunner,
    args: EvaluateArguments,
    reading: Protocol,
    every: list[Batch],
    specs: list[str],
    measures: dict[str, dict[str, float]],
    kv_bytes: dict[str, tuple[float, int | None]],
    sweep: dict[str, list[float]] | None,
) -> EvaluationReport:
    """The report of the measured variants, in the order given; a spec ``allocate`` chose on these
    tokens is flagged (a warning, and the report's list)."""
    size, lm = torch.empty((), dtype=args.dtype).element_size(), runner.kind == "causal-lm"
    num_layers = adapter.layout().num_layers
    layer_bytes = [size * layer_kv_elements(adapter, i) for i in range(num_layers)]
    kv_bytes["model"] = sum(layer_bytes), None
    stats, tokens_seen = args.stats, running.fingerprint(every)
    shares = chosen_shares(specs, tokens_seen, every, stream=reading.kind != "documents", layers=args.layers)
    leaked = [s for s in specs if shares.get(s, 0.0) >= FLAG_SHARE]
    if leaked:
        said = ", ".join(f"{s} (on {shares[s]:.0%} of them)" for s in leaked)
        warnings.warn(
            f"{said} was chosen by headwidget.allocate on these tokens, so its numbers here are not "
            "held-out; evaluate it on other text (the report's table marks it †)",
            stacklevel=3,
        )
    return EvaluationReport(
        model=str(getattr(model.config, "name_or_path", "") or type(model).__name__),
        kind=runner.kind,
        variants=specs,
        measures={s: measures[s] for s in specs},
        kv_bytes_per_token={s: kv_bytes[s][0] for s in specs},
        tokens=predicted_count(every) if lm else sum(int(b.attention_mask.sum()) for b in every),
        sequences=sum(int((b.attention_mask.sum(-1) > 0).sum()) for b in every),
        fingerprint=tokens_seen,
        dtype=str(args.dtype),
        layers=args.layers,
        per_layer=sweep,
        per_layer_measure=None if sweep is None else ("delta_nll" if lm else "hidden_rel_error"),
        calibration={} if stats is None else {"tokens": stats.tokens, "kinds": list(stats.kinds)},
        constant_bytes={s: c for s in specs if (c := kv_bytes[s][1]) is not None},
        num_layers=num_layers,
        converted_kv_bytes=sum(layer_bytes[i] for i in args.layers),
        chosen_on_these_tokens=leaked,
        protocol=reading.text,
    )


def _changed(plan: VariantPlan) -> str:
    """What a plan changes, for a message: ``layers [0, 1] converted, K/V of layers [2] quantized``."""
    parts = []
    if plan.fits:
        parts.append(f"layers {sorted(plan.fits)} converted")
    quantized = sorted(layer for q in plan.quantizers for layer in q.layers)
    if quantized:
        parts.append(f"K/V of layers {quantized} quantized")
    return ", ".join(parts) or "nothing changed"
