"""Rotations that align one head's vectors with another's, fitted on d_h×d_h cross blocks.

For heads i, j with (normalised) token vectors as rows, the cross block ``A = Σ_t x_i^T x_j`` gives the
score of any rotation ``Q`` applied to head i as ``tr(Q^T A) = Σ_ab Q_ab A_ab``. Two families of ``Q``:

- **orthogonal** (Procrustes, reflections allowed): ``Q = U V^T`` from ``A = U Σ V^T``; best score
  ``tr(Σ)`` (the nuclear norm);
- **RoPE-compatible**: a proper 2×2 rotation on every rotary plane ``(p, q)`` (these commute with RoPE)
  plus a full orthogonal block on the dims that do not rotate. Per plane, with
  ``α = A[p,p] + A[q,q]`` and ``β = A[p,q] − A[q,p]``, the best angle is ``atan2(β, α)`` and its score
  ``sqrt(α² + β²)``. Row vectors are rotated as ``x Q`` with ``Q[p,p] = Q[q,q] = cos θ``,
  ``Q[p,q] = sin θ``, ``Q[q,p] = −sin θ``.

Everything is batched over a leading axis of blocks. On the CPU, many small SVDs run fastest with
single-threaded LAPACK, one batch slice per core (see :func:`batched_svd`).

Scores without rotations: the nuclear norm is ``Σ_k sqrt(λ_k)`` over the eigenvalues of ``AᵀA``
(:func:`nuclear_norms`), and a held-out score ``tr(Q(A)ᵀ B)`` with ``Q(A) = A (AᵀA)^{-1/2}`` is
``Σ_k λ_k^{-1/2} (Vᵀ AᵀB V)_kk`` from ``AᵀA = V Λ Vᵀ`` (:func:`polar_scores`): one batched symmetric
eigendecomposition instead of an SVD. Squaring ``A`` squares its condition number, so a block whose
``λ_min / λ_max`` falls below :data:`NUCLEAR_MIN_RATIO` (resp. :data:`POLAR_MIN_RATIO`) is solved by the
SVD instead; above them both agree with the SVD to about 1e-10 of the block's largest singular value
(measured on blocks of 128×128 with controlled condition numbers).

Example:
    >>> import torch
    >>> a = torch.randn(5, 4, 4, dtype=torch.float64)
    >>> split = HeadSplit.make(4, [(0, 2)])
    >>> q = fit_rotations(a, split)
    >>> bool(torch.allclose(score_rotations(q, a), best_scores(a, split)))
    True
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from functools import cached_property
from typing import TypeVar

import torch

__all__ = [
    "HeadSplit",
    "batched_svd",
    "best_scores",
    "fit_rotations",
    "nuclear_norms",
    "plane_terms",
    "polar_scores",
    "score_rotations",
]

F64 = torch.float64
#: Blocks with ``λ_min(AᵀA) < NUCLEAR_MIN_RATIO · λ_max`` get their nuclear norm from the SVD.
NUCLEAR_MIN_RATIO = 1e-12
#: Blocks with ``λ_min(AᵀA) < POLAR_MIN_RATIO · λ_max`` get their polar factor from the SVD.
POLAR_MIN_RATIO = 1e-6
#: Share of ill-conditioned blocks above which :func:`polar_scores` solves the rest by the SVD alone.
POLAR_SVD_SHARE = 0.25
#: About the bytes of blocks solved together: a slice, its ``AᵀA`` and the solver's work stay in cache.
CACHE_BYTES = 2 * 2**20
T = TypeVar("T")


@dataclass(frozen=True)
class HeadSplit:
    """The rotary planes ``(p, q)`` of a head and the remaining dims, as index tensors."""

    head_dim: int
    p: torch.Tensor
    q: torch.Tensor
    rest: torch.Tensor

    @classmethod
    def make(cls, head_dim: int, planes: Sequence[tuple[int, int]]) -> HeadSplit:
        """Planes given as ``(p, q)`` index pairs; every other dim goes to the orthogonal block.

        >>> HeadSplit.make(6, [(0, 2), (1, 3)]).rest.tolist()
        [4, 5]
        """
        used = {i for plane in planes for i in plane}
        if len(used) != 2 * len(planes) or any(not 0 <= i < head_dim for i in used):
            raise ValueError(f"rotary planes {list(planes)} do not fit a head of {head_dim} dims")
        rest = [i for i in range(head_dim) if i not in used]
        long = torch.long
        return cls(
            head_dim,
            torch.tensor([p for p, _ in planes], dtype=long),
            torch.tensor([q for _, q in planes], dtype=long),
            torch.tensor(rest, dtype=long),
        )

    @property
    def has_planes(self) -> bool:
        return bool(self.p.numel())

    @cached_property
    def progression(self) -> tuple[int, int, int, int] | None:
        """``(p0, step, planes, δ)`` when ``p = p0 + step·m`` and ``q = p + δ``, else None.

        Every RoPE layout is one: half-split ``(o, 1, r/2, r/2)``, interleaved ``(o, 2, r/2, 1)``.
        """
        m = int(self.p.numel())
        if m == 0:
            return None
        p0, delta = int(self.p[0]), int(self.q[0] - self.p[0])
        step = int(self.p[1] - self.p[0]) if m > 1 else 1
        expect = p0 + step * torch.arange(m)
        if (
            step < 1
            or delta < 1
            or not torch.equal(self.p, expect)
            or not torch.equal(self.q, expect + delta)
        ):
            return None
        return p0, step, m, delta

    def rest_block(self, blocks: torch.Tensor) -> torch.Tensor:
        """The (…, r, r) sub-blocks of the non-rotary dims."""
        rest = self.rest.to(blocks.device)
        if rest.numel() == self.head_dim:
            return blocks
        return blocks.index_select(-2, rest).index_select(-1, rest)


@contextmanager
def _single_threaded() -> Iterator[None]:
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(old)


def map_chunks(fn: Callable[[int], T], starts: Iterable[int], device: torch.device) -> list[T]:
    """``[fn(s) for s in starts]``, on the CPU spread over one Python thread per core.

    Each worker runs torch single-threaded: memory-bound gathers gain little from intra-op threads,
    and OpenMP's spinning barriers slow them down many times over when other processes share the
    cores; plain threads (torch releases the GIL) do not.

    >>> map_chunks(lambda s: s * 2, range(3), torch.device("cpu"))
    [0, 2, 4]
    """
    items = list(starts)
    workers = min(torch.get_num_threads(), len(items))
    if device.type != "cpu" or workers <= 1:
        return [fn(s) for s in items]
    with _single_threaded(), ThreadPoolExecutor(workers) as pool:
        return list(pool.map(fn, items))


def batched_svd(blocks: torch.Tensor, *, vectors: bool = True) -> tuple[torch.Tensor, ...]:
    """SVD of a batch (B, m, m): ``(U, S, Vh)`` with ``vectors``, else ``(S,)``.

    One batched LAPACK call per core: multi-threaded LAPACK on small matrices is slower than one
    thread (about 10× on a 2-core machine for 128×128), so the batch is cut into one slice per core,
    each solved single-threaded. On GPUs this is a single batched call.

    >>> s, = batched_svd(torch.diag(torch.tensor([3.0, 1.0], dtype=torch.float64))[None], vectors=False)
    >>> s.tolist()
    [[3.0, 1.0]]
    """

    def solve(part: torch.Tensor) -> tuple[torch.Tensor, ...]:
        if vectors:
            return tuple(torch.linalg.svd(part))
        return (torch.linalg.svdvals(part),)

    if blocks.device.type != "cpu":
        return solve(blocks)
    workers = max(1, min(torch.get_num_threads(), blocks.shape[0]))
    with _single_threaded():
        if workers == 1:
            return solve(blocks)
        with ThreadPoolExecutor(workers) as pool:
            parts = list(pool.map(solve, blocks.chunk(workers)))
    return tuple(torch.cat(items) for items in zip(*parts, strict=True))


def _well_conditioned(lam: torch.Tensor, ratio: float) -> torch.Tensor:
    """Per block: ``λ_min ≥ ratio · λ_max`` for ascending eigenvalues (…, m) of ``AᵀA`` (zero blocks pass)."""
    return lam[..., 0] >= ratio * lam[..., -1].clamp_min(0)


def _cache_slices(blocks: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """Slices of a batch small enough that a slice and its products stay in cache between the
    product and the eigensolver (about 15% faster than whole batches of 128×128 blocks on a CPU)."""
    block_bytes = blocks.shape[-2] * blocks.shape[-1] * blocks.element_size()
    return blocks.split(max(1, CACHE_BYTES // max(1, block_bytes)))


def nuclear_norms(blocks: torch.Tensor) -> torch.Tensor:
    """``‖A‖_* = tr(Σ)`` of each block (B, m, m), from the eigenvalues of ``AᵀA`` (see the module doc).

    Single-threaded torch; :func:`best_scores` spreads the batch over the cores.

    >>> a = torch.randn(6, 5, 5, dtype=torch.float64)
    >>> bool(torch.allclose(nuclear_norms(a), torch.linalg.svdvals(a).sum(-1), atol=1e-12))
    True
    >>> rank_one = torch.outer(torch.arange(1.0, 6.0), torch.ones(5)).double()[None]  # falls back to the SVD
    >>> abs(float(nuclear_norms(rank_one)[0]) - float(torch.linalg.matrix_norm(rank_one[0]))) < 1e-12
    True
    """
    lam = torch.cat([torch.linalg.eigvalsh(s.mT @ s) for s in _cache_slices(blocks)])
    out = lam.clamp_min(0).sqrt().sum(-1)
    bad = ~_well_conditioned(lam, NUCLEAR_MIN_RATIO)
    if bool(bad.any()):
        out[bad] = torch.linalg.svdvals(blocks[bad]).sum(-1)
    return out


def polar_scores(fit: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    """``tr(Q_bᵀ S_b)`` with ``Q_b = U Vᵀ`` the orthogonal Procrustes rotation of ``fit[b]`` (B, m, m),
    scored on ``score[b]``, without forming ``Q`` (see the module doc).

    Once more than :data:`POLAR_SVD_SHARE` of the blocks solved so far needed the SVD (the eigensolver
    and then the SVD cost more than the SVD alone), the remaining blocks go to the SVD directly.

    >>> a, b = torch.randn(2, 4, 5, 5, dtype=torch.float64)
    >>> a[0, :, 0] = 0.0  # a singular block: solved by the SVD
    >>> u, _, vh = torch.linalg.svd(a)
    >>> bool(torch.allclose(polar_scores(a, b), ((u @ vh) * b).sum((-2, -1)), atol=1e-10))
    True
    """
    out, solved, by_svd = [], 0, 0
    for a, b in zip(_cache_slices(fit), _cache_slices(score), strict=True):
        if by_svd > POLAR_SVD_SHARE * solved > 0:  # mostly ill-conditioned so far: the SVD directly
            out.append(_svd_polar_scores(a, b))
            continue
        lam, vec = torch.linalg.eigh(a.mT @ a)
        diag = (vec * ((a.mT @ b) @ vec)).sum(-2)  # (Vᵀ AᵀB V)_kk
        safe = torch.where(lam > 0, lam, torch.ones_like(lam))
        scores = (diag / safe.sqrt()).sum(-1)
        bad = ~(_well_conditioned(lam, POLAR_MIN_RATIO) & (lam[..., 0] > 0))
        if bool(bad.any()):
            scores[bad] = _svd_polar_scores(a[bad], b[bad])
        solved, by_svd = solved + len(a), by_svd + int(bad.sum())
        out.append(scores)
    return torch.cat(out) if out else fit.new_zeros(0)


def _svd_polar_scores(fit: torch.Tensor, score: torch.Tensor) -> torch.Tensor:
    u, _, vh = torch.linalg.svd(fit)
    return ((u @ vh) * score).sum((-2, -1))


def plane_terms(blocks: torch.Tensor, split: HeadSplit) -> tuple[torch.Tensor, torch.Tensor]:
    """``(α, β)`` per rotary plane, shape (…, planes), of blocks shaped (…, d_h, d_h).

    >>> a = torch.tensor([[[1.0, 2.0], [3.0, 4.0]]], dtype=torch.float64)
    >>> [t.tolist() for t in plane_terms(a, HeadSplit.make(2, [(0, 1)]))]
    [[[5.0]], [[-1.0]]]
    """
    p, q = split.p.to(blocks.device), split.q.to(blocks.device)
    alpha = blocks[..., p, p] + blocks[..., q, q]
    beta = blocks[..., p, q] - blocks[..., q, p]
    return alpha, beta


def plane_angles(alpha: torch.Tensor, beta: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(cos θ, sin θ)`` of the best plane rotation; the identity where ``α = β = 0``.

    >>> [t.tolist() for t in plane_angles(torch.tensor([0.0, 0.0]), torch.tensor([2.0, 0.0]))]
    [[0.0, 1.0], [1.0, 0.0]]
    """
    radius = torch.sqrt(alpha * alpha + beta * beta)
    safe = torch.where(radius > 0, radius, torch.ones_like(radius))
    cos = torch.where(radius > 0, alpha / safe, torch.ones_like(radius))
    sin = torch.where(radius > 0, beta / safe, torch.zeros_like(radius))
    return cos, sin


