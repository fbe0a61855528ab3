"""The peak of the CPU allocator while a function runs (for tests of memory estimates)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path


def allocated_peak(fn) -> int:
    """Peak bytes the CPU allocator held while ``fn`` ran, above what it held before.

    ``torch.profiler`` with ``profile_memory=True`` records every allocation and free of the c10
    CPU allocator (where all CPU tensors live) with the running total; the largest total is the
    peak of tensor memory during ``fn``, counted from the total before its first event (the running
    total carries over what earlier profiled runs allocated and their garbage freed after them).
    """
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "trace.json"
        prof.export_chrome_trace(str(path))
        events = json.loads(path.read_text())["traceEvents"]
    memory = sorted(
        (e for e in events if e.get("name") == "[memory]" and e["args"].get("Device Type") == 0),
        key=lambda e: e["ts"],
    )
    assert memory, "the profiler recorded no CPU allocations"
    before = memory[0]["args"]["Total Allocated"] - memory[0]["args"]["Bytes"]
    return max(e["args"]["Total Allocated"] for e in memory) - before
