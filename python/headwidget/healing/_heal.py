"""``heal(variant, model, texts)``: train a converted model a little and measure how much it recovers.

The run, in order:

1. **Checks** before any work: ``variant`` must be a copy of ``model`` built by :func:`headwidget.apply`
   (every parameter outside its converted layers equal to ``model``'s), with a conversion to train (a
   K/V quantizer fits no weight, and a conversion that left the model as it was has nothing to recover:
   refused); both models hold their weights (not on the meta device); token ids are in the vocabulary;
   ``max_length`` is within the model's context; the healing and evaluation texts must share no run of
   :data:`~headwidget.healing._data.OVERLAP_TOKENS` tokens.
2. **The untrained point**: the variant as given against the original on the evaluation text (the numbers
   :func:`headwidget.evaluate` gives for the variant's spec on the same tokens and dtype).
3. **Training**: a copy of the variant, its mechanism's own parameters trained
   (:mod:`headwidget.healing._trainable`) with AdamW (β = (0.9, 0.95), no weight decay), a linear warmup
   over the first 10 % of the steps then cosine decay, gradients clipped to norm 1.0. The copy shares
   every tensor the conversion did not change with the original (:mod:`headwidget.healing._student`):
   the frozen weights are in memory once. The loss (:mod:`headwidget.healing._loss`) is the KL of the
   original's next-token distribution to the variant's (``method="kd"``, the original run without
   gradients) or the next-token cross-entropy (``"lm"``); for a language model the head and the loss
   run on chunks of rows of both models' last hidden states (:mod:`headwidget.healing._chunked`): no
   batch's logits are ever whole. ``checkpoint=True`` keeps only each decoder layer's input and
   computes its activations again in the backward pass. ``micro_batch_size`` runs a step's windows
   through the models that many at a time and sums their gradients (each micro-batch's loss weighted by
   its share of the step's predicted tokens) before the one optimizer step: the same step to float
   rounding, with one micro-batch's activations alive. Both models run in eval mode (no dropout), so a
   seed fixes the run: two runs on CPU give bit-identical weights, with or without checkpoints.
4. **Evaluation points** every ``eval_every`` healing tokens and at the end: the curve row and, with
   ``per_layer``, each converted layer's teacher-forced attention-output error.
5. The trained weights are written back (factors multiplied in float64) and the healed copy is returned
   on ``run.model``: the variant's class and structure (its KV-head count, its factors' ranks, its
   partial-RoPE mask), and the variant's own ``requires_grad`` flags and train/eval modes, so it can be
   trained further as the variant could; ``variant`` and ``model`` untouched. Its frozen tensors are the
   variant's own (the same values; no copy is made): training ``run.model`` further changes them in
   ``variant`` too, never in ``model``.

Healing turns gradients on for itself: it may be called under ``torch.no_grad()`` or
``torch.inference_mode()``, which are in force again when it returns.

Memory: the peak the run allocates beyond ``model`` and ``variant`` is estimated before any work
(:func:`~headwidget.healing.estimate_healing`, :mod:`headwidget.healing._memory`) and a run over
``max_memory`` (default: :func:`~headwidget.capture.memory.default_budget` of the model's device) is
refused with :class:`~headwidget.errors.MemoryBudgetError`.

An interrupt (Ctrl-C, the Jupyter stop button) ends the run at the next step boundary and returns it
(``run.stopped_early``), with the model as of the last completed step; a second interrupt stops at once,
still with the weights of the last completed step, and a further one while that point is measured ends
the curve at its last whole point: no interrupt loses the run (one while the run is being made waits
for it). A loss or gradient that is not finite raises :class:`~headwidget.errors.NonFiniteLossError`
naming the step, the run up to the step before on the error (``err.run``).

Under ``torchrun`` (``distributed=True``), the variant's copy is wrapped in ``DistributedDataParallel``:
each rank trains on its share of each global batch (``batch_size`` rows split evenly), DDP averages the
gradients, and every rank evaluates its shard of the evaluation batches, the sums all-reduced, so every
rank returns the same run. ``distributed="fsdp"`` shards the teacher and the trained copy over the ranks
with FSDP2 instead (:mod:`headwidget.healing._sharded`): a model too large for one GPU.
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import InitVar, dataclass, field
from typing import Any

import torch
from torch import nn

from headwidget.adapters import Adapter, adapter_for
from headwidget.capture.inputs import Batch
from headwidget.checks import flag, model_with_weights, optional_whole_number, real_number, whole_number
from headwidget.errors import (
    ArgumentError,
    CaptureInputError,
    HealingInputError,
    NonFiniteLossError,
)
from headwidget.evaluation import AppliedVariant, running
from headwidget.evaluation.measures import predicted_positions
from headwidget.healing._chunked import OutputHead, last_hidden, same_logits
from headwidget.healing._data import (
    OVERLAP_TOKENS,
    TrainingWindows,
    held_out_paragraphs,
    judged_rows,
    overlap_runs,
    stream_fingerprint,
)
from headwidget.healing._layers import AttentionErrors
from headwidget.healing._loss import LOSS_NAMES
from headwidget.healing._memory import HealingMemory, autocast_dtype, check_healing_budget
from headwidget.healing._run import CURVE_MEASURES, HealingRun
from headwidget.healing._sharded import distribution, gather_trained, mesh_device, sharded, shared_module
from headwidget.healing._student import StepLoss, checkpointed, handed_over, trained_copy
from headwidget.healing._trainable import TrainableParts, parse_trainable

__all__ = ["DEFAULT_LR", "heal", "learning_rate"]

#: The peak learning rate ``lr=None`` picks for each ``trainable`` (``lora:r`` as ``"lora"``). For ``kv``,
#: from a sweep on SmolLM2 (8 steps of 4×256 tokens, ΔNLL after): ``mla:128`` +0.144 untrained → +0.114,
#: +0.111, +0.149 at 1e-4, 3e-4, 1e-3; ``mqa`` +6.48 → +6.23, +5.59, +3.42. 3e-4 made no variant worse;
#: a variant with a large damage heals faster at 1e-3 (pass ``lr=``). LoRA's update starts at zero and
#: takes the usual larger rate; training everything takes a smaller one.
DEFAULT_LR = {"kv": 3e-4, "attention": 3e-4, "all": 1e-4, "lora": 1e-3}
WARMUP_SHARE = 0.1
CLIP_NORM = 1.0
BETAS = (0.9, 0.95)


def learning_rate(peak: float, step: int, steps: int) -> float:
    """The learning rate of ``step`` (0-based) of ``steps``: linear warmup over the first 10 % (at least
    one step), then cosine decay that ends above zero.

    >>> [round(learning_rate(1.0, s, 10), 3) for s in range(10)]
    [1.0, 0.976, 0.905, 0.794, 0.655, 0.5, 0.345, 0.206, 0.095, 0.024]
    """
    warmup = max(1, round(WARMUP_SHARE * steps))
    if step < warmup:
        return peak * (step + 1) / warmup
    progress = (step - warmup + 1) / (steps - warmup + 1)
    return peak * 0.5 * (1.0 + math.cos(math.pi * progress))


# ---------------------------------------------------------------------------------------------- checks
def _applied(variant: nn.Module, model: nn.Module) -> AppliedVariant:
    """The :class:`AppliedVariant` of ``variant``, which must be a converted copy of ``model``."""
    for name, value in (("variant", variant), ("model", model)):
        if not isinstance(value, nn.Module):
            raise ArgumentError(
                f"{name} must be a transformers model (an nn.Module), got {type(value).__name__}"
            )
    model_with_weights("variant", variant)
    model_with_weights("model", model)
    info = getattr(variant, "headwidget_variant", None)
    if variant is model or not isinstance(info, AppliedVariant):
        raise HealingInputError(
            "variant is not a converted copy of model: build it with headwidget.apply(model, spec, stats) "
            "and pass that copy as variant, the original as model"
        )
    if info.quantizers:
        raise HealingInputError(
            f"the {info.spec!r} variant fake-quantizes its K/V "
            f"({', '.join(q.spec for q in info.quantizers)}): "
            "a quantizer fits no weight, so healing has nothing to train. Heal the spec without its kv: "
            "parts, then apply the kv: parts to the healed model"
        )
    if info.cache_transforms:
        raise HealingInputError(
            f"the {info.spec!r} variant transforms the cache a prefill builds "
            f"({', '.join(t.spec for t in info.cache_transforms)}): a whole-window forward, as healing "
            "trains and measures, never reads it. Heal the spec without its merge/xkv parts"
        )
    if not info.fits:
        raise HealingInputError(
            f"the {info.spec!r} variant converts no layer: there is nothing to heal; apply a conversion "
            "(mqa, gqa:G, lrkv:r, mla:d_c, rope:r...)"
        )
    if type(variant) is not type(model):
        raise HealingInputError(
            f"variant is a {type(variant).__name__} but model a {type(model).__name__}: variant must be "
            "headwidget.apply(model, ...) of this model"
        )
    adapter = adapter_for(variant)
    names = {id(m): n for n, m in variant.named_modules()}
    converted = tuple(names[id(adapter.attention_at(layer))] + "." for layer in info.fits)
    theirs = dict(model.named_parameters())
    unchanged = all(fit.rope_keep is None for fit in info.fits.values()) and not info.sharing
    for name, p in variant.named_parameters():
        other = theirs.get(name)
        same = (
            other is not None and other.shape == p.shape and other.dtype == p.dtype and torch.equal(other, p)
        )
        if name.startswith(converted):
            unchanged = unchanged and same
        elif not same:
            raise HealingInputError(
                f"variant's {name} differs from model's, outside the layers {sorted(info.fits)} it converts: "
                "variant is not a converted copy of this model (built from another model, or trained "
                "since). Build it with headwidget.apply(model, spec, stats)"
            )
    if unchanged:  # e.g. mqa of a model with one KV head: nothing to recover, nothing to train
        raise HealingInputError(
            f"the {info.spec!r} variant is the model itself: its layers {sorted(info.fits)} hold the model's "
            "own weights (the model already has that mechanism), so healing has nothing to recover. Heal a "
            "conversion that changes the model"
        )
    return info


def _check_ids(model: nn.Module, batches: list[Batch], texts: str) -> None:
    """Token ids outside ``model``'s vocabulary (or negative) refused before any work, naming ``texts``."""
    try:
        running.check_token_ids(model, batches)
    except CaptureInputError as err:
        said = str(err).removeprefix("batch 0: ") if len(batches) == 1 else str(err)
        raise CaptureInputError(f"{texts}: {said}") from None


