"""Files that a planted link cannot redirect, written atomically: a file is its old content or all of the new.

Every file headwidget reads or writes (statistics, reports, healing runs, a timeline folder's snapshots
and index, figures and pages) goes through this module:

- **no symlink** is read or written through: a path whose last part is a symlink is refused with
  :class:`~headwidget.errors.PathRefusedError`, on reading and on writing. Whoever may write into a
  shared folder (a run folder, a results folder) could otherwise plant ``step-20.safetensors ->
  ~/.bashrc`` and have a training job overwrite a file of its user, or have a reader take a file from
  elsewhere for one of the folder's. Reads open the file with ``O_NOFOLLOW`` and check it is the regular
  file they looked at; a write replaces the folder's entry by a rename, which never follows a link, so
  a link planted after the check is replaced, not written through;
- :func:`entry` is a plain name inside a folder: a name from a file (a timeline index) that would
  leave the folder (``../x``, an absolute path, ``a/b``) is refused; a NUL byte in any path too;
- :func:`atomic_write` (a file object) and :func:`atomic_output` (a path, for writers that only take a
  file name) write into a private temporary folder beside the target, flush the result to disk and
  rename it over the target in one step. The temporary folder is reached through a descriptor held
  open (``/proc/self/fd`` where there is one), so swapping it for a link mid-write leads nowhere else;
- an existing file keeps its permission bits (and, where the process may set them, its owner and
  group); a new file gets the mode ``open()`` would give it (``0o666`` less the umask);
- a target that exists but is not a regular file (a directory, FIFO, socket or device node) is
  refused with :class:`NotRegularFileError` before anything is written;
- on any error the temporary folder is removed and the target is untouched. A process killed
  mid-write leaves only a folder named ``.<name>.<random>.headwidget-partial`` beside the target: a
  fresh name that never replaces an existing file, which :func:`partial_leftovers` lists so that it
  can be deleted;
- the new content is a new inode: other hard links to the old file keep the old content.

Failures are ``OSError`` subclasses (``PermissionError``, ``FileNotFoundError``, the refusals above...)
whose ``filename`` or message is the path the caller asked for, not the temporary one, and whose
``strerror`` says what to do.

Example:
    >>> import os, pathlib, shutil, tempfile
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
    >>> read_regular(folder / "data.bin", limit=16)
    b'\\x00\\x01'
    >>> os.symlink("notes.txt", folder / "link.txt")
    >>> read_regular(folder / "link.txt", limit=16)
    Traceback (most recent call last):
    ...
    headwidget.errors.PathRefusedError: .../link.txt is a symlink (to notes.txt); ...
    >>> entry(folder, "../elsewhere")
    Traceback (most recent call last):
    ...
    headwidget.errors.PathRefusedError: '../elsewhere' is not a plain file name ...
    >>> shutil.rmtree(folder)
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import stat
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any, NoReturn

from headwidget.errors import NotRegularFileError, PathRefusedError

__all__ = [
    "PARTIAL_SUFFIX",
    "NotRegularFileError",
    "PathRefusedError",
    "atomic_output",
    "atomic_write",
    "checked_path",
    "entry",
    "partial_leftovers",
    "read_regular",
    "regular_file",
]

#: How the name of a temporary folder ends (it starts with ``.`` and the target's name).
PARTIAL_SUFFIX = ".headwidget-partial"
_NAME_ROOM = 100  # characters of the target's name kept in the temporary folder's name
_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_DIRECTORY = getattr(os, "O_DIRECTORY", 0)
#: A read never follows a last-part symlink, and never waits (a FIFO put in a file's place).
_READ = os.O_RDONLY | _NOFOLLOW | getattr(os, "O_NONBLOCK", 0) | _CLOEXEC


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


def _refuse(given: Path, mode: int) -> NoReturn:
    """Refuse ``given``, whose entry (not followed) has ``mode``, as a file to read or write."""
    if stat.S_ISLNK(mode):
        try:
            where = f" (to {os.readlink(given)})"
        except OSError:
            where = ""
        raise PathRefusedError(
            f"{given} is a symlink{where}; headwidget neither reads nor writes through a link (one planted "
            "in a shared folder would lead outside it): give the path of the file itself"
        )
    raise NotRegularFileError(f"{given} is {_what(mode)}, not a regular file; give the path of a file")


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


def checked_path(path: str | os.PathLike[str]) -> Path:
    """``path`` as a :class:`~pathlib.Path`, refused (:class:`~headwidget.errors.PathRefusedError`)
    when it holds a NUL byte, which no file name may (``open`` would raise a bare ``ValueError``).

    >>> checked_path("runs/a\\x00b.json")
    Traceback (most recent call last):
    ...
    headwidget.errors.PathRefusedError: the path 'runs/a\\x00b.json' holds a NUL byte, ...
    """
    given = Path(path)
    if "\0" in str(given):
        raise PathRefusedError(f"the path {str(given)!r} holds a NUL byte, which no file name may; remove it")
    return given


def entry(folder: str | os.PathLike[str], name: str) -> Path:
    """``folder / name`` for a plain file name: not empty, ``.`` or ``..``, and without a separator, so it
    names a file in ``folder`` itself, never elsewhere (a name read from a file is refused otherwise)."""
    seps = {os.sep, os.altsep or os.sep, "/"}
    if not isinstance(name, str) or name in ("", ".", "..") or "\0" in name or any(s in name for s in seps):
        raise PathRefusedError(
            f"{name!r} is not a plain file name inside {folder} (it would name a file elsewhere)"
        )
    return checked_path(folder) / name


@contextmanager
def _opened(path: str | os.PathLike[str]) -> Iterator[tuple[int, os.stat_result]]:
    """A descriptor of the regular file at ``path`` (not followed), and its status."""
    given = checked_path(path)
    try:
        seen = os.lstat(given)
    except OSError as err:
        raise type(err)(err.errno, err.strerror or str(err), str(given)) from err
    if not stat.S_ISREG(seen.st_mode):
        _refuse(given, seen.st_mode)
    try:
        fd = os.open(given, _READ)
    except OSError as err:
        if err.errno == errno.ELOOP:  # a link put in its place since: refused as a link
            _refuse(given, stat.S_IFLNK)
        raise type(err)(err.errno, err.strerror or str(err), str(given)) from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or (info.st_dev, info.st_ino) != (seen.st_dev, seen.st_ino):
            raise PathRefusedError(f"{given} was replaced while it was opened; read it again")
        yield fd, info
    finally:
        os.close(fd)


def read_regular(path: str | os.PathLike[str], *, limit: int) -> bytes:
    """The bytes of the regular file at ``path``, refused (:class:`~headwidget.errors.PathRefusedError`)
    when ``path`` is a symlink, not a regular file, or holds more than ``limit`` bytes. A missing file
    raises ``FileNotFoundError``, other failures an ``OSError``, each naming ``path``."""
    with _opened(path) as (fd, info):
        if info.st_size > limit:
            raise PathRefusedError(f"{path} holds {info.st_size} bytes, more than the {limit} it may")
        chunks, size = [], 0
        while size <= limit and (chunk := os.read(fd, min(1 << 20, limit + 1 - size))):
            chunks.append(chunk)
            size += len(chunk)
    if size > limit:  # it grew meanwhile
        raise PathRefusedError(f"{path} holds more than the {limit} bytes it may")
    return b"".join(chunks)


@contextmanager
def regular_file(path: str | os.PathLike[str]) -> Iterator[str]:
    """A name that opens the regular file at ``path``, for readers that only take a name
    (``safetensors.safe_open``): the file is opened here, refused as :func:`read_regular` refuses it,
    and the name leads to that open file (``/proc/self/fd/N``), so a link put in its place meanwhile is
    never what the reader reads."""
    with _opened(path) as (fd, _):
        yield _through(fd, str(checked_path(path)))


def _through(fd: int, fallback: str) -> str:
    """The name of the file or folder open as ``fd`` (where the system has one), else ``fallback``."""
    held = f"/proc/self/fd/{fd}"
    return held if os.path.exists(held) else fallback


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
def _folder_of(given: Path) -> Iterator[int]:
    """A descriptor of the folder ``given`` is written into (its path followed: the caller chose it)."""
    try:
        fd = os.open(given.parent, os.O_RDONLY | _DIRECTORY | _CLOEXEC)
    except OSError as err:
        raise _named(err, given) from err
    try:
        yield fd
    finally:
        os.close(fd)


def _target(given: Path, folder: int) -> os.stat_result | None:
    """The status of the entry to replace (None: there is none), refused unless a regular file."""
    try:
        info = os.stat(given.name, dir_fd=folder, follow_symlinks=False)
    except FileNotFoundError:
        return None
    except OSError as err:
        raise _named(err, given) from err
    if not stat.S_ISREG(info.st_mode):
        _refuse(given, info.st_mode)
    return info


def _temporary_folder(given: Path, folder: int) -> str:
    """A fresh private folder beside the target (its name in ``folder``)."""
    for _ in range(100):
        name = f".{given.name[:_NAME_ROOM]}.{secrets.token_hex(4)}{PARTIAL_SUFFIX}"
        try:
            os.mkdir(name, 0o700, dir_fd=folder)
        except FileExistsError:
            continue
        except OSError as err:
            raise _named(err, given) from err
        return name
    raise _named(OSError(errno.EEXIST, "no fresh temporary name"), given)


@contextmanager
def atomic_output(path: str | os.PathLike[str]) -> Iterator[Path]:
    """A fresh path to write the new content of ``path`` to; on a clean exit it replaces ``path``.

    The yielded path has the target's file name (so writers that read the extension see it), inside a
    private folder beside the target. The writer may create, truncate or rename over it. On a clean
    exit the file there is flushed to disk, given the target's mode and renamed over the target (and
    the folder flushed too); on an exception the private folder is removed and the target is left as
    it was. See the module docstring for symlinks, modes and non-regular targets.
    """
    given = checked_path(path)
    if given.name in ("", ".", ".."):
        raise NotRegularFileError(f"{given} is a directory, not a regular file; give the path of a file")
    with _folder_of(given) as folder:
        _target(given, folder)
        temporary = _temporary_folder(given, folder)
        try:
            try:
                held = os.open(temporary, os.O_RDONLY | _DIRECTORY | _NOFOLLOW | _CLOEXEC, dir_fd=folder)
            except OSError as err:
                raise _named(err, given) from err
            try:
                new_mode = _create(given, held)
                yield Path(_through(held, str(given.parent / temporary))) / given.name
                _commit(given, held, folder, new_mode)
            finally:
                os.close(held)
        finally:
            shutil.rmtree(temporary, ignore_errors=True, dir_fd=folder)


def _create(given: Path, held: int) -> int:
    """Create the empty new file in the temporary folder; the mode ``open()`` gives a new file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | _CLOEXEC
    try:
        fd = os.open(given.name, flags, 0o666, dir_fd=held)
    except OSError as err:
        raise _named(err, given) from err
    try:
        return stat.S_IMODE(os.fstat(fd).st_mode)
    finally:
        os.close(fd)


def _commit(given: Path, held: int, folder: int, new_mode: int) -> None:
    """Flush the new file with the right mode, then rename it over the target's entry."""
    try:
        fd = os.open(given.name, os.O_RDONLY | _NOFOLLOW | _CLOEXEC, dir_fd=held)
    except OSError as err:
        raise _named(err, given) from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise NotRegularFileError(f"the writer of {given} left {_what(info.st_mode)} instead of a file")
        old = _target(given, folder)  # a link or a folder may have appeared while the content was written
        mode = new_mode if old is None else stat.S_IMODE(old.st_mode)
        if old is not None:
            _keep_owner(fd, info, old)
        os.fchmod(fd, mode)
        os.fsync(fd)
    except PathRefusedError:
        raise
    except OSError as err:
        raise _named(err, given) from err
    finally:
        os.close(fd)
    try:
        os.replace(given.name, given.name, src_dir_fd=held, dst_dir_fd=folder)
        _fsync_directory(folder)
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


def _fsync_directory(folder: int) -> None:
    """Flush the rename itself; file systems that cannot sync a directory are skipped."""
    try:
        os.fsync(folder)
    except OSError as err:
        if err.errno not in (errno.EINVAL, errno.ENOTSUP, errno.EBADF):
            raise


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
