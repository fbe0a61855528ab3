"""``capture``: run a model over texts with hooks that stream K/V statistics, then remove every hook.

The hooks record the key/value projection outputs (and, on request, the attention input and post-RoPE
keys; with the attention input of a RoPE model also the queries) of each captured layer, select the
non-padding tokens and stage them, on that layer's device; once the last layer of a group has run,
the staged rows of all its layers and kinds are folded into float64 moments in one set of batched
calls (:mod:`headwidget.capture.folds`; the groups and what they hold: :mod:`headwidget.capture.plan`).
The queries' and keys' rotary-pair norm sums are folded layer by layer. The forward pass stops once
the last captured layer's K/V have been recorded (after its attention when post-RoPE keys are
wanted), so the rest of the network (and the LM head) is never computed.

Nothing is changed in the model: hooks are removed on normal exit, on exceptions and on
KeyboardInterrupt, training flags are never touched, and the computation of every layer is the
model's own. The hooks act only in the capture's own forward passes (threads: :func:`capture`; the
dropout of a training-mode model: :mod:`headwidget.capture.dropout`).

:func:`capture` runs in phases: ``_checked`` (arguments, plan, budget), ``_hooked`` (the hooks),
``_stream`` (the batches through the model, :mod:`headwidget.capture.feed`) and ``_finished`` (the
statistics and what they came from).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from headwidget.adapters import Adapter, Tap, adapter_for
from headwidget.adapters.attention_calls import watch_attention_keys
from headwidget.adapters.fingerprint import weight_fingerprint
from headwidget.capture.arguments import CaptureArguments, check_capture_arguments, check_estimate_arguments
from headwidget.capture.dropout import NoDropout, any_training
from headwidget.capture.feed import ModelFeed
from headwidget.capture.folds import StagedFolds
from headwidget.capture.inputs import Batch, length_batches
from headwidget.capture.plan import CapturePlan, FoldShape
from headwidget.capture.tokens import (
    ReservoirStep,
    TokenReservoir,
    TokenSelection,
    narrow_to_selection,
    select_tokens,
)
from headwidget.core.kinds import Kind
from headwidget.errors import (
    CaptureConflictError,
    CaptureInputError,
    NonFiniteActivationError,
    RopeCaptureError,
)
from headwidget.stats import SAMPLE_SEED, KVStats, PlaneNorms, StatsMeta, config_fingerprint

__all__ = ["capture", "estimate"]


class _ForwardDone(Exception):
    """Raised after the last captured layer: the rest of the forward pass is not needed."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__("the capture's forward pass ends after its last captured layer")
        self.recorder = recorder


