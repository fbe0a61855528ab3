"""The per-layer sweep: each variant applied to one layer at a time, reusing the original's hidden states.

For layer ``ℓ`` only layers ``ℓ..L−1`` (and the head) are computed: the original model's output of layer
``ℓ − 1`` is recorded once per batch and replayed (:class:`~headwidget.evaluation._layers.Replay`) in
place of layers ``0..ℓ − 1`` of a copy whose layer ``ℓ`` is converted (the copy shares every other
parameter with the original). So a sweep of L layers × V variants costs about ``V·(L + 1)/2`` forwards
(plus one recording forward per batch) instead of ``V·L``.

Batches are processed in chunks whose recorded hidden states fit :data:`RECORD_BUDGET` bytes; each
converted (variant, layer) copy is built once per chunk (it copies one block), and the quantizers' cells
share one copy of the model per chunk, their :class:`Replay` modules put in and taken out per cell.

K/V quantizers (``kv:int``, ``kv:cq``; :mod:`headwidget.evaluation._quantize`) fit the same scheme: their
copy shares every parameter (no weight changes), only layer ``ℓ``'s K/V are fake-quantized while it
runs (under ``prefill:P``: its prefilled cache quantized), and the replayed layers ``0..ℓ − 1`` are the
original's, as for a conversion. A cross-layer group (``share``, ``merge``, ``xkv``;
:class:`~headwidget.evaluation._plan.GroupCell`) is one cell: measured once, with the layers before its
first one replayed, and its number given to every layer of the group.

Under ``prefill:P`` (:class:`~headwidget.evaluation._prefill.PrefillRunner`) each batch runs two forwards,
both recorded; a replayed block returns the output of the forward in progress
(:class:`~headwidget.evaluation._layers.ReplayFeed`).

The measure per (variant, layer) is ``ΔNLL = nll(variant at ℓ) − nll(original)`` over the same
predicted tokens (language models), or the last hidden state's relative error (encoders).

:func:`swap_sweep` is the same idea around a variant instead of the original: every plan it measures
equals a ``current`` plan (a mixed spec) on the layers before its own layer ``ℓ``, so the current plan's
output of layer ``ℓ − 1`` is recorded once per batch and replayed, and each plan runs layers ``ℓ..L−1``
only, its cross-layer groups there included (``share`` readers, ``merge``/``xkv`` transforms; a group
may not straddle ``ℓ``). It gives each plan's prediction totals against the original's outputs (given):
KL(original ‖ plan), NLL, top-1, as :func:`~headwidget.evaluation.allocate` refines on.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from headwidget.adapters import adapter_for
from headwidget.analysis.variant_fits import LayerFit
from headwidget.capture.inputs import Batch
from headwidget.evaluation._apply import build_variant, shared_copy
from headwidget.evaluation._cache_transforms import CacheTransform, QuantizedCache, transforming_prefill
from headwidget.evaluation._distributed import ONE_PROCESS, Ranks
from headwidget.evaluation._inputs import predicted_count
from headwidget.evaluation._layers import LayerBlocks, Replay, ReplayFeed
from headwidget.evaluation._outputs import BatchOutput, OutputRunner, raise_non_finite
from headwidget.evaluation._plan import GroupCell, VariantPlan
from headwidget.evaluation._prefill import PrefillRunner
from headwidget.evaluation._quantize import KVQuantizer
from headwidget.evaluation._sharing import SharedKV
from headwidget.evaluation.measures import PredictionTotals, chunk_rows, work_dtype

__all__ = ["RECORD_BUDGET", "layer_sweep", "swap_sweep"]

#: Bytes of recorded hidden states held at once (the batches are processed in chunks under it).
RECORD_BUDGET = 2 * 2**30
F64 = torch.float64


def _nll_sum(out: BatchOutput) -> float:
    """Summed next-token cross-entropy of a batch's predicted rows: per row in float32 (float64 for
    float64 logits), summed in float64, in chunks of rows."""
    assert out.targets is not None
    values, targets = out.values, out.targets
    work, step = work_dtype(values), chunk_rows(values.shape[-1])
    total = 0.0
    for start in range(0, int(targets.numel()), step):
        rows = slice(start, start + step)
        nll = torch.nn.functional.cross_entropy(values[rows].to(work), targets[rows], reduction="none")
        total += float(nll.to(F64).sum())
    return total


def _chunks(batches: Sequence[Batch], per_token: int, budget: int) -> list[list[Batch]]:
    chunks: list[list[Batch]] = [[]]
    used = 0
    for batch in batches:
        size = batch.input_ids.numel() * per_token
        if chunks[-1] and used + size > budget:
            chunks.append([])
            used = 0
        chunks[-1].append(batch)
        used += size
    return chunks


@dataclass
class _Sums:
    """Float64 sums of one (variant, layer) cell: NLL, or squared error and reference norm."""

    a: float = 0.0
    b: float = 0.0


#: What one variant does to one layer alone: a fitted conversion, a quantizer, a cross-layer group, or
#: nothing.
Cell = LayerFit | KVQuantizer | GroupCell | None


@contextmanager
def _cell(
    base: nn.Module,
    spec: str,
    layer: int,
    cell: LayerFit | KVQuantizer | GroupCell,
    shared: nn.Module | None = None,
    *,
    prefill: bool = False,
) -> Iterator[nn.Module]:
    """The model of one (variant, layer) cell: layer ``layer`` converted, its K/V quantized inside
    (in ``shared``, a :func:`shared_copy` of ``base`` that the cells reuse, when given; under
    ``prefill``, its prefilled cache), or the cell's group converted."""
    if isinstance(cell, GroupCell):
        with cell.running(base, spec, prefill=prefill) as variant:
            yield variant
    elif isinstance(cell, KVQuantizer):
        variant = shared_copy(base) if shared is None else shared
        if prefill:
            with transforming_prefill(variant, [QuantizedCache(cell, [layer])]):
                yield variant
        else:
            with cell.active(variant, [layer]):
                yield variant
    else:
        yield build_variant(base, spec, {layer: cell}, share=True)


