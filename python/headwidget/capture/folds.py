"""A capture's staged rows and their batched folds: the moments, token samples and cross-layer moments.

The hooks hand each captured layer's selected rows, per kind, to :meth:`StagedFolds.stage`, which copies
them into the staging buffer of their :class:`~headwidget.capture.plan.FoldShape` (and, for the
cross-layer statistics, beside the other cross layers' rows). When the last layer of a
:class:`~headwidget.capture.plan.FoldGroup` has run, :meth:`StagedFolds.fold_group` writes the group's
sampled rows into their reservoirs and folds all of its layers and kinds at once
(:meth:`MomentStack.fold <headwidget.moments.MomentStack.fold>`). Every buffer is allocated once per
capture: on the CPU, the accumulators of a device in one piece (views of which the statistics hold)
and the staging and fold buffers in another (one staging buffer and one set of fold buffers per shape,
reused by its groups, which fold one after another). Nothing that grows with the batch is
allocated while the model runs, beside the model's own tensors.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from headwidget.capture.plan import CapturePlan, FoldGroup, FoldShape
from headwidget.capture.tokens import ReservoirStep, TokenSelection
from headwidget.core.kinds import Kind
from headwidget.moments import FoldWork, Moments, MomentStack

__all__ = ["StagedFolds"]

#: What was checked (one name per row) and the (rows, 2) device flags of :meth:`MomentStack.fold`.
Checks = tuple[list[str], torch.Tensor]


@dataclass
class _Group:
    group: FoldGroup
    stack: MomentStack


@dataclass
class _Shape:
    shape: FoldShape
    staged: torch.Tensor  # (entries of a group, rows, C)
    work: FoldWork


class _Arena:
    """Buffers of a capture: on the CPU typed views, 64-byte aligned, of one block of bytes per device,
    sized by a first pass that only counts (``sizes=None``: meta tensors); on other devices one
    allocation per buffer.

    On the CPU the allocator places blocks below its mmap threshold (up to 32 MB with glibc) in the
    heap it shares with the model's own tensors, which it may return to the system and fault in again
    as they come and go; a capture's buffers held in a few large blocks leave that heap to the model
    as in a plain forward.
    """

    ALIGN = 64

    def __init__(self, sizes: dict[torch.device, int] | None = None) -> None:
        self.counting = sizes is None
        self.blocks = {d: torch.empty(n, dtype=torch.uint8, device=d) for d, n in (sizes or {}).items()}
        self.used: dict[torch.device, int] = {}

    def __call__(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if device.type != "cpu":
            return torch.empty(shape, dtype=dtype, device="meta" if self.counting else device)
        nbytes = math.prod(shape) * dtype.itemsize
        start = self.used.get(device, 0)
        self.used[device] = start + -(-nbytes // self.ALIGN) * self.ALIGN
        if self.counting:
            return torch.empty(shape, dtype=dtype, device="meta")
        return self.blocks[device][start : start + nbytes].view(dtype).view(shape)


class StagedFolds:
    """The staging buffers, accumulators and fold buffers of one capture (see the module docstring)."""

    def __init__(self, plan: CapturePlan, shapes: list[FoldShape], rows: int) -> None:
        self.plan = plan
        self.rows = rows
        kept, scratch = _Arena(), _Arena()
        if any(s.device.type == "cpu" for s in [*shapes, *plan.cross_shapes().values()]):
            self._build(shapes, kept, scratch)  # counts what the CPU's two blocks must hold
            kept, scratch = _Arena(kept.used), _Arena(scratch.used)
        kept.counting = scratch.counting = False
        self._build(shapes, kept, scratch)

    def _build(self, shapes: list[FoldShape], kept: _Arena, scratch: _Arena) -> None:
        """Make every buffer: the accumulators from ``kept`` (they outlive the capture, in the returned
        statistics), the staging and fold buffers from ``scratch`` (freed with the capture)."""
        plan, rows, samples = self.plan, self.rows, self.plan.samples
        self.shapes: dict[FoldShape, _Shape] = {}
        self.groups: list[_Group] = []
        self.slots: dict[tuple[int, Kind], tuple[int, int]] = {}  # (group index, entry) of each (layer, kind)
        self.ending: dict[int, list[int]] = {}  # the groups whose last layer is this one
        # the token samples' reservoir rows, one tensor per (layer, kind): reordered into new tensors at
        # the end, one at a time, each freed as soon as its reordered copy exists
        self.reservoirs: dict[tuple[int, Kind], torch.Tensor] = {}
        for shape in shapes:
            self.shapes[shape] = self._buffers(shape, rows, scratch)
            for group in shape.groups():
                n = len(group.entries())
                stack = MomentStack.empty(
                    n, shape.channels, head_dim=shape.head_dim, device=shape.device, allocate=kept
                )
                index = len(self.groups)
                self.groups.append(_Group(group, stack))
                for i, entry in enumerate(group.entries()):
                    self.slots[entry] = (index, i)
                    if samples and not kept.counting:
                        self.reservoirs[entry] = torch.empty(
                            samples, shape.channels, dtype=torch.float32, device=shape.device
                        )
                self.ending.setdefault(group.layers[-1], []).append(index)
        # cross-layer statistics: every cross layer's rows of a head kind side by side, folded once the
        # last cross layer has run
        self.cross: dict[Kind, _Group] = {}
        self.cross_shapes: dict[Kind, _Shape] = {}
        self.cross_staged: dict[Kind, set[int]] = {}
        for kind, shape in plan.cross_shapes().items():
            stack = MomentStack.empty(
                1, shape.channels, head_dim=shape.head_dim, device=shape.device, allocate=kept
            )
            self.cross[kind] = _Group(shape.groups()[0], stack)
            self.cross_shapes[kind] = self._buffers(shape, rows, scratch)
            self.cross_staged[kind] = set()

    @staticmethod
    def _buffers(shape: FoldShape, rows: int, arena: _Arena) -> _Shape:
        entries = len(shape.kinds) * shape.group_layers
        staged = arena((entries, rows, shape.channels), shape.dtype, shape.device)
        work = FoldWork.make(
            entries, rows, shape.channels, shape.head_dim, shape.dtype, shape.device, shape.mode, arena
        )
        return _Shape(shape, staged, work)

    # ------------------------------------------------------------------ results
    def moments(self) -> dict[tuple[int, Kind], Moments]:
        """Every captured (layer, kind)'s moments (views of the stacked accumulators)."""
        return {entry: self.groups[g].stack.members[i] for entry, (g, i) in self.slots.items()}

    def cross_moments(self) -> dict[Kind, Moments]:
        return {kind: group.stack.members[0] for kind, group in self.cross.items()}

    def samples(self, order: torch.Tensor, filled: int) -> dict[tuple[int, Kind], torch.Tensor]:
        """Every captured (layer, kind)'s ``filled`` reservoir rows in ``order``, each a new tensor; the
        reservoirs are released one by one."""
        out = {}
        for key in list(self.reservoirs):
            rows = self.reservoirs.pop(key)
            out[key] = rows[:filled].index_select(0, order.to(rows.device))
        return out

    # ------------------------------------------------------------------ staging and folding
    def stage(self, layer: int, kind: Kind, tensor: torch.Tensor, selection: TokenSelection) -> None:
        """Copy the selected rows of one layer's ``tensor`` (B, T, C) of ``kind`` into its staging slot."""
        g, i = self.slots[(layer, kind)]
        staged = self.shapes[self.groups[g].group.shape].staged
        rows = tensor.detach().reshape(-1, tensor.shape[-1])
        index = selection.on(rows.device)
        slot = staged[i, : selection.count]
        if rows.dtype == slot.dtype:
            torch.index_select(rows, 0, index, out=slot)
        else:
            slot.copy_(rows.index_select(0, index))
        if kind in self.cross and layer in (self.plan.cross_layers or []):
            position = (self.plan.cross_layers or []).index(layer)
            width = slot.shape[-1]
            joint = self.cross_shapes[kind].staged[
                0, : selection.count, position * width : (position + 1) * width
            ]
            joint.copy_(slot)
            self.cross_staged[kind].add(layer)

    def fold_layer(self, layer: int, selection: TokenSelection, step: ReservoirStep | None) -> list[Checks]:
        """Fold every group whose last layer is ``layer`` (and the cross-layer rows once all are in)."""
        checks = [self.fold_group(g, selection, step) for g in self.ending.get(layer, [])]
        for kind, staged in self.cross_staged.items():
            if len(staged) == len(self.plan.cross_layers or []):
                staged.clear()
                checks.extend(self.fold_cross(kind, selection))
        return checks

    def fold_cross(self, kind: Kind, selection: TokenSelection) -> list[Checks]:
        """Fold the staged rows of every cross layer's ``kind``, side by side, into the joint moments."""
        buffers = self.cross_shapes[kind]
        rows = buffers.staged[:, : selection.count]
        flags = self.cross[kind].stack.fold(rows, selection.split_a, buffers.work)
        if flags is None:
            return []
        return [([f"cross-layer {kind} of layers {self.plan.cross_layers}"], flags)]

    def fold_group(self, g: int, selection: TokenSelection, step: ReservoirStep | None) -> Checks:
        group = self.groups[g]
        shape = self.shapes[group.group.shape]
        entries = group.group.entries()
        staged = shape.staged[: len(entries), : selection.count]
        if self.reservoirs and step is not None and step.count:
            slots, picked = step.on(staged.device)
            for i, entry in enumerate(entries):
                self.reservoirs[entry].index_copy_(0, slots, staged[i].index_select(0, picked).float())
        flags = group.stack.fold(staged, selection.split_a, shape.work)
        assert flags is not None
        return [f"layer {layer} {kind}" for layer, kind in entries], flags