def _checked_callbacks(callbacks: Any) -> list[Any]:
    if callbacks is None:
        return []
    if isinstance(callbacks, (str, bytes)) or not hasattr(callbacks, "__iter__"):
        raise ArgumentError(
            "callbacks must be a list of TrainerCallback-like objects (e.g. [tracker]), got "
            f"{type(callbacks).__name__}"
        )
    out = list(callbacks)
    for c in out:
        if not any(callable(getattr(c, m, None)) for m in ("on_step_end", "on_train_begin", "on_log")):
            raise ArgumentError(
                f"callbacks: {type(c).__name__} has none of on_train_begin, on_step_end, on_log: pass "
                "objects with the transformers TrainerCallback methods"
            )
    return out


# ---------------------------------------------------------------------------------------------- interrupts
class _Interrupts:
    """SIGINT during healing: the first asks for a stop at the next step boundary; each later one raises
    KeyboardInterrupt at once (a step or a measurement is dropped), except inside an optimizer update or
    while the run is being made (then it is only noted). Installed only in the main thread (other
    threads never receive SIGINT)."""

    def __init__(self) -> None:
        self.requested = 0
        self.updating = False
        self.deferred = False
        self.depth = 0

    def handler(self, _signum: int, _frame: Any) -> None:
        self.requested += 1
        if self.requested > 1:
            if self.updating:
                self.deferred = True
            else:
                raise KeyboardInterrupt

    @contextmanager
    def installed(self) -> Iterator[None]:
        """The handler installed inside (once: an inner ``installed`` keeps the outer one's)."""
        if self.depth or threading.current_thread() is not threading.main_thread():
            yield
            return
        previous = signal.signal(signal.SIGINT, self.handler)
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            signal.signal(signal.SIGINT, previous)

    @contextmanager
    def update(self) -> Iterator[None]:
        self.updating = True
        try:
            yield
        finally:
            self.updating = False


