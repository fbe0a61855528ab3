"""How much memory a capture will allocate, and the default budget it must stay within.

A capture's peak on a device is the sum of these parts, for batches of ``batch_size × max_length``
tokens:

- the float64 accumulators (:func:`accumulator_bytes`);
- the staging buffer of each width of rows and the buffers that fold them
  (:meth:`FoldShape.staging_bytes <headwidget.capture.plan.FoldShape.staging_bytes>`; see
  :mod:`headwidget.capture.plan`), and for cross-layer statistics the same for all cross layers'
  channels side by side;
- one kind's rows on their way into staging (the recorded tensor reshaped, a copy when it is a strided
  slice, and its selected rows in the model's dtype), or on a RoPE model with ``inputs=True`` the
  rotary-pair norms of queries and keys (:func:`plane_norm_update_bytes`), whichever is larger;
- the model's own forward pass up to the last captured layer (:func:`forward_peak_bytes`: one layer's
  activations, the attention mask and, where they are materialised, the attention scores).

With ``samples=R`` the token samples add their float32 reservoir of ``R`` rows per (layer, kind)
(:func:`reservoir_bytes`), the rows one batch writes into one of them or the final reordering of one
(:func:`sample_update_bytes`, in place of the staging rows when larger), and the reservoir's float64
keys on the CPU (:func:`reservoir_key_bytes`).

When ``max_memory`` is not given, the budget is half the free memory of the device
(:func:`default_budget`): on the host, the smaller of the machine's available memory and what the
process's limits leave it (a container's or pod's cgroup, ``RLIMIT_AS``, ``RLIMIT_DATA``).

The parts were checked against the CPU allocator's peak (``torch.profiler`` memory events) for every
supported family: the estimate bounds it, and for the Llama family (the shapes of SmolLM2, Llama 3,
LLaMA 2) the peak is 0.8 to 1.0 of it; ``tests/capture/test_capture_memory.py`` and
``tests/capture/test_capture_hardening.py`` keep checking.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headwidget.core.layout import AttentionLayout
from headwidget.core.memory_limits import memory_headroom
from headwidget.errors import MemoryBudgetError
from headwidget.moments import Moments

__all__ = [
    "ForwardShape",
    "FreeMemory",
    "available_bytes",
    "default_budget",
    "default_budget_source",
    "format_bytes",
    "forward_bytes",
    "forward_peak_bytes",
    "free_memory",
    "plane_norm_update_bytes",
    "refuse_over_budget",
    "reservoir_bytes",
    "reservoir_key_bytes",
    "sample_update_bytes",
]

#: Share of the free memory of a device (:func:`free_memory`) that a capture or an evaluation may take
#: when ``max_memory`` is not given.
DEFAULT_FRACTION = 0.5


def format_bytes(n: float) -> str:
    """Human-readable bytes.

    >>> format_bytes(3 * 2**30)
    '3.00 GiB'
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


@dataclass(frozen=True)
class FreeMemory:
    """What a new allocation on a device can count on now: ``bytes``, and ``limit``, the words of the
    process limit that leaves less than the device has free (None: the device's free memory)."""

    bytes: int
    limit: str | None = None


def _host_available() -> int:
    """The machine's available memory (MemAvailable; elsewhere the free pages)."""
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def free_memory(device: torch.device) -> FreeMemory:
    """Free memory on ``device`` now. CUDA: ``mem_get_info`` (the GPU's own memory, which no host limit
    bounds). Host memory (CPU, MPS): the smaller of the machine's available memory and what the
    process's limits leave it (:func:`~headwidget.core.memory_limits.memory_headroom`: a container's or
    pod's cgroup ``memory.max`` / ``memory.limit_in_bytes``, ``RLIMIT_AS``, ``RLIMIT_DATA``).

    >>> free = free_memory(torch.device("cpu"))
    >>> free.bytes > 0, free.limit in (None, "RLIMIT_AS", "RLIMIT_DATA", "the cgroup's memory.max",
    ...                                "the cgroup's memory.limit_in_bytes")
    (True, True)
    """
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return FreeMemory(int(free))
    available = _host_available()
    headroom = memory_headroom()
    if headroom is not None and headroom.bytes < available:
        return FreeMemory(headroom.bytes, headroom.limit)
    return FreeMemory(available)


