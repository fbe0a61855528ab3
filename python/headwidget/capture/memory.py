"""How much memory a capture will allocate, and the default budget it must stay within."""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch

from headwidget.moments import Moments

__all__ = ["available_bytes", "default_budget", "format_bytes"]

#: Share of the free memory of a device that a capture may take when ``max_memory`` is not given.
DEFAULT_FRACTION = 0.5


def format_bytes(n: float) -> str:
    """Human-readable bytes.

    >>> format_bytes(3 * 2**30)
    '3.00 GiB'
    """
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"


def available_bytes(device: torch.device) -> int:
    """Free memory on ``device`` now (CUDA: ``mem_get_info``; CPU: MemAvailable)."""
    if device.type == "cuda":
        free, _ = torch.cuda.mem_get_info(device)
        return int(free)
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def default_budget(device: torch.device) -> int:
    return int(available_bytes(device) * DEFAULT_FRACTION)


def accumulator_bytes(shapes: Iterable[tuple[int, int | None]]) -> int:
    """Bytes of float64 accumulators for (channels, head_dim) shapes."""
    return sum(Moments.nbytes(c, hd) for c, hd in shapes)


def transient_bytes(tokens: int, channels: int) -> int:
    """Float32 working memory of one update: the batch copies and its Gram."""
    return 4 * (3 * tokens * channels + 2 * channels * channels)