# ---------------------------------------------------------------------------------------------- the run
@dataclass
class _Evaluation:
    """The evaluation batches, the original's cached outputs on them, and how to measure the variant."""

    batches: list[Batch]
    reference: list[running.BatchOutput]
    runner: running.OutputRunner
    ranks: running.Ranks
    layers: list[int]
    per_layer: bool
    autocast: Any
    reference_nll: float = math.nan
    rows: list[dict[str, float]] = field(default_factory=list)
    layer_rows: list[list[float]] = field(default_factory=list)

    def trim(self) -> None:
        """Drop a point an interrupt left half measured (its curve row without its per-layer row)."""
        if self.per_layer and len(self.rows) > len(self.layer_rows):
            del self.rows[len(self.layer_rows) :]

    def point(self, teacher: nn.Module, student: nn.Module, tokens: int, step: int) -> None:
        with torch.no_grad(), self.autocast():
            measures = running.summary(
                running.measure(teacher, student, self.batches, self.reference, self.runner, self.ranks)
            )
        measures["delta_nll"] = measures.get("nll", math.nan) - self.reference_nll
        self.rows.append(
            {"tokens": tokens, "step": step, **{k: measures[k] for k in CURVE_MEASURES[self.runner.kind]}}
        )
        if self.per_layer:
            errors = AttentionErrors(self.layers)
            with (
                self.autocast(),
                running.teacher_forced_sharing(student),
            ):  # share:g readers read their group's K/V
                errors.measure(teacher, student, self.batches)
            if self.ranks.world > 1:
                errors.merge(self.ranks.sum(errors.flat()))
            self.layer_rows.append(errors.values())


def _model_name(model: nn.Module) -> str:
    return str(getattr(getattr(model, "config", None), "name_or_path", "") or type(model).__name__)


