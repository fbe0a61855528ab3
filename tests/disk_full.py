"""A disk that fills up mid-write, for the tests of every file writer.

:func:`disk_full_after` lowers this process's file-size limit (``RLIMIT_FSIZE``): a write that would
take any file past ``size`` bytes writes what fits and then fails with ``EFBIG``, as a full disk fails
with ``ENOSPC``: a writer that truncated its target first has by then destroyed it.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

resource = pytest.importorskip("resource")


@contextmanager
def disk_full_after(size: int) -> Iterator[None]:
    """Writes beyond ``size`` bytes of any file fail (``OSError`` EFBIG) inside the ``with`` block."""
    old = resource.getrlimit(resource.RLIMIT_FSIZE)
    previous = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # the error instead of the signal
    resource.setrlimit(resource.RLIMIT_FSIZE, (size, old[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old)
        signal.signal(signal.SIGXFSZ, previous)


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every entry of ``folder`` (hidden ones too) and the bytes of each file."""
    return {p.name: p.read_bytes() if p.is_file() else b"<dir>" for p in sorted(folder.iterdir())}


def check_the_limit_works(folder: Path) -> None:
    """The simulation itself: a plain write past the limit fails and leaves a cut file."""
    probe = folder / "probe"
    with disk_full_after(10), pytest.raises(OSError, match="too large"):
        probe.write_bytes(b"x" * 100)
    assert probe.stat().st_size == 10
    os.unlink(probe)
