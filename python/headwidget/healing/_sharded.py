"""Healing past one GPU: ``heal(..., distributed="fsdp")`` shards the teacher and the trained copy with
FSDP2 (``torch.distributed.fsdp.fully_shard``) over the ranks of ``torch.distributed``'s default group.

What is sharded, on a one-dimensional mesh of every rank (``cuda`` under NCCL, the model's own device
under gloo):

- the **teacher**: its decoder layers, each an FSDP unit, and the rest (embeddings, final norm, head) in
  the root unit: each rank holds ``1/world`` of its weights, and a layer's whole weights only while that
  layer runs;
- the **trained copy**: the same units, and inside each converted layer its attention as a unit of its
  own (so the per-layer errors can call it alone); its trained parameters — the mechanism's factors —
  are sharded too, with their gradients and AdamW's moments (each rank updates its shard);
- each rank trains on its ``batch_size / world`` windows of every step; the gradients are averaged by
  FSDP's reduce-scatter, so the weights equal one process's on the whole batch. The evaluation points
  run every evaluation batch on every rank (a sharded forward is a collective: every rank takes part in
  each), so every rank returns the same run.

The models :func:`~headwidget.healing.heal` is given stay whole and untouched on each rank (typically on
the CPU: a 70B model in bfloat16 is 140 GB of host memory per rank); the sharded copies are built from
them without copying a frozen weight (new parameters over the same storage, then FSDP's shards). At the
end the trained parameters are gathered (``DTensor.full_tensor``) into an unsharded copy of the variant
whose every frozen tensor is the model's own (``run.model`` shares them with ``model``: under FSDP a
whole copy of a model this size is what the sharding avoids).

Example (one process: no process group, so nothing is sharded):
    >>> ranks, sharded = distribution(False)
    >>> ranks.world, sharded
    (1, False)
    >>> distribution("ddp")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.ArgumentError: distributed='ddp' is not one of False, True ...
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from headwidget.errors import ArgumentError
from headwidget.evaluation.running import Ranks

__all__ = ["distribution", "gather_trained", "mesh_device", "sharded", "shared_module"]


def distribution(distributed: Any) -> tuple[Ranks, bool]:
    """The ranks a healing run is shared over, and whether its models are sharded (``"fsdp"``).

    Raises:
        ArgumentError: ``distributed`` is none of False, True, ``"fsdp"``; or True/``"fsdp"`` without an
            initialized process group.
    """
    if isinstance(distributed, str):
        if distributed.strip().lower() != "fsdp":
            raise ArgumentError(
                f"distributed={distributed!r} is not one of False, True (DistributedDataParallel: every rank "
                "holds the whole model) or 'fsdp' (the models sharded over the ranks with FSDP2)"
            )
        return Ranks.of(True), True
    return Ranks.of(distributed), False


def mesh_device(model_device: torch.device) -> torch.device:
    """Where the sharded models run: this rank's GPU under NCCL, else the model's own device."""
    import torch.distributed as dist

    if dist.get_backend() == "nccl":
        return torch.device("cuda", torch.cuda.current_device())
    return model_device


def shared_module(module: nn.Module) -> nn.Module:
    """A copy of ``module``'s modules whose parameters are new ``nn.Parameter`` objects over the same
    storage (their ``requires_grad`` kept) and whose buffers are the same tensors: sharding the copy
    replaces its parameters, never ``module``'s."""
    memo: dict[int, Any] = {}
    for p in module.parameters():
        memo[id(p)] = nn.Parameter(p.detach(), requires_grad=p.requires_grad)
    for b in module.buffers():
        memo[id(b)] = b
    return copy.deepcopy(module, memo)


def sharded(model: nn.Module, units: Sequence[nn.Module], world: int, device: torch.device) -> nn.Module:
    """``model`` (changed in place) sharded over a mesh of ``world`` ranks on ``device``: each of
    ``units`` (inner ones first) an FSDP unit, the rest in the root, which keeps its weights whole from
    its forward until its backward ends (the head is needed right after the forward)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh(device.type, (world,))
    for unit in units:
        fully_shard(unit, mesh=mesh)
    fully_shard(model, mesh=mesh, reshard_after_forward=False)
    return model


@torch.no_grad()
def gather_trained(trained: nn.Module, into: nn.Module) -> None:
    """Copy every trained parameter of the sharded ``trained`` (gathered whole: a collective, every rank
    calls it) into the parameter of the same name of ``into``."""
    from torch.distributed.tensor import DTensor

    targets = dict(into.named_parameters())
    for name, p in trained.named_parameters():
        if not p.requires_grad:
            continue
        whole = p.full_tensor() if isinstance(p, DTensor) else p.detach()
        target = targets[name]
        target.copy_(whole.to(target.device, target.dtype))