@torch.inference_mode(False)  # gradients on, also under no_grad() or inference_mode(): training needs
@torch.enable_grad()  # them; the caller's mode is back when it returns
def heal(
    variant: nn.Module,
    model: nn.Module,
    texts: Any = None,
    *,
    tokenizer: Any = None,
    tokens: int = 65536,
    method: str = "kd",
    trainable: str = "kv",
    lr: float | None = None,
    batch_size: int = 8,
    max_length: int = 512,
    eval_texts: Any = None,
    eval_every: int = 8192,
    eval_tokens: int = 4096,
    protocol: str = "documents",
    per_layer: bool = True,
    seed: int = 0,
    dtype: torch.dtype | str | None = None,
    checkpoint: bool = False,
    micro_batch_size: int | None = None,
    distributed: bool | str = False,
    max_memory: int | None = None,
    progress: bool = True,
    callbacks: Sequence[Any] = (),
) -> HealingRun:
    """Heal ``variant`` (a :func:`headwidget.apply` copy of ``model``) on ``texts`` and measure its
    recovery on ``eval_texts`` (see the module docstring).

    Args:
        variant: the converted model to heal (not changed: a copy is trained).
        model: the original model (the teacher for ``method="kd"``; never changed, never trained).
        texts: healing text, in any form :func:`headwidget.capture` reads (default: the calibration split
            of :func:`headwidget.english_sample`).
        tokenizer: the tokenizer for strings.
        tokens: healing tokens to train on (the run takes whole steps of ``batch_size × max_length``).
        method: ``"kd"`` (distil from ``model``) or ``"lm"`` (next-token loss on ``texts``).
        trainable: ``"kv"``, ``"attention"``, ``"all"`` or ``"lora:r"``
            (:mod:`headwidget.healing._trainable`).
        lr: the peak learning rate (default :data:`DEFAULT_LR` of ``trainable``).
        batch_size, max_length: windows per step and tokens per window (also the evaluation batches).
        eval_texts: held-out text for the curve (default: the evaluation split of ``english_sample``).
        eval_every: healing tokens between evaluation points.
        eval_tokens: real evaluation tokens used at each point.
        protocol: how each point of the curve is measured: ``"documents"`` (each evaluation text its
            own sequence, as :func:`~headwidget.evaluation.evaluate`'s default) or ``"prefill:P"`` (each
            document of at least P + 2 tokens prefills a KV cache with its first P tokens and the rest
            is scored in one forward reading it, as ``evaluate(..., protocol="prefill:P")``). Training
            is the same either way: whole windows.
        per_layer: also measure each converted layer's teacher-forced attention-output error.
        seed: fixes the window order and LoRA's initialization.
        dtype: None: float32 on CPU, bfloat16 autocast on CUDA (trained weights and optimizer in float32
            either way; under autocast the frozen weights stay in the model's dtype, shared with it); or a
            dtype to autocast to (float32: none).
        checkpoint: keep only each decoder layer's input for the backward pass and compute its
            activations again there (one more forward of the layers; a fraction of the memory).
        micro_batch_size: windows a training step runs through the models at a time (default: this
            rank's whole share of ``batch_size``); their gradients are summed into one step of
            ``batch_size`` windows, the same step to float rounding, at the activations of
            ``micro_batch_size × max_length`` tokens. Evaluation points still run ``batch_size`` windows
            a forward (``eval_tokens`` bounds them).
        distributed: ``True``: train with DistributedDataParallel over the initialized
            ``torch.distributed`` group; ``"fsdp"``: shard the models over it with FSDP2.
        max_memory: bytes the run may allocate beyond ``model`` and ``variant`` (default: the default
            budget of the model's device); the estimate is checked before any work.
        progress: show a progress bar over the steps.
        callbacks: objects with transformers ``TrainerCallback`` methods (``on_train_begin``,
            ``on_step_end``, ``on_log``, ``on_train_end``), called with ``model=`` the variant being
            trained; one that sets ``control.should_training_stop`` ends the run after that step.

    Returns:
        :class:`~headwidget.healing.HealingRun`, the healed copy on ``run.model``.

    Raises:
        HealingInputError: ``variant`` is not a converted copy of ``model``; a quantized variant; a
            variant that converts nothing, or whose conversion left the model as it was; ``method="lm"``
            (or any ``"kd"`` of logits) on a model without an LM head; ``tokens`` below one batch;
            ``max_length`` beyond the model's context; healing and evaluation texts that overlap.
        CaptureInputError: token ids of ``texts`` or ``eval_texts`` outside the vocabulary, or negative.
        ArgumentError: an argument of the wrong type or outside its range (an unknown ``method`` or
            ``trainable`` names the accepted ones); a model on the meta device.
        NonFiniteLossError: a loss or gradient that is not finite (the message names the step).
        MemoryBudgetError: the estimate is over ``max_memory`` (the message names ``batch_size``,
            ``max_length``, ``checkpoint`` and ``micro_batch_size``).

    Example:
        >>> import torch, headwidget
        >>> from transformers import LlamaConfig, LlamaForCausalLM
        >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
        ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
        >>> g = torch.Generator().manual_seed(0)
        >>> train = torch.randint(0, 64, (1, 4096), generator=g)
        >>> held = torch.randint(0, 64, (8, 32), generator=g)
        >>> run = heal(headwidget.apply(model, "mqa"), model, train, tokens=2048, batch_size=4,
        ...            max_length=64, eval_texts=held, eval_every=1024, progress=False)
        >>> [row["tokens"] for row in run.curve], run.model.config.num_key_value_heads
        ([0, 1024, 2048], 1)
        >>> run.curve[-1]["kl"] < run.curve[0]["kl"]
        True
    """
    info = _applied(variant, model)
    s = _Settings(
        model,
        adapter_for(model),
        tokens,
        batch_size,
        max_length,
        eval_every,
        eval_tokens,
        seed,
        per_layer,
        progress,
        method,
        trainable,
        lr,
        callbacks,
        distributed,
        dtype,
        checkpoint,
        micro_batch_size,
        protocol,
    )
    check_healing_budget(
        HealingMemory.of(
            variant,
            model,
            method=method,
            trainable=s.trainable,
            batch_size=s.batch_size,
            max_length=s.max_length,
            eval_tokens=s.eval_tokens,
            per_layer=s.per_layer,
            cast=s.cast,
            checkpoint=s.checkpoint,
            micro_batch_size=s.micro_batch_size,
            world=s.ranks.world,
            sharded=s.sharded,
            device=s.device,
            adapter=s.adapter,
        ),
        optional_whole_number("max_memory", max_memory, minimum=1, hint="bytes"),
    )
    every_batch, plan = _texts(model, texts, eval_texts, tokenizer, s)
    training = _prepared(variant, model, info, every_batch, plan, s)

    def finished(stopped: bool) -> HealingRun:
        return _report(training, variant, model, info, every_batch, s, stopped)

    interrupts = _Interrupts()
    with interrupts.installed():  # from the first step to the run returned: no press loses the run
        try:
            stopped = training.run(s.progress, interrupts)
        except _NonFinite as err:
            with interrupts.update():
                run = finished(True)
            raise NonFiniteLossError(str(err), run) from None
        with interrupts.update():  # writing the weights back and making the run: a press waits
            return finished(stopped)


