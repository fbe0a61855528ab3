"""Data-parallel evaluation: each rank of ``torch.distributed`` measures its shard of the batches, and the
float64 totals are summed over the ranks.

Every rank reads the same texts into the same batches (so the report's fingerprint and sequence count
are of all the texts), measures batches ``rank, rank + world, ...`` and, before any number is derived
from them, sums its running totals (:class:`~headwidget.evaluation.measures.PredictionTotals`,
:class:`~headwidget.evaluation.measures.EncoderTotals`, the sweep's sums) with one
``all_reduce`` per call. Every rank then holds the numbers of all the batches: the report equals one
process's on all the texts, up to the order of the float64 sums. A rank that raises (a variant whose
outputs are not finite on its shard) leaves the others waiting in their next ``all_reduce``, as with
any collective: the launcher (``torchrun``) ends the job when one rank fails.

Example (one process: no group, so nothing is sharded or summed):
    >>> from headwidget.evaluation.measures import PredictionTotals
    >>> ranks = Ranks.of(False)
    >>> ranks.world, ranks.shard([10, 11, 12])
    (1, [10, 11, 12])
    >>> totals = PredictionTotals(tokens=3, nll_sum=1.5)
    >>> ranks.merge([totals]); totals.tokens
    3
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, TypeVar

import torch

from headwidget.checks import flag
from headwidget.core.ranks import rank_differences
from headwidget.errors import ArgumentError

__all__ = ["ONE_PROCESS", "Ranks"]

T = TypeVar("T")


def _fields(obj: Any) -> list[str]:
    """The numeric fields of a totals dataclass, in their declared order (the same on every rank)."""
    return [f.name for f in dataclasses.fields(obj) if type(getattr(obj, f.name)) in (int, float)]


@dataclass(frozen=True)
class Ranks:
    """The processes an evaluation is shared over: this one alone, or the ranks of ``torch.distributed``'s
    default group (``distributed=True``)."""

    rank: int = 0
    world: int = 1

    @classmethod
    def of(cls, distributed: Any) -> Ranks:
        """``distributed=False``: this process alone; ``True``: the initialized default process group.

        Raises:
            ArgumentError: ``distributed`` not a bool, or True without an initialized process group.
        """
        if not flag("distributed", distributed):
            return cls()
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise ArgumentError(
                "distributed=True shares the evaluation over the ranks of torch.distributed, but no process "
                "group is initialized: run under torchrun and call torch.distributed.init_process_group() "
                "first (every rank then calls evaluate with the same arguments)"
            )
        return cls(dist.get_rank(), dist.get_world_size())

    def agree(self, call: str, facts: Callable[[], Mapping[str, object]]) -> None:
        """Refuse, on every rank at once, ``facts()`` (what a call was given: its arguments, its tokens'
        fingerprint, the model's weights'; computed only over several ranks) that differ between the
        ranks (:func:`~headwidget.core.ranks.rank_differences`): each rank computes its share of one
        call, so summing shares of different calls would give numbers of none of them.

        Raises:
            ArgumentError: the ranks were given different ``facts`` (the message names them, per rank).
        """
        if self.world == 1:
            return
        differ = rank_differences(facts(), self.world)
        if differ is not None:
            raise ArgumentError(
                f"{call}(distributed=True) shares one call over the ranks, so every rank must pass the same "
                f"arguments, model and texts; they differ: {differ}"
            )

    def shard(self, items: Sequence[T]) -> list[T]:
        """This rank's items: ``rank, rank + world, ...``."""
        return list(items[self.rank :: self.world])

    def sum(self, values: Sequence[float]) -> list[float]:
        """``values`` summed element by element over the ranks, in float64 (as they are for one process)."""
        if self.world == 1:
            return [float(v) for v in values]
        import torch.distributed as dist

        device = (
            torch.device("cpu")
            if dist.get_backend() == "gloo"
            else torch.device("cuda", torch.cuda.current_device())
        )
        packed = torch.tensor(list(values), dtype=torch.float64, device=device)
        dist.all_reduce(packed)
        return [float(v) for v in packed.cpu().tolist()]

    def merge(self, totals: Sequence[object]) -> None:
        """Sum the numeric fields of ``totals`` (dataclasses) over the ranks, in place (every rank must pass
        objects of the same kinds in the same order). Integers stay integers (exact in float64 below
        2**53)."""
        if self.world == 1 or not totals:
            return
        layout = [(obj, _fields(obj)) for obj in totals]
        summed = iter(self.sum([float(getattr(obj, n)) for obj, names in layout for n in names]))
        for obj, names in layout:
            for n in names:
                value = next(summed)
                setattr(obj, n, round(value) if isinstance(getattr(obj, n), int) else value)


#: This process alone (the default of the sweeps).
ONE_PROCESS = Ranks()
