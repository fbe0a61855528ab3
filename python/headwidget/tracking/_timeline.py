"""A timeline: the statistics of one model at a series of training steps, and the trainer's logs.

Snapshots live in memory (a tracker without a path) or in a timeline folder
(:mod:`headwidget.tracking._store`), where each is read only when asked for and at most
:data:`KEEP_LOADED` stay in memory, so a timeline of hundreds of snapshots opens at once.

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
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from torch import nn

from headwidget.analysis.alignment import align
from headwidget.capture import capture
from headwidget.checks import whole_number
from headwidget.errors import ArgumentError, TrackingError
from headwidget.moments import effective_rank, off_diagonal_mean
from headwidget.stats import KVStats
from headwidget.tracking._store import read_index

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


class Timeline:
    """Statistics by training step (see the module docstring): ``timeline[step]`` is a
    :class:`~headwidget.stats.KVStats`, ``timeline.logs[step]`` the trainer's logged numbers there."""

    def __init__(
        self,
        snapshots: dict[int, KVStats | Path],
        logs: dict[int, dict[str, float]] | None = None,
        path: Path | None = None,
    ) -> None:
        self._snapshots = dict(sorted(snapshots.items()))
        self._loaded: OrderedDict[int, KVStats] = OrderedDict()
        self.logs: dict[int, dict[str, float]] = dict(sorted((logs or {}).items()))
        self.path = path
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
                self._loaded[step] = stats
                while len(self._loaded) > KEEP_LOADED:
                    self._loaded.popitem(last=False)
            self._loaded.move_to_end(step)
            return stats

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
            TimelineFileError: not a timeline folder, or a corrupt index.
        """
        folder = Path(path)
        index = read_index(folder)
        snapshots: dict[int, KVStats | Path] = {e["step"]: folder / e["file"] for e in index["snapshots"]}
        logs = {int(step): values for step, values in index["logs"].items()}
        return cls(snapshots, logs, folder)

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
            ArgumentError: ``steps`` not whole numbers from 0, not increasing, or not one per checkpoint.
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
        for step, source in zip(checked, models_or_dirs, strict=True):
            model = source if isinstance(source, nn.Module) else _load_checkpoint(source)
            snapshots[step] = capture(model, probe_texts, tokenizer=tokenizer, **options)
        return cls(snapshots)


def _load_checkpoint(folder: str | Path) -> nn.Module:
    from transformers import AutoModel, AutoModelForCausalLM

    try:
        return AutoModelForCausalLM.from_pretrained(folder).eval()
    except (ValueError, KeyError):  # an encoder: no causal-LM head class for its config
        return AutoModel.from_pretrained(folder).eval()


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
