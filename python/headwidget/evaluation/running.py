"""Run a model over batches and total its measures: what :func:`~headwidget.evaluation.evaluate`,
:func:`~headwidget.evaluation.allocate` and :func:`headwidget.heal` share.

- **Batches**: :func:`evaluation_batches` (documents), :func:`protocol_batches` (a protocol's windows),
  :func:`token_stream` (every real token as one stream), :func:`forward_kwargs` (a batch as a model's
  arguments), :func:`fingerprint` (which tokens), :func:`check_token_ids` (in the vocabulary).
- **Runs**: :func:`working_copy` (an eval-mode copy; the model itself is never run), an
  :class:`OutputRunner` (:func:`runner_for` a protocol) giving a :class:`BatchOutput` per batch,
  :class:`LayerBlocks` (the decoder layers), :func:`teacher_forced_sharing` (``share:g`` readers),
  :func:`forward_working_bytes` (what one forward holds), :func:`output_vocab` (the logits' width).
- **Totals**: :func:`reference_pass` (the original on every batch, its outputs kept) and :func:`measure`
  (a model against them), summed over the :class:`Ranks` of a distributed run; :func:`summary` reads
  the measures off the totals; a merge's retention (its bytes) summed likewise (:func:`sum_retention`).

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> ids = torch.randint(0, 64, (4, 24), generator=torch.Generator().manual_seed(0))
    >>> batches = evaluation_batches(ids)
    >>> base, runner = working_copy(model, torch.float32), OutputRunner.for_model(model)
    >>> totals, kept = reference_pass(base, batches, runner, ONE_PROCESS)
    >>> same = summary(measure(base, base, batches, kept, runner, ONE_PROCESS))
    >>> totals.tokens, same["kl"], same["top1"], same["nll"] == summary(totals)["nll"]
    (92, 0.0, 1.0, True)
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterable
from typing import Any

import torch
from torch import nn

from headwidget.adapters import Adapter, adapter_for
from headwidget.adapters.fingerprint import weight_fingerprint
from headwidget.capture.inputs import Batch
from headwidget.evaluation._apply import shared_copy
from headwidget.evaluation._arguments import check_token_ids, checked_dtype
from headwidget.evaluation._cache_transforms import MergedCache
from headwidget.evaluation._distributed import ONE_PROCESS, Ranks
from headwidget.evaluation._inputs import (
    Protocol,
    chunk_batches,
    evaluation_batches,
    fingerprint,
    forward_kwargs,
    parse_protocol,
    stride_batches,
    token_stream,
)
from headwidget.evaluation._layers import LayerBlocks, first_tensor
from headwidget.evaluation._model_facts import converted_modules, output_vocab
from headwidget.evaluation._outputs import BatchOutput, OutputRunner, raise_non_finite
from headwidget.evaluation._plan import VariantPlan
from headwidget.evaluation._prefill import PrefillRunner, prefill_batches
from headwidget.evaluation._sharing import teacher_forced_sharing
from headwidget.evaluation.measures import EncoderTotals, PredictionTotals

__all__ = [
    "ONE_PROCESS",
    "BatchOutput",
    "LayerBlocks",
    "OutputRunner",
    "PrefillRunner",
    "Progress",
    "Ranks",
    "Totals",
    "call_facts",
    "check_token_ids",
    "checked_dtype",
    "converted_modules",
    "evaluation_batches",
    "fingerprint",
    "first_tensor",
    "forward_kwargs",
    "forward_working_bytes",
    "measure",
    "model_context",
    "output_vocab",
    "parse_protocol",
    "prefilling",
    "protocol_batches",
    "reference_pass",
    "reset_retention",
    "runner_for",
    "sum_retention",
    "summary",
    "teacher_forced_sharing",
    "token_stream",
    "totals_for",
    "working_copy",
]

#: The running totals of a model's measures: next-token predictions, or an encoder's hidden states.
Totals = PredictionTotals | EncoderTotals


def call_facts(adapter: Adapter, batches: list[Batch], stats: Any) -> dict[str, object]:
    """What a distributed call's ranks must agree on beside its arguments
    (:meth:`~headwidget.evaluation._distributed.Ranks.agree`): its tokens, the model's weights and the
    statistics (their weights and token count)."""
    layers = range(adapter.layout().num_layers)
    held = None if stats is None else (stats.meta.weights_fingerprint, stats.meta.tokens, list(stats.layers))
    return {"texts": fingerprint(batches), "model": weight_fingerprint(adapter, layers), "stats": held}


def working_copy(model: nn.Module, dtype: torch.dtype, adapter: Adapter | None = None) -> nn.Module:
    """An eval-mode copy of ``model``'s modules in ``dtype``, never ``model`` itself (``adapter``:
    ``model``'s, when the caller has it).

    When ``model`` is already in ``dtype`` the copy shares every parameter and buffer with it (no weight
    is copied); its modules are its own, so hooks on them see only this run's forwards and another
    thread switching ``model`` to training mode changes nothing here.
    """
    floating = [p for p in (*model.parameters(), *model.buffers()) if p.is_floating_point()]
    if all(p.dtype == dtype for p in floating):
        return shared_copy(model, adapter).eval()
    return copy.deepcopy(model).to(dtype).eval()


class Progress:
    """A progress bar in forwards, or another ``unit`` (nothing when not ``enabled``); a call advances it
    (and shows ``postfix``), ``grow`` adds to its total."""

    def __init__(self, total: int, enabled: bool, desc: str = "evaluate", unit: str = "fwd") -> None:
        self.bar: Any = None
        if enabled:
            from tqdm.auto import tqdm

            self.bar = tqdm(total=total, unit=unit, desc=desc)

    def __call__(self, n: int, **postfix: str) -> None:
        if self.bar is not None:
            if postfix:
                self.bar.set_postfix(**postfix)
            self.bar.update(n)

    def grow(self, n: int) -> None:
        if self.bar is not None:
            self.bar.total += n
            self.bar.refresh()

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


def totals_for(kind: str) -> Totals:
    """Empty totals for a runner's ``kind`` (``"causal-lm"`` or ``"encoder"``)."""
    return PredictionTotals() if kind == "causal-lm" else EncoderTotals()