def available_bytes(device: torch.device) -> int:
    """The bytes of :func:`free_memory` on ``device``."""
    return free_memory(device).bytes


def default_budget(device: torch.device) -> int:
    """What a capture or an evaluation may allocate on ``device`` when no ``max_memory`` is given: half
    of :func:`free_memory`."""
    return int(available_bytes(device) * DEFAULT_FRACTION)


def default_budget_source(device: torch.device) -> str:
    """Where :func:`default_budget` comes from, in words for a message.

    >>> default_budget_source(torch.device("cpu")).startswith("half the free memory")
    True
    """
    limit = free_memory(device).limit
    return "half the free memory" + (f" under {limit}" if limit else "")


def refuse_over_budget(
    call: str,
    need: int,
    device: torch.device,
    max_memory: int | None,
    advice: str,
    parts: Mapping[str, int] | None = None,
    detail: str = "",
    *,
    allowed: int | None = None,
) -> int:
    """Refuse ``need`` bytes of ``call`` on ``device`` over ``max_memory`` (default: :func:`default_budget`)
    with :class:`~headwidget.errors.MemoryBudgetError`, naming the non-zero ``parts``, where the budget
    comes from and the ``advice`` (what to change); return what the budget leaves over. ``allowed``: the
    budget as the caller already read it (the default budget reads the free memory, which moves).

    >>> refuse_over_budget("heal", 2**30, torch.device("cpu"), 3 * 2**30, "Heal less.") == 2 * 2**30
    True
    >>> refuse_over_budget("heal", 2**30, torch.device("cpu"), 2**20, "Heal less.", {"work": 2**30})
    ... # doctest: +ELLIPSIS
    Traceback (most recent call last):
    headwidget.errors.MemoryBudgetError: heal would allocate 1.00 GiB on cpu (work 1.00 GiB), over the ...
    >>> refuse_over_budget("heal", 2**30 + 5, torch.device("cpu"), 2**30, "Heal less.")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    headwidget.errors.MemoryBudgetError: heal would allocate 1.00 GiB (5 bytes more than allowed) on cpu, ...
    """
    if allowed is None:
        allowed = max_memory if max_memory is not None else default_budget(device)
    if need > allowed:
        source = "max_memory" if max_memory is not None else default_budget_source(device)
        listed = ", ".join(f"{k} {format_bytes(v)}" for k, v in (parts or {}).items() if v) + detail
        needed, budget = format_bytes(need), format_bytes(allowed)
        if needed == budget:  # (over by less than the rounding shows: say by how many bytes)
            needed += f" ({math.ceil(need - allowed):,} bytes more than allowed)"
        raise MemoryBudgetError(
            f"{call} would allocate {needed} on {device}{f' ({listed})' if listed else ''}, "
            f"over the {budget} allowed ({source}). {advice}"
        )
    return allowed - need


def refuse_host_over_budget(call: str, host: Mapping[str, int], advice: str) -> None:
    """Refuse the ``host`` parts (bytes) of ``call``, what it holds in the host's memory while its model is
    on another device (float64 fits), over the host's default budget (:func:`default_budget` of the CPU:
    half the free memory under the process's limit), with :class:`~headwidget.errors.MemoryBudgetError`;
    nothing for none. Every process ``torchrun`` starts on this host (``LOCAL_WORLD_SIZE``) holds as
    much: they are counted together.

    >>> refuse_host_over_budget("evaluate", {}, "Fit less.")
    >>> refuse_host_over_budget("evaluate", {"fitting": 2**60}, "Fit less.")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    headwidget.errors.MemoryBudgetError: evaluate would allocate ... on cpu (fitting ...), over ... Fit less.
    """
    if not host:
        return
    ranks = max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1") or 1))
    parts = {name: ranks * size for name, size in host.items()}
    detail = f", for the {ranks} processes on this host" if ranks > 1 else ""
    refuse_over_budget(call, sum(parts.values()), torch.device("cpu"), None, advice, parts, detail)


def accumulator_bytes(shapes: Iterable[tuple[int, int | None]]) -> int:
    """Bytes of float64 accumulators for (channels, head_dim) shapes."""
    return sum(Moments.nbytes(c, hd) for c, hd in shapes)


