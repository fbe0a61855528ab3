"""Before / aligned / held-out scores of every pair of heads, in one pass over (C, C) Gram matrices.

A Gram is passed as parts whose sum is the Gram (the two held-out token splits), so the in-sample
Gram is never materialised: each quantity is linear in the Gram and is summed part by part after it
is read, and the held-out fit reads the same entries. Only pairs ``i ≤ j`` are solved; the matrices
are mirrored (``Q_ji = Q_ij^T`` gives the same score) and the diagonal of an aligned score is the
trace (a head's best rotation onto itself is the identity).

RoPE planes ``(p0 + s·m, p0 + s·m + δ)`` (half-split: ``s = 1, δ = rotary_dim/2``; interleaved:
``s = 2, δ = 1``) are read from strided diagonal views of the Gram, so the closed form touches
``O(P²·d_h)`` entries and copies no d_h×d_h block; non-rotary dims gather their blocks in chunks.

Example:
    >>> import torch
    >>> g = torch.eye(4, dtype=torch.float64)
    >>> s = score_pairs([g / 2, g / 2], HeadSplit.make(2, [(0, 1)]), heldout=True)
    >>> s.best.tolist(), s.heldout.tolist()
    ([[2.0, 0.0], [0.0, 2.0]], [[1.0, 0.0], [0.0, 1.0]])
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import torch

from headwidget.analysis.procrustes import (
    HeadSplit,
    best_scores,
    fit_rotations,
    map_chunks,
    plane_angles,
    plane_terms,
)

__all__ = ["PairScores", "pair_block", "score_pairs"]

CHUNK_BYTES = 128 * 2**20
Parts = Sequence[torch.Tensor]


@dataclass
class PairScores:
    """Raw (unnormalised) (P, P) scores: ``trace`` of the summed Gram's blocks, ``best`` in-sample
    aligned maximum, ``heldout`` fitted on part 0 and scored on part 1, ``heldout_trace`` of part 1."""

    trace: torch.Tensor
    best: torch.Tensor | None
    heldout: torch.Tensor | None
    heldout_trace: torch.Tensor | None


def _view(gram: torch.Tensor, d: int) -> torch.Tensor:
    heads = gram.shape[0] // d
    return gram.reshape(heads, d, heads, d)


def pair_block(parts: Parts, d: int, i: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """The (B, d, d) blocks ``(i[b], j[b])`` of the summed Gram.

    >>> g = torch.arange(16.0).reshape(4, 4)
    >>> pair_block([g, g], 2, torch.tensor([0]), torch.tensor([1])).tolist()
    [[[4.0, 6.0], [12.0, 14.0]]]
    """
    return sum(_view(g, d).permute(0, 2, 1, 3)[i, j] for g in parts)  # type: ignore[return-value]


def _read(g: torch.Tensor, split: HeadSplit, r0: int, r1: int) -> tuple[torch.Tensor, ...]:
    """Block traces (R, P') and, with planes, (α, β) each (R, planes, P') for rows r0..r1, columns r0.."""
    v = _view(g, split.head_dim)[r0:r1, :, r0:, :]
    diag = torch.diagonal(v, 0, 1, 3).permute(0, 2, 1).contiguous()  # [i, k, j] = A_ij[k, k]
    trace = diag.sum(1)
    if not split.has_planes:
        return (trace,)
    prog = split.progression
    if prog is None:
        alpha, beta = plane_terms(v.permute(0, 2, 1, 3), split)
        return trace, alpha.transpose(1, 2), beta.transpose(1, 2)
    p0, step, m, delta = prog
    ps, qs = (
        slice(p0, p0 + step * (m - 1) + 1, step),
        slice(p0 + delta, p0 + delta + step * (m - 1) + 1, step),
    )
    upper = torch.diagonal(v, delta, 1, 3).permute(0, 2, 1)  # A_ij[k, k + δ]
    lower = torch.diagonal(v, -delta, 1, 3).permute(0, 2, 1)  # A_ij[k + δ, k]
    return trace, diag[:, ps] + diag[:, qs], upper[:, ps] - lower[:, ps]


def _upper_blocks(
    parts: Parts, split: HeadSplit, per_chunk: int
) -> Iterator[tuple[torch.Tensor, torch.Tensor, list[torch.Tensor]]]:
    """Chunks of pairs ``i < j`` (row-major) with each part's non-rotary blocks, (B, r, r).

    Each row ``i`` is one strided view of the Gram (rows of d contiguous entries), so a chunk is a
    few plain copies rather than an element-wise gather.
    """
    d = split.head_dim
    heads = parts[0].shape[0] // d
    rest = split.rest.to(parts[0].device)
    r0 = 0
    while r0 < heads - 1:
        r1, count = r0, 0
        while r1 < heads - 1 and (count == 0 or count + heads - 1 - r1 <= per_chunk):
            count += heads - 1 - r1
            r1 += 1
        blocks = [
            torch.cat([_view(g, d)[i, :, i + 1 :, :].permute(1, 0, 2) for i in range(r0, r1)]) for g in parts
        ]
        if rest.numel() != d:
            blocks = [b.index_select(-2, rest).index_select(-1, rest) for b in blocks]
        i = torch.cat([torch.full((heads - 1 - k,), k) for k in range(r0, r1)]).to(rest.device)
        j = torch.cat([torch.arange(k + 1, heads) for k in range(r0, r1)]).to(rest.device)
        yield i, j, blocks
        r0 = r1


def _mirror(upper: torch.Tensor) -> torch.Tensor:
    return torch.triu(upper) + torch.triu(upper, 1).T


def score_pairs(parts: Parts, split: HeadSplit, *, best: bool = True, heldout: bool = False) -> PairScores:
    """All-pairs scores of the Gram ``sum(parts)`` (see the module docstring).

    ``heldout=True`` needs exactly two parts: rotations fitted on ``parts[0]`` are scored on ``parts[1]``.

    >>> x = torch.randn(50, 8, dtype=torch.float64)
    >>> s = score_pairs([x.T @ x], HeadSplit.make(4, [(0, 2), (1, 3)]))
    >>> bool((s.best >= s.trace - 1e-12).all()), s.heldout is None
    (True, True)
    """
    if heldout and len(parts) != 2:
        raise ValueError("held-out scores need the Gram as two parts (fit split, score split)")
    d, first = split.head_dim, parts[0]
    heads = first.shape[0] // d
    zeros = lambda: torch.zeros(heads, heads, dtype=first.dtype, device=first.device)  # noqa: E731
    trace, held_trace = zeros(), zeros()
    fit_best, fit_held = (zeros() if best else None), (zeros() if heldout else None)
    rows = max(1, min(CHUNK_BYTES // (32 * d * heads * len(parts)), -(-heads // 8)))

    Opt = torch.Tensor | None

    def rows_chunk(r0: int) -> tuple[int, torch.Tensor, Opt, Opt, Opt]:
        reads = [_read(g, split, r0, min(heads, r0 + rows)) for g in parts]
        tr = torch.stack([r[0] for r in reads]).sum(0)
        b = h = None
        if split.has_planes and best:
            alpha, beta = reads[0][1], reads[0][2]
            for r in reads[1:]:
                alpha, beta = alpha + r[1], beta + r[2]
            b = torch.sqrt(alpha * alpha + beta * beta).sum(1)
        if split.has_planes and heldout:
            cos, sin = plane_angles(reads[0][1], reads[0][2])
            h = (cos * reads[1][1] + sin * reads[1][2]).sum(1)
        return r0, tr, b, h, (reads[1][0] if heldout else None)

    for r0, tr, b, h, held_tr in map_chunks(rows_chunk, range(0, heads, rows), first.device):
        r1 = min(heads, r0 + rows)
        trace[r0:r1, r0:] = tr
        if held_tr is not None:
            held_trace[r0:r1, r0:] = held_tr
        if b is not None and fit_best is not None:
            fit_best[r0:r1, r0:] += b
        if h is not None and fit_held is not None:
            fit_held[r0:r1, r0:] += h
    if split.rest.numel() and (best or heldout):
        rest_only = HeadSplit.make(int(split.rest.numel()), [])
        per_chunk = max(1, CHUNK_BYTES // (8 * d * d * len(parts)))
        for i, j, blocks in _upper_blocks(parts, split, per_chunk):
            if fit_best is not None:
                fit_best[i, j] += best_scores(sum(blocks), rest_only)  # type: ignore[arg-type]
            if fit_held is not None:
                fit_held[i, j] += (fit_rotations(blocks[0], rest_only) * blocks[1]).sum((-2, -1))
    trace, held_trace = _mirror(trace), _mirror(held_trace)
    eye = torch.eye(heads, dtype=torch.bool, device=first.device)
    return PairScores(
        trace=trace,
        best=None if fit_best is None else torch.where(eye, trace, _mirror(fit_best)),
        heldout=None if fit_held is None else torch.where(eye, held_trace, _mirror(fit_held)),
        heldout_trace=held_trace if heldout else None,
    )
