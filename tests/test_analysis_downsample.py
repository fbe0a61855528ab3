"""Block downsampling against a brute-force loop over blocks."""

from __future__ import annotations

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
@pytest.mark.parametrize(("shape", "size"), [((37, 53), 8), ((64, 64), 64), ((100, 7), 9), ((50, 50), 7),
                                             ((5, 5), 1), ((33, 33), 32)])  # fmt: skip
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


@pytest.mark.parametrize(("shape", "size"), [((64, 64), 16), ((48, 96), 12), ((30, 45), 8)])
def test_whole_blocks_without_nan_match_brute_force(shape: tuple[int, int], size: int) -> None:
    m = np.random.default_rng(7).uniform(-1, 1, shape)  # no NaN: the plain block-mean path when b divides
    got, block = downsample(m, size, "mean")
    want, want_block = brute(m, size, "mean")
    assert block == want_block
    np.testing.assert_allclose(got, want, atol=1e-12)
