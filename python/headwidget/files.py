"""Atomic file writes: a saved file is either its old content or all of the new, never half of it.

:func:`atomic_write` (a file object) and :func:`atomic_output` (a path, for writers that only take a
file name) write into a private temporary folder beside the real target, flush the result to disk and
rename it over the target in one step:

- a symlink is followed: the link stays and the file it points to gets the new content;
- an existing file keeps its permission bits (and, where the process may set them, its owner and
  group); a new file gets the mode ``open()`` would give it (``0o666`` less the umask);
- a target that exists but is not a regular file (a directory, FIFO, socket or device node) is
  refused with :class:`NotRegularFileError` before anything is written;
- on any error the temporary folder is removed and the target is untouched. A process killed
  mid-write leaves only a folder named ``.<name>.<random>.headwidget-partial`` beside the target: a
  fresh name that never replaces an existing file, which :func:`partial_leftovers` lists so that it
  can be deleted;
- the new content is a new inode: other hard links to the old file keep the old content.

Failures are ``OSError`` subclasses (``PermissionError``, ``FileNotFoundError``...) whose ``filename``
is the path the caller asked for, not the temporary one, and whose ``strerror`` says what to do.

Example:
    >>> import pathlib, shutil, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> with atomic_write(folder / "notes.txt", "w") as fh:
    ...     _ = fh.write("complete")
    >>> try:
    ...     with atomic_write(folder / "notes.txt", "w") as fh:
    ...         _ = fh.write("half")
    ...         raise KeyboardInterrupt
    ... except KeyboardInterrupt:
    ...     pass
    >>> (folder / "notes.txt").read_text(), partial_leftovers(folder)
    ('complete', [])
    >>> with atomic_output(folder / "data.bin") as tmp:  # for writers that open the file by name
    ...     _ = tmp.write_bytes(b"\\x00\\x01")
    >>> (folder / "data.bin").read_bytes()
    b'\\x00\\x01'
    >>> shutil.rmtree(folder)
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, NoReturn

from headwidget.errors import HeadwidgetError

__all__ = [
    "PARTIAL_SUFFIX",
    "NotRegularFileError",
    "atomic_output",
    "atomic_write",
    "partial_leftovers",
    "real_target",
]

#: How the name of a temporary folder ends (it starts with ``.`` and the target's name).
PARTIAL_SUFFIX = ".headwidget-partial"
_NAME_ROOM = 100  # characters of the target's name kept in the temporary folder's name


class NotRegularFileError(HeadwidgetError, OSError):
    """The path to write names something other than a regular file (a directory, FIFO, device...)."""


def _what(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "a character device"
    if stat.S_ISBLK(mode):
        return "a block device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "not a regular file"


def _refuse(given: Path, real: Path, mode: int) -> NoReturn:
    where = str(given) if real == Path(os.path.abspath(given)) else f"{given} (which leads to {real})"
    raise NotRegularFileError(
        f"{where} is {_what(mode)}, not a regular file; give the path of a file to create or replace"
    )


def _named(err: OSError, given: Path) -> OSError:
    """``err`` again (same errno, so the same ``OSError`` subclass) naming the caller's path."""
    reason = err.strerror or str(err)
    hint = {
        errno.ENOENT: "; create the directory first",
        errno.ENOTDIR: "; a part of the path is not a directory",
        errno.EACCES: "; choose a directory you may write to",
        errno.EPERM: "; choose a directory you may write to",
        errno.EROFS: "; the file system is read-only, choose another directory",
        errno.ENOSPC: "; free some disk space or choose another disk",
        errno.EDQUOT: "; the disk quota is used up, free some space",
        errno.ELOOP: "; the path is a symlink loop",
    }.get(err.errno or 0, "")
    return OSError(err.errno, f"{reason}{hint}", str(given))


def real_target(path: str | os.PathLike[str]) -> Path:
    """The regular file a write to ``path`` lands in (symlinks followed); it need not exist yet.

    Raises :class:`NotRegularFileError` when it exists but is not a regular file, and an ``OSError``
    naming ``path`` when its directory does not exist or cannot be looked into.

    >>> import tempfile
    >>> real_target(tempfile.gettempdir())
    Traceback (most recent call last):
    ...
    headwidget.files.NotRegularFileError: ... is a directory, not a regular file; ...
    """
    given = Path(path)
    real = Path(os.path.realpath(given))
    try:
        info = os.stat(real)
    except FileNotFoundError:
        pass
    except OSError as err:  # a symlink loop, a name too long, a directory that cannot be searched...
        raise _named(err, given) from err
    else:
        if not stat.S_ISREG(info.st_mode):
            _refuse(given, real, info.st_mode)
        return real
    try:
        parent = os.stat(real.parent)
    except OSError as err:
        raise _named(err, given) from err
    if not stat.S_ISDIR(parent.st_mode):
        raise _named(OSError(errno.ENOTDIR, os.strerror(errno.ENOTDIR)), given)
    return real


