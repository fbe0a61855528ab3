"""What the ranks of a ``torch.distributed`` group were each given, compared (one ``all_gather_object``).

A call shared over ranks sums each rank's share of one piece of work: ranks given different work (other
arguments, texts or statistics) would sum into numbers of none of it, or wait on each other forever.
:func:`rank_differences` gathers every rank's ``facts`` and says which differ, on every rank at once, so
that each can refuse before anything is summed.

Example (one process: nothing to compare):
    >>> rank_differences({"variants": ["model", "mqa"]}, world=1) is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

__all__ = ["rank_differences"]


def rank_differences(facts: Mapping[str, object], world: int, group: Any = None) -> str | None:
    """The ``facts`` that differ between the ``world`` ranks of ``group``, each with every rank's value
    (``"name: rank 0 a, rank 1 b; ..."``), or None when all agree; every rank gets the same answer."""
    if world == 1:
        return None
    import torch.distributed as dist

    every: list[Any] = [None] * world
    dist.all_gather_object(every, dict(facts), group=group)
    differ = [name for name in facts if any(e.get(name) != every[0].get(name) for e in every)]
    if not differ:
        return None
    return "; ".join(
        f"{name}: " + ", ".join(f"rank {r} {e.get(name)!r}" for r, e in enumerate(every)) for name in differ
    )
