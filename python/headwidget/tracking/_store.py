"""A timeline on disk: a folder of one statistics file per snapshot and an index, each written atomically.

``<path>/step-000000050.safetensors`` holds the snapshot of step 50 (:meth:`KVStats.save
<headwidget.stats.KVStats.save>`), and ``<path>/timeline.json`` the index (:class:`TimelineIndex`): the
format tag, the model the snapshots come from (class, config fingerprint, attention layout), the
snapshots' steps and files in order, and the trainer's logs by step. A snapshot's file is written before
the index that names it, and both through :mod:`headwidget.files`, so a crash or a kill at any moment
leaves an index that names only complete snapshot files: the folder loads with every snapshot completed
before it (a file the index does not name yet is ignored, and overwritten by the next write of its step).

The folder is read and written as :mod:`headwidget.files` reads and writes: a snapshot file or an index
that is a symlink is refused, never followed, and a name from the index must be the snapshot's own
plain name, so a folder that others may write into cannot lead a reader or a training job to a file
outside it. The index is read by the one reader of stored dataclasses
(:class:`~headwidget.core.stored.StoredReader`: types, ranges, order) and raises
:class:`~headwidget.errors.TimelineFileError` naming the folder and the field; each snapshot is read,
and checked, only when it is asked for (:class:`~headwidget.tracking.Timeline`), and must be of the
index's model.

Example:
    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp()) / "run.track"
    >>> store = TimelineStore(folder)
    >>> snapshot_name(50), store.index.snapshots, read_index(folder) == store.index
    ('step-000000050.safetensors', [], True)
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from headwidget.core.layout import AttentionLayout
from headwidget.core.stored import StoredReader, describe, key, parse_json, stored
from headwidget.errors import PathRefusedError, TimelineFileError
from headwidget.files import atomic_write, checked_path, entry, read_regular
from headwidget.stats import KVStats

__all__ = [
    "FORMAT",
    "INDEX",
    "SnapshotEntry",
    "TimelineIndex",
    "TimelineModel",
    "TimelineStore",
    "read_index",
    "snapshot_name",
]

#: The format tag of the index.
FORMAT = "headwidget-timeline/1"
#: The index's file name inside the folder.
INDEX = "timeline.json"
_MAX_STEP = 2**62
#: Larger indexes are refused unread (a million snapshots and their logs take far less).
MAX_INDEX_BYTES = 256 << 20
_REPAIR = (
    "this folder was not written by headwidget's Tracker (or was changed since): point Tracker(path=...) "
    "at a new folder, or restore the index"
)


def snapshot_name(step: int) -> str:
    """The file name of the snapshot of ``step`` inside a timeline folder."""
    return f"step-{step:09d}.safetensors"


@dataclass(frozen=True)
class TimelineModel:
    """The model a timeline's snapshots come from: each snapshot must be of it (its class, config
    fingerprint and attention layout), so statistics of another model are never drawn as a step."""

    model_class: str
    config_fingerprint: str
    layout: AttentionLayout

    @classmethod
    def of(cls, stats: KVStats) -> TimelineModel:
        meta = stats.meta
        return cls(meta.model_class, meta.config_fingerprint, meta.layout)

    def __str__(self) -> str:
        layout = self.layout
        heads = f"{layout.num_layers} layers, {layout.num_heads} heads over {layout.num_kv_heads} KV heads"
        return f"{self.model_class} (config {self.config_fingerprint}; {heads})"


@dataclass(frozen=True)
class SnapshotEntry:
    """One snapshot the index names: its step and its file in the folder."""

    step: int = stored(minimum=0, maximum=_MAX_STEP)
    file: str = stored()


@dataclass
class TimelineIndex:
    """What ``timeline.json`` holds (see the module docstring); ``logs`` maps a step (decimal digits) to
    the trainer's numbers there."""

    format: str
    model: TimelineModel | None
    snapshots: list[SnapshotEntry]
    logs: dict[str, dict[str, float]] = stored(finite=True)

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def read_index(folder: str | Path) -> TimelineIndex:
    """The checked index of the timeline folder ``folder`` (see the module docstring).

    Raises:
        TimelineFileError: no index, an unreadable or symlinked one, or a field of the wrong type or out
            of order.
    """
    try:
        path = entry(folder, INDEX)
        raw = read_regular(path, limit=MAX_INDEX_BYTES)
    except FileNotFoundError:
        raise TimelineFileError(
            f"{Path(folder) / INDEX} does not exist: {folder} is not a timeline folder (Tracker(path=...) "
            "writes one)"
        ) from None
    except PathRefusedError as err:
        raise TimelineFileError(f"cannot read the timeline index: {err}") from err
    except OSError as err:
        raise TimelineFileError(f"cannot read {Path(folder) / INDEX}: {err.strerror or err}") from err
    reader = StoredReader(TimelineFileError, str(path), _REPAIR, where=str(path))
    index = reader.read(parse_json(raw, reader.fail_whole), TimelineIndex)
    if index.format != FORMAT:
        reader.fail("format", f"must be {FORMAT!r}, not {describe(index.format)}")
    for i, (before, snapshot) in enumerate(zip([None, *index.snapshots], index.snapshots, strict=False)):
        if before is not None and snapshot.step <= before.step:
            reader.fail(f"snapshots[{i}].step", f"{snapshot.step} does not follow {before.step}")
        if snapshot.file != snapshot_name(snapshot.step):
            wanted = snapshot_name(snapshot.step)
            reader.fail(f"snapshots[{i}].file", f"must be {wanted!r}, not {describe(snapshot.file)}")
    if index.snapshots and index.model is None:
        reader.fail("model", "is null, but the index names snapshots; it must say which model they are of")
    for step in index.logs:
        if not (step.isascii() and step.isdigit() and len(step) <= 19):
            reader.fail(f"logs[{key(step)}]", "must be keyed by a step (decimal digits)")
    return index