def best_scores(blocks: torch.Tensor, split: HeadSplit) -> torch.Tensor:
    """``max_Q tr(Q^T A)`` for each block of (B, d_h, d_h) under the rotations ``split`` allows.

    >>> a = torch.tensor([[[0.0, 1.0], [-1.0, 0.0]]], dtype=torch.float64)  # a 90° turn
    >>> best_scores(a, HeadSplit.make(2, [(0, 1)])).tolist(), best_scores(a, HeadSplit.make(2, [])).tolist()
    ([2.0], [2.0])
    """
    total = torch.zeros(blocks.shape[0], dtype=blocks.dtype, device=blocks.device)
    if split.has_planes:
        alpha, beta = plane_terms(blocks, split)
        total = total + torch.sqrt(alpha * alpha + beta * beta).sum(-1)
    if split.rest.numel():
        (sv,) = batched_svd(split.rest_block(blocks), vectors=False)
        total = total + sv.sum(-1)
    return total


def fit_rotations(blocks: torch.Tensor, split: HeadSplit) -> torch.Tensor:
    """The maximising rotations (B, d_h, d_h): plane rotations plus Procrustes on the other dims.

    >>> a = torch.tensor([[[0.0, 1.0], [-1.0, 0.0]]], dtype=torch.float64)
    >>> fit_rotations(a, HeadSplit.make(2, [(0, 1)]))[0].tolist()
    [[0.0, 1.0], [-1.0, 0.0]]
    """
    b, d = blocks.shape[0], split.head_dim
    out = torch.zeros(b, d, d, dtype=blocks.dtype, device=blocks.device)
    if split.has_planes:
        cos, sin = plane_angles(*plane_terms(blocks, split))
        p, q = split.p.to(blocks.device), split.q.to(blocks.device)
        out[:, p, p] = cos
        out[:, q, q] = cos
        out[:, p, q] = sin
        out[:, q, p] = -sin
    if split.rest.numel():
        u, _, vh = batched_svd(split.rest_block(blocks))
        rest = split.rest.to(blocks.device)
        out[:, rest[:, None], rest[None, :]] = u @ vh
    return out


def score_rotations(rotations: torch.Tensor, blocks: torch.Tensor) -> torch.Tensor:
    """``tr(Q^T A)`` for each pair of rotation and block (B,).

    >>> score_rotations(torch.eye(2)[None], torch.ones(1, 2, 2)).tolist()
    [2.0]
    """
    return (rotations * blocks).sum((-2, -1))
