"""``score_pairs``: every RoPE plane layout (strided fast path and general fallback) vs per-pair numpy."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headwidget.analysis.pair_scores import score_pairs
from headwidget.analysis.procrustes import HeadSplit


def brute_pair(a: np.ndarray, planes: list[tuple[int, int]], rest: list[int]) -> tuple[float, np.ndarray]:
    """Best score and rotation of one d×d block: closed form per plane, SVD on the rest."""
    q = np.zeros_like(a)
    score = 0.0
    for p, r in planes:
        alpha, beta = a[p, p] + a[r, r], a[p, r] - a[r, p]
        score += np.hypot(alpha, beta)
        t = np.arctan2(beta, alpha)
        q[p, p] = q[r, r] = np.cos(t)
        q[p, r], q[r, p] = np.sin(t), -np.sin(t)
    if rest:
        u, s, vh = np.linalg.svd(a[np.ix_(rest, rest)])
        score += s.sum()
        q[np.ix_(rest, rest)] = u @ vh
    return score, q


@pytest.mark.parametrize(
    "planes",
    [
        [(0, 3), (1, 4), (2, 5)],  # half-split, full rotary
        [(1, 2), (3, 4)],  # interleaved with an offset, dims 0 and 5 free
        [(0, 4), (1, 2)],  # no common step/offset: general path
        [],  # orthogonal only
    ],
)
def test_matches_per_pair_numpy(planes: list[tuple[int, int]]) -> None:
    rng = np.random.default_rng(len(planes))
    heads, d = 7, 6
    x0, x1 = rng.normal(size=(40, heads * d)), rng.normal(size=(30, heads * d))
    x0[:, d : 2 * d] += x0[:, :d]  # some structure between heads 0 and 1
    g0, g1 = x0.T @ x0, x1.T @ x1
    split = HeadSplit.make(d, planes)
    rest = split.rest.tolist()
    assert (split.progression is None) == (planes == [(0, 4), (1, 2)] or not planes)
    out = score_pairs([torch.from_numpy(g0), torch.from_numpy(g1)], split, heldout=True)
    g = g0 + g1

    def block(m: np.ndarray, i: int, j: int) -> np.ndarray:
        return m[i * d : (i + 1) * d, j * d : (j + 1) * d]

    for i in range(heads):
        for j in range(heads):
            blk = lambda m, i=i, j=j: block(m, i, j)  # noqa: E731
            assert out.trace[i, j] == pytest.approx(np.trace(blk(g)), abs=1e-9)
            assert out.heldout_trace[i, j] == pytest.approx(np.trace(blk(g1)), abs=1e-9)
            if i == j:
                assert out.best[i, j] == pytest.approx(np.trace(blk(g)), abs=1e-9)
                continue
            best, _ = brute_pair(blk(g), planes, rest)
            _, q0 = brute_pair(blk(g0), planes, rest)
            assert out.best[i, j] == pytest.approx(best, abs=1e-9)
            assert out.heldout[i, j] == pytest.approx(np.sum(q0 * blk(g1)), abs=1e-9)


def test_heldout_needs_two_parts() -> None:
    with pytest.raises(ValueError, match="two parts"):
        score_pairs([torch.eye(4, dtype=torch.float64)], HeadSplit.make(2, []), heldout=True)


@pytest.mark.parametrize("planes", [[(0, 3), (1, 4), (2, 5)], [(1, 2), (3, 4)], [(0, 4), (1, 2)], []])
@pytest.mark.parametrize("layout", ["stacked", "window", "summed"])
def test_in_sample_scores_read_any_strided_gram(planes: list[tuple[int, int]], layout: str) -> None:
    """The in-sample path (parts summed as read) on Grams that are views: an offset into a stacked
    tensor, a window of a wider matrix (row stride ≠ C), or the in-sample Gram as one part."""
    rng = np.random.default_rng(7)
    heads, d = 5, 6
    x0, x1 = rng.normal(size=(30, heads * d)), rng.normal(size=(20, heads * d))
    x0[:, 2 * d : 3 * d] -= 0.5 * x0[:, d : 2 * d]
    g0, g1 = x0.T @ x0, x1.T @ x1
    c = heads * d
    stacked = torch.from_numpy(np.stack([g1, g0, g1]))
    wide = torch.from_numpy(rng.normal(size=(2, c + 3, c + 5)))
    wide[0, 1 : c + 1, 2 : c + 2], wide[1, 2 : c + 2, 4 : c + 4] = torch.from_numpy(g0), torch.from_numpy(g1)
    parts = {
        "stacked": [stacked[1], stacked[2]],
        "window": [wide[0, 1 : c + 1, 2 : c + 2], wide[1, 2 : c + 2, 4 : c + 4]],
        "summed": [torch.from_numpy(g0 + g1)],
    }[layout]
    split = HeadSplit.make(d, planes)
    out = score_pairs(parts, split)
    assert out.heldout is None and out.heldout_trace is None
    g = g0 + g1
    for i in range(heads):
        for j in range(heads):
            a = g[i * d : (i + 1) * d, j * d : (j + 1) * d]
            assert out.trace[i, j] == pytest.approx(np.trace(a), abs=1e-9)
            want = np.trace(a) if i == j else brute_pair(a, planes, split.rest.tolist())[0]
            assert out.best[i, j] == pytest.approx(want, abs=1e-9)
