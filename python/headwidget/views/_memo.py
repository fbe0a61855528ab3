"""``Memo``: a function's most recent results by arguments, that can say what it holds.

A view computes its panels from parts that are worth keeping (the channel view's window matrices),
and a part is asked for again when a user moves back to a state, or by the prefetching thread ahead
of the user. ``functools.lru_cache`` keeps them too, but cannot say whether it holds an entry; a
view asks that to know whether a state's panels are at hand (:meth:`View.ready
<headwidget.views.View.ready>`: then the page is not told "computing").

Example:
    >>> memo = Memo(lambda a, b: a + b, size=2)
    >>> memo(1, 2), memo.holds(1, 2), memo.holds(2, 2)
    (3, True, False)
    >>> memo(2, 2), memo(3, 3), memo.holds(1, 2)  # the oldest is let go past the size
    (4, 6, False)
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, NamedTuple, TypeVar

__all__ = ["CacheInfo", "Memo"]

R = TypeVar("R")


class CacheInfo(NamedTuple):
    """What a :class:`Memo` did, in ``functools.lru_cache``'s terms."""

    hits: int
    misses: int
    maxsize: int
    currsize: int


class Memo(Generic[R]):
    """``fn``'s results by (hashable) positional arguments, the ``size`` most recently used kept;
    safe to call from several threads (two threads asking for one missing entry may both compute it,
    and the second result is kept)."""

    def __init__(self, fn: Callable[..., R], size: int) -> None:
        self.fn = fn
        self.size = size
        self._lock = threading.Lock()
        self._kept: OrderedDict[tuple[Hashable, ...], R] = OrderedDict()
        self._hits = self._misses = 0

    def __call__(self, *args: Hashable) -> R:
        with self._lock:
            if args in self._kept:
                self._hits += 1
                self._kept.move_to_end(args)
                return self._kept[args]
            self._misses += 1
        value = self.fn(*args)
        with self._lock:
            self._kept[args] = value
            while len(self._kept) > self.size:
                self._kept.popitem(last=False)
        return value

    def holds(self, *args: Hashable) -> bool:
        """Whether the result for ``args`` is kept (a call would not compute it)."""
        with self._lock:
            return args in self._kept

    def cache_info(self) -> CacheInfo:
        """Hits, misses, size and how many are kept, as ``functools.lru_cache`` reports them."""
        with self._lock:
            return CacheInfo(self._hits, self._misses, self.size, len(self._kept))
