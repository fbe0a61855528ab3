"""What a capture will record: layers, kinds, devices, how the rows are staged and folded, and the
memory that takes.

Validating a request here, before any hook is installed, means bad options fail fast and leave the
model untouched.

Each captured layer's rows are staged, per kind, into a buffer shared by the kinds of one width on one
device (a :class:`FoldShape`), and folded into the statistics a group of layers at a time
(:class:`FoldGroup`): one set of batched calls for all the layers and kinds of a group
(:class:`~headwidget.moments.MomentStack`). On the CPU a group holds what its caches hold (about
:data:`FOLD_BYTES_CPU` of rows and buffers: one SmolLM2 layer at 8×256 tokens), so that a layer is
folded while its rows are still in them; on a GPU up to :data:`FOLD_BYTES` (all of SmolLM2's layers,
six of Llama-3-8B's at 8×512 tokens), so that launches are few. A GPU folds the rows of a 16-bit model
on its tensor cores (:data:`~headwidget.moments.GramMode` ``"split"``).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch import nn

from headwidget.adapters import Adapter
from headwidget.capture.memory import (
    ForwardShape,
    accumulator_bytes,
    default_budget,
    forward_peak_bytes,
    plane_norm_update_bytes,
    refuse_over_budget,
    reservoir_bytes,
    reservoir_key_bytes,
    sample_update_bytes,
)
from headwidget.core.kinds import Kind
from headwidget.core.layout import AttentionLayout
from headwidget.errors import CaptureInputError, LayerIndexError, RopeCaptureError
from headwidget.moments import FoldWork, GramMode
from headwidget.stats import PlaneNorms

__all__ = ["FOLD_BYTES", "FOLD_BYTES_CPU", "CapturePlan", "FoldGroup", "FoldShape", "module_device"]

ROPE_MODES = ("pre", "post", "both")

#: Bytes of staged rows and fold buffers one shape's group of layers may hold on a GPU.
FOLD_BYTES = 512 * 2**20
#: The same on the CPU: about what its caches hold, so that rows are folded while they are in them.
FOLD_BYTES_CPU = 2 * 2**20


@dataclass(frozen=True)
class FoldShape:
    """The kinds of one width (and head size) captured on one device, and the layers there: they share a
    staging buffer and fold buffers, and are folded in groups of :attr:`group_layers` layers."""

    device: torch.device
    channels: int
    head_dim: int | None
    kinds: tuple[Kind, ...]
    layers: tuple[int, ...]
    mode: GramMode
    dtype: torch.dtype  # of the staged rows
    group_layers: int = 1

    def staging_bytes(self, rows: int, layers: int | None = None) -> int:
        """Bytes of the staging buffer and the fold buffers for groups of ``layers`` layers (default:
        :attr:`group_layers`) and ``rows`` rows."""
        entries = len(self.kinds) * (self.group_layers if layers is None else layers)
        element = self.dtype.itemsize
        staged = entries * rows * self.channels * element
        return staged + FoldWork.nbytes(entries, rows, self.channels, self.head_dim, element, self.mode)

    def groups(self) -> list[FoldGroup]:
        """The groups of consecutive layers folded together, in layer order."""
        k = self.group_layers
        return [FoldGroup(self, self.layers[i : i + k]) for i in range(0, len(self.layers), k)]


@dataclass(frozen=True)
class FoldGroup:
    """Layers of one :class:`FoldShape` whose rows are folded in one set of calls, once the last has run."""

    shape: FoldShape
    layers: tuple[int, ...]

    def entries(self) -> list[tuple[int, Kind]]:
        """(layer, kind) of each staged slot, layer-major."""
        return [(layer, kind) for layer in self.layers for kind in self.shape.kinds]


def module_device(module: nn.Module) -> torch.device:
    """The device of a module's first parameter (CPU for a module without parameters)."""
    for p in module.parameters():
        return p.device
    return torch.device("cpu")


