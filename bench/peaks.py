"""Peak memory of one call, for the benchmarks: on CUDA the caching allocator's live bytes
(``max_memory_allocated``), on the CPU the resident set and the CPU allocator's live bytes.

- :class:`Peak` measures a block: on CUDA ``max_memory_allocated`` above what was allocated when it
  began; on the CPU the rise of the resident set (the kernel's high-water mark ``VmHWM``, reset at the
  start through ``/proc/self/clear_refs``, less ``VmRSS`` then). The resident set counts what the C
  allocator keeps after frees (glibc returns a block above its mmap threshold at once, and keeps the
  rest in its heaps), so on the CPU it can exceed the tensors alive at any moment; run with
  ``MALLOC_MMAP_THRESHOLD_=131072`` to have blocks above 128 KiB returned when freed.
- :func:`allocator_peak` is the CPU allocator's own peak of live tensor bytes during a call (its
  ``torch.profiler`` memory events; slow for large runs): the CPU's counterpart of CUDA's number, and what
  the memory estimates are fitted to.

Example:
    >>> import torch
    >>> with Peak(torch.device("cpu")) as peak:
    ...     x = torch.ones(2**25)  # 128 MiB
    ...     del x
    >>> peak.bytes >= 100 * 2**20
    True
"""

from __future__ import annotations

import gc
import json
import resource
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch


def _status(field: str) -> int:
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def process_peak() -> int:
    """This process's peak resident set since it started (bytes)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Peak:
    """The peak memory a block allocates on ``device`` above what was held when it began (module
    docstring): ``bytes`` after the block."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.bytes = 0
        self.start = 0

    def __enter__(self) -> Peak:
        gc.collect()
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = torch.cuda.memory_allocated(self.device)
        else:
            self.start = _status("VmRSS")
            Path("/proc/self/clear_refs").write_text("5")  # the high-water mark starts again here
        return self

    def __exit__(self, *exc: Any) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = torch.cuda.max_memory_allocated(self.device) - self.start
        else:
            self.bytes = _status("VmHWM") - self.start


def allocator_peak(fn: Callable[[], object]) -> int:
    """The CPU allocator's peak of live tensor bytes while ``fn`` ran, above what it held when ``fn``
    began."""
    from torch.profiler import ProfilerActivity, profile

    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    memory = [e["args"] for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0]
    if not memory:
        return 0
    before = memory[0]["Total Allocated"] - memory[0]["Bytes"]
    return max(m["Total Allocated"] for m in memory) - before


def gib(n: float) -> str:
    return f"{n / 2**30:.2f} GiB"
