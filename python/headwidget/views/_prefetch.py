"""Panels computed ahead, on one background thread shared by every view.

A view that names the states a user is likely to move to next (:meth:`View.neighbours
<headwidget.views.View.neighbours>`: the layers beside the selected one, say) has their panels
computed here while the user looks at the current ones; a move to one of them takes the computed
panels instead of computing them again. Each view queues through its own :class:`Prefetcher`; a new
state replaces what the previous one queued (work not started is cancelled), and a state asked for
while it is being computed is waited for rather than computed twice. Prefetching is best effort: a
failure only means no head start (the view computes that state itself, and reports its error then).

Where a page draws the view, computing ahead would compete with the page for the cores just when it
draws the panels sent (on a 2-core machine, a first visit of a layer took a third longer). The view
then holds its prefetcher (:meth:`~Prefetcher.hold`) from sending panels until the page says it has
drawn them (:meth:`~Prefetcher.release`), or for :data:`PAGE_WAIT_S` should no page answer.

Example:
    >>> prefetcher = Prefetcher()
    >>> prefetcher.queue({"a": lambda: 1, "b": lambda: 2})
    >>> prefetcher.wait()
    >>> prefetcher.ready("b"), prefetcher.ready("c")
    (True, False)
    >>> prefetcher.take("b"), prefetcher.take("b"), prefetcher.take("c")
    (2, None, None)
    >>> prefetcher.close()
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor, wait
from typing import Any

__all__ = ["PAGE_WAIT_S", "Prefetcher"]

#: The longest a held prefetcher waits for the page before it computes ahead all the same (seconds).
PAGE_WAIT_S = 1.0

#: The one thread every view's prefetching runs on (so that exploring never competes with itself).
_EXECUTOR = ThreadPoolExecutor(max_workers=1, thread_name_prefix="headwidget-prefetch")


class Prefetcher:
    """What one view has queued ahead: a future per state key."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._futures: dict[Hashable, Future[Any]] = {}
        self._closed = False
        #: Set when the jobs may run: cleared by ``hold`` (the page is drawing), set by ``release``.
        self._go = threading.Event()
        self._go.set()

    def hold(self) -> None:
        """Start no job (queued now or later) until :meth:`release`, or until it has waited
        :data:`PAGE_WAIT_S`; what is already computing runs on."""
        self._go.clear()

    def release(self) -> None:
        """Let held jobs start."""
        self._go.set()

    def _when_released(self, job: Callable[[], Any]) -> Callable[[], Any]:
        def run() -> Any:
            self._go.wait(PAGE_WAIT_S)
            if self._closed:
                return None
            return job()

        return run

    def queue(self, jobs: Mapping[Hashable, Callable[[], Any]]) -> None:
        """Compute each job in the background, in place of what was queued before: queued work of a
        key not in ``jobs`` is cancelled, a key already queued (or done) is not queued again."""
        with self._lock:
            if self._closed:
                return
            for key in [k for k in self._futures if k not in jobs]:
                self._futures.pop(key).cancel()
            for key, job in jobs.items():
                if key not in self._futures:
                    self._futures[key] = _EXECUTOR.submit(self._when_released(job))

    def drop_others(self, key: Hashable) -> None:
        """Cancel queued work for every key but ``key`` (a new state is shown: the thread should be
        free for it, not busy ahead of the old one); what has started runs on, and stays takeable."""
        with self._lock:
            for other in [k for k in self._futures if k != key]:
                if self._futures[other].cancel():
                    del self._futures[other]

    def ready(self, key: Hashable) -> bool:
        """Whether a result for ``key`` is computed and waiting (``take`` would return it at once)."""
        with self._lock:
            future = self._futures.get(key)
        return future is not None and future.done() and not future.cancelled() and future.exception() is None

    def take(self, key: Hashable) -> Any:
        """The result computed for ``key`` (waiting when it is being computed now), else None: not
        queued, cancelled before it started, or failed."""
        with self._lock:
            future = self._futures.pop(key, None)
        if future is None or future.cancel():
            return None
        if not future.done():
            self._go.set()  # (it is wanted now: if it waits to start, it starts)
        try:
            return future.result()
        except Exception:
            return None

    def wait(self) -> None:
        """Wait until everything queued so far is done (tests, and a view being saved)."""
        with self._lock:
            pending = list(self._futures.values())
        self._go.set()
        wait(pending)

    def close(self) -> None:
        """Cancel what has not started and queue nothing more."""
        with self._lock:
            self._closed = True
            futures, self._futures = list(self._futures.values()), {}
        self._go.set()  # (a job waiting to start ends at once)
        for future in futures:
            future.cancel()