@contextmanager
def _replaying(blocks: LayerBlocks, variant: nn.Module, layer: int, slot: list[object]) -> Iterator[None]:
    """Inside, the blocks of layers ``0..layer − 1`` of ``variant`` return ``slot[0]`` (put back on exit);
    a :class:`ReplayFeed` there moves on at every forward of ``variant``."""
    container = blocks.container(variant)
    replaced = [(i, container[i]) for i in blocks.index[:layer]]
    for i, block in replaced:
        container[i] = Replay(block, slot)

    def advance(_m: nn.Module, _a: object) -> None:
        if isinstance(slot[0], ReplayFeed):
            slot[0].next_forward()

    handle = variant.register_forward_pre_hook(advance)
    try:
        yield
    finally:
        handle.remove()
        for i, block in replaced:
            container[i] = block


def _feed(recorded: list[object], layer: int, blocks: int, forwards: int) -> object:
    """What the replayed blocks before ``layer`` return for one batch: the recorded output of layer
    ``layer − 1``, or, for a batch of several forwards, a :class:`ReplayFeed` of it per forward."""
    if forwards == 1:
        return recorded[layer - 1]
    return ReplayFeed([recorded[f * blocks + layer - 1] for f in range(forwards)])


@torch.no_grad()
def layer_sweep(
    base: nn.Module,
    batches: Sequence[Batch],
    cells: Mapping[str, Mapping[int, Cell]],
    layers: Sequence[int],
    runner: OutputRunner,
    *,
    tick: Callable[[int], None] = lambda n: None,
    record_budget: int = RECORD_BUDGET,
    measure: str = "delta_nll",
    ranks: Ranks = ONE_PROCESS,
) -> dict[str, list[float]]:
    """Per variant, one number per layer of ``layers`` (see the module docstring).

    ``cells[spec][layer]`` is what the variant does to that layer alone: a fitted conversion
    (:class:`LayerFit`), a quantizer (:class:`KVQuantizer`, fitted for that layer), or None or missing
    (a layer the variant leaves as it is: 0, with no forward run). ``tick(n)`` is called after every n
    forwards; at most ``record_budget`` bytes of recorded hidden states are held at once (but always
    one batch's). The result has the specs of ``cells``, in order. ``measure="kl"`` (language models)
    gives each cell's mean KL(original ‖ variant) per predicted token instead of its ΔNLL. The sums
    are summed over ``ranks`` (each passed its own shard of the batches) before any number is taken.
    """
    if measure not in ("delta_nll", "kl") or (measure == "kl" and runner.kind != "causal-lm"):
        raise ValueError(f"measure must be 'delta_nll' or, for a language model, 'kl'; got {measure!r}")
    kl = {spec: {layer: PredictionTotals() for layer in layers} for spec in cells} if measure == "kl" else {}
    specs = list(cells)
    quantized = any(isinstance(c, KVQuantizer) for row in cells.values() for c in row.values())
    prefill = isinstance(runner, PrefillRunner)
    forwards = 2 if prefill else 1
    adapter = adapter_for(base)
    blocks = LayerBlocks.of(base, adapter)
    lay = adapter.layout()
    element = next(base.parameters()).element_size()
    per_token = element * lay.hidden_size * len(blocks.index)
    sums = {spec: {layer: _Sums() for layer in layers} for spec in specs}
    reference = _Sums()
    for chunk in _chunks(batches, per_token, record_budget):
        recorded: list[list[object]] = []
        originals: list[BatchOutput | None] = []  # the original's outputs, where a measure reads them
        for batch in chunk:
            sink: list[object] = []
            with blocks.recording(base, sink):
                out = runner(base, batch)
            recorded.append(sink)
            originals.append(out if kl or runner.kind != "causal-lm" else None)
            if runner.kind == "causal-lm":
                reference.a += _nll_sum(out)
            tick(1)
            del out  # not held through the next forward
        shared = shared_copy(base) if quantized else None  # for every quantizer cell of the chunk
        for spec in specs:
            for layer in layers:
                what = cells[spec].get(layer)
                if what is None or (isinstance(what, GroupCell) and layer != _first_of(what, layers)):
                    continue  # a group is measured at its first layer
                start = min(what.layers) if isinstance(what, GroupCell) else layer
                slot: list[object] = [None]
                with (
                    _cell(base, spec, layer, what, shared, prefill=prefill) as variant,
                    _replaying(blocks, variant, start, slot),
                ):
                    cell = sums[spec][layer]
                    for b, batch in enumerate(chunk):
                        if start > 0:
                            slot[0] = _feed(recorded[b], start, len(blocks.index), forwards)
                        out = runner(variant, batch)
                        if not out.finite():
                            with _cell(base, spec, layer, what, prefill=prefill) as fresh:
                                what_ran = (
                                    f"only layers {what.layers} converted"
                                    if isinstance(what, GroupCell)
                                    else f"only layer {layer} converted"
                                )
                                raise_non_finite(fresh, batch, runner.device, spec, what_ran)
                        ref = originals[b]
                        if kl:
                            assert out.targets is not None and ref is not None
                            kl[spec][layer].add_rows(ref.values, out.values, out.targets)
                        elif runner.kind == "causal-lm":
                            cell.a += _nll_sum(out)
                        else:
                            assert ref is not None
                            real = batch.attention_mask.bool().to(runner.device)
                            diff = (out.values.to(F64) - ref.values.to(F64))[real]
                            cell.a += float((diff * diff).sum())
                            cell.b += float((ref.values.to(F64)[real] ** 2).sum())
                        tick(1)
                        del out, ref  # not held through the next forward
                    del variant
    counted = _Sums()
    counted.a = predicted_count(list(batches))
    ranks.merge(
        [
            reference,
            counted,
            *(c for row in sums.values() for c in row.values()),
            *(t for row in kl.values() for t in row.values()),
        ]
    )

    def measured(spec: str, layer: int) -> int:
        """The layer whose sums hold ``layer``'s cell (a group's first layer)."""
        what = cells[spec].get(layer)
        return _first_of(what, layers) if isinstance(what, GroupCell) else layer

    if kl:
        return {
            spec: [
                kl[spec][measured(spec, layer)].kl if cells[spec].get(layer) is not None else 0.0
                for layer in layers
            ]
            for spec in specs
        }
    if runner.kind == "causal-lm":
        tokens = counted.a
        base_nll = reference.a / tokens

        def delta(spec: str, layer: int) -> float:
            if cells[spec].get(layer) is None:
                return 0.0
            return sums[spec][measured(spec, layer)].a / tokens - base_nll

        return {spec: [delta(spec, layer) for layer in layers] for spec in specs}

    def error(spec: str, layer: int) -> float:
        cell = sums[spec][measured(spec, layer)]
        if cells[spec].get(layer) is None:
            return 0.0
        return (cell.a / cell.b) ** 0.5 if cell.b > 0 else float("nan")

    return {spec: [error(spec, layer) for layer in layers] for spec in specs}