def plane_norm_update_bytes(
    rows: int, heads: tuple[int, int], head_dim: int, planes: int, dtype_bytes: int = 4, work_bytes: int = 4
) -> int:
    """Peak working memory of folding ``rows`` token positions into one layer's rotary-pair norm sums.

    ``heads`` is (query heads, KV heads). For the larger (query) side: the queries split out of a
    fused projection's output, the gathered pair dims (in the model's ``dtype_bytes``) and their float
    copy, the pairs' norms and the selected rows of them (``work_bytes``); and the float64 sums.

    >>> plane_norm_update_bytes(rows=100, heads=(4, 2), head_dim=8, planes=4)
    51984
    """
    h, g = heads
    split = rows * h * head_dim * dtype_bytes
    gathered = rows * h * 2 * planes * (dtype_bytes + work_bytes)
    norms = 2 * rows * h * planes * work_bytes + work_bytes * rows
    return split + gathered + norms + 16 * (h + g) * planes


def reservoir_bytes(samples: int, channels: int) -> int:
    """Bytes of one (layer, kind)'s float32 reservoir of ``samples`` token rows.

    >>> reservoir_bytes(samples=100, channels=8)
    3200
    """
    return 4 * samples * channels


def sample_update_bytes(samples: int, rows: int, channels: int, work_bytes: int = 4) -> int:
    """Peak working memory of the token samples of one (layer, kind) with ``channels`` channels.

    The larger of: writing one batch of ``rows`` tokens into the reservoir (at most
    ``min(samples, rows)`` of them enter, gathered in the fold's ``work_bytes`` and as float32, with
    their slot and row indices), and putting the reservoir in its final order (a float32 copy).

    >>> sample_update_bytes(samples=50, rows=100, channels=8)  # writing 50 rows
    4000
    >>> sample_update_bytes(samples=100, rows=10, channels=8)  # reordering the reservoir
    3200
    """
    entering = min(samples, rows)
    write = entering * channels * (work_bytes + 4) + 16 * entering
    return max(write, reservoir_bytes(samples, channels))


def reservoir_key_bytes(samples: int, rows: int) -> int:
    """Bytes on the CPU of the reservoir's float64 keys and one batch's top-k over them and ``rows`` new ones.

    >>> reservoir_key_bytes(samples=100, rows=40)
    5280
    """
    return 8 * (5 * samples + 4 * rows)


#: Activations whose transformers implementation is several elementwise ops (each a temporary as wide as
#: the MLP), not one kernel.
MULTI_OP_ACTIVATIONS = ("gelu_new", "gelu_fast", "gelu_python", "quick_gelu", "gelu_accurate")


@dataclass(frozen=True)
class ForwardShape:
    """What the working memory of a model's forward pass depends on."""

    hidden: int
    ffn: int  # width of the MLP's hidden layer
    heads: int
    kv_heads: int
    head_dim: int
    dtype_bytes: int
    scores: bool  # whether attention may materialise the (heads × T × T) scores
    materialised: bool = True  # whether it certainly does (eager, or sdpa's math kernel)
    mlp_temporaries: int = 3  # MLP-wide tensors alive at once (gated: gate·act, up, product)

    @classmethod
    def of(cls, model: nn.Module, layout: AttentionLayout, mlp_width: int) -> ForwardShape:
        """The shape of ``model``'s forward: ``layout`` and ``mlp_width`` from its adapter
        (:meth:`~headwidget.adapters.Adapter.mlp_width`, which reads the family's own config field)."""
        config: Any = getattr(model, "config", None)
        dtype_bytes, device = 4, torch.device("cpu")
        for p in model.parameters():
            if p.is_floating_point():
                dtype_bytes, device = p.element_size(), p.device
                break
        impl = str(getattr(config, "_attn_implementation", None) or "eager")
        activation = getattr(config, "hidden_act", None) or getattr(config, "activation_function", None)
        # eager always materialises the scores; sdpa only when torch falls back to its math kernel: key
        # and value heads of different sizes (MLA), or float64 off the CPU; flash kernels never do
        fallback = layout.value_head_dim != layout.head_dim or (dtype_bytes >= 8 and device.type != "cpu")
        return cls(
            hidden=layout.hidden_size,
            ffn=mlp_width,
            heads=layout.num_heads,
            kv_heads=layout.num_kv_heads,
            head_dim=max(layout.head_dim, layout.value_head_dim),
            dtype_bytes=dtype_bytes,
            # eager always does; sdpa does whenever torch falls back to its math kernel (float64,
            # unequal key/value head sizes, broadcast multi-query keys...); flash kernels never do
            scores=not impl.startswith(("flash", "flex")),
            materialised=impl == "eager" or (impl == "sdpa" and fallback),
            mlp_temporaries=4 if activation in MULTI_OP_ACTIVATIONS else 3,
        )

    @property
    def work_bytes(self) -> int:
        """Element size the captured vectors are folded in (float64 models stay float64)."""
        return 8 if self.dtype_bytes >= 8 else 4


