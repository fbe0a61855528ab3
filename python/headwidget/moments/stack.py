"""Many :class:`~headwidget.moments.Moments` of one shape whose accumulators are one stack.

A :class:`MomentStack` is a :class:`~headwidget.moments.folding.StackedMoments` (``N`` streams of ``C``
channels, folded together) whose streams are also ordinary ``Moments``: ``members[i]`` holds views of
row ``i`` of the stacked accumulators, and its counts follow every fold. A capture stages the rows of
several layers and kinds into one (N, n, C) tensor, folds them in one set of calls, and hands out the
members as the statistics of each (layer, kind).

Example:
    >>> import torch
    >>> rows = torch.randn(2, 100, 8, dtype=torch.float64) + 50  # keys and values of one layer
    >>> stack = MomentStack.empty(2, 8, head_dim=4)
    >>> work = FoldWork.make(entries=2, rows=100, channels=8, head_dim=4, dtype=torch.float32)
    >>> flags = stack.fold(rows.float(), split_a=40, work=work)
    >>> key, value = stack.members
    >>> close = torch.allclose(value.covariance(), torch.cov(rows[1].T), atol=1e-5)
    >>> value.count, value.split_count, close
    (100, (40, 60), True)
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from headwidget.moments.folding import Allocate, FoldWork, StackedMoments, _empty
from headwidget.moments.streaming import Moments

__all__ = ["FoldWork", "MomentStack"]


@dataclass
class MomentStack(StackedMoments):
    """:class:`~headwidget.moments.folding.StackedMoments` whose streams are also ``members``, one
    :class:`~headwidget.moments.Moments` each (see the module docstring)."""

    members: list[Moments] = field(default_factory=list)

    @classmethod
    def empty(
        cls,
        entries: int,
        channels: int,
        *,
        head_dim: int | None = None,
        device: torch.device | str = "cpu",
        allocate: Allocate = _empty,
    ) -> MomentStack:
        """Zero moments for ``entries`` streams of ``channels``-wide vectors, in one allocation."""
        base = StackedMoments.empty(entries, channels, head_dim=head_dim, device=device, allocate=allocate)
        gram = base.norm_gram
        members = [
            Moments(0, base.mean[i], base.m2[i], head_dim, None if gram is None else gram[i])
            for i in range(entries)
        ]
        return cls(base.mean, base.m2, gram, head_dim, members=members)

    def fold(self, rows: torch.Tensor, split_a: int, work: FoldWork) -> torch.Tensor | None:
        flags = super().fold(rows, split_a, work)
        for member in self.members:
            member.count, member.split_count = self.count, self.split_count
        return flags

    fold.__doc__ = StackedMoments.fold.__doc__
