"""A timeline: the statistics of one model at a series of training steps, and the trainer's logs.

Snapshots live in memory (a tracker without a path) or in a timeline folder
(:mod:`headwidget.tracking._store`), where each is read only when asked for and at most
:data:`KEEP_LOADED` stay in memory, so a timeline of hundreds of snapshots opens at once. Every snapshot
is of one model (its class, config fingerprint and attention layout: the folder's index says which, or
else the first snapshot): one of another model is refused naming its step, never drawn.

Example:
    >>> import torch, headwidget
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4)).eval()
    >>> probe = torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0))
    >>> timeline = Timeline.from_checkpoints([model, model], [0, 10], probe)
    >>> timeline.steps, timeline[10].tokens, sorted(timeline.summary()[0])[:5]
    ([0, 10], 32, ['key_abs_corr', 'key_aligned_sim', 'key_eff_rank', 'key_head_cos', 'layer'])
    >>> series = timeline.layer_series(1)  # the trend lines of one layer: a value per step
    >>> list(series) == list(SUMMARY_METRICS), len(series["key_abs_corr"])
    (True, 2)
"""

from __future__ import annotations

import itertools
import math
import numbers
import threading
from collections import OrderedDict
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from headwidget.analysis.alignment import align
from headwidget.capture import capture
from headwidget.checks import whole_number
from headwidget.errors import ArgumentError, PathRefusedError, TimelineFileError, TrackingError
from headwidget.files import checked_path, entry
from headwidget.moments import effective_rank, off_diagonal_mean
from headwidget.stats import KVStats
from headwidget.tracking._store import TimelineModel, read_index

__all__ = ["KEEP_LOADED", "SUMMARY_METRICS", "SUMMARY_RANKS", "Timeline"]

#: Snapshots of a timeline folder kept in memory at once (the most recently asked for).
KEEP_LOADED = 8
#: The numbers of a :meth:`Timeline.summary` row, each with what a trend line calls it: mean
#: |off-diagonal channel correlation|, mean off-diagonal head similarity (per-token cosine) before
#: alignment, and after it (each pair of KV heads aligned as :class:`~headwidget.AlignmentView` does by
#: default: RoPE plane rotations or orthogonal Procrustes for keys, orthogonal for values; held-out
#: scores where its rule picks them), of the keys (pre-RoPE) and the values. All lie in −1..1, so one
#: chart draws them; the rows also hold the K and V effective ranks (1..C, see :data:`SUMMARY_RANKS`).
SUMMARY_METRICS: dict[str, str] = {
    "key_abs_corr": "K mean |ρ|",
    "value_abs_corr": "V mean |ρ|",
    "key_head_cos": "K head cosine",
    "value_head_cos": "V head cosine",
    "key_aligned_sim": "K aligned heads",
    "value_aligned_sim": "V aligned heads",
}
#: The entropy effective rank of the K and of the V covariance over all of a layer's KV channels
#: (:func:`~headwidget.moments.effective_rank`): how many directions K/V use, the room low-rank KV has.
SUMMARY_RANKS: dict[str, str] = {"key_eff_rank": "K effective rank", "value_eff_rank": "V effective rank"}


def finite(value: object) -> float | None:
    """``value`` as a float when it is a finite real number (an int too large for a float is not)."""
    if type(value) not in (int, float):
        return None
    try:
        number = float(value)  # type: ignore[arg-type]
    except OverflowError:
        return None
    return number if math.isfinite(number) else None


def _checked_logs(logs: Mapping[int, Mapping[str, float]] | None) -> dict[int, dict[str, float]]:
    if logs is not None and not isinstance(logs, Mapping):
        raise ArgumentError(f"logs must map steps to the numbers logged there, got {type(logs).__name__}")
    out: dict[int, dict[str, float]] = {}
    for step, values in (logs or {}).items():
        at = whole_number("a step of logs", step, minimum=0, hint="a training step")
        if not isinstance(values, Mapping):
            raise ArgumentError(f"logs[{at}] must map names to numbers, got {type(values).__name__}")
        out[at] = {}
        for name, value in values.items():
            number = finite(value)
            if not isinstance(name, str) or number is None:
                what = f"an integer of {value.bit_length()} bits" if type(value) is int else repr(value)[:40]
                raise ArgumentError(
                    f"logs[{at}][{name!r}] is {what}; a logged number is a finite float, named by a string"
                )
            out[at][name] = number
    return dict(sorted(out.items()))