@dataclass
class _Settings:
    """The arguments of :func:`heal` checked, in its signature's order and before any work (each field
    as given, then as checked), and what follows from them: the runner (the model's kind, the device),
    the loss, the ranks, the peak learning rate and the autocast dtype."""

    model: InitVar[nn.Module]
    adapter: Adapter
    tokens: int
    batch_size: int
    max_length: int
    eval_every: int
    eval_tokens: int
    seed: int
    per_layer: bool
    progress: bool
    method: str
    trainable: str
    lr: float | None
    callbacks: Sequence[Any]
    distributed: bool | str
    dtype: torch.dtype | str | None
    checkpoint: bool
    micro_batch_size: int | None
    protocol: Any = "documents"
    mode: str = field(init=False)
    peak: float = field(init=False)
    ranks: running.Ranks = field(init=False)
    sharded: bool = field(init=False)
    runner: running.OutputRunner = field(init=False)
    #: How the curve's points run a batch: :attr:`runner`, or under ``prefill:P`` a prefill and a forward
    eval_runner: running.OutputRunner = field(init=False)
    reading: Any = field(init=False)
    loss_name: str = field(init=False)
    cast: torch.dtype | None = field(init=False)

    def __post_init__(self, model: nn.Module) -> None:
        self.tokens = whole_number("tokens", self.tokens, minimum=1, hint="healing tokens")
        self.batch_size = whole_number(
            "batch_size", self.batch_size, minimum=1, maximum=1 << 20, hint="windows a step"
        )
        self.max_length = whole_number(
            "max_length", self.max_length, minimum=2, maximum=1 << 24, hint="tokens a window"
        )
        self.eval_every = whole_number(
            "eval_every", self.eval_every, minimum=1, hint="healing tokens between evaluations"
        )
        self.eval_tokens = whole_number("eval_tokens", self.eval_tokens, minimum=2, hint="evaluation tokens")
        self.seed = whole_number("seed", self.seed, minimum=0, maximum=2**63 - 1)
        self.per_layer, self.progress = flag("per_layer", self.per_layer), flag("progress", self.progress)
        if self.method not in ("kd", "lm"):
            raise ArgumentError(
                f"method={self.method!r} is not one of 'kd' (distil the original's next-token distributions; "
                "an encoder: its last hidden states) or 'lm' (next-token cross-entropy on the texts)"
            )
        self.mode, rank = parse_trainable(self.trainable)
        self.trainable = self.mode if rank is None else f"lora:{rank}"
        lr = self.lr
        self.peak = (
            DEFAULT_LR[self.mode]
            if lr is None
            else real_number("lr", lr, above=0.0, maximum=10.0, hint="peak learning rate")
        )
        self.callbacks = _checked_callbacks(self.callbacks)
        self.ranks, self.sharded = distribution(self.distributed)
        if self.batch_size % self.ranks.world:
            raise ArgumentError(
                f"batch_size={self.batch_size} does not split evenly over {self.ranks.world} ranks: give a "
                f"multiple of {self.ranks.world} (each rank trains on batch_size / world windows a step)"
            )
        self.runner = running.OutputRunner.for_model(model, adapter=self.adapter)
        loss_name = LOSS_NAMES.get((self.method, self.runner.kind))
        if loss_name is None:
            raise HealingInputError(
                f"method='lm' needs next-token predictions, and {type(model).__name__} has no language-model "
                "head; heal an encoder with method='kd' (the MSE of its last hidden states)"
            )
        self.loss_name, context = loss_name, running.model_context(model)
        if context is not None and self.max_length > context:
            raise HealingInputError(
                f"max_length={self.max_length} is longer than the model's context of {context} positions; "
                f"give max_length ≤ {context}"
            )
        if self.sharded:  # the sharded models run on this rank's GPU (NCCL) or where the model is (gloo)
            self.runner = running.OutputRunner(self.runner.kind, mesh_device(self.runner.device))
        self.reading = running.parse_protocol(self.protocol)
        prefill = self.reading.prefill
        if self.reading.kind not in ("documents", "prefill") or (
            prefill is not None and self.runner.kind != "causal-lm"
        ):
            raise ArgumentError(
                f"heal measures its curve under protocol='documents' or 'prefill:P' (a causal LM's), not "
                f"{self.reading.text!r} on a {self.runner.kind} model: evaluate the healed run.model under "
                "another protocol"
            )
        if prefill is not None and prefill + 2 > self.max_length:
            raise ArgumentError(
                f"protocol={self.reading.text!r} scores the tokens after a prefill of {prefill}: give "
                f"max_length ≥ {prefill + 2}"
            )
        self.eval_runner = (
            self.runner
            if prefill is None
            else running.PrefillRunner(self.runner.kind, self.runner.device, prefill)
        )
        self.cast = autocast_dtype(self.dtype, self.device)
        self.checkpoint = flag("checkpoint", self.checkpoint)
        share = self.batch_size // self.ranks.world
        self.micro_batch_size = optional_whole_number(
            "micro_batch_size",
            self.micro_batch_size,
            minimum=1,
            maximum=share,
            hint=f"windows run at a time, at most the {share} windows of a step"
            + ("" if self.ranks.world == 1 else " on each rank"),
        )

    @property
    def device(self) -> torch.device:
        return self.runner.device

    def autocast(self) -> Any:
        return nullcontext() if self.cast is None else torch.autocast(self.device.type, dtype=self.cast)


def _texts(
    model: nn.Module, texts: Any, eval_texts: Any, tokenizer: Any, s: _Settings
) -> tuple[list[Batch], TrainingWindows]:
    """Every rank's evaluation batches and the healing windows, checked: ids in the vocabulary, no run of
    :data:`OVERLAP_TOKENS` tokens in both (``None``: the English sample's splits)."""
    from headwidget.texts import english_sample

    if (texts is None or eval_texts is None) and tokenizer is None:
        raise ArgumentError(
            "texts=None and eval_texts=None mean the English sample's calibration and evaluation splits, "
            "which are strings: pass tokenizer=..., or give both texts and eval_texts as token ids"
        )
    if eval_texts is None:
        eval_texts = english_sample(split="evaluation")
    elif not isinstance(eval_texts, (str, list, tuple, torch.Tensor)):
        eval_texts = list(eval_texts)  # dict batches from an iterator: read twice below
    shortest = 2 if s.runner.kind == "causal-lm" else 1
    documents = running.evaluation_batches(
        eval_texts,
        tokenizer,
        batch_size=s.batch_size,
        max_length=s.max_length,
        max_tokens=s.eval_tokens,
        min_tokens=shortest,
    )
    _check_ids(model, documents, "eval_texts")
    every_batch = documents
    if s.reading.prefill is not None:  # the documents of at least P + 2 tokens, right-padded past P
        every_batch = running.protocol_batches(
            model,
            eval_texts,
            tokenizer,
            s.reading,
            batch_size=s.batch_size,
            max_length=s.max_length,
            max_tokens=s.eval_tokens,
            min_tokens=shortest,
        )
        if not every_batch:
            raise HealingInputError(
                f"no evaluation text has the {s.reading.prefill + 2} tokens protocol={s.reading.text!r} "
                "needs (a prefill and two scored): give longer eval_texts or a shorter prefill"
            )
    judged = documents
    if s.max_length < OVERLAP_TOKENS:  # windows shorter than a run: judge the texts they come from
        longer = running.evaluation_batches(
            eval_texts,
            tokenizer,
            batch_size=s.batch_size,
            max_length=OVERLAP_TOKENS,
            max_tokens=s.eval_tokens * math.ceil(OVERLAP_TOKENS / s.max_length),
            min_tokens=1,
        )
        judged = judged_rows(documents, longer)
    if texts is None:
        texts = held_out_paragraphs(english_sample(split="calibration"), tokenizer, judged)
    stream = running.token_stream(texts, tokenizer, None)
    if stream.numel():
        _check_ids(model, [Batch(stream.reshape(1, -1), torch.ones(1, stream.numel()))], "texts")
    plan = TrainingWindows.of(
        stream, max_length=s.max_length, batch_size=s.batch_size, tokens=s.tokens, seed=s.seed
    )
    shared = overlap_runs(plan.windows.reshape(-1), judged)
    if shared:
        raise HealingInputError(
            f"the healing and evaluation texts overlap: {shared} run(s) of {OVERLAP_TOKENS} tokens of the "
            "evaluation texts (a text shorter than that: whole) also occur in the healing text, so the "
            "curve would not be held out. Heal on other text (english_sample(split='calibration') for "
            "healing, split='evaluation' for the curve)"
        )
    return every_batch, plan