def _first_of(group: GroupCell, layers: Sequence[int]) -> int:
    """The first of ``layers`` in ``group`` (where the sweep measures the group)."""
    return next(layer for layer in layers if layer in group.layers)


K = TypeVar("K", bound=Hashable)


@contextmanager
def _running_from(plan: VariantPlan, base: nn.Module, layer: int, *, prefill: bool) -> Iterator[nn.Module]:
    """``plan`` on ``base`` for layers ``layer..L−1`` only (the earlier ones are replayed, so their fits,
    quantizers and cross-layer groups are left out: a quantizer or a group checks that every layer it
    holds ran). A cross-layer group may not straddle ``layer``."""
    fits = {ell: fit for ell, fit in plan.fits.items() if ell >= layer}
    variant = build_variant(base, plan.spec, fits, share=True) if fits else shared_copy(base)

    def later(groups: list[list[int]], spec: str) -> list[list[int]]:
        kept = [g for g in groups if g[-1] >= layer]
        if any(g[0] < layer for g in kept):
            raise ValueError(f"{spec}: a group of {plan.spec} straddles layer {layer}, where the replay ends")
        return kept

    with ExitStack() as stack:
        for shared in plan.cross.sharing:
            groups = later(shared.acting, shared.spec)
            if groups:
                stack.enter_context(SharedKV(shared.spec, groups).active(variant))
        transforms: list[CacheTransform] = []
        for cache in plan.cross.caches:
            groups = later(cache.acting, cache.spec)
            if groups:
                transforms.append(cache.only(groups))
        for quantizer in plan.quantizers:
            later_layers = [ell for ell in quantizer.layers if ell >= layer]
            if later_layers and prefill:
                transforms.append(QuantizedCache(quantizer, later_layers))
            elif later_layers:
                stack.enter_context(quantizer.active(variant, later_layers))
        stack.enter_context(transforming_prefill(variant, transforms))
        yield variant