def forward_bytes(shape: ForwardShape, batch_size: int, max_length: int) -> int:
    """Upper bound of the activations one forward pass holds at a time, under ``no_grad`` (a looser one
    than :func:`forward_peak_bytes`: evaluation's).

    Layers run one after another, so this is one layer's working set: the residual stream and
    normalised input, the query/key/value projections with their rotated and transposed copies,
    or the MLP's hidden activations (whichever phase is larger), float32 copies inside norms, the
    (B, 1, T, T) attention mask, and the attention scores with their softmax (unless the attention
    is a flash kernel, which never materialises them).

    >>> shape = ForwardShape(hidden=64, ffn=256, heads=4, kv_heads=4, head_dim=16, dtype_bytes=4,
    ...                      scores=True)
    >>> forward_bytes(shape, batch_size=2, max_length=10)
    143720
    """
    tokens = batch_size * max_length
    b = shape.dtype_bytes
    qkv = (shape.heads + 2 * shape.kv_heads) * shape.head_dim
    phase = max(6 * qkv, 5 * shape.ffn)
    per_token = b * (4 * shape.hidden + phase) + 8 * shape.hidden
    mask = batch_size * max_length * max_length * (b + 1)
    scores = 0
    if shape.scores:
        scores = 3 * max(b, 4) * batch_size * shape.heads * max_length * max_length
    return tokens * per_token + mask + scores


def forward_peak_bytes(shape: ForwardShape, batch_size: int, max_length: int, *, mlp: bool = True) -> int:
    """The activations one forward pass holds at its peak, under ``no_grad``: what a capture counts.

    Layers run one after another, so this is one layer's working set, per token: the embeddings (which
    the model's forward keeps), the layer's input, the sublayer's normalised input, and the larger of
    two phases. Attention: the query/key/value
    projections and, while they are rotated, a rotated copy and one temporary of the queries and keys,
    and for GQA and MQA the keys and values repeated to every query head (sdpa with a padding mask).
    MLP (``mlp``: whether a layer's MLP runs before the forward stops, i.e. a layer before the last
    captured one is in the forward): one more hidden-size tensor and ``mlp_temporaries`` MLP-wide ones.
    A 16-bit model's norms add float32 copies. Per
    batch: the (B, 1, T, T) attention mask (boolean and additive, when there is padding), and the
    attention scores with their softmax where they are certainly materialised (``materialised``: eager
    attention, or sdpa falling back to its math kernel).

    Measured against the CPU allocator's peak of the forward to the last attention (Llama-family
    models, sdpa): about 0.9 of this bound, the mask aside.

    >>> shape = ForwardShape(hidden=64, ffn=256, heads=4, kv_heads=4, head_dim=16, dtype_bytes=4,
    ...                      scores=True)
    >>> forward_peak_bytes(shape, batch_size=2, max_length=10)
    92520
    >>> forward_peak_bytes(shape, batch_size=2, max_length=10, mlp=False)  # stopped in the first layer
    61800
    """
    tokens = batch_size * max_length
    b = shape.dtype_bytes
    h, g, d = shape.heads, shape.kv_heads, shape.head_dim
    repeated = 2 * h * d if g < h else 0
    attention = (h + 2 * g) * d + 2 * (h + g) * d + repeated
    mlp_phase = shape.hidden + shape.mlp_temporaries * shape.ffn if mlp else 0
    per_token = b * (3 * shape.hidden + max(attention, mlp_phase)) + (8 * shape.hidden if b < 4 else 0)
    mask = batch_size * max_length * max_length * (b + 1)
    scores = 0
    if shape.materialised:
        scores = 3 * max(b, 4) * batch_size * shape.heads * max_length * max_length
    return tokens * per_token + mask + scores
