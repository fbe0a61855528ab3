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

from headwidget.errors import HeadwidgetError, PathRefusedError
from headwidget.files import (
    PARTIAL_SUFFIX,
    NotRegularFileError,
    atomic_output,
    atomic_write,
    checked_path,
    entry,
    partial_leftovers,
    read_regular,
    regular_file,
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
        assert tmp.name == path.name  # the target's name, in a private folder beside it
        (beside,) = partial_leftovers(tmp_path)
        assert beside.name.startswith(".data.bin.") and tmp.samefile(beside / path.name)
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

    def replace(src: str | os.PathLike[str], dst: str | os.PathLike[str], **folders: int) -> None:
        calls.append("replace")
        real_replace(src, dst, **folders)

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
        write(loop / "child", b"never")
    assert info.value.errno == errno.ELOOP and info.value.filename == str(loop / "child")
    file = tmp_path / "file"
    file.write_bytes(b"")
    with pytest.raises(NotADirectoryError) as not_dir:
        write(file / "child", b"never")
    assert not_dir.value.filename == str(file / "child")
    with pytest.raises(FileNotFoundError, match="create the directory first") as missing:
        write(tmp_path / "missing" / "child", b"never")
    assert missing.value.filename == str(tmp_path / "missing" / "child")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file", "loop"]


@pytest.mark.parametrize("kind", ["directory", "fifo"])
def test_targets_that_are_not_regular_files_are_refused(tmp_path: Path, kind: str) -> None:
    path = tmp_path / "target"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    with pytest.raises(
        NotRegularFileError, match=r"is (a directory|a FIFO \(named pipe\)), not a regular file"
    ):
        write(path, b"never")
    assert isinstance(NotRegularFileError("x"), OSError) and issubclass(NotRegularFileError, HeadwidgetError)
    assert [p.name for p in tmp_path.iterdir()] == ["target"]


@pytest.mark.parametrize("link", ["to a file outside", "to a missing file outside", "to a directory"])
def test_a_symlink_at_the_target_is_refused_and_what_it_points_to_untouched(
    tmp_path: Path, link: str
) -> None:
    """A link planted where a file will be written (a shared run folder) never redirects the write."""
    folder, outside = tmp_path / "run", tmp_path / "outside"
    folder.mkdir()
    outside.mkdir()
    victim = outside / "victim.txt"
    if link != "to a missing file outside":
        victim.write_text("precious")
    planted = folder / "step-000000020.safetensors"
    planted.symlink_to(outside if link == "to a directory" else victim)
    with pytest.raises(PathRefusedError, match=r"step-000000020\.safetensors is a symlink \(to .*outside"):
        write(planted, b"attack")
    assert planted.is_symlink() and [p.name for p in folder.iterdir()] == [planted.name]
    assert sorted(p.name for p in outside.iterdir()) == (
        [] if link == "to a missing file outside" else ["victim.txt"]
    )
    if victim.exists():
        assert victim.read_text() == "precious"


def test_a_link_planted_during_the_write_is_never_written_through(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    target = tmp_path / "run" / "timeline.json"
    target.parent.mkdir()
    target.write_text("old")

    def plant() -> None:
        target.unlink()
        target.symlink_to(victim)

    def write_and_plant() -> None:
        with atomic_write(target, "w") as fh:
            fh.write("new")
            plant()  # after the first check: refused at the commit

    with pytest.raises(PathRefusedError, match="is a symlink"):
        write_and_plant()
    assert target.is_symlink() and victim.read_text() == "precious"
    target.unlink()
    target.write_text("old")
    real_replace = os.replace

    def replace(src: str, dst: str, **folders: int) -> None:
        plant()  # after the last check, before the rename: the rename replaces the link itself
        real_replace(src, dst, **folders)

    monkeypatch.setattr(os, "replace", replace)
    with atomic_write(target, "w") as fh:
        fh.write("new")
    assert not target.is_symlink() and target.read_text() == "new" and victim.read_text() == "precious"


def test_a_temporary_folder_swapped_for_a_link_mid_write_leads_nowhere_else(tmp_path: Path) -> None:
    """Whoever may write in the folder may rename the private temporary folder and put a link to a folder
    of theirs (or of the victim's) in its place; the writer still writes into the folder it created."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("no /proc/self/fd: the temporary folder is reached by its name")
    target = tmp_path / "run" / "notes.txt"
    target.parent.mkdir()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    with atomic_output(target) as tmp:
        (private,) = partial_leftovers(target.parent)
        private.rename(target.parent / "moved")
        private.symlink_to(elsewhere)
        tmp.write_text("new")
    assert target.read_text() == "new" and list(elsewhere.iterdir()) == []


def test_reads_refuse_links_and_what_is_not_a_file_without_waiting(tmp_path: Path) -> None:
    real = tmp_path / "stats.json"
    real.write_bytes(b"{}")
    assert read_regular(real, limit=2) == b"{}"
    with regular_file(real) as name:
        assert Path(name).read_bytes() == b"{}"
    link = tmp_path / "link.json"
    link.symlink_to(real)
    fifo = tmp_path / "pipe.json"
    os.mkfifo(fifo)
    for path, message in [
        (link, r"link\.json is a symlink \(to .*stats\.json\)"),
        (fifo, r"pipe\.json is a FIFO \(named pipe\), not a regular file"),
        (tmp_path, r"is a directory, not a regular file"),
    ]:
        with pytest.raises(PathRefusedError, match=message):
            read_regular(path, limit=10)
        with pytest.raises(PathRefusedError, match=message), regular_file(path):
            pass
    with pytest.raises(PathRefusedError, match=r"holds 2 bytes, more than the 1 it may"):
        read_regular(real, limit=1)
    with pytest.raises(FileNotFoundError) as missing:
        read_regular(tmp_path / "missing.json", limit=10)
    assert missing.value.filename == str(tmp_path / "missing.json")


@pytest.mark.parametrize("name", ["../escape.json", "/etc/passwd", "sub/step.json", "..", ".", "", "a\x00b"])
def test_a_name_that_leaves_its_folder_is_refused(tmp_path: Path, name: str) -> None:
    with pytest.raises(PathRefusedError, match=r"is not a plain file name inside"):
        entry(tmp_path, name)
    assert entry(tmp_path, "step-000000020.safetensors") == tmp_path / "step-000000020.safetensors"


def test_a_nul_byte_in_a_path_is_a_clear_refusal(tmp_path: Path) -> None:
    bad = tmp_path / "a\x00b.json"
    for attempt in (
        lambda: checked_path(bad),
        lambda: write(bad, b"x"),
        lambda: read_regular(bad, limit=1),
        lambda: entry(bad, "x"),
    ):
        with pytest.raises(PathRefusedError, match=r"holds a NUL byte, which no file name may; remove it"):
            attempt()
    assert list(tmp_path.iterdir()) == []


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
