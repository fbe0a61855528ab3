"""Block downsampling against a brute-force loop over blocks."""

from __future__ import annotations

import importlib
import math

import numpy as np
import pytest
import torch

from headwidget.analysis.downsample import downsample


def brute(m: np.ndarray, size: int, how: str) -> tuple[np.ndarray, int]:
    b = math.ceil(max(m.shape) / size)
    out = np.full((math.ceil(m.shape[0] / b), math.ceil(m.shape[1] / b)), np.nan)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            cells = [x for x in m[i * b : (i + 1) * b, j * b : (j + 1) * b].ravel() if not np.isnan(x)]
            if cells and how == "mean":
                out[i, j] = sum(cells) / len(cells)
            elif cells:
                out[i, j] = max(cells, key=abs)  # first of equal magnitudes, row-major
    return out, b


@pytest.mark.parametrize("how", ["mean", "maxabs"])
@pytest.mark.parametrize(
    ("shape", "size"),
    [((37, 53), 8), ((64, 64), 64), ((100, 7), 9), ((50, 50), 7), ((5, 5), 1), ((33, 33), 32)],
)
def test_matches_brute_force(how: str, shape: tuple[int, int], size: int) -> None:
    rng = np.random.default_rng(sum(shape) + size)
    m = rng.uniform(-1, 1, shape).round(2)  # rounding creates magnitude ties
    m[rng.random(shape) < 0.2] = np.nan
    m[:, 3] = np.nan  # an undefined channel: whole column
    m[: min(shape[0], 12), : min(shape[1], 12)] = np.nan  # at least one all-NaN block
    got, block = downsample(m, size, how)
    want, want_block = brute(m, size, how)
    assert block == want_block
    assert got.shape == want.shape
    assert max(got.shape) <= size
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, atol=1e-12)
    if size > 1:
        assert np.isnan(got[0, 0])


def test_channel_count_8192_closed_form() -> None:
    """C = 8192 → 512: 16×16 blocks of an outer-sum matrix whose block means are known exactly."""
    c = 8192
    idx = torch.arange(c, dtype=torch.float32)
    m = (idx[:, None] + 2 * idx[None, :]) / c  # torch input, float32
    got, block = downsample(m, 512)
    centre = np.arange(512) * 16 + 7.5
    np.testing.assert_allclose(got, (centre[:, None] + 2 * centre[None, :]) / c, atol=1e-9)
    assert block == 16
    peak, _ = downsample(-m, 500, how="maxabs")  # block 17: last block partial
    assert peak.shape == (482, 482)
    assert peak[-1, -1] == pytest.approx(-3 * (c - 1) / c)


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="maxabs"):
        downsample(np.eye(4), 2, how="median")
    with pytest.raises(ValueError, match="size must be at least 1, got 0"):
        downsample(np.eye(4), 0)
    with pytest.raises(ValueError, match="2-D"):
        downsample(np.zeros(4), 2)


@pytest.mark.parametrize(
    ("shape", "size"),
    [
        ((64, 64), 16),
        ((48, 96), 12),
        ((30, 45), 8),
        ((37, 53), 8),
        ((53, 37), 8),
        ((40, 53), 8),
        ((53, 40), 8),
        ((100, 7), 9),
        ((7, 100), 30),
        ((4096, 9), 820),
    ],
)
def test_blocks_without_nan_match_brute_force(shape: tuple[int, int], size: int) -> None:
    """No NaN: the summed block-mean path, with whole blocks and with partial last rows and/or columns."""
    m = np.random.default_rng(7).uniform(-1, 1, shape)
    got, block = downsample(m, size, "mean")
    want, want_block = brute(m, size, "mean")
    assert block == want_block
    np.testing.assert_allclose(got, want, atol=1e-12)


def tokens_stats(x: np.ndarray):
    """One-layer KVStats whose keys (and values) are the rows of ``x`` (N, C)."""
    from headwidget.core.layout import AttentionLayout
    from headwidget.moments import Moments
    from headwidget.stats import KVStats, StatsMeta

    n, c = x.shape
    layout = AttentionLayout(
        family="llama",
        mechanism="mha",
        num_layers=1,
        num_heads=c // 8,
        num_kv_heads=c // 8,
        head_dim=8,
        value_head_dim=8,
        hidden_size=c,
    )
    moments = {}
    for kind in ("key", "value"):
        m = Moments.empty(c)
        if n:
            m.update(torch.from_numpy(x), split_a=n)
        moments[(0, kind)] = m
    return KVStats(StatsMeta("synthetic", "Synthetic", layout, [0], ["key", "value"], tokens=n), moments)


def pearson(x: np.ndarray) -> np.ndarray:
    """Float64 Pearson correlation of the columns of ``x``, NaN for a constant column (numpy only)."""
    centred = x - x.mean(0)
    cov = centred.T @ centred
    std = np.sqrt(np.diag(cov))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.clip(cov / np.outer(std, std), -1.0, 1.0)


@pytest.mark.parametrize("band_cells", [2**20, 200])  # one band; many bands (some partial)
@pytest.mark.parametrize(("start", "stop", "size"), [(0, 96, 10), (5, 96, 7), (8, 40, 40), (3, 83, 16)])
def test_downsampled_corr_is_the_block_mean_of_the_correlation(monkeypatch, band_cells, start, stop, size):
    module = importlib.import_module("headwidget.analysis.downsample")  # the package names a function so
    monkeypatch.setattr(module, "BAND_CELLS", band_cells)
    rng = np.random.default_rng(start + stop)
    x = rng.standard_normal((300, 96)) @ rng.standard_normal((96, 96))
    x[:, 17] = 2.5  # a constant channel: NaN row and column, ignored by the block means
    stats = tokens_stats(x)
    got, block = module.downsampled_corr(stats, 0, "key", start, stop, size)
    want, want_block = brute(pearson(x)[start:stop, start:stop], size, "mean")
    assert block == want_block
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    np.testing.assert_allclose(got, want, atol=1e-12)


def test_downsampled_corr_edge_cases():
    from headwidget.analysis.downsample import downsampled_corr

    x = np.random.default_rng(1).standard_normal((50, 32))
    got, block = downsampled_corr(tokens_stats(x), 0, "value", 4, 20, 64)  # fits: the window itself
    assert block == 1
    np.testing.assert_allclose(got, pearson(x)[4:20, 4:20], atol=1e-12)
    empty, block = downsampled_corr(tokens_stats(x[:1]), 0, "key", 0, 32, 5)  # one token: undefined
    assert block == 7 and empty.shape == (5, 5) and np.isnan(empty).all()
    for start, stop in ((0, 33), (-1, 4), (5, 5)):
        with pytest.raises(ValueError, match="not a window of the 32 channels"):
            downsampled_corr(tokens_stats(x), 0, "key", start, stop, 4)
    with pytest.raises(ValueError, match="size must be at least 1"):
        downsampled_corr(tokens_stats(x), 0, "key", 0, 32, 0)
