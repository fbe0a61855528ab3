"""How much memory :func:`~headwidget.healing.heal` allocates on the model's device, and the refusal when it
is too much.

The estimate is of the bytes a run allocates beyond the ``model`` and ``variant`` it is given (what
:func:`estimate_healing` returns, and what ``max_memory`` bounds), as the sum of:

- ``teacher``: the original's working copy in the training dtype, when the model is held in another
  (none otherwise: the teacher shares every weight with the model);
- ``student``: the trained copy's own tensors: the converted layers' attention modules (every other
  tensor is the teacher's, :func:`~headwidget.healing._student.trained_copy`; ``trainable="all"``: the
  whole model), and the trained parameters in float32 (float64 for a float64 model);
- ``optimizer``: AdamW's two moments of every trained parameter;
- ``references``: the original's predicted-row logits of every evaluation batch, kept for the run;
- ``work``: the largest of one training step, one evaluation point, the installing of the trained
  parameters (a converted layer's weights read in float64, one layer at a time) and the end (where the
  model is held in another dtype than the one trained in, the healed model's copy of the frozen weights;
  else it takes the variant's).

  A **step** holds the trained parameters' gradients, the teacher's and the student's last hidden states,
  the student's saved activations — per layer from the first converted one on (layers before it record
  nothing: no gradient reaches them), for a Llama-shaped layer ``3·D + 3·F + 2·Q + 2·G·d_h`` elements a
  token (hidden size D, MLP width F, query width Q, G KV heads of d_h), two D of them in float32 under
  autocast; with ``checkpoint=True`` only each layer's input, and in the backward one layer's activations
  at a time —, the backward pass's gradients of one layer's activations, and the chunked head's work
  (:mod:`headwidget.healing._chunked`: the hidden rows and their gradient, five float32 chunks of logits
  for ``kd``, three for ``lm``).

  An **evaluation point** holds one forward of the variant with its whole logits and the rows picked
  from them, then the measures' float32 chunks.

The coefficients were fitted to the CPU allocator's peak on Llama-family models
(``tests/healing/test_heal_memory.py`` keeps the measured peak within 0.8–1.2 of the estimate).
Under ``distributed="fsdp"`` the teacher's and the student's frozen weights are sharded over the ranks
(a copy of each's shards, plus two layers gathered at a time), and a step's activations are those of
the rank's share of the batch; with ``micro_batch_size``, those of one micro-batch.

Example:
    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2))
    >>> need = HealingMemory.of("mqa", model, batch_size=4, max_length=32)
    >>> sorted(need.parts), need.total == sum(need.parts.values())
    (['optimizer', 'references', 'student', 'teacher', 'work'], True)
    >>> with_checkpoints = HealingMemory.of("mqa", model, batch_size=4, max_length=32, checkpoint=True)
    >>> with_checkpoints.phases["step"] < need.phases["step"]
    True
"""

from __future__ import annotations

from collections.abc import Iterable
from contextlib import suppress
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headwidget.adapters import Adapter, adapter_for
from headwidget.analysis.variants import MixedSpec, VariantSpec, parse_variant, uniform_parts
from headwidget.capture.memory import format_bytes, refuse_over_budget
from headwidget.errors import UnsupportedModelError
from headwidget.evaluation import AppliedVariant
from headwidget.evaluation.measures import CHUNK_BYTES
from headwidget.evaluation.running import checked_dtype, forward_working_bytes, output_vocab
from headwidget.healing import _chunked
from headwidget.healing._trainable import parse_trainable

__all__ = ["HealingMemory", "autocast_dtype", "check_healing_budget", "estimate_healing"]


def _numel(tensors: Iterable[torch.Tensor]) -> int:
    return sum(t.numel() for t in {id(t): t for t in tensors}.values())


def _float_dtype(model: nn.Module) -> torch.dtype:
    return next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)


def _attention_tensors(adapter: Adapter, layers: Iterable[int]) -> list[torch.Tensor]:
    """The tensors of the modules a conversion of ``layers`` writes into: each layer's attention and
    the modules holding its head projections."""
    out: list[torch.Tensor] = []
    for layer in layers:
        attention = adapter.attention_at(layer)
        modules = [attention]
        with suppress(UnsupportedModelError):  # a family that does not say where its heads are (MLA)
            modules += list(adapter.head_projections(attention).modules())
        for m in modules:
            out += [*m.parameters(), *m.buffers()]
    return out


