"""What a capture will record: layers, kinds, devices, and the memory that takes.

Validating a request here, before any hook is installed, means bad options fail fast and leave the
model untouched.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from headwidget.adapters import Adapter
from headwidget.capture.memory import (
    ForwardShape,
    accumulator_bytes,
    default_budget,
    format_bytes,
    forward_bytes,
    plane_norm_update_bytes,
    reservoir_bytes,
    reservoir_key_bytes,
    sample_update_bytes,
    update_bytes,
)
from headwidget.core.kinds import Kind
from headwidget.core.layout import AttentionLayout
from headwidget.errors import CaptureInputError, LayerIndexError, MemoryBudgetError, RopeCaptureError
from headwidget.stats import PlaneNorms

__all__ = ["CapturePlan", "module_device"]

ROPE_MODES = ("pre", "post", "both")


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
                cross = None
        attention = [modules[i] for i in chosen]
        taps = [adapter.taps(m)[0].module for m in attention]
        devices = [module_device(t) for t in taps]
        forward = ForwardShape.of(adapter.model, layout, adapter.mlp_width())
        plane_norms = inputs and layout.rope.uses_rope and adapter.query_taps(attention[0]) is not None
        plan = cls(layout, chosen, kinds, cross, attention, devices, forward, int(samples))
        plan.plane_norms = bool(plane_norms)
        return plan

    # ------------------------------------------------------------------ memory
    def head_kinds(self) -> list[Kind]:
        """Kinds whose vectors are split into heads (those get cross-layer statistics)."""
        return [k for k in self.kinds if self.layout.head_dim_of(k) is not None]

    def bytes_by_device(self, batch_size: int, max_length: int) -> dict[torch.device, int]:
        """Peak bytes per device: accumulators, one batch's working memory, the forward's activations.

        See :mod:`headwidget.capture.memory` for what each part covers.
        """
        lay, fwd = self.layout, self.forward
        tokens = batch_size * max_length
        w, b = fwd.work_bytes, fwd.dtype_bytes
        shapes = [(lay.channels_of(k), lay.head_dim_of(k)) for k in self.kinds]

        def fold(channels: int, head_dim: int | None) -> int:
            # the recorded tensor reshaped (a copy when it is a strided slice), its selected rows in
            # the model's dtype and converted, and the update itself
            heads = channels // head_dim if head_dim else 1
            return tokens * channels * (b + w) + update_bytes(tokens, channels, heads, w)

        r = self.samples

        def fold_and_sample(channels: int, head_dim: int | None) -> int:
            return fold(channels, head_dim) + (sample_update_bytes(r, tokens, channels, w) if r else 0)

        planes = len(lay.rope.planes()) if self.plane_norms else 0
        out: dict[torch.device, int] = {}
        for device in self.devices:
            out[device] = out.get(device, 0) + accumulator_bytes(shapes)
            out[device] += sum(reservoir_bytes(r, c) for c, _ in shapes)
            out[device] += PlaneNorms.nbytes(lay.num_heads, lay.num_kv_heads, planes)
        for device in set(self.devices):
            folds = [fold_and_sample(c, hd) for c, hd in shapes]
            if planes:
                heads = (lay.num_heads, lay.num_kv_heads)
                folds.append(plane_norm_update_bytes(tokens, heads, lay.head_dim, planes, b, w))
            out[device] += max(folds)
            out[device] += forward_bytes(fwd, batch_size, max_length)
        if r:
            cpu = torch.device("cpu")
            out[cpu] = out.get(cpu, 0) + reservoir_key_bytes(r, tokens)
        if self.cross_layers:
            device = self.devices[self.layers.index(self.cross_layers[0])]
            n = len(self.cross_layers)
            joint = [(n * lay.channels_of(k), lay.head_dim_of(k)) for k in self.head_kinds()]
            # every head kind's rows of the cross layers wait for the last one, then one kind's are
            # concatenated and folded
            waiting = sum(tokens * c * w for c, _ in joint)
            out[device] = out.get(device, 0) + accumulator_bytes(joint) + waiting
            out[device] += max(tokens * c * w + fold(c, hd) for c, hd in joint)
        return out

    def check_budget(self, batch_size: int, max_length: int, max_memory: int | None) -> None:
        for device, need in self.bytes_by_device(batch_size, max_length).items():
            allowed = max_memory if max_memory is not None else default_budget(device)
            if need > allowed:
                source = "max_memory" if max_memory is not None else "half the free memory"
                raise MemoryBudgetError(
                    f"this capture would allocate {format_bytes(need)} on {device}, over the "
                    f"{format_bytes(allowed)} allowed ({source}). Capture fewer layers (layers=[...]), "
                    "a shorter cross_layer list, rope='pre' instead of 'both', inputs=False, fewer "
                    "samples=, a smaller batch_size/max_length, or raise max_memory= (bytes) if the "
                    "memory is there."
                )