class TimelineStore:
    """The writer of one timeline folder (see the module docstring); an existing folder is continued.

    Raises:
        TimelineFileError: ``path`` is a file, or a folder whose index cannot be read (or is a symlink).
    """

    def __init__(self, path: str | Path) -> None:
        try:
            self.path = checked_path(path)
        except PathRefusedError as err:
            raise TimelineFileError(f"cannot use the timeline folder: {err}") from err
        if self.path.exists() and not self.path.is_dir():
            raise TimelineFileError(f"{self.path} is a file; a timeline is a folder: give a folder's path")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise TimelineFileError(f"cannot create the timeline folder {self.path}: {err}") from err
        if os.path.lexists(self.path / INDEX):  # a link there too: read_index refuses it
            self.index = read_index(self.path)
        else:
            self.index = TimelineIndex(FORMAT, None, [], {})
            self._write_index()

    @property
    def steps(self) -> list[int]:
        return [snapshot.step for snapshot in self.index.snapshots]

    def check_model(self, stats: KVStats) -> None:
        """Refuse a snapshot of another model than the folder's earlier ones."""
        facts, held = TimelineModel.of(stats), self.index.model
        if held is not None and held != facts:
            raise TimelineFileError(
                f"{self.path} holds snapshots of {held}, not of this {facts}: give this run a folder of "
                "its own"
            )

    def add(self, step: int, stats: KVStats) -> Path:
        """Write the snapshot of ``step`` (after every step the folder holds), then the index naming it."""
        self.check_model(stats)
        if self.steps and step <= self.steps[-1]:
            raise TimelineFileError(
                f"{self.path} already holds step {self.steps[-1]}; snapshots are written in step order"
            )
        written = stats.save(entry(self.path, snapshot_name(step)))  # refuses a link planted there
        model = self.index.model
        self.index.model = TimelineModel.of(stats)
        self.index.snapshots.append(SnapshotEntry(step, snapshot_name(step)))
        try:
            self._write_index()
        except TimelineFileError:  # the folder does not hold the step: neither does the index kept here
            self.index.snapshots.pop()
            self.index.model = model
            raise
        return written

    def set_logs(self, logs: dict[int, dict[str, float]]) -> None:
        self.index.logs = {str(step): dict(values) for step, values in sorted(logs.items())}
        self._write_index()

    def _write_index(self) -> None:
        try:
            with atomic_write(entry(self.path, INDEX), "w") as fh:
                json.dump(self.index.to_json(), fh, indent=1, allow_nan=False)
        except PathRefusedError as err:
            raise TimelineFileError(f"cannot write the timeline index: {err}") from err
        except OSError as err:
            raise TimelineFileError(f"cannot write {self.path / INDEX}: {err.strerror or err}") from err