@torch.no_grad()
def swap_sweep(
    base: nn.Module,
    batches: Sequence[Batch],
    references: Sequence[BatchOutput],
    current: VariantPlan,
    swaps: Mapping[K, tuple[int, VariantPlan]],
    runner: OutputRunner,
    *,
    tick: Callable[[int], None] = lambda n: None,
    record_budget: int = RECORD_BUDGET,
    ranks: Ranks = ONE_PROCESS,
) -> tuple[PredictionTotals, dict[K, PredictionTotals]]:
    """The prediction totals against the original (mean KL(original ‖ plan), NLL, top-1) of ``current``
    and of every plan of ``swaps`` (see the module docstring).

    ``references[b]`` is the original model's output on ``batches[b]``; ``swaps[key] = (layer, plan)``
    is a plan equal to ``current`` on layers ``0..layer − 1`` (the caller's promise: those layers are
    replayed from ``current``). Costs one forward of ``current`` per batch and ``(L − layer)/L`` of one
    per swap and batch. The totals are summed over ``ranks`` (each passed its own shard).
    """
    if runner.kind != "causal-lm":
        raise ValueError(f"swap_sweep measures next-token KL: it takes a causal LM, not {runner.kind}")
    if len(references) != len(batches):
        raise ValueError(f"{len(references)} reference outputs for {len(batches)} batches")
    adapter = adapter_for(base)
    blocks = LayerBlocks.of(base, adapter)
    per_token = next(base.parameters()).element_size() * adapter.layout().hidden_size * len(blocks.index)
    prefill = isinstance(runner, PrefillRunner)
    forwards = 2 if prefill else 1
    whole = PredictionTotals()
    totals = {key: PredictionTotals() for key in swaps}
    done = 0
    for chunk in _chunks(batches, per_token, record_budget):
        refs = references[done : done + len(chunk)]
        done += len(chunk)
        recorded: list[list[object]] = []
        with current.running(base, prefill=prefill) as variant:
            for batch, ref in zip(chunk, refs, strict=True):
                sink: list[object] = []
                with blocks.recording(variant, sink):
                    out = runner(variant, batch)
                if not out.finite():
                    raise_non_finite(variant, batch, runner.device, current.spec, "the current allocation")
                assert out.targets is not None
                whole.add_rows(ref.values, out.values, out.targets)
                recorded.append(sink)
                tick(1)
                del out  # not held through the next forward
        for key, (layer, plan) in swaps.items():
            slot: list[object] = [None]
            with (
                _running_from(plan, base, layer, prefill=prefill) as variant,
                _replaying(blocks, variant, layer, slot),
            ):
                for b, (batch, ref) in enumerate(zip(chunk, refs, strict=True)):
                    if layer > 0:
                        slot[0] = _feed(recorded[b], layer, len(blocks.index), forwards)
                    out = runner(variant, batch)
                    if not out.finite():
                        with plan.running(base, prefill=prefill) as fresh:
                            raise_non_finite(
                                fresh, batch, runner.device, plan.spec, f"swapped at layer {layer}"
                            )
                    assert out.targets is not None
                    totals[key].add_rows(ref.values, out.values, out.targets)
                    tick(1)
                    del out  # not held through the next forward
    ranks.merge([whole, *totals.values()])
    return whole, totals
