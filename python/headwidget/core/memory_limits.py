"""How much more host memory this process may take before one of its limits stops it.

A machine's free memory is not what a process in a container, a Kubernetes pod or under ``ulimit``
may use. Each limit below leaves the process a headroom; the smallest is what an allocation can count on:

- **cgroup v2** ``memory.max`` of the process's cgroup and of each cgroup above it, less what the
  cgroup uses (``memory.current``) that the kernel cannot drop (its ``inactive_file`` page cache, as
  the kubelet counts a pod's working set);
- **cgroup v1** ``memory.limit_in_bytes`` of the memory controller's cgroup and those above it, less
  ``memory.usage_in_bytes`` without ``total_inactive_file`` alike;
- ``RLIMIT_AS`` (the soft address-space limit) less the address space in use (``VmSize``);
- ``RLIMIT_DATA`` less the data segment in use (``VmData``).

The cgroups are found as the kernel lists them (``/proc/self/cgroup``, and their mounts in
``/proc/self/mountinfo``); every file is read under ``root``, so a test can lay out fake ones. A file
that is missing or unreadable, an unlimited value, or a system without ``/proc`` (macOS, Windows)
leaves that limit out: no limit found means ``None``.

Example:
    >>> import tempfile
    >>> from pathlib import Path
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "proc/self").mkdir(parents=True)
    >>> _ = (root / "proc/self/cgroup").write_text("0::/\\n")
    >>> (root / "sys/fs/cgroup").mkdir(parents=True)
    >>> _ = (root / "sys/fs/cgroup/memory.max").write_text(f"{4 * 2**30}\\n")
    >>> _ = (root / "sys/fs/cgroup/memory.current").write_text(f"{2**30}\\n")
    >>> tightest = memory_headroom(root, rlimit=lambda which: (-1, -1))
    >>> tightest.bytes == 3 * 2**30, tightest.limit
    (True, "the cgroup's memory.max")
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

__all__ = ["Headroom", "limit_headrooms", "memory_headroom"]

#: A cgroup v1 limit at or above this is "no limit" (the kernel writes 2**63 rounded down to a page).
UNLIMITED = 2**62

#: ``(soft, hard)`` of a resource limit, as :func:`resource.getrlimit` gives it.
RLimitReader = Callable[[int], tuple[int, int]]


@dataclass(frozen=True)
class Headroom:
    """What one limit leaves the process: ``bytes`` more before ``limit`` (its words) stops it."""

    bytes: int
    limit: str


def _read(path: Path) -> str | None:
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def _number(path: Path) -> int | None:
    """The integer a cgroup file holds, None where it is missing, ``max`` or not a number."""
    text = _read(path)
    if text is None:
        return None
    text = text.strip()
    return int(text) if text.isdigit() else None


def _stat_field(path: Path, name: str) -> int:
    """A field of a cgroup's ``memory.stat`` (0 where missing)."""
    for line in (_read(path) or "").splitlines():
        key, _, value = line.partition(" ")
        if key == name and value.strip().isdigit():
            return int(value)
    return 0


def _unescape(field: str) -> str:
    """A mountinfo path field with its octal escapes (``\\040`` for a space) decoded."""
    return re.sub(r"\\([0-7]{3})", lambda m: chr(int(m.group(1), 8)), field)


@dataclass(frozen=True)
class _Mount:
    """A cgroup hierarchy mounted at ``point`` (inside ``root``) showing the cgroup ``source`` as its top."""

    point: PurePosixPath
    source: PurePosixPath


def _cgroup_mounts(root: Path) -> Iterator[tuple[str, _Mount]]:
    """``("v2", mount)`` for cgroup2 and ``("v1", mount)`` for a v1 hierarchy with the memory controller,
    from mountinfo; where mountinfo cannot be read, the usual places (``/sys/fs/cgroup`` and
    ``/sys/fs/cgroup/memory``)."""
    text = _read(root / "proc/self/mountinfo")
    if text is None:
        yield "v2", _Mount(PurePosixPath("/sys/fs/cgroup"), PurePosixPath("/"))
        yield "v1", _Mount(PurePosixPath("/sys/fs/cgroup/memory"), PurePosixPath("/"))
        return
    for line in text.splitlines():
        head, sep, tail = line.partition(" - ")
        fields, after = head.split(), tail.split()
        if not sep or len(fields) < 5 or len(after) < 3:
            continue
        mount = _Mount(PurePosixPath(_unescape(fields[4])), PurePosixPath(_unescape(fields[3])))
        if after[0] == "cgroup2":
            yield "v2", mount
        elif after[0] == "cgroup" and "memory" in after[2].split(","):
            yield "v1", mount


