"""The specs :func:`~headwidget.allocate` chose in this process, and what it chose them on, so that
:func:`~headwidget.evaluation.evaluate` can flag such a spec measured on (some of) those tokens.

What is kept of the chosen-on tokens is a sketch: the hashes of one in :data:`KEEP_ONE_IN` of the
:data:`NGRAM`-grams of real tokens of every sequence (the hash decides which, so the same n-gram is kept
or left wherever it appears). An evaluation whose sketch shares at least :data:`FLAG_SHARE` of its
hashes, and at least :data:`MIN_SHARED` of them, with one the spec was chosen on is flagged, whatever
the protocol cut the text into (documents, chunks or strides), in whatever order and with whatever else
beside it: the same tokens in other windows share every n-gram but those that cross a window's edge.
Different natural text shares almost none, and an n-gram found in several sequences (a template) counts
for neither side. Sequences shorter than an n-gram leave no hash; their exact
fingerprint (:func:`~headwidget.evaluation._inputs.fingerprint`) is kept too.

Example:
    >>> import torch
    >>> from headwidget.capture.inputs import Batch
    >>> ids = torch.arange(1, 401).reshape(1, 400)
    >>> whole = token_sketch([Batch(ids, torch.ones_like(ids))])
    >>> halves = [Batch(ids[:, :200], torch.ones(1, 200)), Batch(ids[:, 200:], torch.ones(1, 200))]
    >>> round(shared_share(token_sketch(halves), [whole]), 2), shared_share(whole, [frozenset()])
    (1.0, 0.0)
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from headwidget.capture.inputs import Batch

__all__ = [
    "CHOSEN_ON",
    "FLAG_SHARE",
    "KEEP_ONE_IN",
    "MIN_SHARED",
    "NGRAM",
    "Chosen",
    "chosen_shares",
    "remember",
    "shared_share",
    "token_sketch",
]

#: Tokens per hashed n-gram.
NGRAM = 8
#: One n-gram hash in this many is kept (those whose hash is a multiple of it).
KEEP_ONE_IN = 8
#: The share of an evaluation's kept hashes found in a chosen-on sketch from which it is flagged ...
FLAG_SHARE = 0.01
#: ... and the fewest shared hashes that can flag it (a short shared run, a few n-grams, is not the
#: same text).
MIN_SHARED = 2

# fixed odd 64-bit multipliers, one per n-gram position, and a final mixing constant (splitmix64's)
_WEIGHTS = np.array(
    [
        0x9E3779B97F4A7C15,
        0xC2B2AE3D27D4EB4F,
        0x165667B19E3779F9,
        0xD6E8FEB86659FD93,
        0xFF51AFD7ED558CCD,
        0xC4CEB9FE1A85EC53,
        0x94D049BB133111EB,
        0xBF58476D1CE4E5B9,
    ],
    dtype=np.uint64,
)[:NGRAM]
_MIX = np.uint64(0x94D049BB133111EB)


@dataclass(frozen=True)
class Chosen:
    """What one allocation was chosen on: the exact fingerprint and the n-gram sketch of its tokens."""

    fingerprint: str
    sketch: frozenset[int]


#: spec → what each allocation that chose it was chosen on (this process only).
CHOSEN_ON: dict[str, list[Chosen]] = {}


def _row_hashes(row: np.ndarray) -> np.ndarray:
    """The kept hashes of one row's n-grams (none for a row shorter than an n-gram)."""
    if row.shape[0] < NGRAM:
        return np.empty(0, dtype=np.uint64)
    grams = sliding_window_view(row.astype(np.uint64), NGRAM)
    h = (grams * _WEIGHTS).sum(axis=1, dtype=np.uint64)  # wraps modulo 2**64
    h ^= h >> np.uint64(31)
    h *= _MIX
    h ^= h >> np.uint64(29)
    return h[h % np.uint64(KEEP_ONE_IN) == 0]


def token_sketch(batches: Iterable[Batch]) -> frozenset[int]:
    """The kept n-gram hashes of the real tokens of every sequence of ``batches`` (padding left out),
    without those found in more than one sequence: a prompt template or boilerplate shared by
    sequences is not text anyone chose on."""
    kept: list[np.ndarray] = []
    for batch in batches:
        for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True):
            kept.append(np.unique(_row_hashes(ids[mask.bool()].to("cpu").numpy())))
    if not kept:
        return frozenset()
    hashes, rows = np.unique(np.concatenate(kept), return_counts=True)
    return frozenset(hashes[rows == 1].tolist())


def shared_share(sketch: frozenset[int], chosen_on: Sequence[frozenset[int]]) -> float:
    """The largest share of ``sketch``'s hashes found in one of ``chosen_on``, counting only sketches
    that share at least :data:`MIN_SHARED` hashes with it (0 for none, or an empty sketch)."""
    if not sketch:
        return 0.0
    shared = [len(sketch & other) for other in chosen_on]
    return max((n / len(sketch) for n in shared if n >= MIN_SHARED), default=0.0)


def remember(spec: str, fingerprint: str, sketch: frozenset[int]) -> None:
    """Record that :func:`~headwidget.allocate` chose ``spec`` on these tokens."""
    CHOSEN_ON.setdefault(spec, []).append(Chosen(fingerprint, sketch))


def chosen_shares(specs: Sequence[str], fingerprint: str, batches: Sequence[Batch]) -> dict[str, float]:
    """How much of an evaluation's tokens each spec was chosen on, for the specs chosen at all: 1 for
    the very same sequences (exact fingerprint), else :func:`shared_share` of the sketches (the
    evaluation's sketch is made only when some spec was chosen in this process)."""
    chosen = {s: CHOSEN_ON[s] for s in specs if s in CHOSEN_ON}
    sketch = token_sketch(batches) if chosen else frozenset()
    exact = {s for s, on in chosen.items() if any(c.fingerprint == fingerprint for c in on)}
    return {
        s: 1.0 if s in exact else shared_share(sketch, [c.sketch for c in on]) for s, on in chosen.items()
    }