def _kv_heads(adapter: Adapter, layer: int) -> int:
    """The KV slots ``layer`` holds (read from where its heads sit, not from its weights)."""
    return int(adapter.head_projections(adapter.attention_at(layer)).k.index.shape[0])


def _kv_tensors(adapter: Adapter, layers: Iterable[int]) -> int:
    """Elements of the K/V rows (and biases) of ``layers``: what ``trainable="kv"`` trains (merged heads
    count once per KV slot, an upper bound)."""
    d = adapter.layout().hidden_size
    total = 0
    for layer in layers:
        p = adapter.head_projections(adapter.attention_at(layer))
        for part in (p.k, p.v):
            rows = part.index.numel()
            total += rows * d + (rows if getattr(part.module, "bias", None) is not None else 0)
    return total


@dataclass(frozen=True)
class _Conversion:
    """What the estimate needs of the variant: its converted layers and their K/V widths."""

    layers: list[int]
    kv_heads: int
    own: int  # elements of the converted modules, as the variant holds them
    trained_kv: int  # elements of the K/V sources

    @classmethod
    def of(cls, variant: nn.Module | str, model: nn.Module, adapter: Adapter) -> _Conversion:
        lay = adapter.layout()
        if isinstance(variant, nn.Module):
            info = getattr(variant, "headwidget_variant", None)
            if not isinstance(info, AppliedVariant):
                raise TypeError("variant must be a model built by headwidget.apply, or a variant spec")
            layers = sorted(info.fits)
            theirs = adapter_for(variant)
            heads = min((_kv_heads(theirs, x) for x in layers), default=0)
            own = _numel(_attention_tensors(theirs, layers))
            return cls(layers, heads or lay.num_kv_heads, own, _kv_tensors(theirs, layers))
        parsed = parse_variant(variant)
        if isinstance(parsed, MixedSpec):
            layers = sorted(x for ls in parsed.converted.values() for x in ls)
        else:
            layers = [] if parsed.quantizer or parsed.unchanged else list(range(lay.num_layers))
        kept = [p for p in uniform_parts(parsed) if p.mechanism != "model" and not p.quantizer]
        heads = lay.num_kv_heads
        for p in kept:
            heads = min(heads, _kept_heads(p, lay.num_kv_heads))
        own = _numel(_attention_tensors(adapter, layers))
        kv = _kv_tensors(adapter, layers) * heads // max(1, lay.num_kv_heads)
        return cls(layers, heads, own, kv)


def _kept_heads(spec: VariantSpec, heads: int) -> int:
    if spec.mechanism == "mqa":
        return 1
    if spec.mechanism == "gqa" and spec.arg is not None:
        return min(heads, spec.arg)
    return heads