def partial_leftovers(directory: str | os.PathLike[str]) -> list[Path]:
    """Temporary folders that an interrupted (killed) atomic write left in ``directory``, sorted.

    Each is named ``.<target name>.<random>.headwidget-partial``; deleting them loses nothing.
    """
    folder = Path(directory)
    return sorted(
        p
        for p in folder.iterdir()
        if p.name.startswith(".") and p.name.endswith(PARTIAL_SUFFIX) and p.is_dir()
    )


@contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A fresh path to write the new content of ``path`` to; on a clean exit it replaces ``path``.

    The yielded path has the target's file name (so writers that read the extension see it), inside a
    private folder beside the real target. The writer may create, truncate or rename over it. On a
    clean exit the file there is flushed to disk, given the target's mode and renamed over the target
    (and the directory entry flushed too); on an exception the folder is removed and the target is
    left as it was. See the module docstring for symlinks, modes and non-regular targets.
    """
    given = Path(path)
    real = real_target(given)
    prefix = f".{real.name[:_NAME_ROOM]}."
    try:
        folder = Path(tempfile.mkdtemp(prefix=prefix, suffix=PARTIAL_SUFFIX, dir=real.parent))
    except OSError as err:
        raise _named(err, given) from err
    try:
        tmp = folder / real.name
        try:
            # Created by this process so that the umask's default mode can be read back from it.
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
        except OSError as err:
            raise _named(err, given) from err
        try:
            new_mode = stat.S_IMODE(os.fstat(fd).st_mode)
        finally:
            os.close(fd)
        yield tmp
        _commit(tmp, real, given, new_mode)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def _commit(tmp: Path, real: Path, given: Path, new_mode: int) -> None:
    """Flush ``tmp`` with the right mode, then rename it over ``real``."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(tmp, flags)
    except OSError as err:
        raise _named(err, given) from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFileError(f"the writer of {given} left {_what(info.st_mode)} instead of a file")
        try:
            old = os.stat(real)
        except FileNotFoundError:
            mode = new_mode
        else:
            if not stat.S_ISREG(old.st_mode):  # appeared while the content was written
                _refuse(given, real, old.st_mode)
            mode = stat.S_IMODE(old.st_mode)
            _keep_owner(fd, info, old)
        os.fchmod(fd, mode)
        os.fsync(fd)
    except NotRegularFileError:
        raise
    except OSError as err:
        raise _named(err, given) from err
    finally:
        os.close(fd)
    try:
        os.replace(tmp, real)
        _fsync_directory(real.parent)
    except OSError as err:
        raise _named(err, given) from err


def _keep_owner(fd: int, new: os.stat_result, old: os.stat_result) -> None:
    """Give the new file the old one's owner and group where this process may (root, or own group)."""
    if (new.st_uid, new.st_gid) == (old.st_uid, old.st_gid):
        return
    for uid in (old.st_uid, -1):
        try:
            os.fchown(fd, uid, old.st_gid)
            return
        except OSError:
            continue


def _fsync_directory(directory: Path) -> None:
    """Flush the rename itself; file systems that cannot sync a directory are skipped."""
    try:
        fd = os.open(directory, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise
    finally:
        os.close(fd)


@contextmanager
def atomic_write(
    path: str | os.PathLike[str], mode: str = "wb", *, encoding: str | None = None, newline: str | None = None
) -> Iterator[IO[Any]]:
    """A file object whose content replaces ``path`` atomically when the ``with`` block ends cleanly.

    ``mode`` is ``"wb"`` (bytes) or ``"w"``/``"wt"`` (text, UTF-8 unless ``encoding`` says otherwise).
    """
    if mode not in ("wb", "w", "wt"):
        raise ValueError(f"atomic_write mode must be 'wb', 'w' or 'wt', not {mode!r}")
    text = mode != "wb"
    with atomic_output(path) as tmp:
        if text:
            fh: IO[Any] = open(tmp, mode, encoding=encoding or "utf-8", newline=newline)  # noqa: SIM115
        else:
            fh = open(tmp, mode)  # noqa: SIM115
        with fh:
            yield fh