class Timeline:
    """Statistics by training step (see the module docstring): ``timeline[step]`` is a
    :class:`~headwidget.stats.KVStats`, ``timeline.logs[step]`` the trainer's logged numbers there.

    Raises:
        ArgumentError: ``logs`` with a value that is no finite float, or a step that is no whole number.
        TrackingError: snapshots of different models.
    """

    def __init__(
        self,
        snapshots: dict[int, KVStats | Path],
        logs: dict[int, dict[str, float]] | None = None,
        path: Path | None = None,
        *,
        model: TimelineModel | None = None,
    ) -> None:
        self._snapshots = dict(sorted(snapshots.items()))
        self._loaded: OrderedDict[int, KVStats] = OrderedDict()
        self.logs: dict[int, dict[str, float]] = _checked_logs(logs)
        self.path = path
        self._model = model
        for step, held in self._snapshots.items():
            if isinstance(held, KVStats):
                self._check_model(step, held)
        self._summary: list[dict[str, Any]] | None = None
        self._lock = threading.Lock()

    @property
    def steps(self) -> list[int]:
        """The snapshots' steps, in order."""
        return list(self._snapshots)

    def __len__(self) -> int:
        return len(self._snapshots)

    def __iter__(self) -> Iterator[int]:
        return iter(self._snapshots)

    def __contains__(self, step: object) -> bool:
        return step in self._snapshots

    def __getitem__(self, step: int) -> KVStats:
        whole = isinstance(step, numbers.Integral) and not isinstance(step, bool)
        if not whole or int(step) not in self._snapshots:
            near = ", ".join(map(str, self.steps[:8])) + (" ..." if len(self) > 8 else "")
            raise TrackingError(f"step {step!r} is not in this timeline; its steps are {near or 'none'}")
        step = int(step)
        held = self._snapshots[step]
        if isinstance(held, KVStats):
            return held
        with self._lock:  # a view computes the next step on a background thread meanwhile
            stats = self._loaded.get(step)
            if stats is None:
                stats = KVStats.load(held)
                self._check_model(step, stats, held)
                self._loaded[step] = stats
                while len(self._loaded) > KEEP_LOADED:
                    self._loaded.popitem(last=False)
            self._loaded.move_to_end(step)
            return stats

    def _check_model(self, step: int, stats: KVStats, file: Path | None = None) -> None:
        """Refuse ``stats`` as the snapshot of ``step`` unless it is of this timeline's model."""
        facts = TimelineModel.of(stats)
        if self._model is None:
            self._model = facts
        elif facts != self._model:
            if file is None:
                raise TrackingError(
                    f"the snapshot of step {step} is of {facts}, but this timeline's first is of "
                    f"{self._model}: a timeline holds the snapshots of one model"
                )
            raise TimelineFileError(
                f"{self.path}: the snapshot of step {step} ({file.name}) is of {facts}, but the folder's "
                f"index says its snapshots are of {self._model}; the file was replaced since the Tracker "
                "wrote it: restore it, or take the snapshots again in a new folder"
            )

    def summary(self) -> list[dict[str, Any]]:
        """Per step and captured layer: mean |channel correlation| of K and V and mean head similarity
        before alignment (the rows of :meth:`KVStats.summary <headwidget.stats.KVStats.summary>` with
        their step), mean head similarity after alignment and the effective ranks of K and V (see
        :data:`SUMMARY_METRICS` and :data:`SUMMARY_RANKS`; NaN where a layer has one KV head).

        Computed once per timeline (its snapshots do not change): trend lines read it again for free.
        """
        if self._summary is None:
            rows = []
            for step in self.steps:
                stats = self[step]
                for row in stats.summary():
                    rows.append({"step": step, **row, **_aligned_and_ranks(stats, row["layer"])})
            self._summary = rows
        return [dict(row) for row in self._summary]

    def layer_series(self, layer: int) -> dict[str, list[float]]:
        """The trend lines of ``layer``: for each of :data:`SUMMARY_METRICS`, its value at every step
        (in step order), from :meth:`summary`; NaN at a step whose snapshot lacks the layer or the kind.

        Raises:
            ArgumentError: ``layer`` not a whole number from 0.
        """
        layer = whole_number("layer", layer, minimum=0, hint="a layer of the model")
        rows = {row["step"]: row for row in self.summary() if row["layer"] == layer}
        return {
            metric: [float(rows.get(step, {}).get(metric, math.nan)) for step in self.steps]
            for metric in SUMMARY_METRICS
        }

    def log_series(self, name: str = "loss") -> tuple[list[int], list[float]]:
        """The steps at which the trainer logged ``name`` (``"loss"``, ``"learning_rate"``…) and the
        values, in step order; two empty lists when it never did.

        Raises:
            ArgumentError: ``name`` not a string.
        """
        if not isinstance(name, str):
            raise ArgumentError(f"name must be the name of a logged number (a string), got {name!r}")
        logged = [(step, values[name]) for step, values in self.logs.items() if name in values]
        return [step for step, _ in logged], [value for _, value in logged]

    def __repr__(self) -> str:
        where = f", {self.path}" if self.path is not None else ""
        span = f"steps {self.steps[0]}..{self.steps[-1]}" if self.steps else "no steps"
        return f"Timeline({len(self)} snapshots, {span}{where})"

    # ---------------------------------------------------------------------------------------- making
    @classmethod
    def load(cls, path: str | Path) -> Timeline:
        """The timeline a :class:`~headwidget.tracking.Tracker` wrote to the folder ``path``; each
        snapshot is read (and checked, as ``KVStats.load`` checks) when first asked for.

        Raises:
            TimelineFileError: not a timeline folder, a corrupt or symlinked index; when a snapshot is
                read, a symlinked one (:class:`~headwidget.errors.StatsFileError`) or one of another model
                than the index's.
        """
        try:
            folder = checked_path(path)
        except PathRefusedError as err:
            raise TimelineFileError(f"cannot load a timeline: {err}") from err
        index = read_index(folder)
        snapshots: dict[int, KVStats | Path] = {e.step: entry(folder, e.file) for e in index.snapshots}
        logs = {int(step): values for step, values in index.logs.items()}
        return cls(snapshots, logs, folder, model=index.model)

    @classmethod
    def from_checkpoints(
        cls,
        models_or_dirs: Sequence[nn.Module | str | Path],
        steps: Sequence[int],
        probe_texts: Any,
        *,
        tokenizer: Any = None,
        **capture_options: Any,
    ) -> Timeline:
        """A timeline of saved checkpoints: ``capture(checkpoint, probe_texts, ...)`` at each step.

        ``models_or_dirs`` are models, or folders that ``transformers.AutoModel.from_pretrained`` reads
        (each loaded in turn and let go after its capture); ``steps`` their steps, increasing.
        ``capture_options`` go to :func:`~headwidget.capture` (``progress`` is off unless given).

        Raises:
            ArgumentError: ``steps`` not whole numbers from 0, not increasing, or not one per checkpoint;
                an entry of ``models_or_dirs`` that is neither a model nor a folder.
            TrackingError: a folder that ``from_pretrained`` cannot load, or checkpoints of different
                models.
        """
        if isinstance(models_or_dirs, (str, Path, nn.Module)) or not isinstance(models_or_dirs, Sequence):
            raise ArgumentError("models_or_dirs must be a list of models or checkpoint folders")
        if isinstance(steps, (str, bytes)) or not isinstance(steps, Sequence):
            raise ArgumentError(f"steps must be a list of whole numbers, one per checkpoint, got {steps!r}")
        checked = [
            whole_number(f"steps[{i}]", s, minimum=0, hint="a training step") for i, s in enumerate(steps)
        ]
        if len(checked) != len(models_or_dirs):
            raise ArgumentError(
                f"steps has {len(checked)} entries for {len(models_or_dirs)} checkpoints; give one step each"
            )
        if any(b <= a for a, b in itertools.pairwise(checked)):
            raise ArgumentError(f"steps must increase, got {checked}")
        options = {"progress": False, **capture_options}
        snapshots: dict[int, KVStats | Path] = {}
        for i, (step, source) in enumerate(zip(checked, models_or_dirs, strict=True)):
            model = source if isinstance(source, nn.Module) else _load_checkpoint(i, source)
            snapshots[step] = capture(model, probe_texts, tokenizer=tokenizer, **options)
        return cls(snapshots)


