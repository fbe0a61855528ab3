"""Channel-group entropies against a brute-force numpy histogram: one Python loop over groups, np.unique
on the bin-index tuples, float64 sums."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import headwidget
from headwidget.analysis import entropy as entropy_module
from headwidget.analysis.entropy import ChannelEntropyError, channel_entropy, channel_entropy_of
from headwidget.errors import HeadwidgetError, LayerIndexError, UnknownKindError
from headwidget.stats import NoSamplesError
from tiny_models import VOCAB, make_model


def reference_bins(x: np.ndarray, bins: int) -> np.ndarray:
    """Each value's equal-width bin between its channel's min and max; 0 on a constant channel."""
    out = np.zeros(x.shape, dtype=np.int64)
    for ch in range(x.shape[1]):
        lo, hi = x[:, ch].min(), x[:, ch].max()
        if hi == lo:
            continue
        t = (x[:, ch] - lo) / (hi - lo)
        out[:, ch] = np.minimum(np.floor(t * bins), bins - 1)
    return out


def plug_in(index: np.ndarray, miller_madow: bool = False) -> float:
    """Entropy (bits) of the rows of ``index`` (N, k) as tuples."""
    _, counts = np.unique(index, axis=0, return_counts=True)
    p = counts / counts.sum()
    h = float(-(p * np.log2(p)).sum())
    if miller_madow:
        h += (len(counts) - 1) / (2 * len(index) * math.log(2))
    return h


def reference(x: np.ndarray, c: int, bins: int, miller_madow: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """Per-group joint entropies and sums of marginal entropies, group by group."""
    index = reference_bins(x.astype(np.float64), bins)
    joint, marginal = [], []
    for g in range(x.shape[1] // c):
        block = index[:, g * c : (g + 1) * c]
        joint.append(plug_in(block, miller_madow))
        marginal.append(sum(plug_in(block[:, [j]], miller_madow) for j in range(c)))
    return np.array(joint), np.array(marginal)


def coupled_rows(n: int = 3000, seed: int = 0) -> torch.Tensor:
    """11 channels: correlated Gaussians, a constant, a few discrete values, a heavy tail."""
    gen = torch.Generator().manual_seed(seed)
    base = torch.randn(n, 3, generator=gen)
    mix = torch.randn(3, 7, generator=gen)
    smooth = base @ mix + 0.3 * torch.randn(n, 7, generator=gen)
    constant = torch.full((n, 1), 2.5)
    discrete = torch.randint(0, 3, (n, 1), generator=gen).float()
    tail = torch.randn(n, 2, generator=gen) ** 3
    return torch.cat([smooth[:, :4], constant, smooth[:, 4:], discrete, tail], 1).float()


@pytest.mark.parametrize("bins", [1, 2, 5, 16])
@pytest.mark.parametrize("miller_madow", [False, True])
def test_entropies_equal_a_brute_force_histogram(bins: int, miller_madow: bool) -> None:
    x = coupled_rows()
    sizes = (1, 2, 3, 4, 8, 11)  # 11 channels: most sizes leave channels over
    result = channel_entropy_of(x, group_sizes=sizes, bins=bins, miller_madow=miller_madow)
    assert result.samples == 3000 and result.channels == 11 and result.bins == bins
    for c in sizes:
        joint, marginal = reference(x.numpy(), c, bins, miller_madow)
        assert result.joint_per_group[c].shape == (11 // c,)
        np.testing.assert_allclose(result.joint_per_group[c], joint, rtol=0, atol=1e-12)
        np.testing.assert_allclose(result.marginal_per_group[c], marginal, rtol=0, atol=1e-12)
        assert result.joint[c] == pytest.approx(joint.mean(), abs=1e-12)
        assert result.marginal_sum[c] == pytest.approx(marginal.mean(), abs=1e-12)
    assert result.per_channel[4] == 0.0  # the constant channel: one bin (Miller–Madow adds (1 − 1)/2N)


def test_the_maximum_falls_in_the_last_bin_and_a_constant_channel_is_one_bin() -> None:
    x = torch.tensor([[0.0, 7.0], [1.0, 7.0], [2.0, 7.0], [3.0, 7.0]])
    r = channel_entropy_of(x, group_sizes=(1, 2), bins=3)
    # bins of channel 0: floor(t·3) for t = 0, 1/3, 2/3, 1 → 0, 1, 2, 2 (the maximum in the last)
    assert r.per_channel[0] == pytest.approx(-(2 * 0.25 * math.log2(0.25) + 0.5 * math.log2(0.5)))
    assert r.per_channel[1] == 0.0
    assert r.joint[2] == pytest.approx(r.per_channel[0])


def test_miller_madow_adds_the_occupied_cells_term() -> None:
    x = coupled_rows(n=500, seed=3)
    plain = channel_entropy_of(x, group_sizes=(2,), bins=4)
    corrected = channel_entropy_of(x, group_sizes=(2,), bins=4, miller_madow=True)
    index = reference_bins(x.numpy().astype(np.float64), 4)
    for g in range(5):
        cells = len(np.unique(index[:, 2 * g : 2 * g + 2], axis=0))
        by_hand = (cells - 1) / (2 * 500 * math.log(2))
        assert corrected.joint_per_group[2][g] - plain.joint_per_group[2][g] == pytest.approx(
            by_hand, abs=1e-12
        )
        marginal_cells = [len(np.unique(index[:, ch])) for ch in (2 * g, 2 * g + 1)]
        by_hand = sum((m - 1) / (2 * 500 * math.log(2)) for m in marginal_cells)
        gap = corrected.marginal_per_group[2][g] - plain.marginal_per_group[2][g]
        assert gap == pytest.approx(by_hand, abs=1e-12)


def test_biased_flags_where_cells_outnumber_a_fifth_of_the_samples() -> None:
    x = coupled_rows(n=1000)
    r = channel_entropy_of(x, group_sizes=(1, 2, 3, 4), bins=4)
    # 4**c cells against 1000 / 5 = 200: 4, 16, 64 are fewer; 256 are more
    assert r.biased == {1: False, 2: False, 3: False, 4: True}
    exact = channel_entropy_of(x[:20], group_sizes=(1, 2), bins=2)  # 2 and 4 cells against 20 / 5 = 4
    assert exact.biased == {1: False, 2: False}
    assert channel_entropy_of(x[:19], group_sizes=(2,), bins=2).biased == {2: True}


def test_huge_cell_counts_and_chunks_give_the_same_entropies(monkeypatch: pytest.MonkeyPatch) -> None:
    x = coupled_rows(n=400)
    bins, sizes = 1000, (1, 3, 8)  # 1000**8 cells: the codes are renumbered on the way
    whole = channel_entropy_of(x, group_sizes=sizes, bins=bins)
    for c in sizes:
        joint, marginal = reference(x.numpy(), c, bins)
        np.testing.assert_allclose(whole.joint_per_group[c], joint, rtol=0, atol=1e-12)
        np.testing.assert_allclose(whole.marginal_per_group[c], marginal, rtol=0, atol=1e-12)
    monkeypatch.setattr(entropy_module, "_CHUNK", 400 * 3)  # one group of 3 at a time
    chunked = channel_entropy_of(x, group_sizes=sizes, bins=bins)
    for c in sizes:
        np.testing.assert_array_equal(chunked.joint_per_group[c], whole.joint_per_group[c])


def test_numpy_samples_and_float64_are_accepted() -> None:
    x = coupled_rows(n=300)
    a = channel_entropy_of(x, group_sizes=(2,), bins=8)
    b = channel_entropy_of(x.double().numpy(), group_sizes=(2,), bins=8)
    np.testing.assert_array_equal(a.joint_per_group[2], b.joint_per_group[2])


@pytest.fixture(scope="module")
def captured() -> headwidget.KVStats:
    model = make_model("llama_mha", dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (16, 64), generator=gen)
    return headwidget.capture(model, ids, rope="both", samples=800, progress=False)


def test_real_keys_and_values_are_sub_additive(captured: headwidget.KVStats) -> None:
    for kind in ("key", "key_post", "value"):
        r = channel_entropy(captured, 1, kind, group_sizes=(1, 2, 4, 8), bins=8)
        assert r.samples == 800
        direct = channel_entropy_of(captured.samples(1, kind), group_sizes=(1, 2, 4, 8), bins=8)
        assert r.joint == direct.joint and r.marginal_sum == direct.marginal_sum
        for c in (2, 4, 8):
            assert (r.marginal_per_group[c] >= r.joint_per_group[c] - 1e-12).all()
            assert r.marginal_sum[c] >= r.joint[c]
        assert r.joint[1] == r.marginal_sum[1]
        joint, marginal = reference(captured.samples(1, kind).numpy(), 4, 8)
        np.testing.assert_allclose(r.joint_per_group[4], joint, rtol=0, atol=1e-12)
        np.testing.assert_allclose(r.marginal_per_group[4], marginal, rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ({"group_sizes": (0,)}, r"group size 0 is outside 1\.\.11"),
        ({"group_sizes": (12,)}, r"group size 12 is outside 1\.\.11: .* 1 ≤ c ≤ C = 11"),
        ({"group_sizes": ()}, r"group_sizes is empty"),
        ({"group_sizes": (2.0,)}, r"group_sizes\[0\] must be an integer, got 2\.0 \(float\); pass 2"),
        ({"group_sizes": None}, r"group_sizes must be a list of integers, got None"),
        ({"bins": 0}, r"bins must be at least 1, got 0"),
        ({"bins": True}, r"bins must be an integer, got True \(bool\)"),
        ({"bins": 2**62}, r"bins must be at most 1048576, got 4611686018427387904"),
        ({"miller_madow": "yes"}, r"miller_madow must be True or False, got the string 'yes'"),
    ],
)
def test_bad_arguments_are_refused_by_name(args: dict, message: str) -> None:
    with pytest.raises(ChannelEntropyError, match=message):
        channel_entropy_of(coupled_rows(n=10), **args)


def test_unusable_samples_are_refused_by_name() -> None:
    with pytest.raises(ChannelEntropyError, match=r"at least 2 samples, got 1; capture with samples=R"):
        channel_entropy_of(torch.zeros(1, 4))
    with pytest.raises(ChannelEntropyError, match=r"2-D \(tokens, channels\) array, got shape \(5,\)"):
        channel_entropy_of(torch.zeros(5))
    with pytest.raises(ChannelEntropyError, match=r"NaN or infinite"):
        channel_entropy_of(torch.tensor([[0.0], [float("inf")]]), group_sizes=(1,))
    assert issubclass(ChannelEntropyError, HeadwidgetError) and issubclass(ChannelEntropyError, ValueError)


def test_stats_without_samples_or_kind_say_how_to_capture(captured: headwidget.KVStats) -> None:
    model = make_model("llama_mha", dtype=torch.float32)
    plain = headwidget.capture(model, torch.randint(1, VOCAB, (2, 8)), progress=False)
    with pytest.raises(NoSamplesError, match=r"capture with samples=R"):
        channel_entropy(plain, 0, "key")
    with pytest.raises(UnknownKindError, match=r"kind 'input' was not captured .* inputs=True"):
        channel_entropy(captured, 0, "input")
    with pytest.raises(LayerIndexError, match=r"out of range"):
        channel_entropy(captured, 7, "key")


def test_shuffled_rows_keep_every_channel_and_lose_the_dependence() -> None:
    from headwidget.analysis.entropy import shuffled_rows

    x = coupled_rows(n=2000)
    y = shuffled_rows(x, seed=3)
    assert torch.equal(y.sort(0).values, x.sort(0).values)  # each channel keeps its values
    assert torch.equal(y, shuffled_rows(x, seed=3)) and not torch.equal(y, shuffled_rows(x, seed=4))
    # rows no longer line up: a perfectly coupled pair of channels (a copy) loses its correlation
    copies = torch.cat([x[:, :1], x[:, :1]], 1)
    mixed = shuffled_rows(copies, seed=0).double().numpy()
    assert abs(np.corrcoef(mixed.T)[0, 1]) < 0.1
    with pytest.raises(ValueError, match="seed"):
        shuffled_rows(x, seed=-1)


def test_the_control_is_the_entropy_of_the_shuffled_sample(captured: headwidget.KVStats) -> None:
    from headwidget.analysis.entropy import coupling_control, shuffled_rows

    for layer, kind in ((0, "key"), (1, "value")):
        control = coupling_control(captured, layer, kind, group_sizes=(1, 2, 4), bins=4)
        rows = captured.samples(layer, kind).double().numpy()
        order = shuffled_rows(torch.arange(rows.size, dtype=torch.float64).reshape(rows.shape), layer)
        flat = order.numpy().astype(np.int64)  # which original cell each shuffled cell came from
        shuffled = rows.reshape(-1)[flat]
        for c in (2, 4):
            joint, marginal = reference(shuffled, c, 4)
            assert control.joint[c] == pytest.approx(joint.mean(), abs=1e-12)
            assert control.marginal_sum[c] == pytest.approx(marginal.mean(), abs=1e-12)
        real = channel_entropy(captured, layer, kind, group_sizes=(1, 2, 4), bins=4)
        assert control.marginal_sum == pytest.approx(real.marginal_sum, abs=1e-12)  # same marginals


def test_the_control_separates_coupling_from_the_estimators_bias() -> None:
    """Independent channels: the real ratio is the control's (all of its gap from 1 is bias).
    Copies: the control stays near 1 and the real ratio falls to 1/2."""
    from headwidget.analysis.entropy import shuffled_rows

    gen = torch.Generator().manual_seed(5)
    independent = torch.rand(300, 8, generator=gen)
    copies = torch.rand(300, 1, generator=gen).repeat(1, 2)

    def ratio(x: torch.Tensor) -> float:
        e = channel_entropy_of(x, group_sizes=(2,), bins=16)
        return e.joint[2] / e.marginal_sum[2]

    biased, control = ratio(independent), ratio(shuffled_rows(independent, seed=0))
    assert biased < 0.95 and abs(biased - control) < 0.01  # 256 cells for 300 samples: biased low
    assert ratio(copies) == pytest.approx(0.5, abs=1e-12) and ratio(shuffled_rows(copies, seed=0)) > 0.9