class _Recorder:
    """Holds the accumulators and the per-forward scratch space of one capture.

    Its hooks act only while :attr:`forwarding` is set, in the thread that created it: during the
    capture's own forward passes. Anything else that runs the model meanwhile passes through them.
    """

    def __init__(
        self,
        adapter: Adapter,
        plan: CapturePlan,
        shapes: list[FoldShape],
        rows: int,
        sample_seed: int = SAMPLE_SEED,
    ) -> None:
        self.adapter = adapter
        self.plan = plan
        self.thread = threading.get_ident()
        self.forwarding = False
        lay = plan.layout
        self.folds = StagedFolds(plan, shapes, rows)
        # the token samples: one reservoir of keys; the rows of every (layer, kind) live in self.folds
        self.reservoir = TokenReservoir(plan.samples, sample_seed) if plan.samples else None
        self.sample_step: ReservoirStep | None = None
        # the rotary-pair norm sums of queries and keys, and the pair dims they gather
        self.plane_norms: dict[int, PlaneNorms] = {}
        self.pair_index: torch.Tensor | None = None
        self.pairs_on: dict[torch.device, torch.Tensor] = {}
        if plan.plane_norms:
            planes = lay.rope.planes()
            for layer, device in zip(plan.layers, plan.devices, strict=True):
                self.plane_norms[layer] = PlaneNorms.empty(
                    heads=lay.num_heads, kv_heads=lay.num_kv_heads, planes=len(planes), device=device
                )
            index = torch.tensor([a for a, _ in planes] + [b for _, b in planes], dtype=torch.long)
            # half-split RoPE on every dim: the planes are the two halves of a head, nothing to gather
            self.pair_index = None if torch.equal(index, torch.arange(lay.head_dim)) else index
        self.parts: dict[int, dict[str, torch.Tensor]] = {layer: {} for layer in plan.layers}
        self.selection: TokenSelection | None = None
        # (what was checked, one name per row; (rows, 2) device flags of the folds), read once per batch
        self.checks: list[tuple[list[str], torch.Tensor]] = []

    def active(self) -> bool:
        """Whether a hook firing now belongs to this capture's own forward pass."""
        return threading.get_ident() == self.thread and self.forwarding

    # ------------------------------------------------------------------ hooks
    def tap_hook(self, layer: int, tap: Tap, complete: frozenset[str] | None = None) -> Any:
        """Record what ``tap`` sees of ``layer``. With ``complete`` (the last layer's slots, when nothing
        it needs comes from inside the attention), the forward ends as soon as they are all recorded:
        the last layer's attention itself is never computed."""
        parts = self.parts[layer]

        def recorded() -> None:
            if complete is not None and complete <= parts.keys():
                self.fold_layer(layer)
                raise _ForwardDone(self)

        if tap.on_input:

            def record_input(module: nn.Module, args: tuple[Any, ...]) -> None:
                if self.active():
                    parts[tap.slot] = args[0]
                    recorded()

            return tap.module.register_forward_pre_hook(record_input)

        def record_output(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if self.active():
                parts[tap.slot] = output[0] if isinstance(output, tuple) else output
                recorded()

        return tap.module.register_forward_hook(record_output)

    def on_post_rope_key(self, layer: int, key: torch.Tensor) -> None:
        b, g, t, d = key.shape
        self.parts[layer]["key_post"] = key.transpose(1, 2).reshape(b, t, g * d)

    def layer_done_hook(self, layer: int, attention: nn.Module) -> Any:
        last = layer == self.plan.layers[-1]

        def layer_done(module: nn.Module, args: tuple[Any, ...], output: Any) -> None:
            if not self.active():
                return
            self.fold_layer(layer)
            if last:
                raise _ForwardDone(self)

        return attention.register_forward_hook(layer_done)

    def forward(self, model: nn.Module, inputs: dict[str, Any], *, no_dropout: bool) -> None:
        """Run ``model(**inputs)`` as this capture's forward pass (hooks active, in this thread)."""
        with ExitStack() as stack:
            if no_dropout:
                stack.enter_context(NoDropout())
            self.forwarding = True
            try:
                model(**inputs)
            except _ForwardDone as done:
                if done.recorder is not self:
                    raise
            finally:
                self.forwarding = False

    # ------------------------------------------------------------------ accumulation
    def fold_layer(self, layer: int) -> None:
        parts = self.parts[layer]
        post = parts.pop("key_post", None)
        attention_input = parts.pop("input", None)
        by_kind = self.adapter.split(parts)
        if layer in self.plane_norms:
            self.fold_plane_norms(layer, self.adapter.split_queries(parts), by_kind["key"])
        if attention_input is not None:
            by_kind["input"] = attention_input
        if "key_post" in self.plan.kinds:
            if post is None:
                raise RopeCaptureError(
                    f"layer {layer}: the attention did not pass its keys through "
                    "transformers.AttentionInterface (a model-local attention function?), so post-RoPE "
                    "keys cannot be captured for this model; use rope='pre'"
                )
            by_kind["key_post"] = post
        parts.clear()
        sel = self.selection
        assert sel is not None
        for kind in self.plan.kinds:
            self.folds.stage(layer, kind, by_kind[kind], sel)
        self.checks.extend(self.folds.fold_layer(layer, sel, self.sample_step))

    def fold_plane_norms(self, layer: int, queries: torch.Tensor, keys: torch.Tensor) -> None:
        """Fold the selected tokens' query and key heads (B, T, heads·d_h) into the layer's pair norms."""
        sel = self.selection
        assert sel is not None
        d = self.plan.layout.head_dim
        q = queries.detach().reshape(-1, queries.shape[-1] // d, d)
        k = keys.detach().reshape(-1, keys.shape[-1] // d, d).to(q.device)
        # the norms of every position are taken, the selected ones summed (all of them: no selection)
        rows = None if sel.count == q.shape[0] else sel.on(q.device)
        pairs = None
        if self.pair_index is not None:
            pairs = self.pairs_on.get(q.device)
            if pairs is None:  # one copy per device, not one per batch
                pairs = self.pairs_on[q.device] = self.pair_index.to(q.device)
        checks: list[torch.Tensor] = []
        self.plane_norms[layer].update(q, k, pairs, rows, checks=checks)
        self.checks.extend(([f"layer {layer} query/key rotary-pair norms"], c.unsqueeze(0)) for c in checks)

    def samples(self) -> dict[tuple[int, Kind], torch.Tensor]:
        """The sampled rows of every (layer, kind), filled slots only, in the reservoir's random order."""
        if self.reservoir is None:
            return {}
        return self.folds.samples(self.reservoir.order(), self.reservoir.filled)

    def check_finite(self) -> None:
        """Raise if anything folded in since the last call was NaN or infinite (one read per device)."""
        checks = [
            (what, flag) for names, flags in self.checks for what, flag in zip(names, flags, strict=True)
        ]
        self.checks = []
        by_device: dict[torch.device, list[int]] = {}
        for i, (_, flag) in enumerate(checks):
            by_device.setdefault(flag.device, []).append(i)
        for indices in by_device.values():
            ok = torch.stack([checks[i][1] for i in indices]).cpu()  # (k, 2): mean, second moments
            if bool(ok.all()):
                continue
            row = int((~ok).any(dim=1).nonzero()[0])
            what = checks[indices[row]][0]
            if not bool(ok[row, 0]):
                raise NonFiniteActivationError(
                    f"{what}: the model produced NaN or infinite activations (typically an fp16 "
                    "overflow). Run the model in bfloat16 or float32, or exclude that layer with layers=[...]"
                )
            raise NonFiniteActivationError(
                f"{what}: activations so large (|x| beyond about 1e19) that their float32 co-moment or "
                "per-head norms overflow to infinity, so no correlation or similarity would be right. "
                "Check the model's weights for that layer, run it in float64, or exclude that layer "
                "with layers=[...]"
            )


def _narrowed(batch: Batch, recorder: _Recorder, *, causal: bool) -> Batch:
    """``batch`` cut to the rows and columns its selected tokens need (a ``max_tokens`` budget that
    ends inside it), the recorder's selection indexed into the cut batch."""
    assert recorder.selection is not None
    b, t = batch.input_ids.shape
    rows, width, recorder.selection = narrow_to_selection(recorder.selection, (b, t), causal=causal)
    if (rows, width) == (b, t):
        return batch
    return Batch(batch.input_ids[:rows, :width], batch.attention_mask[:rows, :width])


def _versions() -> dict[str, str]:
    import transformers

    from headwidget._version import __version__

    return {"headwidget": __version__, "torch": torch.__version__, "transformers": transformers.__version__}


def _model_dtype(model: nn.Module) -> str:
    for p in model.parameters():
        return str(p.dtype).removeprefix("torch.")
    return "float32"


def capture(
    model: nn.Module,
    texts: Any,
    *,
    tokenizer: Any = None,
    layers: Sequence[int] | None = None,
    batch_size: int = 8,
    max_length: int = 512,
    max_tokens: int | None = None,
    rope: str = "pre",
    skip_first_token: bool = False,
    inputs: bool = False,
    cross_layer: Sequence[int] | bool | None = None,
    max_memory: int | None = None,
    samples: int = 0,
    sample_seed: int = SAMPLE_SEED,
    progress: bool = True,
) -> KVStats:
    """Stream key/value statistics of ``model`` over ``texts``.

    Args:
        model: a Hugging Face ``transformers`` model of a supported family (see
            ``headwidget.supported_families()``), on any device or split with ``device_map``.
        texts: a string, a list of strings (needs ``tokenizer``), a LongTensor of token ids, or an
            iterable of dicts with ``input_ids`` and optional ``attention_mask`` (of the same shape;
            a dict with more than ``batch_size`` rows is split). Padding never enters a statistic;
            left padding gets positions counted from each row's first real token (as generation
            does), so left-, right- and unpadded rows give the same statistics. A long string is
            tokenised only as far as ``max_length`` tokens reach.
        layers: layer indices to capture (default: all).
        max_tokens: stop after this many counted tokens (in row order; the batch where the budget ends
            runs only the rows, and in a causal model the positions, that it counts). A list of strings
            is batched by length: the texts the budget reaches, in text order, are grouped into
            batches of rows of similar length (far less padding to compute; the same tokens counted).
        rope: ``"pre"`` (key-projection output), ``"post"`` (the keys attention uses, kind
            ``"key_post"``) or ``"both"``.
        skip_first_token: drop each sequence's first real token (BOS / attention sink).
        inputs: also accumulate the attention input's moments (kind ``"input"``) and, for a model
            with rotary embeddings, the token sums of every rotary pair's 2-norm of the queries and
            keys (:meth:`KVStats.plane_norms <headwidget.stats.KVStats.plane_norms>`), which partial
            RoPE (``rope:r``) ranks the pairs by.
        cross_layer: two or more layers (or ``True`` for all captured: none when one is) whose heads get
            joint statistics, needed to compare heads of different layers.
        max_memory: bytes the capture may allocate per device — statistics, staging and fold buffers,
            one batch's working memory and the forward pass's activations, as :func:`estimate` counts
            them (default: half the free memory). Where the default groups of layers do not fit, fewer
            layers are staged and folded at a time.
        samples: keep a uniform random sample of this many real token rows (float32) of every
            captured (layer, kind), on the layer's device: :meth:`KVStats.samples
            <headwidget.stats.KVStats.samples>`. The same tokens for every (layer, kind); exactly the
            rows that enter the moments (never padding, never a skipped first token). 0: none.
        sample_seed: the seed of the samples' ``torch.Generator`` (``0 ≤ seed < 2**63``; default
            :data:`~headwidget.stats.SAMPLE_SEED`): the same texts, batches and seed give the same
            samples. Captures to be merged should use different seeds (for example the rank).
        progress: show a tqdm bar in tokens/s.

    Returns:
        :class:`~headwidget.stats.KVStats`.

    Raises:
        ArgumentError: an argument of the wrong type or outside its range (a count given as a float,
            a bool or a string, NaN, a huge value; a flag that is not a bool; layers given as a string).
        CaptureInputError: unusable input (a mask of another shape, token ids outside the
            vocabulary, left padding for a model whose forward takes no ``position_ids``...).
        NonFiniteActivationError: a layer's activations (or their float32 second moments) were
            NaN or infinite; the message names the layer and kind.
        CaptureConflictError: another thread switched the model to training mode mid-forward.

    Threads: the hooks act only on this call's own forward passes; forwards of the same model in
    other threads, and other captures of it, pass through untouched. A model in training mode is
    captured without dropout, without changing any training flag.

    Example:
        >>> import torch, headwidget
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> model = GPT2LMHeadModel(GPT2Config(n_layer=2, n_embd=32, n_head=4, vocab_size=50)).eval()
        >>> stats = headwidget.capture(model, torch.randint(0, 50, (3, 20)), progress=False)
        >>> stats.tokens, stats.meta.mechanism
        (60, 'mha')
    """
    adapter = adapter_for(model)
    run = _checked(
        adapter,
        check_capture_arguments(
            adapter,
            layers=layers,
            cross_layer=cross_layer,
            batch_size=batch_size,
            max_length=max_length,
            max_tokens=max_tokens,
            max_memory=max_memory,
            skip_first_token=skip_first_token,
            inputs=inputs,
            progress=progress,
        ),
        rope=rope,
        samples=samples,
        sample_seed=sample_seed,
    )
    batches = length_batches(
        texts,
        tokenizer,
        batch_size=run.args.batch_size,
        max_length=run.args.max_length,
        max_tokens=run.args.max_tokens,
        skip_first_token=run.args.skip_first_token,
    )
    recorder = _Recorder(adapter, run.plan, run.shapes, run.args.batch_size * run.args.max_length, run.seed)
    feed = ModelFeed.of(model)
    with ExitStack() as stack:
        _hooked(stack, model, recorder)
        total = _stream(stack, feed, batches, recorder, run.args)
    return _finished(model, adapter, run, recorder, total)


@dataclass(frozen=True)
class _Run:
    """What :func:`capture` checked and planned before any hook: its arguments, the layers' groups and
    their fold shapes, the samples' seed."""

    args: CaptureArguments
    plan: CapturePlan
    shapes: list[FoldShape]
    seed: int


def _checked(
    adapter: Adapter, args: CaptureArguments, *, rope: str, samples: int, sample_seed: object
) -> _Run:
    """The plan of a capture with ``args`` (the kinds, groups and devices of its layers), checked against
    its memory budget, before any hook or batch."""
    plan = CapturePlan.make(
        adapter,
        layers=args.layers,
        rope=rope,
        inputs=args.inputs,
        cross_layer=args.cross_layer,
        samples=samples,
    )
    seed = sample_seed
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool) or not 0 <= int(seed) < 2**63:
        raise CaptureInputError(f"sample_seed must be an integer with 0 ≤ seed < 2**63, got {seed!r}")
    return _Run(args, plan, plan.check_budget(args.batch_size, args.max_length, args.max_memory), int(seed))


def _hooked(stack: ExitStack, model: nn.Module, recorder: _Recorder) -> None:
    """Install the recorder's hooks on every captured layer, each removed when ``stack`` closes."""
    adapter, plan = recorder.adapter, recorder.plan
    for layer, attention in zip(plan.layers, plan.attention, strict=True):
        taps = list(adapter.taps(attention))
        if "input" in plan.kinds:
            taps.append(adapter.input_tap(attention))
        if plan.plane_norms:
            taps.extend(adapter.query_taps(attention) or [])
        # the last layer's taps end the forward once they have all fired, unless post-RoPE keys
        # (handed over inside the attention) are wanted
        last = layer == plan.layers[-1] and "key_post" not in plan.kinds
        complete = frozenset(tap.slot for tap in taps) if last else None
        for tap in taps:
            stack.callback(recorder.tap_hook(layer, tap, complete).remove)
        stack.callback(recorder.layer_done_hook(layer, attention).remove)
    # Post-RoPE keys come through AttentionInterface; so does the dropout of attention kernels
    # outside torch (flash attention), which the watcher sets to 0 in this capture's forwards.
    impl = getattr(model.config, "_attn_implementation", None) or "eager"
    if "key_post" in plan.kinds or impl not in ("eager", "sdpa"):
        layer_of = {id(m): layer for layer, m in zip(plan.layers, plan.attention, strict=True)}
        stack.enter_context(watch_attention_keys(model, layer_of, recorder.on_post_rope_key, recorder.active))
    stack.enter_context(torch.no_grad())


def _stream(
    stack: ExitStack, feed: ModelFeed, batches: Iterable[Batch], recorder: _Recorder, args: CaptureArguments
) -> int:
    """Run the batches through the hooked model until ``max_tokens`` are counted, folding each batch's
    selected tokens in and checking them finite; the number of tokens counted."""
    from tqdm.auto import tqdm

    bar = stack.enter_context(
        tqdm(total=args.max_tokens, unit="tok", unit_scale=True, disable=not args.progress, desc="capture")
    )
    modules = list(feed.model.modules())
    total = 0
    for number, batch in enumerate(batches):
        if not bool(batch.attention_mask.any()):
            raise CaptureInputError(
                f"batch {number} has no real tokens: its attention_mask is all zero. "
                "Remove empty texts or all-padding batches"
            )
        remaining = None if args.max_tokens is None else args.max_tokens - total
        recorder.selection = select_tokens(
            batch.attention_mask, batch_number=number, skip_first_token=args.skip_first_token, limit=remaining
        )
        if recorder.selection.count == 0:
            continue
        feed.check_ids(batch, number)
        batch = _narrowed(batch, recorder, causal=recorder.adapter.causal)
        count = recorder.selection.count
        if recorder.reservoir is not None:
            recorder.sample_step = recorder.reservoir.step(count)
        call = feed.call(batch, number)
        training = any_training(modules)
        recorder.forward(feed.model, call, no_dropout=training)
        if not training and any_training(modules):
            raise CaptureConflictError(
                f"{type(feed.model).__name__} was switched to training mode while batch {number} ran "
                "through it (by another thread?), so dropout may have entered the statistics. "
                "Capture while nothing switches the model's mode (capture a training-mode model "
                "as it is: its dropout is turned off for the capture alone)"
            )
        recorder.check_finite()
        total += count
        bar.update(count)
        if args.max_tokens is not None and total >= args.max_tokens:
            break
    return total


def _finished(model: nn.Module, adapter: Adapter, run: _Run, recorder: _Recorder, total: int) -> KVStats:
    """The statistics of ``total`` captured tokens: the recorder's moments, samples and pair norms, with
    what they were captured from (model, layers, kinds, fingerprints, versions)."""
    if total == 0:
        raise CaptureInputError(
            "no tokens were captured: every text was empty, or every position padding (or skipped as a "
            "first token); give texts with real tokens"
        )
    cfg: Any = model.config
    plan = run.plan
    meta = StatsMeta(
        model_name=str(getattr(cfg, "name_or_path", "") or ""),
        model_class=type(model).__name__,
        layout=plan.layout,
        layers=plan.layers,
        kinds=plan.kinds,
        tokens=total,
        dtype=_model_dtype(model),
        skip_first_token=run.args.skip_first_token,
        cross_layers=plan.cross_layers,
        config_fingerprint=config_fingerprint(cfg),
        weights_fingerprint=weight_fingerprint(adapter, plan.layers),
        versions=_versions(),
        sample_size=plan.samples,
        sample_seed=run.seed if plan.samples else 0,
    )
    folds = recorder.folds
    return KVStats(meta, folds.moments(), folds.cross_moments(), recorder.samples(), recorder.plane_norms)


def estimate(
    model: nn.Module,
    layers: Sequence[int] | None = None,
    *,
    rope: str = "pre",
    inputs: bool = False,
    cross_layer: Sequence[int] | bool | None = None,
    batch_size: int = 8,
    max_length: int = 512,
    samples: int = 0,
) -> int:
    """Peak bytes a :func:`capture` with these options allocates (all devices together).

    For batches of ``batch_size × max_length`` tokens (every input is cut to that): the float64
    statistics, the buffers the rows are staged and folded in, one kind's rows on their way into
    staging, and the model's forward activations up to the last captured layer (see
    :mod:`headwidget.capture.memory`), and with ``samples=R`` the float32 reservoir of ``R`` rows per
    captured (layer, kind), the rows one batch writes into one and the reservoir's keys on the CPU. The
    model's weights are not included. It bounds the peak; for the Llama family the peak is 0.8 to 1.0
    of it.

    Example:
        >>> from transformers import BertConfig, BertModel
        >>> model = BertModel(BertConfig(hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        ...                              intermediate_size=64))
        >>> estimate(model) > 2 * 2 * 8 * 32 * 32
        True
    """
    adapter = adapter_for(model)
    layers, cross_layer, batch_size, max_length, inputs = check_estimate_arguments(
        adapter,
        layers=layers,
        cross_layer=cross_layer,
        batch_size=batch_size,
        max_length=max_length,
        inputs=inputs,
    )
    plan = CapturePlan.make(
        adapter, layers=layers, rope=rope, inputs=inputs, cross_layer=cross_layer, samples=samples
    )
    return sum(plan.bytes_by_device(batch_size, max_length).values())
