"""Streaming moments: accuracy against float64 numpy on hard data, merging, splits, serialisation."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headwidget.moments import Moments, normalise_heads
from headwidget.moments.correlation import corr_from_comoment


def hard_activations(n: int = 60_000, c: int = 24, seed: int = 0) -> np.ndarray:
    """Correlated unit-scale channels on large offsets (|mean| up to 300) with 50σ outliers, float32.

    Like real K/V: a few channels carry huge constant offsets and rare spikes.
    """
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(c, c)) / np.sqrt(c)
    x = rng.normal(size=(n, c)) @ mix + rng.uniform(-300, 300, size=c)
    spikes = rng.random((n, c)) < 1e-3
    x[spikes] += rng.normal(scale=50.0, size=spikes.sum())
    return x.astype(np.float32)


def stream(x: np.ndarray, batch: int = 4096, head_dim: int | None = None) -> Moments:
    m = Moments.empty(x.shape[1], head_dim=head_dim)
    for start in range(0, len(x), batch):
        chunk = torch.from_numpy(np.ascontiguousarray(x[start : start + batch]))
        m.update(chunk, split_a=len(chunk) // 3)
    return m


def test_correlation_of_large_mean_data_with_outliers_is_float64_accurate():
    x = hard_activations()
    ref = np.corrcoef(x.astype(np.float64).T)
    got = corr_from_comoment(stream(x).m2).numpy()
    assert np.abs(got - ref).max() <= 1e-6
    # The naive float32 route (E[xx^T] - E[x]E[x]^T) is far off on the same data (by how much depends on
    # the float32 GEMM's accumulation order, which differs between instruction sets: 6e-3 to 3e-2 seen).
    xt = torch.from_numpy(x)
    mean = xt.mean(0)
    naive_cov = (xt.T @ xt) / len(x) - torch.outer(mean, mean)
    assert np.abs(corr_from_comoment(naive_cov.double()).numpy() - ref).max() > 1e-3


def test_mean_and_covariance_match_numpy():
    x = hard_activations(n=10_000)
    m = stream(x, batch=777)
    x64 = x.astype(np.float64)
    np.testing.assert_allclose(m.mean.numpy(), x64.mean(0), rtol=1e-12, atol=1e-10)
    np.testing.assert_allclose(m.covariance().numpy(), np.cov(x64.T), rtol=1e-6, atol=1e-7)


def test_merge_equals_single_stream():
    x = hard_activations(n=9_000, c=8).astype(np.float64)  # float64 data: the merge itself is exact
    whole = stream(x, head_dim=4)
    merged = stream(x[:3_000], head_dim=4).merge(stream(x[3_000:], head_dim=4))
    assert merged.count == whole.count and merged.split_count == whole.split_count
    np.testing.assert_allclose(merged.m2.numpy(), whole.m2.numpy(), rtol=1e-11)
    np.testing.assert_allclose(merged.mean.numpy(), whole.mean.numpy(), rtol=1e-13)
    assert merged.norm_gram is not None and whole.norm_gram is not None
    np.testing.assert_allclose(merged.norm_gram.sum(0).numpy(), whole.norm_gram.sum(0).numpy(), rtol=1e-11)


def test_normalised_gram_keeps_two_splits():
    rng = np.random.default_rng(3)
    x = rng.normal(size=(500, 6)).astype(np.float32)
    m = Moments.empty(6, head_dim=3)
    m.update(torch.from_numpy(x), split_a=200)
    xn = x.astype(np.float64).reshape(500, 2, 3)
    xn = (xn / np.linalg.norm(xn, axis=-1, keepdims=True)).reshape(500, 6)
    np.testing.assert_allclose(m.token_gram(0).numpy(), xn[:200].T @ xn[:200], rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(m.token_gram(1).numpy(), xn[200:].T @ xn[200:], rtol=1e-5, atol=1e-4)
    assert m.split_count == (200, 300)
    assert m.split_tokens() == 500


def test_normalise_heads_leaves_zero_heads_zero():
    x = torch.tensor([[0.0, 0.0, 3.0, 4.0]], dtype=torch.float64)
    assert normalise_heads(x, 2).tolist() == [[0.0, 0.0, 0.6, 0.8]]


def test_tensor_round_trip_is_exact():
    m = stream(hard_activations(n=2_000, c=6), head_dim=3)
    back = Moments.from_tensors(m.to_tensors("p"), "p", head_dim=3)
    assert back.count == m.count and back.split_count == m.split_count
    assert torch.equal(back.m2, m.m2) and torch.equal(back.mean, m.mean)
    assert back.norm_gram is not None and m.norm_gram is not None
    assert torch.equal(back.norm_gram, m.norm_gram)


def test_too_few_tokens_give_undefined_covariance():
    m = Moments.empty(3)
    m.update(torch.ones(1, 3), split_a=1)
    assert torch.isnan(m.covariance()).all()


def test_zero_variance_channel_is_nan_not_zero():
    x = torch.randn(100, 3)
    x[:, 1] = 5.0
    m = Moments.empty(3)
    m.update(x, split_a=50)
    rho = corr_from_comoment(m.m2)
    assert torch.isnan(rho[1]).all() and torch.isnan(rho[:, 1]).all()
    assert not torch.isnan(rho[0, 2])


def test_merging_different_shapes_is_refused():
    with pytest.raises(ValueError, match="cannot merge"):
        Moments.empty(4).merge(Moments.empty(5))


@pytest.mark.parametrize("channels", [127, 128, 192, 385, 2311])
def test_wide_grams_are_formed_by_blocks_and_equal_the_float64_product(channels):
    from headwidget.moments.folding import _add_gram, _same_dtype_products, gram_blocks

    rng = np.random.default_rng(channels)
    x = (rng.normal(size=(300, channels)) * rng.uniform(0.1, 10, size=channels)).astype(np.float32)
    got = torch.zeros(1, channels, channels, dtype=torch.float64)
    rows = torch.from_numpy(x)[None]
    largest = _add_gram(got, [(rows, rows)], torch.empty(channels * channels), _same_dtype_products)
    assert (
        largest is not None and largest.item() == torch.diagonal(got[0]).max().item()
    )  # formed in float32, added into float64
    blocks = gram_blocks(channels)
    assert len(blocks) == (1 if channels < 128 else min(channels // 32, max(8, channels // 256)))
    for start, stop in blocks[:-1]:  # formed by block rows: the lower triangle is the upper one transposed
        assert torch.equal(got[0, stop:, start:stop], got[0, start:stop, stop:].T)
    reference = x.astype(np.float64).T @ x.astype(np.float64)
    # float32 products of 300 terms: |error| ≤ 300·eps32·Σ|x_i||x_j| (the bound, with headroom)
    bound = 300 * np.finfo(np.float32).eps * (np.abs(x).T @ np.abs(x))
    assert np.all(np.abs(got[0].numpy() - reference) <= bound)


def test_off_diagonal_mean_against_a_loop():
    from headwidget.moments import off_diagonal_mean

    rng = np.random.default_rng(4)
    m = rng.normal(size=(5, 5))
    m[1, 3] = np.nan
    for absolute in (False, True):
        kept = [
            abs(m[i, j]) if absolute else m[i, j]
            for i in range(5)
            for j in range(5)
            if i != j and not np.isnan(m[i, j])
        ]
        assert off_diagonal_mean(m, absolute=absolute) == pytest.approx(sum(kept) / len(kept), abs=1e-15)
    assert np.isnan(off_diagonal_mean(np.eye(1))) and np.isnan(off_diagonal_mean(np.full((3, 3), np.nan)))
