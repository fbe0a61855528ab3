"""The cross-layer maths (``headwidget.analysis.cross_layer``) against numpy loops and closed forms."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headwidget.analysis.cross_layer import (
    layer_groups,
    merge_elements,
    minicache_merge,
    rotate,
    shared_svd,
    shared_svd_is_exact,
    xkv_elements,
)

F64 = torch.float64


def test_layer_groups_cut_runs_of_adjacent_layers() -> None:
    assert layer_groups(range(30), 2)[-1] == [28, 29]
    assert layer_groups([0, 1, 2, 3, 4], 3) == [[0, 1, 2], [3, 4]]
    assert layer_groups([9, 1, 2, 5, 6, 7], 2) == [[1, 2], [5, 6], [7], [9]]


def test_minicache_merge_equals_a_loop_per_state() -> None:
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, 40, 8, generator=gen, dtype=F64)
    b = a + 0.8 * torch.randn(2, 3, 40, 8, generator=gen, dtype=F64)
    b[1, 0, 0] = a[1, 0, 0] * 3  # parallel: the linear limit, and the smallest distance of row 1
    ra, rb, kept = minicache_merge(a, b, t=0.6, gamma=0.2)
    for row in range(2):
        angle = np.array(
            [
                [
                    math.acos(
                        max(
                            -1.0,
                            min(
                                1.0,
                                float(
                                    a[row, g, i] @ b[row, g, i] / (a[row, g, i].norm() * b[row, g, i].norm())
                                ),
                            ),
                        )
                    )
                    for i in range(40)
                ]
                for g in range(3)
            ]
        )
        d = angle / math.pi
        want_kept = d <= d.min() + (d.max() - d.min()) * 0.2  # xKV: merged where Ω > threshold
        assert np.array_equal(kept[row].numpy(), want_kept)
        for g in range(3):
            for i in range(40):
                x, y = a[row, g, i].numpy(), b[row, g, i].numpy()
                if want_kept[g, i]:
                    ex, ey = x, y
                else:
                    w = angle[g, i]
                    ux, uy = x / np.linalg.norm(x), y / np.linalg.norm(y)
                    e = math.sin(0.4 * w) / math.sin(w) * ux + math.sin(0.6 * w) / math.sin(w) * uy
                    ex, ey = e * np.linalg.norm(x), e * np.linalg.norm(y)
                np.testing.assert_allclose(ra[row, g, i].numpy(), ex, atol=1e-12)
                np.testing.assert_allclose(rb[row, g, i].numpy(), ey, atol=1e-12)
    assert bool(kept[1, 0, 0])


def test_the_parallel_limit_keeps_lengths_and_the_common_direction() -> None:
    a = torch.tensor([[[[1.0, 0.0, 0.0], [1.0, 0.0, 0.0], [0.0, 1.0, 0.0]]]], dtype=F64)
    b = torch.tensor([[[[2.0, 0.0, 0.0], [1.0, 3e-8, 0.0], [1.0, 0.0, 0.0]]]], dtype=F64)
    ra, rb, kept = minicache_merge(a, b, gamma=0.0)  # γ = 0: only the pairs at d_min = 0 retained
    assert kept.tolist() == [[[True, False, False]]]
    angle = float(torch.acos((a[0, 0, 1] @ b[0, 0, 1]) / b[0, 0, 1].norm()))
    assert 0 < angle < 1e-7  # merged, by SLERP's linear limit
    direction = 0.4 * a[0, 0, 1] + 0.6 * b[0, 0, 1] / b[0, 0, 1].norm()
    torch.testing.assert_close(ra[0, 0, 1], direction, atol=1e-15, rtol=0)
    torch.testing.assert_close(rb[0, 0, 1], direction * b[0, 0, 1].norm(), atol=1e-15, rtol=0)
    torch.testing.assert_close(ra[0, 0, 0], a[0, 0, 0], atol=0, rtol=0)


def test_the_retained_states_are_the_most_similar_pairs_as_xkv_s_code_keeps_them() -> None:
    """xKV's reimplementation merges the pairs with Ω > Ω_min + (Ω_max − Ω_min)·γ and restores the
    others: at γ = 0.05 the few most similar pairs stay exact, the distinct ones are merged; a sequence
    whose pairs are all at one distance keeps them all."""
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(1, 2, 50, 8, generator=gen, dtype=F64)
    b = torch.randn(1, 2, 50, 8, generator=gen, dtype=F64)
    b[0, 1, 7] = 2 * a[0, 1, 7]  # the one parallel pair: the least distance
    b[0, 0, 3] = -a[0, 0, 3]  # an opposite pair: the largest distance
    _, rb, kept = minicache_merge(a, b)
    assert kept[0, 1, 7] and not kept[0, 0, 3]
    assert int(kept.sum()) < 10  # the low end of the distances, not most of them
    torch.testing.assert_close(rb[0, 1, 7], b[0, 1, 7], atol=0, rtol=0)
    same = torch.ones(2, 1, 4, 3, dtype=F64)
    assert bool(minicache_merge(same, 3 * same)[2].all())


def test_shared_svd_is_numpy_s_truncated_svd_of_the_side_by_side_caches() -> None:
    gen = torch.Generator().manual_seed(1)
    caches = [torch.randn(2, g, 12, 4, generator=gen, dtype=F64) for g in (2, 1, 2)]
    out = shared_svd(caches, 3)
    for row in range(2):
        joint = np.concatenate([c[row].transpose(0, 1).reshape(12, -1).numpy() for c in caches], axis=1)
        u, s, vh = np.linalg.svd(joint, full_matrices=False)
        approx = (u[:, :3] * s[:3]) @ vh[:3]
        got = np.concatenate([o[row].transpose(0, 1).reshape(12, -1).numpy() for o in out], axis=1)
        np.testing.assert_allclose(got, approx, atol=1e-12)
    full = shared_svd(caches, 100)
    for c, o in zip(caches, full, strict=True):
        torch.testing.assert_close(o, c, atol=1e-12, rtol=0)


def _svd_reconstruction(caches: list[torch.Tensor], rank: int, dtype: torch.dtype) -> list[torch.Tensor]:
    """The side-by-side caches' truncated SVD by ``torch.linalg.svd`` in ``dtype`` (the float32 route is
    how ``shared_svd`` formed it before it used the float64 Gram)."""
    b, _, t, _ = caches[0].shape
    joint = torch.cat([c.to(dtype).transpose(1, 2).reshape(b, t, -1) for c in caches], dim=-1)
    u, s, vh = torch.linalg.svd(joint, full_matrices=False)
    approx = (u[..., :rank] * s[..., None, :rank]) @ vh[..., :rank, :]
    widths = [int(c.shape[1] * c.shape[3]) for c in caches]
    return [
        p.reshape(b, t, c.shape[1], c.shape[3]).transpose(1, 2)
        for p, c in zip(torch.split(approx, widths, dim=-1), caches, strict=True)
    ]


@pytest.mark.parametrize("tokens", [12, 40])  # wide (the T × T Gram) and tall (the W × W Gram)
def test_shared_svd_of_float32_caches_is_the_float64_svd_to_float32_rounding(tokens: int) -> None:
    gen = torch.Generator().manual_seed(3)
    spectrum = 0.7 ** torch.arange(24, dtype=F64)  # singular values over 3 decades
    caches = []
    for g in (2, 1):
        mix = torch.randn(24, g * 8, generator=gen, dtype=F64)
        rows = torch.randn(3, tokens, 24, generator=gen, dtype=F64) * spectrum
        caches.append((rows @ mix).reshape(3, tokens, g, 8).transpose(1, 2).float())
    out = shared_svd(caches, 5)
    reference = _svd_reconstruction(caches, 5, F64)
    previous = _svd_reconstruction(caches, 5, torch.float32)
    scale = max(float(c.abs().max()) for c in caches)
    for o, ref, prev in zip(out, reference, previous, strict=True):
        assert o.dtype == torch.float32
        float64_gap = float((o.double() - ref).abs().max()) / scale
        previous_gap = float((prev.double() - ref).abs().max()) / scale
        assert float64_gap < 4 * 2**-24  # float32 rounding of the result
        assert float((o.double() - prev.double()).abs().max()) / scale < max(previous_gap, 1e-7) * 2


def test_shared_svd_of_full_rank_returns_the_caches_unchanged() -> None:
    gen = torch.Generator().manual_seed(4)
    caches = [torch.randn(2, 1, 6, 4, generator=gen) for _ in range(2)]
    for rank in (6, 8, 100):  # at or above min(T = 6, W = 8)
        out = shared_svd(caches, rank)
        for o, c in zip(out, caches, strict=True):
            assert torch.equal(o, c) and o.data_ptr() != c.data_ptr()
    assert not shared_svd_is_exact(6, 8, 5) and shared_svd_is_exact(6, 8, 6)


def test_rotate_back_is_the_exact_inverse_even_for_rounded_angles() -> None:
    """Angles whose cosine and sine were rounded in float32 (c² + s² ≠ 1): turning back and again gives
    the keys as turned by those angles, to float64 rounding."""
    gen = torch.Generator().manual_seed(2)
    keys = torch.randn(1, 2, 5, 8, generator=gen, dtype=F64)
    angles = torch.rand(1, 5, 2, generator=gen) * 7
    cos = torch.cat([angles.cos(), angles.cos()], -1).to(F64)
    sin = torch.cat([angles.sin(), angles.sin()], -1).to(F64)
    planes = [(2, 4), (3, 5)]  # half pairing of a rotary part of 4 dims starting at dim 2
    turned = rotate(keys, cos, sin, planes, offset=2)
    torch.testing.assert_close(
        rotate(rotate(turned, cos, sin, planes, 2, inverse=True), cos, sin, planes, 2),
        turned,
        atol=1e-15,
        rtol=0,
    )
    assert torch.equal(turned[..., [0, 1, 6, 7]], keys[..., [0, 1, 6, 7]])
    c, s = cos[0, 3, 0], sin[0, 3, 0]
    want = keys[0, 1, 3, 2] * c - keys[0, 1, 3, 4] * s
    assert float(turned[0, 1, 3, 2]) == pytest.approx(float(want), abs=1e-15)


def test_cached_elements_per_token() -> None:
    # MiniCache pair: half the merged direction per layer, a magnitude per head, retained states exact
    assert merge_elements({"key": 128, "value": 64}, 2, {"key": 0.25, "value": 0.0}) == 64 + 32 + 4 + 32
    # xKV group of 4: r/4 of the token factor per kind, the basis r·C spread over the prefill
    same = {"key": 32, "value": 32}
    assert xkv_elements({"key": 128, "value": 128}, same, 4, 1024) == 2 * (8 + 32 * 128 / 1024)
    assert xkv_elements({"key": 128, "value": 128}, same, 4, None) == 16
    # xKV's rank_k and rank_v: each kind by its own rank
    both = {"key": 32, "value": 48}
    assert xkv_elements({"key": 128, "value": 128}, both, 4, 1024) == (8 + 4) + (12 + 6)
    # a rank that keeps the whole P × g·C matrix leaves that kind's cache as it is: its C; so does one
    # whose factors would hold more than the matrix (30/2 + 30·192/32 = 195 > 192)
    assert xkv_elements({"key": 128, "value": 128}, both, 4, 40) == (8 + 32 * 128 / 40) + 128
    assert xkv_elements({"key": 8, "value": 8}, both, 4, 1024) == 16
    assert xkv_elements({"key": 192, "value": 192}, {"key": 30, "value": 8}, 2, 32) == 192 + (4 + 48)
