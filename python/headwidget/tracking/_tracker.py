"""``Tracker``: snapshots of a model's K/V statistics while it trains, from a ``transformers`` Trainer
callback or a hand-written loop.

A snapshot at step s is exactly ``capture(model, probe, ...)`` of the model as it is at s, over the
probe set the tracker tokenised (and copied) once, cut to ``max_tokens`` with the columns left all
padding dropped. Its moments equal those of a capture of the probe as given; the two token splits of
its normalised Grams are drawn over the batches as the tracker holds them (and, under
``torch.distributed``, per rank), so held-out alignment scores can differ from such a capture's as
another split's would. It does not perturb training: capture draws its token split and
samples from generators of its own (never the global random state), turns dropout off in its own forwards
only, runs without gradients and leaves every flag, grad mode and gradient as it found them, so a seeded
run has the same losses with the tracker as without it.

Under ``torch.distributed`` every rank captures its share of the probe batches and the statistics are
summed over the ranks (:meth:`KVStats.all_reduce <headwidget.stats.KVStats.all_reduce>`); only rank 0
writes the folder, and tells every rank how it went: an error there (a planted link, a full disk,
another model's folder) is raised on every rank as the same headwidget error, so no rank waits for the
process group's timeout.

Example:
    >>> import torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=50, n_embd=32, n_layer=2, n_head=4))
    >>> tracker = Tracker(torch.randint(0, 50, (2, 16), generator=torch.Generator().manual_seed(0)), every=2)
    >>> for step in range(5):
    ...     if step % tracker.every == 0:
    ...         _ = tracker.snapshot(model, step)
    >>> tracker.timeline.steps
    [0, 2, 4]
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import torch.distributed as dist
from torch import nn
from transformers import TrainerCallback

from headwidget.capture import adapter_for, capture
from headwidget.capture.inputs import first_tokens, length_batches
from headwidget.checks import optional_whole_number, whole_number
from headwidget.errors import ArgumentError, HeadwidgetError, TimelineFileError, TrackingError
from headwidget.stats import KVStats
from headwidget.tracking._store import TimelineIndex, TimelineModel, TimelineStore, snapshot_name
from headwidget.tracking._timeline import Timeline, finite

__all__ = ["Tracker"]

T = TypeVar("T")


def _rank_and_world() -> tuple[int, int]:
    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _on_rank_zero(action: Callable[[], T], folder: Path) -> T:
    """``action()`` run by rank 0 alone, its result given to every rank. When it fails there, every rank
    raises the same headwidget error (another error becomes a :class:`TimelineFileError` on the others),
    instead of waiting at the next collective for a rank that has stopped."""
    rank, world = _rank_and_world()
    if world == 1:
        return action()
    outcome: list[Any] = [None]
    failure: BaseException | None = None
    if rank == 0:
        try:
            outcome[0] = (True, action())
        except BaseException as err:  # an interrupt too: the other ranks must not wait for it
            failure = err
            known = isinstance(err, HeadwidgetError)
            said = str(err) if known else f"rank 0 could not write {folder}: {type(err).__name__}: {err}"
            outcome[0] = (False, (type(err) if known else TimelineFileError, said))
    dist.broadcast_object_list(outcome, src=0)
    done, value = outcome[0]
    if done:
        return value
    if failure is not None:
        raise failure
    kind, said = value
    raise kind(said)


class Tracker(TrainerCallback):
    """K/V statistics of a training model every ``every`` steps (see the module docstring).

    Args:
        probe_texts: the probe set, in any form :func:`~headwidget.capture` takes (strings need
            ``tokenizer``); tokenised once, here.
        every: snapshot every this many global steps (``on_step_end``), besides step 0
            (``on_train_begin``) and the last step (``on_train_end``).
        layers, rope, max_tokens, cross_layer, batch_size, max_length: as for
            :func:`~headwidget.capture`, for every snapshot; ``rope="auto"`` (the default) is
            ``"both"`` (the keys before and after RoPE) for a model with rotary embeddings, else ``"pre"``.
        path: a timeline folder to write each snapshot into as it is taken
            (:mod:`headwidget.tracking._store`) and read back from it when asked for (on other ranks
            than 0, the timeline names rank 0's files); without it, snapshots stay in memory.

    Raises:
        ArgumentError: an argument of the wrong type or out of range.
        TrackingError: a probe set without a real token.
        TimelineFileError: a ``path`` that is a file, or a folder that is not a timeline.

    Example:
        >>> import torch
        >>> tracker = Tracker(torch.ones(1, 8, dtype=torch.long), every=50)
        >>> tracker.every, tracker.timeline.steps
        (50, [])
    """

    def __init__(
        self,
        probe_texts: Any,
        *,
        tokenizer: Any = None,
        every: int = 50,
        layers: list[int] | None = None,
        rope: str = "auto",
        max_tokens: int | None = 2048,
        cross_layer: list[int] | bool | None = None,
        batch_size: int = 8,
        max_length: int = 512,
        path: str | Path | None = None,
    ) -> None:
        self.every = whole_number("every", every, minimum=1, hint="steps between snapshots")
        max_tokens = optional_whole_number(
            "max_tokens", max_tokens, minimum=1, hint="probe tokens per snapshot"
        )
        batch_size = whole_number("batch_size", batch_size, minimum=1, hint="probe texts per forward")
        max_length = whole_number("max_length", max_length, minimum=1, hint="tokens per probe text")
        if rope not in ("auto", "pre", "post", "both"):
            raise ArgumentError(f"rope must be 'auto', 'pre', 'post' or 'both', not {rope!r}")
        if path is not None and not isinstance(path, (str, Path)):
            raise ArgumentError(
                f"path must be a folder's path (str or Path) or None, got {type(path).__name__}"
            )
        # cut to max_tokens once, here, so every rank's share of the probe is a share of the same tokens
        # (strings batched by length: every snapshot computes little padding)
        read = length_batches(
            probe_texts, tokenizer, batch_size=batch_size, max_length=max_length, max_tokens=max_tokens
        )
        probe = first_tokens(list(read), max_tokens)
        # (copies: a caller's tensor changed later must not change the probe)
        self._batches = [
            {"input_ids": b.input_ids.clone(), "attention_mask": b.attention_mask.clone()} for b in probe
        ]
        if not any(bool(b["attention_mask"].any()) for b in self._batches):
            raise TrackingError("the probe set has no real token: give the tracker texts (or ids) to capture")
        self._options: dict[str, Any] = {
            "layers": layers,
            "rope": rope,
            "max_tokens": None,
            "cross_layer": cross_layer,
            "batch_size": batch_size,
            "max_length": max_length,
            "progress": False,
        }
        self._snapshots: dict[int, KVStats | Path] = {}
        self._logs: dict[int, dict[str, float]] = {}
        self._store: TimelineStore | None = None
        self._timeline: Timeline | None = None
        self._path = None if path is None else Path(path)
        self._index: TimelineIndex | None = None
        if self._path is not None:  # rank 0 opens it; every rank gets its steps, so all decide alike
            index = _on_rank_zero(self._open_store, self._path)
            self._index = index if self._store is None else self._store.index  # rank 0: the store's own
            self._snapshots = {e.step: self._path / e.file for e in index.snapshots}
            self._logs = {int(s): v for s, v in index.logs.items()}

    def _open_store(self) -> TimelineIndex:
        assert self._path is not None
        self._store = TimelineStore(self._path)
        return self._store.index

    @property
    def timeline(self) -> Timeline:
        """The snapshots so far (a folder's are read when asked for, the last few kept)."""
        if self._timeline is None:
            model = None if self._index is None else self._index.model
            self._timeline = Timeline(self._snapshots, self._logs, self._path, model=model)
        return self._timeline

    def snapshot(self, model: nn.Module, step: int) -> KVStats:
        """Capture ``model`` as it is now as the snapshot of ``step`` (and write it, with a path).

        Raises:
            ArgumentError: ``step`` not a whole number from 0.
            TrackingError: ``step`` is not after every step already taken.
        """
        step = whole_number("step", step, minimum=0, hint="the training step of this snapshot")
        if self._snapshots and step <= max(self._snapshots):
            raise TrackingError(
                f"step {step} is not after the last snapshot's step {max(self._snapshots)}; snapshots are "
                "taken in step order"
            )
        rank, world = _rank_and_world()
        batches = self._batches
        if world > 1:
            if len(batches) < world:
                raise TrackingError(
                    f"the probe set makes {len(batches)} batch(es) for {world} ranks; every rank needs one: "
                    "give more probe texts or a smaller batch_size"
                )
            batches = batches[rank::world]
        options = dict(self._options)
        if options["rope"] == "auto":
            options["rope"] = "both" if adapter_for(model).layout().rope.uses_rope else "pre"
        stats = capture(model, batches, **options)
        if world > 1:
            stats.all_reduce()
        if self._path is None:
            if self._snapshots:  # of the model of the first, as a folder's (the timeline refuses others)
                Timeline({**self._snapshots, step: stats})
            self._snapshots[step] = stats
        else:  # written by rank 0 (every rank waits for it): the timeline reads it back when asked
            _on_rank_zero(lambda: self._write(step, stats), self._path)
            self._snapshots[step] = self._path / snapshot_name(step)
            if self._index is not None and self._index.model is None:
                self._index.model = TimelineModel.of(stats)
        self._timeline = None
        return stats

    def _write(self, step: int, stats: KVStats) -> Path:
        assert self._store is not None
        return self._store.add(step, stats)

    def _due(self, step: int) -> bool:
        return not self._snapshots or step > max(self._snapshots)

    # ------------------------------------------------------------------------ TrainerCallback
    def on_train_begin(
        self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **kwargs: Any
    ) -> None:
        if self._snapshots and state.global_step < max(self._snapshots):
            last = max(self._snapshots)
            warnings.warn(
                f"this tracker already holds snapshots up to step {last} and training starts at step "
                f"{state.global_step}: it takes no snapshot before step {last}; give a new run a new "
                "Tracker (and path)",
                stacklevel=2,
            )
        if model is not None and self._due(state.global_step):
            self.snapshot(model, state.global_step)

    def on_step_end(
        self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **kwargs: Any
    ) -> None:
        if model is not None and state.global_step % self.every == 0 and self._due(state.global_step):
            self.snapshot(model, state.global_step)

    def on_train_end(
        self, args: Any, state: Any, control: Any, model: nn.Module | None = None, **kwargs: Any
    ) -> None:
        if model is not None and self._due(state.global_step):
            self.snapshot(model, state.global_step)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        numbers = {k: v for k, v in ((k, finite(v)) for k, v in (logs or {}).items()) if v is not None}
        if not numbers:  # non-finite numbers and ints too large for a float are not recorded
            return
        self._logs.setdefault(state.global_step, {}).update(numbers)
        self._timeline = None
        if self._path is not None:
            _on_rank_zero(self._write_logs, self._path)

    def _write_logs(self) -> None:
        assert self._store is not None
        self._store.set_logs(self._logs)