def _prepared(
    variant: nn.Module,
    model: nn.Module,
    info: AppliedVariant,
    every_batch: list[Batch],
    plan: TrainingWindows,
    s: _Settings,
) -> _Training:
    """The teacher and the trained student (sharded under FSDP), the reference pass and the untrained
    point measured: the training, ready to run."""
    train_dtype = _train_dtype(variant)
    copy_dtype = train_dtype if s.cast is None else next(model.parameters()).dtype
    teacher = running.working_copy(model, copy_dtype, s.adapter)
    layers = sorted(info.fits)
    converted = running.converted_modules(variant, adapter_for(variant), layers)
    held = next(teacher.parameters()).dtype
    student = trained_copy(variant, teacher, converted, held, share=s.mode != "all").eval()
    heads = _chunked_heads(teacher, student, s.loss_name, plan, next(teacher.parameters()).device)
    # under FSDP every rank runs every evaluation batch (a sharded forward is a collective)
    judge = running.ONE_PROCESS if s.sharded else s.ranks
    pair = (teacher, student)
    if s.sharded:
        pair = (
            _sharded_copy(teacher, [], s.ranks, s.device),
            _sharded_copy(student, layers, s.ranks, s.device),
        )
    evaluation = _Evaluation(
        judge.shard(every_batch), [], s.eval_runner, judge, layers, s.per_layer, s.autocast
    )
    with torch.no_grad(), s.autocast():
        reference, kept = running.reference_pass(pair[0], evaluation.batches, s.eval_runner, judge)
    assert kept is not None
    evaluation.reference, evaluation.reference_nll = kept, running.summary(reference).get("nll", math.nan)
    evaluation.point(*pair, 0, 0)

    parts = _installed(student, s.trainable, s.seed, train_dtype)
    skeleton, origin = None, teacher
    if s.sharded:  # train a sharded copy; the unsharded student receives its trained weights at the end
        skeleton, teacher, student = student, pair[0], _sharded_copy(student, layers, s.ranks, s.device)
        if heads is not None:
            heads = (heads[0].on(teacher), heads[1].on(student))
    return _Training(student, teacher, parts, plan, evaluation, s, heads, skeleton, origin, variant)


def _train_dtype(variant: nn.Module) -> torch.dtype:
    """The dtype the student trains in: the variant's when float32 or float64, else float32."""
    dtype = next(variant.parameters()).dtype
    return dtype if dtype in (torch.float32, torch.float64) else torch.float32


def _report(
    training: _Training,
    variant: nn.Module,
    model: nn.Module,
    info: AppliedVariant,
    every_batch: list[Batch],
    s: _Settings,
    stopped: bool,
) -> HealingRun:
    """The run: the healed model (the variant's dtype, modes and structure) and its curve."""
    healed = training.finish()
    variant_dtype = next(variant.parameters()).dtype
    if variant_dtype != _train_dtype(variant):
        healed = healed.to(variant_dtype)
    modes = {name: m.training for name, m in variant.named_modules()}
    for name, m in healed.named_modules():  # trained in eval mode; back to the variant's modes
        m.training = modes.get(name, m.training)
    evaluation, plan = training.evaluation, training.plan
    return HealingRun(
        model_name=_model_name(model),
        spec=info.spec,
        kind=s.runner.kind,
        method=s.method,
        loss=s.loss_name,
        trainable=s.trainable,
        lr=s.peak,
        batch_size=s.batch_size,
        max_length=plan.max_length,
        tokens=s.tokens,
        seed=s.seed,
        dtype=str(s.cast or _train_dtype(variant)),
        steps=len(training.losses),
        tokens_seen=training.seen,
        reference_nll=evaluation.reference_nll,
        kv_bytes_per_token=float(info.kv_bytes_per_token(variant_dtype)),
        layers=evaluation.layers,
        curve=list(evaluation.rows),
        per_layer=list(evaluation.layer_rows) if s.per_layer else None,
        losses=list(training.losses),
        healing_fingerprint=stream_fingerprint(plan.windows.reshape(-1)),
        evaluation_fingerprint=running.fingerprint(every_batch),
        evaluation_tokens=sum(int(b.attention_mask.sum()) for b in every_batch),
        stopped_early=stopped,
        protocol=s.reading.text,
        model=healed,
    )


class _NonFinite(Exception):
    """A loss or gradient norm that is not finite (turned into NonFiniteLossError with the run so far)."""


def _installed(student: nn.Module, trainable: str, seed: int, dtype: torch.dtype) -> TrainableParts:
    """The trained parameters of ``student`` (:class:`TrainableParts`), each held in ``dtype`` (float32
    masters where the student holds its frozen weights in bfloat16 or float16, under autocast)."""
    parts = TrainableParts.install(student, trainable, seed=seed)
    for p in parts.parameters():
        if p.dtype != dtype:
            p.data = p.data.to(dtype)
    return parts


def _sharded_copy(
    model: nn.Module, layers: list[int], ranks: running.Ranks, device: torch.device
) -> nn.Module:
    """``model`` sharded with FSDP2 (:mod:`headwidget.healing._sharded`): its decoder layers, and the
    attention of each of ``layers``, FSDP units."""
    shards = shared_module(model)
    adapter = adapter_for(shards)
    units = [adapter.attention_at(layer) for layer in layers]
    units += running.LayerBlocks.of(shards, adapter).modules(shards)
    return sharded(shards, units, ranks.world, device)


