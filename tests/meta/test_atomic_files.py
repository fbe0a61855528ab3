"""headwidget.files: atomic writes that never leave a half-written or replaced-by-accident file."""

from __future__ import annotations

import errno
import os
import re
import signal
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from headwidget.errors import HeadwidgetError
from headwidget.files import (
    PARTIAL_SUFFIX,
    NotRegularFileError,
    atomic_output,
    atomic_write,
    partial_leftovers,
    real_target,
)

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "headwidget"


def write(path: Path, data: bytes) -> None:
    with atomic_write(path) as fh:
        fh.write(data)


def test_text_and_bytes_replace_the_content(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("old")
    with atomic_write(path, "w") as fh:
        fh.write("naïve\n")
        assert path.read_text() == "old"  # nothing visible until the block ends
    assert path.read_bytes() == "naïve\n".encode()
    with atomic_write(path) as fh:
        fh.write(b"\x00\xff")
    assert path.read_bytes() == b"\x00\xff"
    assert list(tmp_path.iterdir()) == [path]


def test_an_exception_keeps_the_old_content_and_propagates_unchanged(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("old")
    failure = RuntimeError("disk on fire")

    def write_then_fail() -> None:
        with atomic_write(path, "w") as fh:
            fh.write("new")
            raise failure

    with pytest.raises(RuntimeError) as info:
        write_then_fail()
    assert info.value is failure
    assert path.read_text() == "old" and list(tmp_path.iterdir()) == [path]


def test_a_writer_that_renames_over_the_path_still_commits_with_the_targets_mode(tmp_path: Path) -> None:
    path = tmp_path / "data.bin"
    path.write_bytes(b"old")
    path.chmod(0o640)
    with atomic_output(path) as tmp:
        assert tmp.name == path.name and tmp.parent.parent == tmp_path  # same name, beside the target
        own = tmp.with_name(".writer-temp")
        own.write_bytes(b"new")
        own.chmod(0o600)
        os.replace(own, tmp)  # what safetensors does with its own temporary file
    assert path.read_bytes() == b"new" and stat.S_IMODE(path.stat().st_mode) == 0o640
    assert list(tmp_path.iterdir()) == [path]


def test_the_content_is_flushed_before_the_rename_and_the_rename_after(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[str] = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd: int) -> None:
        calls.append("fsync directory" if stat.S_ISDIR(os.fstat(fd).st_mode) else "fsync file")
        real_fsync(fd)

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str]) -> None:
        calls.append("replace")
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    with atomic_write(tmp_path / "x.bin") as fh:
        fh.write(b"data")
    assert calls == ["fsync file", "replace", "fsync directory"]


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a file to another owner needs root")
def test_owner_and_group_are_kept(tmp_path: Path) -> None:
    path = tmp_path / "theirs.bin"
    path.write_bytes(b"old")
    os.chown(path, 12345, 23456)
    with atomic_write(path) as fh:
        fh.write(b"new")
    info = path.stat()
    assert (info.st_uid, info.st_gid) == (12345, 23456)


def test_a_hard_link_keeps_the_old_content(tmp_path: Path) -> None:
    """Replacing gives the path a new file: other names of the old one still show the old content."""
    path, other = tmp_path / "a.bin", tmp_path / "b.bin"
    path.write_bytes(b"old")
    os.link(path, other)
    with atomic_write(path) as fh:
        fh.write(b"new")
    assert path.read_bytes() == b"new" and other.read_bytes() == b"old"


def test_a_long_name_still_fits(tmp_path: Path) -> None:
    path = tmp_path / ("n" * 250)
    with atomic_write(path) as fh:
        fh.write(b"x")
    assert path.read_bytes() == b"x"


def test_problems_with_the_path_name_the_path(tmp_path: Path) -> None:
    loop = tmp_path / "loop"
    loop.symlink_to("loop")
    with pytest.raises(OSError, match=r"symlink loop") as info:
        real_target(loop)
    assert info.value.errno == errno.ELOOP and info.value.filename == str(loop)
    file = tmp_path / "file"
    file.write_bytes(b"")
    with pytest.raises(NotADirectoryError) as not_dir:
        real_target(file / "child")
    assert not_dir.value.filename == str(file / "child")
    with pytest.raises(FileNotFoundError, match="create the directory first") as missing:
        real_target(tmp_path / "missing" / "child")
    assert missing.value.filename == str(tmp_path / "missing" / "child")


@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink to a directory"])
def test_targets_that_are_not_regular_files_are_refused(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "target"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        (tmp_path / "dir").mkdir()
        path.symlink_to("dir")
    with pytest.raises(
        NotRegularFileError, match=r"is (a directory|a FIFO \(named pipe\)), not a regular file"
    ):
        write(path, b"never")
    assert isinstance(NotRegularFileError("x"), OSError) and issubclass(NotRegularFileError, HeadwidgetError)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        {"target", *(["dir"] if "symlink" in kind else [])}
    )


def test_only_text_and_binary_writing_modes(tmp_path: Path) -> None:
    with (
        pytest.raises(ValueError, match="mode must be 'wb', 'w' or 'wt', not 'a'"),
        atomic_write(tmp_path / "x", "a"),
    ):
        pass
    assert list(tmp_path.iterdir()) == []


def test_partial_leftovers_lists_only_the_temporary_folders(tmp_path: Path) -> None:
    (tmp_path / f".x.abc{PARTIAL_SUFFIX}").mkdir()
    (tmp_path / f".file{PARTIAL_SUFFIX}").write_bytes(b"")  # a file, not a leftover folder
    (tmp_path / f"visible{PARTIAL_SUFFIX}").mkdir()
    (tmp_path / ".cache").mkdir()
    assert partial_leftovers(tmp_path) == [tmp_path / f".x.abc{PARTIAL_SUFFIX}"]


# headwidget.files is a leaf: the child imports it (and headwidget.errors) without the package's
# __init__, so without torch, and is killed in the middle of writing a megabyte.
KILLED_WRITER = """
import sys, types
package = types.ModuleType("headwidget")
package.__path__ = [sys.argv[1]]
sys.modules["headwidget"] = package
from headwidget.files import atomic_write

with atomic_write(sys.argv[2]) as fh:
    fh.write(b"x" * 1_000_000)
    fh.flush()
    print("writing" if "torch" not in sys.modules else "torch was imported", flush=True)
    sys.stdin.readline()  # never answered: the parent kills this process here
"""


def test_a_writer_killed_mid_write_leaves_the_old_file_and_a_recognisable_folder(tmp_path: Path) -> None:
    path = tmp_path / "notes.txt"
    path.write_text("old")
    child = subprocess.Popen(
        [sys.executable, "-c", KILLED_WRITER, str(PACKAGE), str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline() == "writing\n"
        os.kill(child.pid, signal.SIGKILL)
    finally:
        child.kill()
        child.communicate(timeout=60)
    assert child.returncode == -signal.SIGKILL
    assert path.read_text() == "old"
    (leftover,) = partial_leftovers(tmp_path)
    assert re.fullmatch(rf"\.notes\.txt\.\w+{re.escape(PARTIAL_SUFFIX)}", leftover.name)
    assert (leftover / "notes.txt").stat().st_size == 1_000_000
    with atomic_write(path, "w") as fh:  # a later write neither trips over the leftover nor touches it
        fh.write("new")
    assert path.read_text() == "new"
    assert partial_leftovers(tmp_path) == [leftover] and (leftover / "notes.txt").stat().st_size == 1_000_000
