"""Helpers for the tests that run torch.distributed over gloo in several CPU processes."""

from __future__ import annotations

import multiprocessing
import socket
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

#: What the fork server imports once (headwidget imports torch, transformers and its evaluation and
#: healing); each rank is forked from it instead of importing them anew, as a spawned process does (the
#: six distributed test modules: 94.6 s with spawn, 59.6 s forked, with two pytest workers on a 2-core
#: machine). The server has run no torch op, so no thread pool is forked.
PRELOAD = ["headwidget"]


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for ``init_method=f"tcp://127.0.0.1:{port}"``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def run_ranks(worker: Callable[..., None], args: tuple[Any, ...], nprocs: int = 2) -> None:
    """``worker(rank, *args)`` in ``nprocs`` processes (ranks 0..nprocs-1), as ``torch.multiprocessing``
    starts them, forked from one server per test process that has imported :data:`PRELOAD`. A rank
    that fails raises here with its traceback."""
    multiprocessing.set_forkserver_preload(PRELOAD)
    mp.start_processes(worker, args=args, nprocs=nprocs, start_method="forkserver")
