"""The specs :func:`~headwidget.allocate` chose in this process, and the tokens it chose them on, so that
:func:`~headwidget.evaluation.evaluate` can flag such a spec measured on (some of) those tokens.

What is kept of an allocation is its choice per layer and its chosen-on text as token pieces: each
sequence's real tokens (``documents``), or the one stream a ``chunks:W`` or ``stride:W/S`` protocol read
(its windows joined again, each token once). An evaluated spec is matched by what it does per layer,
not by how it is written (``kv:int4`` and ``kv:int4@0-29`` on a 30-layer model are one spec), and its
evaluation text is cut into pieces the same way.

A predicted token of the evaluation (a real token after a real one, scored where the protocol scores)
counts as **chosen on** when it lies inside a run of :data:`RUN_TOKENS` consecutive tokens of its piece
that also occurs in the chosen-on text. Pieces shorter than that count whole: an evaluation piece of at
least :data:`SHORT_RUN_TOKENS` tokens that occurs inside the chosen-on text, and the tokens of the
evaluation where a chosen-on piece that short occurs. Shorter pieces cannot tell shared text from
common words and count as not chosen on, except that an evaluation of exactly the chosen-on sequences
(the same fingerprint) is chosen on throughout. Runs are found by a 64-bit hash and compared token for
token (a hash alone never decides), in memory linear in the tokens.
Repetition changes nothing: a template or a repeated row is chosen-on text like any other. Different
natural text shares almost no run of 32 tokens: the English sample's evaluation split shares none with
its calibration split (SmolLM2's tokenizer), where 8-token runs cover 3.9 % of it.

Example:
    >>> import torch
    >>> from headwidget.capture.inputs import Batch
    >>> ids = torch.arange(1, 401).reshape(1, 400)
    >>> chosen = token_pieces([Batch(ids, torch.ones_like(ids))])
    >>> halves = [Batch(ids[:, :200], torch.ones(1, 200)), Batch(ids[:, 200:], torch.ones(1, 200))]
    >>> share_chosen_on(halves, chosen.pieces), share_chosen_on(halves, [])
    (1.0, 0.0)
    >>> other = torch.arange(1000, 1400).reshape(2, 200)
    >>> share_chosen_on([Batch(torch.cat([ids[:, :200], other]), torch.ones(3, 200))], chosen.pieces)
    0.3333333333333333
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np

from headwidget.analysis.cross_layer import layer_groups, within_layer
from headwidget.analysis.variants import MixedSpec, parse_variant
from headwidget.capture.inputs import Batch
from headwidget.evaluation.measures import predicted_positions

__all__ = [
    "CHOSEN_ON",
    "FLAG_SHARE",
    "RUN_TOKENS",
    "SHORT_RUN_TOKENS",
    "Chosen",
    "TokenPieces",
    "chosen_shares",
    "per_layer_specs",
    "remember",
    "share_chosen_on",
    "token_pieces",
]

#: Consecutive tokens shared with the chosen-on text that make a token chosen on.
RUN_TOKENS = 32
#: The shortest piece (an evaluation sequence, or a chosen-on one) that counts whole.
SHORT_RUN_TOKENS = 16
#: The share of an evaluation's predicted tokens chosen on from which its spec is flagged.
FLAG_SHARE = 0.01


@dataclass(frozen=True)
class TokenPieces:
    """Contiguous token pieces of a text (int64 arrays) and, per token, whether it is predicted."""

    pieces: list[np.ndarray]
    predicted: list[np.ndarray]


def _first_scored(batch: Batch, row: int) -> int:
    """The index of the first scored token of ``row`` (0 when the batch marks none as scored)."""
    if batch.scored is None:
        return 0
    scored = batch.scored[row][batch.attention_mask[row].bool()]
    hits = np.flatnonzero(scored.to("cpu").numpy())
    return int(hits[0]) if hits.size else 0


def token_pieces(batches: Sequence[Batch], *, stream: bool = False) -> TokenPieces:
    """The real tokens of ``batches`` as pieces: one per sequence, or (``stream``: the windows of
    ``chunks:W`` or ``stride:W/S``, in order) the one stream they were cut from, each window after the
    first from its first scored token (a stride window's earlier tokens are the previous windows')."""
    pieces: list[np.ndarray] = []
    predicted: list[np.ndarray] = []
    for batch in batches:
        real = batch.attention_mask.bool()
        after = predicted_positions(batch.attention_mask, batch.scored).to("cpu")
        flags = np.zeros(tuple(real.shape), dtype=bool)
        flags[:, 1:] = after.numpy()
        for row in range(real.shape[0]):
            keep = real[row].to("cpu").numpy()
            ids = batch.input_ids[row].to("cpu").numpy()[keep].astype(np.int64)
            flag = flags[row][keep]
            start = _first_scored(batch, row) if stream and pieces else 0
            pieces.append(ids[start:])
            predicted.append(flag[start:])
    if stream and pieces:
        pieces, predicted = [np.concatenate(pieces)], [np.concatenate(predicted)]
    return TokenPieces(pieces, predicted)


# fixed odd 64-bit multipliers (splitmix64's and golden-ratio constants), one per run position cycled
_WEIGHTS = np.array(
    [0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F, 0x165667B19E3779F9, 0xD6E8FEB86659FD93], dtype=np.uint64
)
_MIX = np.uint64(0x94D049BB133111EB)
#: Candidate runs verified token for token at a time (bounds the memory of a check: 32 ids each).
_VERIFY_CHUNK = 1 << 14


def _hashes(piece: np.ndarray, width: int) -> np.ndarray:
    """A 64-bit hash of every run of ``width`` tokens of ``piece`` (a weighted sum, mixed), in O(len)
    memory. Equal runs hash equal; a shared hash is only a candidate, checked token for token."""
    count = piece.shape[0] - width + 1
    if count <= 0:
        return np.empty(0, dtype=np.uint64)
    ids = piece.astype(np.uint64)
    acc = np.zeros(count, dtype=np.uint64)
    for j in range(width):
        weight = _WEIGHTS[j % _WEIGHTS.size] + np.uint64(2 * j)  # odd, and different at every position
        acc += ids[j : j + count] * weight  # wraps modulo 2**64
    acc ^= acc >> np.uint64(31)
    acc *= _MIX
    acc ^= acc >> np.uint64(29)
    return acc


class _RunTable:
    """Every run of ``width`` tokens of some pieces: found by hash, confirmed token for token."""

    def __init__(self, pieces: Sequence[np.ndarray], width: int) -> None:
        self.width = width
        kept = [p for p in pieces if p.shape[0] >= width]
        self.flat = np.concatenate(kept) if kept else np.empty(0, dtype=np.int64)
        hashes, starts, offset = [], [], 0
        for p in kept:
            hashes.append(_hashes(p, width))
            starts.append(offset + np.arange(p.shape[0] - width + 1))
            offset += p.shape[0]
        every = np.concatenate(hashes) if hashes else np.empty(0, dtype=np.uint64)
        order = np.argsort(every, kind="stable")
        self.hashes = every[order]
        self.starts = (np.concatenate(starts) if starts else np.empty(0, dtype=np.int64))[order]

    def holds(self, piece: np.ndarray) -> np.ndarray:
        """Per run of ``width`` tokens of ``piece`` (by its start), whether the table holds that run."""
        h = _hashes(piece, self.width)
        found = np.zeros(h.shape, dtype=bool)
        if self.hashes.size == 0 or h.size == 0:
            return found
        at = np.searchsorted(self.hashes, h)
        at[at == self.hashes.size] = 0
        candidates = np.flatnonzero(self.hashes[at] == h)
        offsets = np.arange(self.width)
        for lo in range(0, candidates.size, _VERIFY_CHUNK):
            chunk = candidates[lo : lo + _VERIFY_CHUNK]
            mine = piece[chunk[:, None] + offsets]
            theirs = self.flat[self.starts[at[chunk]][:, None] + offsets]
            same = (mine == theirs).all(axis=1)
            found[chunk[same]] = True
            for i in chunk[~same]:  # another run with the same hash: look at the rest that share it
                j = int(at[i]) + 1
                while j < self.hashes.size and self.hashes[j] == h[i]:
                    start = int(self.starts[j])
                    if np.array_equal(self.flat[start : start + self.width], piece[i : i + self.width]):
                        found[i] = True
                        break
                    j += 1
        return found


@dataclass
class _ChosenRuns:
    """The runs of the chosen-on pieces, a table per width (made when first asked for)."""

    pieces: Sequence[np.ndarray]
    tables: dict[int, _RunTable] = field(default_factory=dict)
    whole: dict[int, _RunTable] | None = None

    def table(self, width: int) -> _RunTable:
        if width not in self.tables:
            self.tables[width] = _RunTable(self.pieces, width)
        return self.tables[width]

    def short(self) -> dict[int, _RunTable]:
        """The chosen-on pieces of :data:`SHORT_RUN_TOKENS` up to :data:`RUN_TOKENS` − 1 tokens, whole,
        a table per length."""
        if self.whole is None:
            lengths = {int(p.shape[0]) for p in self.pieces if SHORT_RUN_TOKENS <= p.shape[0] < RUN_TOKENS}
            self.whole = {n: _RunTable([p for p in self.pieces if p.shape[0] == n], n) for n in lengths}
        return self.whole


def _spans(hits: np.ndarray, width: int, length: int) -> np.ndarray:
    """Per token of a piece of ``length``, whether it lies in one of the runs of ``width`` that start
    where ``hits`` is true."""
    starts = np.concatenate([[0], np.cumsum(hits, dtype=np.int64)])
    index = np.arange(length)
    low = np.clip(index - width + 1, 0, hits.size)
    high = np.clip(index + 1, 0, hits.size)
    return np.asarray(starts[high] - starts[low] > 0)


def _covered(piece: np.ndarray, runs: _ChosenRuns, short: dict[int, _RunTable]) -> np.ndarray:
    """Per token of ``piece``, whether it is chosen on (the module docstring's rules)."""
    length = int(piece.shape[0])
    if length >= RUN_TOKENS:
        covered = _spans(runs.table(RUN_TOKENS).holds(piece), RUN_TOKENS, length)
    elif length >= SHORT_RUN_TOKENS and bool(runs.table(length).holds(piece).any()):
        return np.ones(length, dtype=bool)
    else:
        covered = np.zeros(length, dtype=bool)
    for width, table in short.items():
        if width <= length:
            covered |= _spans(table.holds(piece), width, length)
    return covered


def share_chosen_on(batches: Sequence[Batch], chosen: Sequence[np.ndarray], *, stream: bool = False) -> float:
    """The share of the predicted tokens of ``batches`` that are chosen on, given the chosen-on pieces
    (:func:`token_pieces`; ``stream`` as there). 0 when nothing is predicted."""
    return _share(batches, _ChosenRuns(chosen), stream)


def _share(batches: Sequence[Batch], runs: _ChosenRuns, stream: bool) -> float:
    text = token_pieces(batches, stream=stream)
    short = runs.short()
    found = total = 0
    for piece, predicted in zip(text.pieces, text.predicted, strict=True):
        total += int(predicted.sum())
        if predicted.any():
            found += int((_covered(piece, runs, short) & predicted).sum())
    return found / total if total else 0.0


def per_layer_specs(
    spec: str, num_layers: int, layers: Sequence[int] | None = None
) -> tuple[str, ...] | None:
    """What ``spec`` does to each of ``num_layers`` layers (a uniform spec applied to ``layers``, None:
    every layer), as canonical uniform specs; None when it names a layer the model does not have. A layer
    of a cross-layer group has its part's spec (the grouping follows from the parts' layers); a layer
    left alone in its group has what it keeps (:func:`~headwidget.analysis.cross_layer.within_layer`), so
    ``share:2@0-2`` and ``share:2@0-1`` on three layers are one spec; a shorter last group that still
    acts (xKV's) is the part with that group size.

    >>> per_layer_specs("KV:INT4", 2), per_layer_specs("kv:int4@1;mqa@0", 3)
    (('kv:int4', 'kv:int4'), ('mqa', 'kv:int4', 'model'))
    >>> per_layer_specs("mqa", 3, layers=[2]), per_layer_specs("mqa@5", 3)
    (('model', 'model', 'mqa'), None)
    >>> per_layer_specs("mqa+share:2", 3), per_layer_specs("share:2@0-2", 3)
    (('mqa+share:2', 'mqa+share:2', 'mqa'), ('share:2', 'share:2', 'model'))
    >>> per_layer_specs("mqa+xkv:4/2", 3)  # xKV compresses a layer left over alone
    ('mqa+xkv:4/2', 'mqa+xkv:4/2', 'mqa+xkv:4/1')
    """
    parsed = parse_variant(spec)
    if isinstance(parsed, MixedSpec):
        if any(layer >= num_layers for layer in parsed.layers):
            return None
        parts = list(parsed.parts)
    else:
        on = range(num_layers) if layers is None else sorted({x for x in layers if x < num_layers})
        parts = [(parsed, tuple(on))]
    out = ["model"] * num_layers
    for part, part_layers in parts:
        cross = part.cross
        if cross is None:
            for layer in part_layers:
                out[layer] = part.text
            continue
        head = part.text[: -len(cross.text)]
        for group in layer_groups(part_layers, cross.group):
            # a shorter last group is the part with that group size (xkv:4/2's layer left over is
            # xkv:4/1's); one that is too short to act keeps its within-layer spec
            acts = len(group) >= cross.smallest_group
            shown = head + replace(cross, group=len(group)).text if acts else within_layer(part)
            for layer in group:
                out[layer] = shown
    return tuple(out)


@dataclass(frozen=True)
class Chosen:
    """What one allocation chose (its canonical spec per layer) and what it chose it on: the exact
    fingerprint of its sequences and their tokens as pieces."""

    choice: tuple[str, ...]
    fingerprint: str
    pieces: list[np.ndarray] = field(repr=False)
    runs: _ChosenRuns = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "runs", _ChosenRuns(self.pieces))  # tables made once, when first used