@dataclass
class CapturePlan:
    layout: AttentionLayout
    layers: list[int]
    kinds: list[Kind]
    cross_layers: list[int] | None
    attention: list[nn.Module]  # one per captured layer
    devices: list[torch.device]  # one per captured layer
    forward: ForwardShape
    dtype: torch.dtype  # the model's floating-point dtype
    samples: int = 0  # token rows sampled per (layer, kind)
    #: Whether the token sums of every rotary pair's query/key norms are kept (inputs=True, RoPE
    #: models whose adapter gives the queries): partial RoPE's ranking.
    plane_norms: bool = False

    @classmethod
    def make(
        cls,
        adapter: Adapter,
        *,
        layers: Sequence[int] | None,
        rope: str,
        inputs: bool,
        cross_layer: Sequence[int] | bool | None,
        samples: int = 0,
    ) -> CapturePlan:
        layout = adapter.layout()
        modules = adapter.attention_modules()
        n = len(modules)
        if layers is None:
            chosen = list(range(n))
        else:
            if isinstance(layers, int):
                layers = [layers]
            chosen = []
            for layer in layers:
                if not isinstance(layer, (int, np.integer)) or isinstance(layer, bool):
                    raise LayerIndexError(f"layers must be ints, got {layer!r}")
                layer = int(layer)
                if not -n <= layer < n:
                    raise LayerIndexError(
                        f"layer {layer} is out of range: {type(adapter.model).__name__} has {n} "
                        f"layers (0..{n - 1})"
                    )
                chosen.append(layer % n)
            chosen = sorted(set(chosen))
            if not chosen:
                raise LayerIndexError("layers is empty: pass None for all layers or a list of indices")
        if not isinstance(samples, (int, np.integer)) or isinstance(samples, bool) or samples < 0:
            raise CaptureInputError(
                f"samples must be a whole number of token rows to keep per layer and kind (0: none), "
                f"got {samples!r}"
            )
        if rope not in ROPE_MODES:
            raise CaptureInputError(f"rope must be one of {ROPE_MODES}, got {rope!r}")
        kinds: list[Kind] = ["key"] if rope in ("pre", "both") else []
        if rope in ("post", "both"):
            model_name = type(adapter.model).__name__
            if not layout.rope.uses_rope:
                raise RopeCaptureError(
                    f"{model_name} uses no rotary embedding, so post-RoPE keys equal the key "
                    "projection output: capture with rope='pre'"
                )
            if not adapter.routes_through_interface:
                raise RopeCaptureError(
                    f"{model_name} ({adapter.family}) does not pass its keys through "
                    "transformers.AttentionInterface, so post-RoPE keys cannot be captured; use rope='pre'"
                )
            kinds.append("key_post")
        kinds.append("value")
        if layout.latent_dim:
            kinds.append("latent")
        if inputs:
            kinds.append("input")
        cross: list[int] | None = None
        if cross_layer is True:
            cross = list(chosen) if len(chosen) > 1 else None
        elif cross_layer:
            cross = sorted({int(c) % n if -n <= int(c) < n else int(c) for c in cross_layer})
            outside = [c for c in cross if c not in chosen]
            if outside:
                raise LayerIndexError(
                    f"cross_layer {outside} are not among the captured layers {chosen}; add them to layers="
                )
            if len(cross) < 2:
                raise CaptureInputError(
                    f"cross_layer={list(cross_layer)} names one layer, and joint statistics compare layers: "
                    "give two or more (or cross_layer=True for every captured layer)"
                )
        attention = [modules[i] for i in chosen]
        taps = [adapter.taps(m)[0].module for m in attention]
        devices = [module_device(t) for t in taps]
        forward = ForwardShape.of(adapter.model, layout, adapter.mlp_width())
        plane_norms = inputs and layout.rope.uses_rope and adapter.query_taps(attention[0]) is not None
        dtype = next((p.dtype for p in adapter.model.parameters() if p.is_floating_point()), torch.float32)
        plan = cls(layout, chosen, kinds, cross, attention, devices, forward, dtype, int(samples))
        plan.plane_norms = bool(plane_norms)
        return plan

    # ------------------------------------------------------------------ memory
    def head_kinds(self) -> list[Kind]:
        """Kinds whose vectors are split into heads (those get cross-layer statistics)."""
        return [k for k in self.kinds if self.layout.head_dim_of(k) is not None]

    def gram_mode(self, device: torch.device) -> GramMode:
        """How the Grams of rows on ``device`` are formed: on a GPU's tensor cores for a 16-bit model."""
        split = device.type == "cuda" and self.dtype in (torch.bfloat16, torch.float16)
        return "split" if split else "exact"

    def staged_dtype(self, device: torch.device) -> torch.dtype:
        """The dtype rows are staged in on ``device``: the model's own for the tensor cores, else float32
        (float64 for a float64 model)."""
        if self.gram_mode(device) == "split":
            return self.dtype
        return torch.float64 if self.dtype == torch.float64 else torch.float32

    def fold_shapes(self, rows: int, most_layers: int | None = None) -> list[FoldShape]:
        """The staging shapes of every device, for batches of up to ``rows`` token rows, with groups of
        as many layers as :data:`FOLD_BYTES` (:data:`FOLD_BYTES_CPU` on the CPU) hold, at least one and
        at most ``most_layers``."""
        lay = self.layout
        widths: dict[tuple[int, int | None], list[Kind]] = {}
        for kind in self.kinds:
            widths.setdefault((lay.channels_of(kind), lay.head_dim_of(kind)), []).append(kind)
        shapes = []
        for device in dict.fromkeys(self.devices):
            layers = tuple(layer for layer, d in zip(self.layers, self.devices, strict=True) if d == device)
            # a model on the meta device (shapes only, for an estimate) is counted as on the CPU
            cap = FOLD_BYTES_CPU if device.type in ("cpu", "meta") else FOLD_BYTES
            for (channels, head_dim), kinds in widths.items():
                mode, dtype = self.gram_mode(device), self.staged_dtype(device)
                shape = FoldShape(device, channels, head_dim, tuple(kinds), layers, mode, dtype)
                k = 1
                while k < len(layers) and shape.staging_bytes(rows, k + 1) <= cap:
                    k += 1
                shapes.append(replace(shape, group_layers=min(k, most_layers or k)))
        return shapes

    def cross_shapes(self) -> dict[Kind, FoldShape]:
        """The staging shapes of the cross-layer statistics, per head kind: one entry of every cross
        layer's channels side by side (none without cross layers)."""
        if not self.cross_layers:
            return {}
        device = self.devices[self.layers.index(self.cross_layers[0])]
        mode, dtype = self.gram_mode(device), self.staged_dtype(device)
        out = {}
        for kind in self.head_kinds():
            width = len(self.cross_layers) * self.layout.channels_of(kind)
            out[kind] = FoldShape(device, width, self.layout.head_dim_of(kind), (kind,), (0,), mode, dtype)
        return out

    def bytes_by_device(
        self, batch_size: int, max_length: int, most_layers: int | None = None
    ) -> dict[torch.device, int]:
        """Peak bytes per device: accumulators, staging and fold buffers, one batch's working memory,
        the forward's activations (with groups of at most ``most_layers`` layers).

        See :mod:`headwidget.capture.memory` for what each part covers.
        """
        lay, fwd = self.layout, self.forward
        tokens = batch_size * max_length
        b = fwd.dtype_bytes
        r = self.samples
        planes = len(lay.rope.planes()) if self.plane_norms else 0
        out: dict[torch.device, int] = {}
        shapes = self.fold_shapes(tokens, most_layers)
        for shape in shapes:
            kept = len(shape.kinds) * len(shape.layers)
            out[shape.device] = out.get(shape.device, 0) + accumulator_bytes(
                [(shape.channels, shape.head_dim)] * kept
            )
            out[shape.device] += kept * reservoir_bytes(r, shape.channels)
            out[shape.device] += shape.staging_bytes(tokens)
        for device in self.devices:
            out[device] += PlaneNorms.nbytes(lay.num_heads, lay.num_kv_heads, planes)
        for cross in self.cross_shapes().values():
            out[cross.device] = out.get(cross.device, 0) + accumulator_bytes(
                [(cross.channels, cross.head_dim)]
            )
            out[cross.device] += cross.staging_bytes(tokens)
        for device in set(self.devices):
            # one kind's rows on their way into the staging buffer: the recorded tensor reshaped (a copy
            # when it is a strided slice) and its selected rows in the model's dtype
            on = [s for s in shapes if s.device == device]
            working = [2 * tokens * s.channels * b for s in on]
            if r:
                working += [sample_update_bytes(r, tokens, s.channels, s.dtype.itemsize) for s in on]
            if planes:
                heads = (lay.num_heads, lay.num_kv_heads)
                working.append(
                    plane_norm_update_bytes(tokens, heads, lay.head_dim, planes, b, fwd.work_bytes)
                )
            # the forward stops after the last captured attention: no MLP runs when that is the first layer's
            mlp = self.layers[-1] > 0
            out[device] += max(working) + forward_peak_bytes(fwd, batch_size, max_length, mlp=mlp)
        if r:
            cpu = torch.device("cpu")
            out[cpu] = out.get(cpu, 0) + reservoir_key_bytes(r, tokens)
        return out

    def check_budget(self, batch_size: int, max_length: int, max_memory: int | None) -> list[FoldShape]:
        """The fold shapes of a capture of batches of ``batch_size × max_length`` tokens that stays within
        ``max_memory`` (default: half the free memory) on every device: groups of fewer layers where
        the default ones do not fit. Raises :class:`~headwidget.errors.MemoryBudgetError` when even
        one layer at a time does not."""
        rows = batch_size * max_length
        most = max(s.group_layers for s in self.fold_shapes(rows))
        while True:
            over = [
                (device, need, allowed)
                for device, need in self.bytes_by_device(batch_size, max_length, most).items()
                if need > (allowed := max_memory if max_memory is not None else default_budget(device))
            ]
            if not over:
                return self.fold_shapes(rows, most)
            if most == 1:
                break
            most = max(1, most // 2)
        device, need, allowed = over[0]
        refuse_over_budget(
            "this capture",
            need,
            device,
            max_memory,
            "Capture fewer layers (layers=[...]), a shorter cross_layer list, rope='pre' instead of 'both', "
            "inputs=False, fewer samples=, a smaller batch_size/max_length, or raise max_memory= (bytes) if "
            "the memory is there.",
            allowed=allowed,
        )
        raise AssertionError("unreachable: the need is over the budget")