def _load_checkpoint(i: int, source: object) -> nn.Module:
    """The model in the checkpoint folder ``models_or_dirs[i]`` (a folder here, never a Hub model id)."""
    from transformers import AutoModel, AutoModelForCausalLM

    name = f"models_or_dirs[{i}]"
    if not isinstance(source, (str, Path)):
        raise ArgumentError(f"{name} is a {type(source).__name__}; give a model or a checkpoint folder")
    try:
        folder = checked_path(source)
    except PathRefusedError as err:
        raise ArgumentError(f"{name}: {err}") from err
    if not folder.is_dir():
        raise ArgumentError(
            f"{name} is {str(source)!r}, which is no folder: give a model, or a checkpoint folder that "
            "save_pretrained or a Trainer wrote (a Hub model id is not downloaded here)"
        )
    try:
        try:
            return AutoModelForCausalLM.from_pretrained(folder).eval()
        except (ValueError, KeyError):  # an encoder: no causal-LM head class for its config
            return AutoModel.from_pretrained(folder).eval()
    except (OSError, ValueError, KeyError) as err:
        raise TrackingError(f"cannot load the checkpoint {name} ({folder}): {err}") from err


def _aligned_and_ranks(stats: KVStats, layer: int) -> dict[str, float]:
    """The summary numbers of one snapshot's layer beyond :meth:`KVStats.summary`: mean aligned head
    similarity and effective rank of the keys and of the values."""
    out: dict[str, float] = {}
    for kind in ("key", "value"):
        if kind not in stats.kinds:
            continue
        one_head = stats.meta.layout.num_kv_heads < 2  # no pair of heads to align
        method = "orthogonal" if kind == "value" else None  # keys: as AlignmentView's "auto"
        out[f"{kind}_aligned_sim"] = (
            math.nan if one_head else off_diagonal_mean(align(stats, [layer], kind=kind, method=method).shown)
        )
        out[f"{kind}_eff_rank"] = effective_rank(stats.moments(layer, kind).m2)
    return out