def _own_cgroups(root: Path) -> dict[str, PurePosixPath]:
    """The process's cgroup in the v2 hierarchy (``"v2"``) and in v1's memory controller (``"v1"``)."""
    out: dict[str, PurePosixPath] = {}
    for line in (_read(root / "proc/self/cgroup") or "").splitlines():
        parts = line.split(":", 2)
        if len(parts) != 3:
            continue
        number, controllers, path = parts
        if number == "0" and controllers == "":
            out["v2"] = PurePosixPath(path)
        elif "memory" in controllers.split(","):
            out["v1"] = PurePosixPath(path)
    return out


def _cgroup_dirs(root: Path, mount: _Mount, cgroup: PurePosixPath) -> list[Path]:
    """The directories of ``cgroup`` and of every cgroup above it up to the mount's top, under ``root``.
    A cgroup outside what the mount shows (another namespace's path) is read at the mount's top."""
    try:
        relative = cgroup.relative_to(mount.source)
    except ValueError:
        relative = PurePosixPath()
    parts = [p for p in relative.parts if p not in ("", ".", "..", "/")]
    top = root / str(mount.point).lstrip("/")
    return [top.joinpath(*parts[:n]) for n in range(len(parts), -1, -1)]


def _cgroup_headroom(root: Path) -> list[Headroom]:
    own = _own_cgroups(root)
    found: list[Headroom] = []
    for version, mount in _cgroup_mounts(root):
        cgroup = own.get(version)
        if cgroup is None:
            continue
        for directory in _cgroup_dirs(root, mount, cgroup):
            if version == "v2":
                limit, used = _number(directory / "memory.max"), _number(directory / "memory.current")
                dropped = _stat_field(directory / "memory.stat", "inactive_file")
                name = "the cgroup's memory.max"
            else:
                limit = _number(directory / "memory.limit_in_bytes")
                used = _number(directory / "memory.usage_in_bytes")
                dropped = _stat_field(directory / "memory.stat", "total_inactive_file")
                name = "the cgroup's memory.limit_in_bytes"
            if limit is None or limit >= UNLIMITED:
                continue
            in_use = max(0, (used or 0) - dropped)
            found.append(Headroom(max(0, limit - in_use), name))
    return found


def _status_bytes(root: Path, field: str) -> int:
    """A ``kB`` field of ``/proc/self/status`` in bytes (0 where it cannot be read)."""
    for line in (_read(root / "proc/self/status") or "").splitlines():
        key, _, value = line.partition(":")
        words = value.split()
        if key == field and words and words[0].isdigit():
            return int(words[0]) * 1024
    return 0


def _default_rlimit(which: int) -> tuple[int, int]:
    import resource

    return resource.getrlimit(which)


def _rlimit_headroom(root: Path, rlimit: RLimitReader | None) -> list[Headroom]:
    try:
        import resource
    except ImportError:  # Windows
        return []
    read = rlimit or _default_rlimit
    found = []
    for name, field in (("RLIMIT_AS", "VmSize"), ("RLIMIT_DATA", "VmData")):
        which = getattr(resource, name, None)
        if which is None:
            continue
        soft, _ = read(which)
        if soft == resource.RLIM_INFINITY or soft < 0:
            continue
        found.append(Headroom(max(0, soft - _status_bytes(root, field)), name))
    return found


def limit_headrooms(root: Path | str = "/", *, rlimit: RLimitReader | None = None) -> list[Headroom]:
    """What each limit of the process leaves it (see the module docstring), in no particular order.

    ``root``: where ``/proc`` and ``/sys`` are read from; ``rlimit``: reads a resource limit
    (:func:`resource.getrlimit` when None).

    >>> all(h.bytes >= 0 for h in limit_headrooms())
    True
    """
    base = Path(root)
    return [*_cgroup_headroom(base), *_rlimit_headroom(base, rlimit)]


def memory_headroom(root: Path | str = "/", *, rlimit: RLimitReader | None = None) -> Headroom | None:
    """The smallest :func:`limit_headrooms`, or None where the process has no memory limit.

    >>> memory_headroom("/nonexistent", rlimit=lambda which: (-1, -1)) is None
    True
    """
    found = limit_headrooms(root, rlimit=rlimit)
    return min(found, key=lambda h: h.bytes) if found else None