#: What each allocation of this process chose, and on what.
CHOSEN_ON: list[Chosen] = []


def remember(choice: Sequence[str], fingerprint: str, pieces: list[np.ndarray]) -> None:
    """Record that :func:`~headwidget.allocate` chose ``choice`` (per layer) on these tokens."""
    CHOSEN_ON.append(Chosen(tuple(choice), fingerprint, pieces))


def chosen_shares(
    specs: Sequence[str],
    fingerprint: str,
    batches: Sequence[Batch],
    *,
    stream: bool = False,
    layers: Sequence[int] | None = None,
) -> dict[str, float]:
    """For each of ``specs`` that an allocation of this process chose (matched per layer; ``layers``:
    those a uniform spec is applied to), the largest share of the evaluation's predicted tokens chosen
    on: 1 for the very sequences it was chosen on (the same fingerprint), else :func:`share_chosen_on`.
    ``model``, which changes nothing, is never flagged."""
    out: dict[str, float] = {}
    for spec in specs:
        shares = []
        for record in CHOSEN_ON:
            mine = per_layer_specs(spec, len(record.choice), layers)
            if mine != record.choice or all(s == "model" for s in mine):
                continue
            same = record.fingerprint == fingerprint
            shares.append(1.0 if same else _share(batches, record.runs, stream))
        if shares:
            out[spec] = max(shares)
    return out
