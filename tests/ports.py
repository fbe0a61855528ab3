"""Helpers for the tests that run torch.distributed over gloo in spawned CPU processes."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A TCP port on 127.0.0.1 that is free now (for ``init_method=f"tcp://127.0.0.1:{port}"``)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