def _chunked_heads(
    teacher: nn.Module, student: nn.Module, loss_name: str, plan: TrainingWindows, device: torch.device
) -> tuple[OutputHead, OutputHead] | None:
    """The teacher's and the student's heads when the loss can run them in chunks: a language model's
    loss, and a head that gives the model's own logits on a few tokens of the healing text (else None:
    the whole logits are formed)."""
    if loss_name not in ("kd", "lm"):
        return None
    heads = OutputHead.of(teacher), OutputHead.of(student)
    if heads[0] is None or heads[1] is None:
        return None
    probe = plan.windows[:1, : min(8, plan.max_length)]
    if not same_logits(
        teacher, heads[0], running.forward_kwargs(teacher, Batch(probe, torch.ones_like(probe)), device)
    ):
        return None
    return heads[0], heads[1]


def _micro_batches(batch: Batch, size: int | None, loss_name: str) -> list[tuple[Batch, float]]:
    """``batch`` in runs of ``size`` windows (None: whole), each with its share of the batch's loss: the
    tokens its loss is a mean over (predicted tokens; real tokens for ``hidden_mse``) ÷ the batch's.

    >>> ids = torch.arange(12).reshape(3, 4)
    >>> mask = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 1], [1, 1, 0, 0]])
    >>> [(tuple(b.input_ids.shape), w) for b, w in _micro_batches(Batch(ids, mask), 2, "kd")]
    [((2, 4), 0.8571428571428571), ((1, 4), 0.14285714285714285)]
    """
    rows = int(batch.input_ids.shape[0])
    if size is None or size >= rows:
        return [(batch, 1.0)]
    parts = [
        Batch(batch.input_ids[a : a + size], batch.attention_mask[a : a + size]) for a in range(0, rows, size)
    ]
    if loss_name == "hidden_mse":
        counts = [int(p.attention_mask.sum()) for p in parts]
    else:
        counts = [int(predicted_positions(p.attention_mask).sum()) for p in parts]
    total = max(1, sum(counts))
    return [(p, n / total) for p, n in zip(parts, counts, strict=True)]


def _global_mean(value: float, ranks: running.Ranks) -> float:
    """The mean of ``value`` over the ranks (every rank's loss is a mean over as many tokens)."""
    return ranks.sum([value])[0] / ranks.world


def _call(callback: Any, name: str, *args: Any, **kwargs: Any) -> None:
    method = getattr(callback, name, None)
    if callable(method):
        method(*args, **kwargs)


@dataclass
class HealingArguments:
    """What the ``args`` of a callback holds during healing (a small stand-in for ``TrainingArguments``)."""

    learning_rate: float
    per_device_train_batch_size: int
    max_steps: int
    output_dir: str | None = None
    logging_steps: int = 1


def _callback_state(
    callbacks: Sequence[Any], peak: float, batch_size: int, steps: int
) -> tuple[Any, Any, Any]:
    """``(state, control, args)`` for the callbacks: transformers' own TrainerState and TrainerControl."""
    if not callbacks:
        return _Step(), None, None
    from transformers.trainer_callback import TrainerControl, TrainerState

    return TrainerState(max_steps=steps), TrainerControl(), HealingArguments(peak, batch_size, steps)


@dataclass
class _Step:
    global_step: int = 0