def _add(totals: Totals, ref: BatchOutput, var: BatchOutput) -> None:
    if isinstance(totals, PredictionTotals):
        assert var.targets is not None
        totals.add_rows(ref.values, var.values, var.targets)
    else:
        assert var.mask is not None
        totals.add(ref.values, var.values, var.mask)


def summary(totals: Totals) -> dict[str, float]:
    """The measures of ``totals``: NLL, perplexity, KL, top-1 (or the encoder's two)."""
    if isinstance(totals, PredictionTotals):
        return {"nll": totals.nll, "perplexity": totals.perplexity, "kl": totals.kl, "top1": totals.top1}
    return {"hidden_rel_error": totals.hidden_rel_error, "embedding_cosine": totals.embedding_cosine}


def reference_pass(
    model: nn.Module,
    batches: list[Batch],
    runner: OutputRunner,
    ranks: Ranks,
    *,
    keep: float = math.inf,
    tick: Callable[[int], None] | None = None,
) -> tuple[Totals, list[BatchOutput] | None]:
    """``model`` (the original) run on every batch: its own totals, summed over ``ranks``, and its outputs
    while they fit ``keep`` bytes (else None: a measure runs it again). Non-finite outputs are refused,
    naming the first layer that gives them."""
    totals = totals_for(runner.kind)
    kept: list[BatchOutput] | None = []
    width = 0
    for batch in batches:
        out = runner(model, batch)
        if not out.finite():
            raise_non_finite(model, batch, runner.device, "model", "nothing converted")
        _add(totals, out, out)
        width += out.values.numel() * out.values.element_size()
        kept = None if kept is None or width > keep else [*kept, out]
        if tick is not None:
            tick(1)
        del out  # not held through the next batch's forward (the kept list holds it)
    ranks.merge([totals])
    return totals, kept


def measure(
    reference: nn.Module,
    model: nn.Module,
    batches: list[Batch],
    kept: list[BatchOutput] | None,
    runner: OutputRunner,
    ranks: Ranks,
    *,
    tick: Callable[[int], None] | None = None,
    named: tuple[str, str] | None = None,
) -> Totals:
    """``model``'s totals against the ``reference`` model's outputs (``kept``, or run again when None),
    summed over ``ranks``. ``named`` (the spec, what it changes): non-finite outputs are refused with
    them, naming the first layer that gives them."""
    totals = totals_for(runner.kind)
    for b, batch in enumerate(batches):
        ref = kept[b] if kept is not None else runner(reference, batch)
        out = runner(model, batch)
        if named is not None and not out.finite():
            raise_non_finite(model, batch, runner.device, *named)
        _add(totals, ref, out)
        if tick is not None:
            tick(1)
        del ref, out  # not held through the next batch's forwards
    ranks.merge([totals])
    return totals


def _merges(plans: Iterable[VariantPlan]) -> list[MergedCache]:
    return [c for plan in plans for c in plan.cross.caches if isinstance(c, MergedCache)]


