"""Folding many moments at once: the stack equals one Moments per stream, and the tensor-core split
(bfloat16 hi + lo parts, products emulated exactly on the CPU) keeps correlations within 1e-5 of float64
on activations with large means and outliers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from headwidget.moments import (
    FoldWork,
    Moments,
    MomentStack,
    StackedMoments,
    bf16_products,
    folding,
    split_bf16,
)
from headwidget.moments.correlation import corr_from_comoment


def hard_activations(n: int, c: int, seed: int = 0) -> np.ndarray:
    """Correlated unit-scale channels on offsets up to ±300 with 0.1 % 50σ outliers, float32 (the
    stress data of ``bench/capture.py`` (c))."""
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(c, c)).astype(np.float32) / np.sqrt(c)
    x = rng.standard_normal((n, c), dtype=np.float32) @ mix
    x += rng.uniform(-300, 300, size=c).astype(np.float32)
    spikes = rng.random((n, c)) < 1e-3
    x[spikes] += rng.normal(scale=50.0, size=int(spikes.sum()))
    return x.astype(np.float32)


def unit_heads(x: np.ndarray, head_dim: int) -> np.ndarray:
    heads = x.reshape(len(x), -1, head_dim)
    return (heads / np.linalg.norm(heads, axis=-1, keepdims=True)).reshape(len(x), -1)


def fold_stream(x: torch.Tensor, head_dim: int, mode: str, batch: int = 2048) -> StackedMoments:
    """Fold the rows of ``x`` (n, C) batch by batch into one stream, the first third of each batch in
    split A."""
    c = int(x.shape[1])
    stack = StackedMoments.empty(1, c, head_dim=head_dim)
    work = FoldWork.make(1, batch, c, head_dim, x.dtype, mode=mode)  # type: ignore[arg-type]
    for start in range(0, len(x), batch):
        rows = x[start : start + batch].unsqueeze(0).clone()
        stack.fold(rows, split_a=rows.shape[1] // 3, work=work)
    return stack


def test_the_tensor_core_split_keeps_correlations_within_1e_5_of_float64():
    x = torch.from_numpy(hard_activations(100_000, 128, seed=7)).to(torch.bfloat16)  # a bf16 model's K/V
    x64 = x.double().numpy()
    stack = fold_stream(x, head_dim=64, mode="split")
    corr = corr_from_comoment(stack.m2[0]).numpy()
    assert np.abs(corr - np.corrcoef(x64.T)).max() <= 1e-5
    np.testing.assert_allclose(stack.mean[0].numpy(), x64.mean(0), rtol=0, atol=1e-6)
    # the normalised Grams (per-head cosines summed over tokens), per token
    unit = unit_heads(x64, 64)
    third = [2048 // 3] * (len(x64) // 2048) + [(len(x64) % 2048) // 3]
    in_a = np.concatenate([np.arange(s, s + k) for s, k in zip(range(0, len(x64), 2048), third, strict=True)])
    a = unit[in_a]
    assert stack.norm_gram is not None and stack.split_count == (len(in_a), len(x64) - len(in_a))
    assert np.abs(stack.norm_gram[0, 0].numpy() - a.T @ a).max() / len(a) <= 1e-6
    assert np.abs(stack.norm_gram[0].sum(0).numpy() - unit.T @ unit).max() / len(unit) <= 1e-6


def test_onednn_s_chunked_products_keep_the_blas_route_s_accuracy(monkeypatch: pytest.MonkeyPatch):
    """The joint Gram of many cross layers goes through oneDNN in chunks of 128 tokens: its correlations
    (mean error) and normalised Grams stay as close to float64 as the batched BLAS products' (stress
    data, 3 batches of up to 2,048 rows, the last one short)."""
    if folding.onednn_linear() is None:
        pytest.skip("this PyTorch has no oneDNN matmul")
    x = torch.from_numpy(hard_activations(4500, 512, seed=5))
    x64 = x.double().numpy()
    calls = []
    original = folding.add_gram_onednn
    monkeypatch.setattr(folding, "add_gram_onednn", lambda *a, **k: calls.append(1) or original(*a, **k))
    errors, m2 = {}, {}
    # "tiles": block rows of 64 by tiles of 96 columns, some starting inside the diagonal block
    for route, fewest, tile in (("onednn", 512, 10**9), ("tiles", 512, 96), ("blas", 10**9, 96)):
        monkeypatch.setattr(folding, "ONEDNN_CHANNELS", fewest)
        monkeypatch.setattr(folding, "ONEDNN_TILE", tile)
        stack = fold_stream(x, head_dim=64, mode="exact")
        m2[route] = stack.m2[0].clone()
        corr = corr_from_comoment(stack.m2[0]).numpy()
        unit = unit_heads(x64, 64)
        assert stack.norm_gram is not None
        gram = np.abs(stack.norm_gram[0].sum(0).numpy() - unit.T @ unit).max() / len(unit)
        off = np.abs(corr - np.corrcoef(x64.T))
        errors[route] = (off.max(), off.mean(), gram)
        np.testing.assert_allclose(stack.mean[0].numpy(), x64.mean(0), rtol=0, atol=1e-12)
        if route == "onednn":
            assert len(calls) == 3 * 3  # each batch: the co-moment and both splits' normalised Grams
    assert len(calls) == 2 * 3 * 3
    assert errors["onednn"][0] <= 1e-6 and errors["onednn"][1] <= errors["blas"][1]
    assert errors["onednn"][2] <= 1e-8 and errors["onednn"][2] <= 1.5 * errors["blas"][2]
    scale = float(m2["onednn"].diagonal().max())
    torch.testing.assert_close(m2["tiles"], m2["onednn"], rtol=0, atol=1e-12 * scale)
    assert errors["tiles"][1] <= errors["blas"][1] and errors["tiles"][2] <= 1e-8


def test_without_the_split_bfloat16_products_lose_the_correlations():
    """The check above can fail: one bfloat16 part of the centred rows is far from float64."""
    x = torch.from_numpy(hard_activations(20_000, 64, seed=3)).to(torch.bfloat16)
    centred = (x.float() - x.float().mean(0)).to(torch.bfloat16).double()
    one_part = corr_from_comoment(centred.T @ centred).numpy()
    assert np.abs(one_part - np.corrcoef(x.double().numpy().T)).max() > 1e-4


def test_split_parts_hold_the_rows_to_2_to_the_minus_17():
    rng = np.random.default_rng(1)
    r = torch.from_numpy(np.concatenate([rng.normal(size=5000), rng.normal(scale=1e3, size=50)])).float()
    hi, lo = torch.empty_like(r, dtype=torch.bfloat16), torch.empty_like(r, dtype=torch.bfloat16)
    split_bf16(r.clone(), hi, lo)
    assert torch.all((hi.double() + lo.double() - r.double()).abs() <= 2.0**-17 * r.double().abs())


def test_emulated_bfloat16_products_are_exact_products_summed_in_float32():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(2, 3, 5, generator=gen).to(torch.bfloat16)
    b = torch.randn(2, 5, 4, generator=gen).to(torch.bfloat16)
    out = torch.zeros(2, 3, 4)
    bf16_products(out, a[:, :, :1], b[:, :1], accumulate=False)  # one term: exact
    assert torch.equal(out.double(), a[:, :, :1].double() @ b[:, :1].double())
    bf16_products(out, a[:, :, 1:], b[:, 1:], accumulate=True)
    exact = a.double() @ b.double()
    assert torch.allclose(
        out.double(), exact, rtol=0, atol=5 * 2.0**-24 * float((a.abs().double() @ b.abs().double()).max())
    )


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_stack_folds_each_stream_as_moments_update_does(dtype):
    gen = torch.Generator().manual_seed(5)
    rows = (torch.randn(3, 700, 160, generator=gen, dtype=torch.float64) * 2 + 40).to(dtype)
    stack = MomentStack.empty(3, 160, head_dim=32)
    work = FoldWork.make(3, 400, 160, 32, dtype)
    singles = [Moments.empty(160, head_dim=32) for _ in range(3)]
    for start, stop in ((0, 400), (400, 700)):
        batch = rows[:, start:stop]
        flags = stack.fold(batch.clone(), split_a=150, work=work)
        assert flags is not None and bool(flags.all())
        for i, single in enumerate(singles):
            single.update(batch[i], split_a=150)
    for member, single in zip(stack.members, singles, strict=True):
        assert (member.count, member.split_count) == (single.count, single.split_count) == (700, (300, 400))
        torch.testing.assert_close(member.mean, single.mean, rtol=1e-15, atol=0)
        torch.testing.assert_close(
            member.m2, single.m2, rtol=1e-12, atol=1e-12 * float(single.m2.abs().max())
        )
        assert member.norm_gram is not None and single.norm_gram is not None
        torch.testing.assert_close(member.norm_gram, single.norm_gram, rtol=1e-12, atol=1e-9)


@pytest.mark.parametrize(
    ("mode", "dtype", "element"),
    [("exact", torch.float32, 4), ("exact", torch.float64, 8), ("split", torch.bfloat16, 2)],
)
def test_fold_buffers_take_what_their_nbytes_says(mode, dtype, element):
    taken: list[int] = []

    def count(shape: tuple[int, ...], dt: torch.dtype, device: torch.device) -> torch.Tensor:
        taken.append(int(np.prod(shape)) * dt.itemsize)
        return torch.empty(shape, dtype=dt, device=device)

    FoldWork.make(3, 100, 192, 64, dtype, mode=mode, allocate=count)
    assert sum(taken) == FoldWork.nbytes(3, 100, 192, 64, element, mode)


def test_a_batch_larger_than_the_buffers_is_refused():
    stack = StackedMoments.empty(2, 8)
    with pytest.raises(ValueError, match=r"2 × 11 rows do not fit the fold's buffers of 2 × 10"):
        stack.fold(torch.zeros(2, 11, 8), split_a=0, work=FoldWork.make(2, 10, 8, None, torch.float32))