@dataclass
class _Training:
    """The training loop of one healing run (see the module docstring)."""

    student: nn.Module
    teacher: nn.Module
    parts: TrainableParts
    plan: TrainingWindows
    evaluation: _Evaluation
    s: _Settings
    heads: tuple[OutputHead, OutputHead] | None = None
    skeleton: nn.Module | None = None  # under FSDP: the unsharded student the trained weights go to
    origin: nn.Module | None = None  # the unsharded teacher, whose tensors the student borrows
    variant: nn.Module | None = None  # the variant given, whose tensors the healed model keeps
    losses: list[float] = field(default_factory=list)
    seen: int = 0

    def __post_init__(self) -> None:
        self.params = [p for p in self.student.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(self.params, lr=self.s.peak, betas=BETAS, weight_decay=0.0)
        self.objective = StepLoss(self.student, self.s.loss_name, self.heads, whole=self.skeleton is not None)
        self.trained: nn.Module = self.objective
        if self.s.ranks.world > 1 and self.skeleton is None:
            from torch.nn.parallel import DistributedDataParallel

            # what is not trained is left alone: DDP would broadcast rank 0's copy into every rank's
            # tensors, which are the model's own
            left = [n for n, p in self.objective.named_parameters() if not p.requires_grad]
            left += [n for n, _ in self.objective.named_buffers()]
            DistributedDataParallel._set_params_and_buffers_to_ignore_for_model(self.objective, left)
            self.trained = DistributedDataParallel(self.objective)
        blocks = running.LayerBlocks.of(self.student, adapter_for(self.student)).modules(self.student)
        self.restore = checkpointed(blocks) if self.s.checkpoint else lambda: None
        self.state, self.control, self.arguments = _callback_state(
            self.s.callbacks, self.s.peak, self.plan.batch_size, self.plan.steps
        )

    def target(self, batch: Batch) -> torch.Tensor | None:
        """What the student is compared with on ``batch``: the teacher's last hidden states (an encoder,
        or a chunked head), its logits, or nothing (``lm``); the teacher run without gradients."""
        if self.s.loss_name == "lm":
            return None
        with torch.no_grad():
            if self.s.loss_name == "hidden_mse":
                return last_hidden(self.teacher(**running.forward_kwargs(self.teacher, batch, self.s.device)))
            if self.heads is not None:
                return self.objective.hidden(self.teacher, batch, self.s.device)
            return self.teacher(**running.forward_kwargs(self.teacher, batch, self.s.device)).logits

    def loss(self, batch: Batch) -> torch.Tensor:
        """This rank's loss on ``batch``."""
        with self.s.autocast():
            target = self.target(batch)
            kwargs = self.objective.kwargs(batch, self.s.device)
            ids, mask = batch.input_ids.to(self.s.device), batch.attention_mask.to(self.s.device)
            return self.trained(kwargs, target, ids, mask)

    def step(self, step: int) -> float:
        """One optimizer step; the global mean loss. Raises _NonFinite before changing any weight."""
        batch = self.plan.batch(step, self.s.ranks.rank, self.s.ranks.world)
        parts = _micro_batches(batch, self.s.micro_batch_size, self.s.loss_name)
        *earlier, (last, last_weight) = parts
        local: torch.Tensor | float = 0.0  # this rank's loss of the earlier micro-batches, on the device
        # share:g readers read their group's K/V also where the student's body runs without its own
        # forward (the chunked head) and where checkpoints compute a layer again in the backward pass
        with running.teacher_forced_sharing(self.student):
            for part, weight in earlier:  # their gradients are reduced with the last micro-batch's
                loss = self.loss(part) * weight
                local = local + loss.detach()
                with self._no_sync():
                    loss.backward()
            loss = self.loss(last) * last_weight  # (a weight of 1 changes no bit)
            # the loss is read once a step, as the ranks' mean, before the backward that reduces their
            # gradients: every rank stops at the same step (an earlier part's gradients are dropped too)
            value = _global_mean(float(local + loss.detach()), self.s.ranks)
            if not math.isfinite(value):
                raise self._non_finite(f"the healing loss is {value}", step)
            loss.backward()
        norm = float(torch.nn.utils.clip_grad_norm_(self.params, CLIP_NORM))
        if not math.isfinite(norm):
            raise self._non_finite(f"the gradient norm is {norm} (loss {value:.4g})", step)
        return value

    def _non_finite(self, what: str, step: int) -> _NonFinite:
        """The error of a step whose ``what`` is not finite; its gradients dropped."""
        self.optimizer.zero_grad(set_to_none=True)
        return _NonFinite(
            f"{what} at step {step + 1} of {self.plan.steps}: training stopped there, and the run up to "
            "the step before is on this error (err.run, its model with the last good weights). Lower lr, "
            "or heal in float32 (dtype=torch.float32)"
        )

    def _no_sync(self) -> Any:
        """DistributedDataParallel's ``no_sync``, for a micro-batch before a step's last one (its gradients
        are reduced once, with the last); nothing for a model that does not reduce them."""
        no_sync = getattr(self.trained, "no_sync", None)
        return nullcontext() if no_sync is None else no_sync()

    def update(self, step: int) -> None:
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(self.s.peak, step, self.plan.steps)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def run(self, progress: bool, interrupts: _Interrupts) -> bool:
        """Train every step (or until interrupted); whether it stopped early. ``interrupts`` must be
        installed around it (and around what makes the run of it: see :func:`heal`)."""
        for c in self.s.callbacks:
            _call(c, "on_train_begin", self.arguments, self.state, self.control, model=self.student)
        bar = running.Progress(self.plan.steps, progress, desc="heal", unit="step")
        stopped = False
        try:
            with interrupts.installed():
                for step in range(self.plan.steps):
                    try:
                        value = self.step(step)
                    except KeyboardInterrupt:
                        self.optimizer.zero_grad(set_to_none=True)
                        stopped = True
                        break
                    with interrupts.update():
                        self.update(step)
                    self.losses.append(value)
                    self.seen += self.plan.tokens_per_step
                    bar(1, loss=f"{value:.4f}")
                    try:
                        stopped = self.after_step(step, value) or bool(interrupts.requested)
                        stopped = stopped or interrupts.deferred
                        if stopped or step + 1 == self.plan.steps or self.due():
                            self.evaluation.point(self.teacher, self.student, self.seen, step + 1)
                    except KeyboardInterrupt:
                        self.evaluation.trim()
                        stopped = True
                    if stopped:
                        break
        finally:
            bar.close()
        if stopped and self.evaluation.rows[-1]["step"] != len(self.losses):
            try:
                self.evaluation.point(self.teacher, self.student, self.seen, len(self.losses))
            except KeyboardInterrupt:  # a further press: the curve ends at its last whole point
                self.evaluation.trim()
        return stopped

    def due(self) -> bool:
        """Whether the last step crossed a multiple of ``eval_every`` healing tokens."""
        return self.seen // self.s.eval_every > (self.seen - self.plan.tokens_per_step) // self.s.eval_every

    def after_step(self, step: int, value: float) -> bool:
        """The callbacks of a finished step; whether one asked to stop."""
        self.state.global_step = step + 1
        if not self.s.callbacks:
            return False
        logs = {"loss": value, "learning_rate": learning_rate(self.s.peak, step, self.plan.steps)}
        for c in self.s.callbacks:
            _call(c, "on_log", self.arguments, self.state, self.control, logs=logs)
            _call(c, "on_step_end", self.arguments, self.state, self.control, model=self.student)
        return bool(self.control.should_training_stop)

    def finish(self) -> nn.Module:
        """Write the trained weights back and call ``on_train_end``; the healed model, whose frozen tensors
        are the variant's (:func:`~headwidget.healing._student.handed_over`)."""
        self.restore()
        self.restore = lambda: None
        if self.skeleton is not None:  # FSDP: the trained weights gathered into the unsharded student
            gather_trained(self.student, self.skeleton)
            self.student = self.skeleton
        if self.parts.installed:
            self.parts.write_back()
            self.student.headwidget_variant = self.parts.healed_variant()  # type: ignore[assignment]
            for c in self.s.callbacks:
                _call(c, "on_train_end", self.arguments, self.state, self.control, model=self.student)
        assert self.origin is not None and self.variant is not None
        return handed_over(self.student, self.origin, self.variant)
