"""The files a command reads and writes: text files in, output paths checked before any work.

Example:
    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> check_output_file(folder / "report.json")
    >>> check_output_dir(folder / "demo")
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

from headwidget.cli._errors import UsageError

__all__ = ["check_output_dir", "check_output_file", "read_texts"]


def read_texts(path: Path, option: str = "--texts") -> list[str]:
    """Paragraphs of a UTF-8 text file (blank-line separated), whitespace-normalised.

    A missing, unreadable, non-UTF-8 or empty file, or a directory, is a :class:`UsageError` (exit 2).
    What is not a regular file but can be read (a pipe such as ``<(zcat texts.gz)``, ``/dev/stdin``) is
    read as one; ``/dev/null`` is an empty file.

    Example:
        >>> import pathlib, tempfile
        >>> file = pathlib.Path(tempfile.mkdtemp()) / "texts.txt"
        >>> _ = file.write_text("First  text,\\non two lines.\\n\\nSecond text.", encoding="utf-8")
        >>> read_texts(file)
        ['First text, on two lines.', 'Second text.']
    """
    if path.is_dir():
        raise UsageError(f"{option} {path}: is a directory; give a UTF-8 text file")
    if not path.exists():
        raise UsageError(f"{option} {path}: no such file")
    try:
        raw = path.read_bytes()
    except OSError as err:
        raise UsageError(f"{option} {path}: cannot read it ({err.strerror or err})") from err
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        raise UsageError(
            f"{option} {path}: not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start}); "
            "save it as UTF-8 (iconv -f latin1 -t utf-8, or your editor's 'save with encoding')"
        ) from err
    paragraphs = [" ".join(p.split()) for p in text.split("\n\n")]
    texts = [p for p in paragraphs if p]
    if not texts:
        what = "it is empty" if not raw else "only whitespace"
        raise UsageError(f"{option} {path}: the file holds no text ({what}); give a UTF-8 text file")
    return texts


def _probe_directory(directory: Path, option: str, path: Path) -> None:
    """Create and remove a file in ``directory``: the one test of writability that also holds for root
    (whom permission bits do not stop) and for read-only file systems."""
    try:
        fd, probe = tempfile.mkstemp(dir=directory, prefix=".headwidget-write-test-")
    except OSError as err:
        raise UsageError(
            f"{option} {path}: cannot write in {directory} ({err.strerror or err}); "
            "choose a directory you may write to"
        ) from err
    os.close(fd)
    os.unlink(probe)


def check_output_file(path: Path, option: str = "--out") -> None:
    """Refuse, before any work, an output file that cannot be written (a :class:`UsageError`).

    Its directory must exist and be writable; an existing target must be a regular file we may write,
    not a symlink (headwidget never writes through one: :mod:`headwidget.files`).

    Example:
        >>> import pathlib, tempfile
        >>> folder = pathlib.Path(tempfile.mkdtemp())
        >>> check_output_file(folder / "stats.safetensors")
        >>> try:
        ...     check_output_file(folder / "missing" / "stats.safetensors")
        ... except UsageError as err:
        ...     print(str(err).split(";")[1].strip())
        create it first
    """
    if path.is_symlink():
        raise UsageError(f"{option} {path}: is a symlink; give the path of the file itself")
    target = Path(os.path.realpath(path))
    if target.is_dir():
        raise UsageError(f"{option} {path}: is a directory; give the path of a file in it")
    if target.exists() and not target.is_file():
        raise UsageError(f"{option} {path}: exists and is not a regular file; give the path of a file")
    if target.exists() and not os.access(target, os.W_OK):
        raise UsageError(f"{option} {path}: exists and is read-only; choose another path or make it writable")
    directory = target.parent
    if not directory.exists():
        raise UsageError(f"{option} {path}: the directory {path.parent} does not exist; create it first")
    if not directory.is_dir():
        raise UsageError(f"{option} {path}: {path.parent} is not a directory")
    _probe_directory(directory, option, path)


def check_output_dir(path: Path, option: str = "--out") -> None:
    """Refuse, before any work, an output directory that cannot be created or written (UsageError).

    A missing directory is fine when it can be created: its nearest existing parent must be a
    writable directory.

    Example:
        >>> import pathlib, tempfile
        >>> check_output_dir(pathlib.Path(tempfile.mkdtemp()) / "new" / "demo")
    """
    target = Path(os.path.realpath(path))
    existing = target
    while not existing.exists() and existing != existing.parent:
        existing = existing.parent
    if not existing.is_dir():
        what = "is a file" if existing == target else f"lies under {existing}, which is not a directory"
        raise UsageError(f"{option} {path}: {what}; give a directory")
    _probe_directory(existing, option, path)
