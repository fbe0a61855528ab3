"""The text :func:`~headwidget.healing.heal` trains on, and the proof that it never saw the evaluation text.

Healing text is read as one token stream (strings joined by a blank line and tokenized once, token ids
row after row without padding) and cut into windows of ``max_length`` tokens, a final partial window
dropped, so every row of every batch is full: each rank of a distributed run gets the same number of
predicted tokens, and a step's loss is the mean over all of them. Each epoch visits the windows in an
order drawn from the seed; a step takes ``batch_size`` windows; the run takes as many steps as it needs
to see ``tokens`` tokens.

Overlap: every run of :data:`OVERLAP_TOKENS` consecutive tokens of the evaluation sequences is looked up
among those of the healing stream; one shared run refuses the healing (the curve would not be held out).
A sequence that ``max_length`` cuts shorter than a run is judged by the first :data:`OVERLAP_TOKENS`
tokens of its text (:func:`judged_rows`); a text shorter than that, whole.

Example:
    >>> stream = torch.arange(100)
    >>> plan = TrainingWindows.of(stream, max_length=10, batch_size=4, tokens=80, seed=0)
    >>> plan.steps, plan.tokens_per_step, tuple(plan.batch(0).input_ids.shape)
    (2, 40, (4, 10))
    >>> shared_runs(torch.arange(50, 90), [torch.arange(200, 240)], 32)
    0
    >>> shared_runs(torch.arange(100), [torch.arange(10, 50)], 32)
    9
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

from headwidget.capture.inputs import Batch
from headwidget.errors import HealingInputError

__all__ = [
    "OVERLAP_TOKENS",
    "TrainingWindows",
    "held_out_paragraphs",
    "judged_rows",
    "overlap_runs",
    "shared_runs",
    "stream_fingerprint",
]

#: Token runs this long shared by the healing and the evaluation text make them overlap.
OVERLAP_TOKENS = 32


@dataclass(frozen=True)
class TrainingWindows:
    """The healing stream cut into windows, and which windows each step trains on."""

    windows: torch.Tensor  # (N, L) token ids
    batch_size: int
    steps: int
    seed: int

    @classmethod
    def of(
        cls, stream: torch.Tensor, *, max_length: int, batch_size: int, tokens: int, seed: int
    ) -> TrainingWindows:
        """Windows of ``max_length`` tokens of ``stream``, enough steps of ``batch_size`` for ``tokens``.

        Raises:
            HealingInputError: fewer windows than one batch, or ``tokens`` below one batch.
        """
        count = stream.numel() // max_length
        if count < batch_size:
            raise HealingInputError(
                f"the healing texts give {stream.numel():,} tokens: {count} window(s) of max_length="
                f"{max_length}, fewer than one batch of batch_size={batch_size}; give more text, or a "
                "smaller batch_size or max_length"
            )
        per_step = batch_size * max_length
        if tokens < per_step:
            raise HealingInputError(
                f"tokens={tokens:,} is below one batch (batch_size={batch_size} × max_length={max_length} = "
                f"{per_step:,} tokens a step); give tokens ≥ {per_step:,}, or a smaller batch_size or "
                "max_length"
            )
        windows = stream[: count * max_length].reshape(count, max_length).clone()
        return cls(windows, batch_size, math.ceil(tokens / per_step), seed)

    @property
    def max_length(self) -> int:
        return int(self.windows.shape[1])

    @property
    def tokens_per_step(self) -> int:
        return self.batch_size * self.max_length

    @property
    def per_epoch(self) -> int:
        """Steps in one pass over the windows (a last partial batch is left to the next epoch's order)."""
        return int(self.windows.shape[0]) // self.batch_size

    def order(self, epoch: int) -> torch.Tensor:
        """The windows' order in ``epoch`` (a permutation drawn from the seed and the epoch)."""
        generator = torch.Generator().manual_seed((self.seed * 1_000_003 + epoch) % 2**64)
        return torch.randperm(int(self.windows.shape[0]), generator=generator)

    def batch(self, step: int, rank: int = 0, world: int = 1) -> Batch:
        """The rows of ``step`` that ``rank`` of ``world`` trains on (all of them for one process)."""
        epoch, within = divmod(step, self.per_epoch)
        rows = self.order(epoch)[within * self.batch_size : (within + 1) * self.batch_size]
        share = self.batch_size // world
        ids = self.windows[rows[rank * share : (rank + 1) * share]]
        return Batch(ids, torch.ones_like(ids))


def _runs(ids: torch.Tensor, width: int) -> set[bytes]:
    """The digests of every run of ``width`` consecutive tokens of ``ids``."""
    ids = ids.to(torch.int64).reshape(-1)
    if ids.numel() < width:
        return set()
    view = ids.unfold(0, width, 1).numpy()
    return {hashlib.blake2b(row.tobytes(), digest_size=16).digest() for row in view}


def shared_runs(stream: torch.Tensor, sequences: Sequence[torch.Tensor], width: int = OVERLAP_TOKENS) -> int:
    """How many runs of ``width`` tokens of ``sequences`` (a shorter sequence: the whole of it) also
    occur in ``stream``."""
    wanted: dict[int, set[bytes]] = {}
    for seq in sequences:
        size = min(width, int(seq.numel()))
        if size:
            wanted.setdefault(size, set()).update(_runs(seq, size))
    return sum(len(digests & _runs(stream, size)) for size, digests in wanted.items())


def overlap_runs(stream: torch.Tensor, batches: Sequence[Batch]) -> int:
    """:func:`shared_runs` of the real tokens of each evaluation sequence in ``batches``."""
    rows = [
        ids[mask.bool()] for b in batches for ids, mask in zip(b.input_ids, b.attention_mask, strict=True)
    ]
    return shared_runs(stream, [r for r in rows if r.numel()])


def judged_rows(scored: Sequence[Batch], longer: Sequence[Batch]) -> list[Batch]:
    """The evaluation sequences the overlap is judged on when ``max_length`` cuts them shorter than
    :data:`OVERLAP_TOKENS`: each sequence of ``scored`` as the row of ``longer`` (the same texts read up
    to that many tokens) that begins with it, else as it is. Two tokens of a text say nothing about
    whether the text is shared; its first 32 do.

    >>> ids = torch.arange(40).reshape(1, 40)
    >>> rows = judged_rows([Batch(ids[:, :2], torch.ones(1, 2))], [Batch(ids[:, :32], torch.ones(1, 32))])
    >>> [int(b.attention_mask.sum()) for b in rows]
    [32]
    """
    rows = [ids[mask.bool()] for b in longer for ids, mask in zip(b.input_ids, b.attention_mask, strict=True)]
    wanted = [
        ids[mask.bool()] for b in scored for ids, mask in zip(b.input_ids, b.attention_mask, strict=True)
    ]
    by_prefix: dict[tuple[int, ...], torch.Tensor] = {}
    for size in sorted({int(w.numel()) for w in wanted}):
        for row in rows:
            if row.numel() >= size:
                by_prefix.setdefault(tuple(row[:size].tolist()), row)
    out = []
    for row in wanted:
        whole = by_prefix.get(tuple(row.tolist()), row)
        out.append(Batch(whole.reshape(1, -1), torch.ones(1, whole.numel(), dtype=torch.long)))
    return out


def held_out_paragraphs(paragraphs: Sequence[str], tokenizer: Any, batches: Sequence[Batch]) -> list[str]:
    """The ``paragraphs`` that share no run of :data:`OVERLAP_TOKENS` tokens with the evaluation
    ``batches`` (each paragraph tokenized alone).

    The default healing text needs it: CPython's reference topics repeat some passages under several
    topics (the ``for`` statement's text is in ``compound`` too), so a few calibration paragraphs of
    :func:`~headwidget.texts.english_sample` repeat evaluation ones.
    """
    rows = [
        ids[mask.bool()] for b in batches for ids, mask in zip(b.input_ids, b.attention_mask, strict=True)
    ]
    wanted: set[bytes] = set()
    for row in rows:
        wanted |= _runs(row, min(OVERLAP_TOKENS, int(row.numel())))
    texts = list(paragraphs)
    encoded = tokenizer(texts)["input_ids"] if texts else []  # one call: a fast tokenizer batches it
    kept = []
    for text, ids in zip(texts, encoded, strict=True):
        if not _runs(torch.as_tensor(ids, dtype=torch.long), OVERLAP_TOKENS) & wanted:
            kept.append(text)
    return kept


def stream_fingerprint(stream: torch.Tensor) -> str:
    """A short hash of a token stream.

    >>> a, b = stream_fingerprint(torch.arange(5)), stream_fingerprint(torch.arange(6))
    >>> a != b, len(a)
    (True, 16)
    """
    return hashlib.sha256(stream.to(torch.int64).numpy().tobytes()).hexdigest()[:16]