def reset_retention(plans: Iterable[VariantPlan]) -> None:
    """Zero what each merge of ``plans`` retains, before the batches whose prefills its bytes count."""
    for cache in _merges(plans):
        cache.retained = {kind: [0, 0] for kind in cache.retained}


def sum_retention(plans: Iterable[VariantPlan], ranks: Ranks) -> None:
    """A merge's retention over every rank's prefills (what its bytes count)."""
    caches = _merges(plans)
    if not caches:
        return
    kinds = sorted(caches[0].retained)
    summed = iter(ranks.sum([v for c in caches for kind in kinds for v in c.retained[kind]]))
    for cache in caches:
        cache.retained = {kind: [round(next(summed)), round(next(summed))] for kind in kinds}


def protocol_batches(
    model: nn.Module,
    texts: Any,
    tokenizer: Any,
    reading: Protocol,
    *,
    batch_size: int,
    max_length: int,
    max_tokens: int | None,
    min_tokens: int,
) -> list[Batch]:
    """The evaluation batches of a protocol: documents, ``chunks:W`` or ``stride:W/S`` windows, or the
    documents of ``prefill:P`` (:func:`~headwidget.evaluation._prefill.prefill_batches`)."""
    if reading.window is None:  # documents, or prefill's documents of at least P + 2 tokens
        prefill = reading.prefill
        documents = evaluation_batches(
            texts,
            tokenizer,
            batch_size=batch_size,
            max_length=max_length,
            max_tokens=max_tokens,
            min_tokens=min_tokens if prefill is None else prefill + 2,
        )
        return documents if prefill is None else prefill_batches(documents, prefill, batch_size=batch_size)
    if reading.stride is None:
        return chunk_batches(
            texts,
            tokenizer,
            reading.window,
            batch_size=batch_size,
            max_tokens=max_tokens,
            context=model_context(model),
        )
    return stride_batches(
        texts,
        tokenizer,
        reading.window,
        reading.stride,
        batch_size=batch_size,
        max_tokens=max_tokens,
        context=model_context(model),
    )


def runner_for(model: nn.Module, reading: Protocol, adapter: Adapter | None = None) -> OutputRunner:
    """How a protocol runs a batch: one forward, or (``prefill:P``) a prefill and a scored forward
    (``adapter``: ``model``'s, when the caller has it)."""
    if reading.prefill is not None:
        return PrefillRunner.for_model(model, reading.prefill, adapter=adapter)
    return OutputRunner.for_model(model, adapter=adapter)


def prefilling(runner: OutputRunner) -> bool:
    """Whether ``runner`` prefills a cache first (the variants' cache transforms then run)."""
    return isinstance(runner, PrefillRunner)


def model_context(model: nn.Module) -> int | None:
    """The positions the model was made for (``config.max_position_embeddings``), None when unknown."""
    context = getattr(getattr(model, "config", None), "max_position_embeddings", None)
    return context if isinstance(context, int) and not isinstance(context, bool) else None


def forward_working_bytes(
    model: nn.Module,
    rows: int,
    length: int,
    dtype_bytes: int,
    *,
    scores: bool,
    adapter: Adapter | None = None,
) -> int:
    """The working memory of one forward of ``model``'s layers under ``no_grad`` (the head left out): about
    ``4·D + 3·F`` elements a token (hidden size D, MLP width F: one layer's residual, normed input and
    MLP activations at a time; ``5·F`` for a GELU written out in Python, GPT-2's ``gelu_new``), and with
    ``scores`` (eager attention, or ``sdpa`` given a padding mask) the (heads × length) attention scores
    and their softmax. Fitted to the CPU allocator's peak on Llama-family and GPT-2 models (``adapter``:
    ``model``'s, when the caller has it).

    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=128, intermediate_size=384,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    >>> forward_working_bytes(model, 4, 64, 4, scores=False)  # (4·128 + 3·384) × 4 bytes × 256 tokens
    1703936
    """
    adapter = adapter or adapter_for(model)
    lay = adapter.layout()
    config = getattr(model, "config", None)
    act = getattr(config, "activation_function", None) or getattr(config, "hidden_act", None)
    mlp = 5 if act in ("gelu_new", "gelu_fast", "quick_gelu") else 3
    per_token = (4 * lay.hidden_size + mlp * adapter.mlp_width()) * dtype_bytes
    if scores:
        per_token += 3 * lay.num_heads * length * max(dtype_bytes, 4) // 2
    return rows * length * per_token