@dataclass(frozen=True)
class HealingMemory:
    """The parts (bytes) of a healing run's peak on the model's device; see the module docstring.
    ``phases`` holds the two candidates for ``work``: ``step`` and ``evaluation``."""

    parts: dict[str, int]
    phases: dict[str, int]
    device: torch.device

    @property
    def total(self) -> int:
        return sum(self.parts.values())

    @classmethod
    def of(
        cls,
        variant: nn.Module | str,
        model: nn.Module,
        *,
        method: str = "kd",
        trainable: str = "kv",
        batch_size: int = 8,
        max_length: int = 512,
        eval_tokens: int = 4096,
        per_layer: bool = True,
        cast: torch.dtype | None = None,
        checkpoint: bool = False,
        micro_batch_size: int | None = None,
        world: int = 1,
        sharded: bool = False,
        device: torch.device | None = None,
        adapter: Adapter | None = None,
    ) -> HealingMemory:
        adapter = adapter or adapter_for(model)
        lay = adapter.layout()
        mode, rank = parse_trainable(trainable)
        conversion = _Conversion.of(variant, model, adapter)
        own_dtype = _float_dtype(model)
        m_b = own_dtype.itemsize
        t_b = 8 if m_b == 8 else 4  # the trained parameters and the optimizer
        h_b = m_b if cast is not None else t_b  # what the teacher and the student hold their weights in
        a_b = cast.itemsize if cast is not None else h_b  # activations
        n4 = max(h_b, 4)
        total_numel = _numel([*model.parameters(), *model.buffers()])
        d, f = lay.hidden_size, adapter.mlp_width()
        q = lay.num_heads * lay.head_dim
        kv = conversion.kv_heads * (lay.head_dim + lay.value_head_dim)
        vocab = output_vocab(model)

        # ---- persistent: teacher copy, the student's own tensors, the optimizer's moments
        teacher = 0 if m_b == h_b else total_numel * h_b
        trained = conversion.trained_kv
        if mode == "attention":
            trained = conversion.own
        elif mode == "lora":
            per_layer_matrices = 2 * (d + q) + 2 * (d + kv // 2)  # q, o and the K/V rows, in + out
            trained = len(conversion.layers) * int(rank or 1) * per_layer_matrices
        elif mode == "all":
            trained = total_numel + conversion.trained_kv
        student = (total_numel if mode == "all" else conversion.own) * h_b + trained * t_b
        optimizer = 2 * trained * t_b
        if sharded:  # each model's weights sharded over the ranks (the trained copy's own ones too)
            teacher = total_numel * h_b // world
            student = (total_numel * h_b + trained * t_b) // world
            optimizer //= world

        # ---- one training step (this rank's share of the batch, one micro-batch of it at a time)
        rows = max(1, batch_size // world)
        rows = rows if micro_batch_size is None else min(rows, micro_batch_size)
        tokens = rows * max_length
        layer = 2 * d * n4 + (d + 3 * f + 2 * q + kv) * a_b + 4 * lay.num_heads * 4 // 3
        impl = str(getattr(getattr(model, "config", None), "_attn_implementation", None) or "eager")
        if impl == "eager":
            layer += lay.num_heads * max_length * max(a_b, 4) * 5 // 4
        first = min(conversion.layers, default=0) if mode != "all" else 0
        with_grad = lay.num_layers - first
        hidden = tokens * d * a_b
        kept = tokens * (d * a_b if checkpoint else layer)  # what each layer keeps for the backward
        if vocab and method in ("kd", "lm"):
            chunk = _chunked.chunk_rows(tokens, vocab, d) * vocab
            head = (5 * hidden + 5 * chunk * 4) if method == "kd" else (3 * hidden + 3 * chunk * 4)
            if a_b != 4:
                head += chunk * a_b  # the chunk's logits before their float32 copy
        else:
            head = 3 * hidden
        forward_end = with_grad * kept + head
        # the backward: one layer's gradients (and, checkpointed, its activations computed again)
        backward = with_grad * kept + tokens * layer * (17 if checkpoint else 7) // 10 + 2 * hidden
        step = trained * t_b + max(forward_end, backward)
        if sharded:
            step += 2 * (total_numel * h_b // max(1, lay.num_layers))  # two layers gathered at a time

        # ---- one evaluation point: the original's rows kept, one forward of the variant, its measures
        e_length = min(max_length, eval_tokens)
        e_rows = min(batch_size, -(-eval_tokens // e_length))
        e_tokens = e_rows * e_length
        working = forward_working_bytes(model, e_rows, e_length, a_b, scores=impl == "eager", adapter=adapter)
        if vocab:
            logits = e_tokens * vocab * a_b
            measures = 5 * min(e_tokens, max(1, CHUNK_BYTES // (4 * vocab))) * vocab * max(a_b, 4)
            references = eval_tokens * vocab * a_b  # the original's predicted rows, kept for the run
            evaluation = max(working + 2 * logits, logits + measures)
        else:
            references = eval_tokens * d * a_b
            evaluation = e_tokens * d * a_b + working
        if per_layer:
            evaluation += 4 * e_tokens * d * max(a_b, 4)

        # ---- installing the trained parameters: each converted layer's head weights read in float64 in turn
        layer_numel = conversion.own // max(1, len(conversion.layers))
        install = 12 * layer_numel if conversion.layers else 0

        # ---- the end: the healed model takes the variant's frozen tensors, copies where the dtypes differ
        healed = 0 if mode == "all" or h_b == m_b else max(0, total_numel - conversion.own) * h_b

        parts = {
            "teacher": teacher,
            "student": student,
            "optimizer": optimizer,
            "references": references,
            "work": max(step, evaluation, install, healed),
        }
        where = device if device is not None else next(model.parameters()).device
        phases = {"step": step, "evaluation": evaluation, "install": install, "healed": healed}
        return cls(parts, phases, where)


def check_healing_budget(need: HealingMemory, max_memory: int | None) -> None:
    """Refuse ``need`` over the budget with :class:`MemoryBudgetError`, naming what to change.

    >>> need = HealingMemory({"work": 3 * 2**30}, {}, torch.device("cpu"))
    >>> check_healing_budget(need, 4 * 2**30)
    >>> check_healing_budget(need, 2**30)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.MemoryBudgetError: heal would allocate 3.00 GiB on cpu (work 3.00 GiB), over ...
    """
    phases = ", ".join(f"{k} {format_bytes(v)}" for k, v in need.phases.items())
    refuse_over_budget(
        "heal",
        need.total,
        need.device,
        max_memory,
        "Use a smaller batch_size or max_length (a step's activations grow with batch_size × max_length), "
        "checkpoint=True (keeps one layer's activations instead of every layer's), a micro_batch_size "
        "below batch_size (the same steps, fewer windows' activations at a time), fewer eval_tokens, or "
        "raise max_memory= (bytes) if the memory is there.",
        need.parts,
        f"; work is the larger of {phases}" if phases else "",
    )


def autocast_dtype(dtype: torch.dtype | str | None, device: torch.device) -> torch.dtype | None:
    """What :func:`~headwidget.healing.heal` autocasts to for ``dtype`` on ``device``: None for float32
    (no autocast), bfloat16 on CUDA for None."""
    cast = checked_dtype(dtype) if dtype is not None else torch.bfloat16 if device.type == "cuda" else None
    return None if cast == torch.float32 else cast


def estimate_healing(
    variant: nn.Module | str,
    model: nn.Module,
    texts: Any = None,
    *,
    method: str = "kd",
    trainable: str = "kv",
    batch_size: int = 8,
    max_length: int = 512,
    eval_tokens: int = 4096,
    per_layer: bool = True,
    dtype: torch.dtype | str | None = None,
    checkpoint: bool = False,
    micro_batch_size: int | None = None,
    distributed: bool | str = False,
    world_size: int | None = None,
    **ignored: Any,
) -> int:
    """Peak bytes :func:`~headwidget.healing.heal` with these arguments allocates on the model's device
    beyond ``model`` and ``variant`` (the bound it checks against ``max_memory``; module docstring).

    Takes :func:`~headwidget.healing.heal`'s arguments (those the memory does not depend on, such as
    ``tokens``, ``lr`` or ``seed``, are accepted and ignored). ``variant`` may also be a spec
    (``"mqa"``, ``"mla:512@0-15"``): then ``model`` may live on the ``meta`` device, so that a model
    too large for this machine can be sized. With ``distributed``, the bytes of one rank of
    ``world_size`` (default: the initialized process group's size).

    >>> import torch
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> with torch.device("meta"):
    ...     big = LlamaForCausalLM(LlamaConfig(vocab_size=128256, hidden_size=4096,
    ...         intermediate_size=14336, num_hidden_layers=32, num_attention_heads=32,
    ...         num_key_value_heads=8, torch_dtype=torch.bfloat16)).to(torch.bfloat16)
    >>> need = estimate_healing("mqa", big, batch_size=8, max_length=2048, dtype=torch.bfloat16,
    ...                         checkpoint=True)
    >>> 0 < need < 70 * 10**9
    True
    """
    from headwidget.checks import flag, optional_whole_number, whole_number

    batch_size = whole_number("batch_size", batch_size, minimum=1, maximum=1 << 20, hint="windows a step")
    max_length = whole_number("max_length", max_length, minimum=2, maximum=1 << 24, hint="tokens a window")
    eval_tokens = whole_number("eval_tokens", eval_tokens, minimum=2, hint="evaluation tokens")
    per_layer = flag("per_layer", per_layer)
    checkpoint = flag("checkpoint", checkpoint)
    cast = autocast_dtype(dtype, next(model.parameters()).device)
    world = 1
    sharded = distributed == "fsdp"
    if distributed is True or sharded:
        import torch.distributed as dist

        world = dist.get_world_size() if dist.is_available() and dist.is_initialized() else 1
        if world_size is not None:
            world = whole_number("world_size", world_size, minimum=1, maximum=1 << 20, hint="ranks")
    return HealingMemory.of(
        variant,
        model,
        method=method,
        trainable=trainable,
        batch_size=batch_size,
        max_length=max_length,
        eval_tokens=eval_tokens,
        per_layer=per_layer,
        cast=cast,
        checkpoint=checkpoint,
        micro_batch_size=optional_whole_number(
            "micro_batch_size", micro_batch_size, minimum=1, hint="windows run at a time"
        ),
        world=world,
        sharded=sharded,
    ).total
