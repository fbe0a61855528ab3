"""The default memory budget knows the process's limits: cgroup v2 and v1 (read from fake /proc and cgroup
files under a root), RLIMIT_AS and RLIMIT_DATA (faked, and one real limit in a subprocess)."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from headwidget.capture import memory
from headwidget.core.memory_limits import Headroom, limit_headrooms, memory_headroom

GiB = 2**30
UNLIMITED_V1 = "9223372036854771712"


def no_rlimit(which: int) -> tuple[int, int]:
    return (resource.RLIM_INFINITY, resource.RLIM_INFINITY)


def write(root: Path, path: str, text: str) -> None:
    target = root / path.lstrip("/")
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(text)


def mountinfo(*lines: str) -> str:
    return "".join(f"{line}\n" for line in lines)


V2_MOUNT = "30 23 0:26 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw"
V1_MEMORY_MOUNT = "35 31 0:32 {root} /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory"
V1_CPU_MOUNT = "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu"


def test_cgroup_v2_takes_the_tightest_cgroup_on_the_way_up(tmp_path: Path) -> None:
    write(tmp_path, "/proc/self/cgroup", "0::/kubepods/pod1/ctr\n")
    write(tmp_path, "/proc/self/mountinfo", mountinfo(V2_MOUNT))
    base = "/sys/fs/cgroup/kubepods"
    write(tmp_path, f"{base}/pod1/ctr/memory.max", "max\n")  # the container itself: no limit
    write(tmp_path, f"{base}/pod1/ctr/memory.current", f"{GiB}\n")
    write(tmp_path, f"{base}/pod1/memory.max", f"{4 * GiB}\n")  # the pod: 4 GiB
    write(tmp_path, f"{base}/pod1/memory.current", f"{3 * GiB}\n")
    write(tmp_path, f"{base}/pod1/memory.stat", f"anon {2 * GiB}\ninactive_file {GiB}\nactive_file 5\n")
    write(tmp_path, f"{base}/memory.max", f"{100 * GiB}\n")
    write(tmp_path, f"{base}/memory.current", f"{50 * GiB}\n")
    found = limit_headrooms(tmp_path, rlimit=no_rlimit)
    # the pod: 4 GiB − (3 GiB used − 1 GiB of page cache the kernel can drop); above it: 100 − 50
    assert sorted(h.bytes for h in found) == [2 * GiB, 50 * GiB]
    assert memory_headroom(tmp_path, rlimit=no_rlimit) == Headroom(2 * GiB, "the cgroup's memory.max")


def test_cgroup_v1_reads_the_memory_controller_as_the_container_sees_it(tmp_path: Path) -> None:
    # a container without its own cgroup namespace: the kernel names the host's path, the mount shows it
    # as its top
    write(tmp_path, "/proc/self/cgroup", "5:cpu,cpuacct:/docker/abc\n4:memory:/docker/abc\n0::/\n")
    write(
        tmp_path, "/proc/self/mountinfo", mountinfo(V1_CPU_MOUNT, V1_MEMORY_MOUNT.format(root="/docker/abc"))
    )
    write(tmp_path, "/sys/fs/cgroup/memory/memory.limit_in_bytes", f"{3 * GiB}\n")
    write(tmp_path, "/sys/fs/cgroup/memory/memory.usage_in_bytes", f"{GiB}\n")
    write(tmp_path, "/sys/fs/cgroup/memory/memory.stat", f"inactive_file 7\ntotal_inactive_file {GiB // 4}\n")
    write(tmp_path, "/sys/fs/cgroup/cpu/memory.limit_in_bytes", "1024\n")  # not the memory controller
    assert memory_headroom(tmp_path, rlimit=no_rlimit) == Headroom(
        3 * GiB - (GiB - GiB // 4), "the cgroup's memory.limit_in_bytes"
    )


def test_cgroup_v1_nested_path_and_unlimited_levels(tmp_path: Path) -> None:
    # as on a host: the memory hierarchy mounted at its root, the process in a nested cgroup
    write(tmp_path, "/proc/self/cgroup", "4:memory:/jobs/run 1\n")
    write(tmp_path, "/proc/self/mountinfo", mountinfo(V1_MEMORY_MOUNT.format(root="/")))
    write(tmp_path, "/sys/fs/cgroup/memory/memory.limit_in_bytes", UNLIMITED_V1)
    write(tmp_path, "/sys/fs/cgroup/memory/memory.usage_in_bytes", f"{20 * GiB}")
    write(tmp_path, "/sys/fs/cgroup/memory/jobs/memory.limit_in_bytes", UNLIMITED_V1)
    write(tmp_path, "/sys/fs/cgroup/memory/jobs/run 1/memory.limit_in_bytes", f"{6 * GiB}")
    write(tmp_path, "/sys/fs/cgroup/memory/jobs/run 1/memory.usage_in_bytes", f"{5 * GiB}")
    assert memory_headroom(tmp_path, rlimit=no_rlimit) == Headroom(GiB, "the cgroup's memory.limit_in_bytes")


def test_escaped_mount_points_and_a_full_cgroup(tmp_path: Path) -> None:
    write(tmp_path, "/proc/self/cgroup", "0::/\n")
    write(tmp_path, "/proc/self/mountinfo", mountinfo(V2_MOUNT.replace("/sys/fs/cgroup", r"/cg\040root")))
    write(tmp_path, "/cg root/memory.max", f"{GiB}\n")
    write(tmp_path, "/cg root/memory.current", f"{2 * GiB}\n")  # over its limit (reclaim pending): 0 left
    assert memory_headroom(tmp_path, rlimit=no_rlimit) == Headroom(0, "the cgroup's memory.max")


def test_without_mountinfo_the_usual_places_are_read(tmp_path: Path) -> None:
    write(tmp_path, "/proc/self/cgroup", "0::/\n")
    write(tmp_path, "/sys/fs/cgroup/memory.max", f"{8 * GiB}\n")
    write(tmp_path, "/sys/fs/cgroup/memory.current", f"{GiB}\n")
    assert memory_headroom(tmp_path, rlimit=no_rlimit) == Headroom(7 * GiB, "the cgroup's memory.max")


@pytest.mark.parametrize(
    "files",
    [
        {},  # no /proc at all (macOS, Windows)
        {"/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/memory.max": "max\n"},
        {"/proc/self/cgroup": "0::/\n", "/sys/fs/cgroup/memory.max": "12 GiB\n"},  # unreadable: left out
        {"/proc/self/cgroup": "garbage\n4:memory\n", "/sys/fs/cgroup/memory/memory.limit_in_bytes": "1"},
        {"/proc/self/cgroup": "4:memory:/\n", "/sys/fs/cgroup/memory/memory.limit_in_bytes": UNLIMITED_V1},
    ],
)
def test_no_limit_found_is_none(tmp_path: Path, files: dict[str, str]) -> None:
    for path, text in files.items():
        write(tmp_path, path, text)
    assert limit_headrooms(tmp_path, rlimit=no_rlimit) == []
    assert memory_headroom(tmp_path, rlimit=no_rlimit) is None


def test_rlimits_leave_the_limit_less_what_the_process_uses(tmp_path: Path) -> None:
    write(
        tmp_path,
        "/proc/self/status",
        "Name:\tpython\nVmPeak:\t 9 kB\nVmSize:\t 1048576 kB\nVmData:\t 524288 kB\n",
    )
    limits = {resource.RLIMIT_AS: (3 * GiB, 4 * GiB), resource.RLIMIT_DATA: (8 * GiB, resource.RLIM_INFINITY)}
    found = limit_headrooms(tmp_path, rlimit=lambda which: limits.get(which, no_rlimit(which)))
    assert sorted(found, key=lambda h: h.bytes) == [
        Headroom(3 * GiB - GiB, "RLIMIT_AS"),  # the soft limit counts, less VmSize
        Headroom(8 * GiB - GiB // 2, "RLIMIT_DATA"),  # less VmData
    ]
    # the smallest of the cgroup and the rlimits
    write(tmp_path, "/proc/self/cgroup", "0::/\n")
    write(tmp_path, "/sys/fs/cgroup/memory.max", f"{GiB}\n")
    tightest = memory_headroom(tmp_path, rlimit=lambda which: limits.get(which, no_rlimit(which)))
    assert tightest == Headroom(GiB, "the cgroup's memory.max")


def test_the_cpu_budget_is_half_the_smaller_of_free_memory_and_the_headroom(monkeypatch) -> None:
    cpu = torch.device("cpu")
    monkeypatch.setattr(memory, "_host_available", lambda: 8 * GiB)
    monkeypatch.setattr(memory, "memory_headroom", lambda: Headroom(GiB, "RLIMIT_AS"))
    assert memory.free_memory(cpu) == memory.FreeMemory(GiB, "RLIMIT_AS")
    assert memory.available_bytes(cpu) == GiB and memory.default_budget(cpu) == GiB // 2
    assert memory.default_budget_source(cpu) == "half the free memory under RLIMIT_AS"
    monkeypatch.setattr(memory, "memory_headroom", lambda: Headroom(10 * GiB, "RLIMIT_AS"))
    assert memory.free_memory(cpu) == memory.FreeMemory(8 * GiB)  # the machine has less free
    assert memory.default_budget_source(cpu) == "half the free memory"
    monkeypatch.setattr(memory, "memory_headroom", lambda: None)
    assert memory.default_budget(cpu) == 4 * GiB


def test_a_gpu_budget_is_its_own_free_memory(monkeypatch) -> None:
    """Host limits bound host memory, not a GPU's."""
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (40 * GiB, 80 * GiB))
    monkeypatch.setattr(memory, "memory_headroom", lambda: Headroom(GiB, "the cgroup's memory.max"))
    assert memory.free_memory(torch.device("cuda", 0)) == memory.FreeMemory(40 * GiB)
    assert memory.default_budget(torch.device("cuda", 0)) == 20 * GiB


def run_python(code: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=env,
        timeout=timeout,
    )


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/self/status")
def test_a_real_rlimit_as_is_read() -> None:
    done = run_python(
        """
        import resource
        from headwidget.core.memory_limits import memory_headroom
        from headwidget.capture.memory import free_memory
        import torch
        limit = 3 * 10**9
        resource.setrlimit(resource.RLIMIT_AS, (limit, resource.getrlimit(resource.RLIMIT_AS)[1]))
        size = next(int(l.split()[1]) * 1024 for l in open("/proc/self/status") if l.startswith("VmSize:"))
        headroom = memory_headroom()
        print(headroom.limit, headroom.bytes, limit - size, free_memory(torch.device("cpu")).limit)
        """
    )
    assert done.returncode == 0, done.stderr
    name, found, expected, cpu_limit = done.stdout.split()
    assert name == "RLIMIT_AS" and cpu_limit == "RLIMIT_AS"
    assert abs(int(found) - int(expected)) < 64 * 2**20  # VmSize read a moment apart
