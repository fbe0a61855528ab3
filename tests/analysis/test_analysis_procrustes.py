"""Batched Procrustes scores (nuclear norms, held-out polar scores) against numpy's SVD, block by block."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headwidget.analysis import procrustes
from headwidget.analysis.procrustes import nuclear_norms, polar_scores


def conditioned_blocks(rng: np.random.Generator, conditions: list[float], m: int = 6) -> np.ndarray:
    """One m×m block per condition number: random singular vectors, log-spaced singular values."""
    out = []
    for kappa in conditions:
        u, _ = np.linalg.qr(rng.normal(size=(m, m)))
        v, _ = np.linalg.qr(rng.normal(size=(m, m)))
        out.append(u @ np.diag(np.logspace(0, -np.log10(kappa), m)) @ v.T)
    return np.stack(out)


def numpy_polar_scores(fit: np.ndarray, score: np.ndarray) -> np.ndarray:
    u, _, vh = np.linalg.svd(fit)
    return np.einsum("bij,bij->b", u @ vh, score)


@pytest.fixture
def slices_of_two(monkeypatch: pytest.MonkeyPatch) -> None:
    """Solve 6×6 float64 blocks two at a time, so a small batch spans several cache slices."""
    monkeypatch.setattr(procrustes, "CACHE_BYTES", 2 * 6 * 6 * 8)


@pytest.mark.parametrize(
    "conditions",
    [
        [3.0] * 12,  # all well-conditioned: eigensolver throughout
        [1e5, 1e6] * 2 + [3.0] * 8,  # mostly ill-conditioned at first: the rest by the SVD alone
        [3.0] * 8 + [1e5, 1e6, 10.0, 1e8],  # the ill-conditioned ones late: each falls back
    ],
)
def test_polar_scores_equal_the_svd_in_every_slice(slices_of_two: None, conditions: list[float]) -> None:
    rng = np.random.default_rng(len(conditions) + int(conditions[0]))
    fit, score = conditioned_blocks(rng, conditions), rng.normal(size=(len(conditions), 6, 6))
    got = polar_scores(torch.from_numpy(fit), torch.from_numpy(score)).numpy()
    np.testing.assert_allclose(got, numpy_polar_scores(fit, score), rtol=0, atol=1e-10)


def test_polar_scores_switch_to_the_svd_once_most_blocks_need_it(
    slices_of_two: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls: list[int] = []
    eigh = torch.linalg.eigh

    def counted(m: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        calls.append(len(m))
        return eigh(m)

    monkeypatch.setattr(torch.linalg, "eigh", counted)
    rng = np.random.default_rng(3)
    fit = conditioned_blocks(rng, [1e6, 1e7] + [3.0] * 10)
    score = rng.normal(size=fit.shape)
    got = polar_scores(torch.from_numpy(fit), torch.from_numpy(score)).numpy()
    assert calls == [2]  # the first slice found both blocks ill-conditioned; the others skip eigh
    np.testing.assert_allclose(got, numpy_polar_scores(fit, score), rtol=0, atol=1e-10)


def test_nuclear_norms_equal_singular_value_sums_across_slices(slices_of_two: None) -> None:
    rng = np.random.default_rng(5)
    blocks = np.concatenate([conditioned_blocks(rng, [2.0, 1e3, 1e7]), rng.normal(size=(4, 6, 6))])
    blocks[-1, :, 0] = 0.0  # singular: the SVD
    got = nuclear_norms(torch.from_numpy(blocks)).numpy()
    np.testing.assert_allclose(got, np.linalg.svd(blocks, compute_uv=False).sum(-1), rtol=0, atol=1e-12)


def test_empty_batches_give_empty_scores() -> None:
    empty = torch.empty(0, 4, 4, dtype=torch.float64)
    assert nuclear_norms(empty).shape == (0,) and polar_scores(empty, empty).shape == (0,)
