"""A timeline on disk: a folder of one statistics file per snapshot and an index, each written atomically.

``<path>/step-000000050.safetensors`` holds the snapshot of step 50 (:meth:`KVStats.save
<headwidget.stats.KVStats.save>`), and ``<path>/timeline.json`` the index: the format tag, the model
the snapshots come from (class, config fingerprint, attention layout), the snapshots' steps and files in
order, and the trainer's logs by step. A snapshot's file is written before the index that names it, and
both through :mod:`headwidget.files`, so a crash or a kill at any moment leaves an index that names only
complete snapshot files: the folder loads with every snapshot completed before it (a file the index does
not name yet is ignored, and overwritten by the next write of its step).

Reading checks the index as :meth:`KVStats.load <headwidget.stats.KVStats.load>` checks a statistics
file (types, ranges, order, names that stay inside the folder) and raises
:class:`~headwidget.errors.TimelineFileError` naming the folder and the field; each snapshot is read,
and checked, only when it is asked for.

Example:
    >>> import pathlib, tempfile
    >>> folder = pathlib.Path(tempfile.mkdtemp()) / "run.track"
    >>> store = TimelineStore(folder)
    >>> snapshot_name(50), store.index["snapshots"]
    ('step-000000050.safetensors', [])
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from headwidget.errors import TimelineFileError
from headwidget.files import atomic_write
from headwidget.stats import KVStats

__all__ = ["FORMAT", "INDEX", "TimelineStore", "read_index", "snapshot_name"]

#: The format tag of the index.
FORMAT = "headwidget-timeline/1"
#: The index's file name inside the folder.
INDEX = "timeline.json"
_NAME = re.compile(r"step-(\d{9,})\.safetensors")
_MAX_STEP = 2**62


def snapshot_name(step: int) -> str:
    """The file name of the snapshot of ``step`` inside a timeline folder."""
    return f"step-{step:09d}.safetensors"


def model_facts(stats: KVStats) -> dict[str, Any]:
    """What the index records of the model the snapshots come from (they must all agree)."""
    meta = stats.meta
    return {
        "model_class": meta.model_class,
        "config_fingerprint": meta.config_fingerprint,
        "layout": json.loads(json.dumps(meta.to_json()["layout"])),
    }


def _fail(folder: Path, field: str, why: str) -> TimelineFileError:
    return TimelineFileError(
        f"{folder / INDEX}: {field} {why}; this folder was not written by headwidget's Tracker (or was "
        "changed since): point Tracker(path=...) at a new folder, or restore the index"
    )


def _steps_and_files(folder: Path, raw: Any) -> list[dict[str, Any]]:
    if not isinstance(raw, list):
        raise _fail(folder, "snapshots", f"must be a list, not {type(raw).__name__}")
    out: list[dict[str, Any]] = []
    for i, entry in enumerate(raw):
        if not isinstance(entry, dict) or set(entry) != {"step", "file"}:
            raise _fail(folder, f"snapshots[{i}]", "must be an object with exactly 'step' and 'file'")
        step, name = entry["step"], entry["file"]
        if type(step) is not int or not 0 <= step <= _MAX_STEP:
            raise _fail(folder, f"snapshots[{i}].step", f"must be a whole number from 0, not {step!r}")
        if out and step <= out[-1]["step"]:
            raise _fail(folder, f"snapshots[{i}].step", f"{step} does not follow {out[-1]['step']}")
        if name != snapshot_name(step):
            raise _fail(folder, f"snapshots[{i}].file", f"must be {snapshot_name(step)!r}, not {name!r}")
        out.append({"step": step, "file": name})
    return out


def _logs(folder: Path, raw: Any) -> dict[str, dict[str, float]]:
    if not isinstance(raw, dict):
        raise _fail(folder, "logs", f"must be an object, not {type(raw).__name__}")
    out: dict[str, dict[str, float]] = {}
    for step, values in raw.items():
        if not (isinstance(step, str) and step.isascii() and step.isdigit() and len(step) <= 19):
            raise _fail(folder, f"logs[{step!r}]", "must be keyed by a step (decimal digits)")
        if not isinstance(values, dict):
            raise _fail(folder, f"logs[{step!r}]", "must be an object of numbers")
        for name, value in values.items():
            if not isinstance(name, str) or type(value) not in (int, float) or not math.isfinite(value):
                raise _fail(folder, f"logs[{step!r}][{name!r}]", f"must be a finite number, not {value!r}")
        out[str(int(step))] = {name: float(value) for name, value in values.items()}
    return out


def read_index(folder: str | Path) -> dict[str, Any]:
    """The checked index of the timeline folder ``folder`` (see the module docstring).

    Raises:
        TimelineFileError: no index, an unreadable one, or a field of the wrong type or out of order.
    """
    folder = Path(folder)
    path = folder / INDEX
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise TimelineFileError(
            f"{path} does not exist: {folder} is not a timeline folder (Tracker(path=...) writes one)"
        ) from None
    except (OSError, UnicodeDecodeError) as err:
        raise TimelineFileError(f"cannot read {path}: {err}") from err
    try:
        raw = json.loads(text)
    except json.JSONDecodeError as err:
        raise _fail(folder, "the file", f"is not JSON ({err})") from None
    if not isinstance(raw, dict) or raw.get("format") != FORMAT:
        raise _fail(folder, "format", f"must be {FORMAT!r}")
    expected = {"format", "model", "snapshots", "logs"}
    if set(raw) != expected:
        raise _fail(folder, "the index", f"must hold exactly {sorted(expected)}, not {sorted(raw)}")
    model = raw["model"]
    facts = {"model_class", "config_fingerprint", "layout"}
    if model is not None and (not isinstance(model, dict) or set(model) != facts):
        raise _fail(folder, "model", "must be null or an object with model_class, config_fingerprint, layout")
    return {
        "format": FORMAT,
        "model": model,
        "snapshots": _steps_and_files(folder, raw["snapshots"]),
        "logs": _logs(folder, raw["logs"]),
    }


class TimelineStore:
    """The writer of one timeline folder (see the module docstring); an existing folder is continued.

    Raises:
        TimelineFileError: ``path`` is a file, or a folder whose index cannot be read.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        if self.path.exists() and not self.path.is_dir():
            raise TimelineFileError(f"{self.path} is a file; a timeline is a folder: give a folder's path")
        try:
            self.path.mkdir(parents=True, exist_ok=True)
        except OSError as err:
            raise TimelineFileError(f"cannot create the timeline folder {self.path}: {err}") from err
        if (self.path / INDEX).exists():
            self.index = read_index(self.path)
        else:
            self.index = {"format": FORMAT, "model": None, "snapshots": [], "logs": {}}
            self._write_index()

    @property
    def steps(self) -> list[int]:
        return [entry["step"] for entry in self.index["snapshots"]]

    def check_model(self, stats: KVStats) -> None:
        """Refuse a snapshot of another model than the folder's earlier ones."""
        facts, held = model_facts(stats), self.index["model"]
        if held is not None and held != facts:
            raise TimelineFileError(
                f"{self.path} holds snapshots of {held['model_class']} (config "
                f"{held['config_fingerprint']}), not of this {facts['model_class']} (config "
                f"{facts['config_fingerprint']}): give this run a folder of its own"
            )

    def add(self, step: int, stats: KVStats) -> Path:
        """Write the snapshot of ``step`` (after every step the folder holds), then the index naming it."""
        self.check_model(stats)
        if self.steps and step <= self.steps[-1]:
            raise TimelineFileError(
                f"{self.path} already holds step {self.steps[-1]}; snapshots are written in step order"
            )
        written = stats.save(self.path / snapshot_name(step))
        self.index["model"] = model_facts(stats)
        self.index["snapshots"].append({"step": step, "file": snapshot_name(step)})
        self._write_index()
        return written

    def set_logs(self, logs: dict[int, dict[str, float]]) -> None:
        self.index["logs"] = {str(step): dict(values) for step, values in sorted(logs.items())}
        self._write_index()

    def _write_index(self) -> None:
        with atomic_write(self.path / INDEX, "w") as fh:
            json.dump(self.index, fh, indent=1, allow_nan=False)
