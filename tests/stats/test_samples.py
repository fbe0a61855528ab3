"""Token samples: real captured rows only, uniform over the stream and over merged streams, kept by files.

The references are independent of the capture: K/V read by this file's own forward hooks on the key and
value projections, post-RoPE keys rotated here, and chi-square tests against closed-form
distributions (uniform positions, the hypergeometric split of a merge).
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.distributed as dist
from torch import nn

import headwidget
from headwidget import KVStats, StatsFileError
from headwidget.capture.memory import reservoir_bytes, reservoir_key_bytes, sample_update_bytes
from headwidget.capture.tokens import TokenReservoir
from headwidget.core.layout import AttentionLayout
from headwidget.errors import CaptureInputError, HeadwidgetError, LayerIndexError, UnknownKindError
from headwidget.moments import Moments
from headwidget.stats import StatsMeta
from headwidget.stats._samples import NoSamplesError
from memory_peak import allocated_peak
from ports import free_port, run_ranks
from tiny_models import VOCAB, make_model, rope_half

PAD = VOCAB - 1  # a padding id no real token uses: padding rows are unlike every real row
LENGTHS = ((13, 7, 10), (9, 12))  # 51 real tokens


# ----------------------------------------------------------------------------- helpers
def chi_square_p(observed: np.ndarray, expected: np.ndarray) -> float:
    """Upper tail of the chi-square statistic, ``len - 1`` degrees of freedom."""
    stat = float(((observed - expected) ** 2 / expected).sum())
    dof = len(observed) - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64), torch.tensor(stat / 2)))


def padded_batches(side: str, seed: int = 3) -> list[dict[str, torch.Tensor]]:
    """Two batches of ragged rows, every real id distinct, padded with ``PAD`` on ``side``."""
    gen = torch.Generator().manual_seed(seed)
    ids = iter((torch.randperm(VOCAB - 2, generator=gen) + 1).tolist())
    out = []
    for rows in LENGTHS:
        width = max(rows) + 2
        batch = torch.full((len(rows), width), PAD)
        mask = torch.zeros(len(rows), width, dtype=torch.long)
        for i, n in enumerate(rows):
            where = slice(0, n) if side == "right" else slice(width - n, width)
            batch[i, where] = torch.tensor([next(ids) for _ in range(n)])
            mask[i, where] = 1
        out.append({"input_ids": batch, "attention_mask": mask})
    return out


def hooked_rows(model: nn.Module, batches: list[dict[str, torch.Tensor]]) -> dict[tuple[int, str], Any]:
    """Per (layer, kind): ``(real, padding, first)`` float64 rows read by this file's own hooks.

    ``real`` holds every real token's row (batch by batch, row-major), ``padding`` every padding
    position's, ``first`` whether the real row is its sequence's first token. Post-RoPE keys are the
    pre-RoPE keys rotated here at each real token's position counted from its row's first real token.
    """
    layers = model.model.layers
    seen: dict[tuple[int, str], list[torch.Tensor]] = {}
    handles = []
    for layer, block in enumerate(layers):
        attn = block.self_attn

        def keep(name: str, layer: int = layer) -> Callable[..., None]:
            def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
                seen.setdefault((layer, name), []).append(output.detach().clone())

            return hook

        def keep_input(module: nn.Module, args: tuple, layer: int = layer) -> None:
            seen.setdefault((layer, "input"), []).append(args[0].detach().clone())

        handles += [
            attn.k_proj.register_forward_hook(keep("key")),
            attn.v_proj.register_forward_hook(keep("value")),
            attn.k_proj.register_forward_pre_hook(keep_input),
        ]
    try:
        with torch.no_grad():
            for b in batches:
                mask = b["attention_mask"]
                positions = (mask.cumsum(-1) - 1).clamp(min=0)
                model(input_ids=b["input_ids"], attention_mask=mask, position_ids=positions, use_cache=False)
    finally:
        for h in handles:
            h.remove()
    cfg = model.config
    heads, head_dim = cfg.num_key_value_heads, cfg.hidden_size // cfg.num_attention_heads
    theta = (getattr(cfg, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    out: dict[tuple[int, str], Any] = {}
    masks = [b["attention_mask"].bool() for b in batches]
    firsts = torch.cat([(m & (m.cumsum(-1) == 1))[m] for m in masks])
    for (layer, kind), parts in list(seen.items()):
        real = torch.cat([p[m] for p, m in zip(parts, masks, strict=True)]).double()
        pad = torch.cat([p[~m] for p, m in zip(parts, masks, strict=True)]).double()
        out[(layer, kind)] = (real, pad, firsts)
        if kind == "key":
            posts = []
            for p, m in zip(parts, masks, strict=True):
                positions = (m.long().cumsum(-1) - 1).clamp(min=0)
                for row in range(p.shape[0]):
                    k = p[row][m[row]].double().reshape(-1, heads, head_dim)
                    posts.append(
                        rope_half(k, positions[row][m[row]], head_dim, theta).reshape(k.shape[0], -1)
                    )
            out[(layer, "key_post")] = (torch.cat(posts), None, firsts)
    return out


def match_exact(sample: torch.Tensor, rows: torch.Tensor) -> list[int]:
    """For each sampled row, the index of the one reference row it equals bit for bit (as float32)."""
    where: dict[bytes, list[int]] = {}
    for i, row in enumerate(rows.float().numpy()):
        where.setdefault(row.tobytes(), []).append(i)
    found = []
    for row in sample.numpy():
        hits = where.get(row.tobytes())
        assert hits is not None, f"sampled row {row[:4]}... is no captured token's row"
        assert len(hits) == 1, "the reference rows are not distinct"
        found.append(hits[0])
    return found


def match_close(sample: torch.Tensor, rows: torch.Tensor) -> list[int]:
    """For each sampled row, the index of the reference row within float32 rounding of it."""
    gaps = (sample.double()[:, None, :] - rows[None, :, :]).abs().amax(-1)
    best = gaps.argmin(1)
    scale = rows.abs().max()
    assert bool((gaps[torch.arange(len(sample)), best] <= 1e-6 * scale).all())
    return best.tolist()


def moments_of(rows: torch.Tensor) -> Moments:
    moments = Moments.empty(rows.shape[1], head_dim=rows.shape[1])
    moments.update(rows, len(rows) // 2)
    return moments


def synthetic_stats(
    rows: torch.Tensor, size: int, seed: int, batch: int = 37, moments: Moments | None = None
) -> KVStats:
    """Statistics of one layer's values ``rows`` (N, C), sampled batch by batch as a capture does."""
    n, c = rows.shape
    layout = AttentionLayout("synthetic", "mha", 1, 1, 1, c, c, c)
    moments = moments_of(rows) if moments is None else moments
    reservoir = TokenReservoir(size, seed)
    buffer = torch.empty(size, c)
    for start in range(0, n, batch):
        x = rows[start : start + batch]
        step = reservoir.step(len(x))
        buffer[step.slots] = x[step.rows]
    sample = buffer[: reservoir.filled][reservoir.order()]
    meta = StatsMeta(
        "synthetic", "Synthetic", layout, [0], ["value"], tokens=n, sample_size=size, sample_seed=seed
    )
    return KVStats(meta, {(0, "value"): moments}, samples={(0, "value"): sample})


def no_hooks(model: nn.Module) -> bool:
    return all(
        not m._forward_hooks and not m._forward_pre_hooks and not m._forward_hooks_with_kwargs
        for m in model.modules()
    )


@pytest.fixture(scope="module")
def llama() -> nn.Module:
    return make_model("llama_gqa")  # float64


# ----------------------------------------------------------------------------- real rows only
@pytest.mark.parametrize("side", ["right", "left"])
@pytest.mark.parametrize("size", [20, 1000])
def test_samples_are_real_rows_of_the_same_tokens_never_padding(
    llama: nn.Module, side: str, size: int
) -> None:
    batches = padded_batches(side)
    reference = hooked_rows(llama, batches)
    stats = headwidget.capture(llama, batches, rope="both", inputs=True, samples=size, progress=False)
    assert stats.tokens == 51 and stats.meta.sample_size == size
    for layer in (0, 1):
        tokens = None
        for kind in ("key", "value", "input", "key_post"):
            sample = stats.samples(layer, kind)
            real, pad, _ = reference[(layer, kind)]
            assert sample.dtype == torch.float32 and sample.shape == (min(size, 51), real.shape[1])
            if kind == "key_post":
                found = match_close(sample, real)
            else:
                found = match_exact(sample, real)
                padding = {row.tobytes() for row in pad.float().numpy()}
                assert not padding & {row.tobytes() for row in sample.numpy()}
            assert len(set(found)) == len(found)  # without replacement
            if size >= 51:
                assert sorted(found) == list(range(51))  # every counted row, once
            tokens = found if tokens is None else tokens
            assert found == tokens  # row i of every (layer, kind) is the same token
    assert no_hooks(llama)


def test_samples_hold_exactly_the_rows_that_entered_the_moments(llama: nn.Module) -> None:
    batches = padded_batches("left")
    reference = hooked_rows(llama, batches)
    stats = headwidget.capture(llama, batches, skip_first_token=True, samples=500, progress=False)
    real, _, first = reference[(1, "value")]
    found = match_exact(stats.samples(1, "value"), real)
    assert sorted(found) == [i for i in range(len(real)) if not first[i]]
    limited = headwidget.capture(llama, batches, max_tokens=17, samples=500, progress=False)
    assert limited.samples(0, "key").shape == (17, 16)
    np.testing.assert_allclose(
        limited.samples(0, "key").double().mean(0).numpy(), limited.mean(0, "key"), rtol=1e-6, atol=1e-7
    )


def test_the_same_seed_gives_the_same_samples(llama: nn.Module) -> None:
    batches = padded_batches("right")
    a, b, c = (
        headwidget.capture(llama, batches, samples=10, sample_seed=seed, progress=False) for seed in (5, 5, 6)
    )
    assert torch.equal(a.samples(1, "key"), b.samples(1, "key"))
    assert not torch.equal(a.samples(1, "key"), c.samples(1, "key"))
    assert a.meta.sample_seed == 5


# ----------------------------------------------------------------------------- uniformity
def reservoir_positions(size: int, batches: list[int], seed: int) -> torch.Tensor:
    """The stream positions a :class:`TokenReservoir` keeps over batches of these sizes."""
    reservoir = TokenReservoir(size, seed)
    kept = torch.empty(size, dtype=torch.long)
    start = 0
    for n in batches:
        step = reservoir.step(n)
        kept[step.slots] = start + step.rows
        start += n
    return kept[: reservoir.filled]


def first_rows(size: int, batches: list[int], seed: int) -> torch.Tensor:
    """A biased sampler: the first ``size`` rows of the stream."""
    return torch.arange(min(size, sum(batches)))


def position_p_value(sampler: Callable[[int, list[int], int], torch.Tensor], repeats: int = 300) -> float:
    size, batches = 40, [1, 7, 33, 64, 2, 100, 5, 64, 64, 64, 13, 200, 1, 1, 57, 124]  # 800 rows
    total = sum(batches)
    counts = np.zeros(total)
    for seed in range(repeats):
        kept = sampler(size, batches, seed)
        assert len(set(kept.tolist())) == len(kept) == size
        np.add.at(counts, kept.numpy(), 1)
    bins = counts.reshape(20, -1).sum(1)  # 20 stretches of 40 positions
    return chi_square_p(bins, np.full(20, repeats * size / 20))


def test_the_reservoir_keeps_every_position_equally_often() -> None:
    assert position_p_value(reservoir_positions) > 1e-3
    assert position_p_value(first_rows) < 1e-3  # the test sees a biased sampler


def test_a_long_captured_stream_is_sampled_uniformly() -> None:
    model = make_model("llama_mha", dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (160, 16), generator=gen)
    rows = torch.arange(160)
    ids[:, 0], ids[:, 1] = rows % (VOCAB - 1) + 1, rows // (VOCAB - 1) + 1  # distinct 2-token prefixes
    batches = [{"input_ids": part, "attention_mask": torch.ones_like(part)} for part in ids.split(8)]
    real, _, first = hooked_rows(model, batches)[(1, "value")]
    real = real[~first]  # 2400 rows, all distinct after each row's first token
    counts = np.zeros(16)
    for seed in range(2):
        stats = headwidget.capture(
            model, batches, layers=[1], skip_first_token=True, samples=400, sample_seed=seed, progress=False
        )
        found = np.array(match_exact(stats.samples(1, "value"), real))
        np.add.at(counts, found // 150, 1)  # 16 stretches of 150 rows
    assert chi_square_p(counts, np.full(16, 800 / 16)) > 1e-3


def hypergeometric_p(picks: list[int], good: int, bad: int, draws: int) -> float:
    """Chi-square of how many of ``draws`` came from the ``good`` side, against the hypergeometric pmf."""
    pmf = np.array([math.comb(good, k) * math.comb(bad, draws - k) for k in range(draws + 1)], dtype=float)
    pmf /= pmf.sum()
    expected = pmf * len(picks)
    observed = np.bincount(picks, minlength=draws + 1).astype(float)
    # pool the tails (and any sparse cell) so that every cell expects at least 5
    cells_o, cells_e, acc_o, acc_e = [], [], 0.0, 0.0
    for o, e in zip(observed, expected, strict=True):
        acc_o, acc_e = acc_o + o, acc_e + e
        if acc_e >= 5:
            cells_o.append(acc_o)
            cells_e.append(acc_e)
            acc_o = acc_e = 0.0
    cells_o[-1] += acc_o
    cells_e[-1] += acc_e
    return chi_square_p(np.array(cells_o), np.array(cells_e))


def test_merged_samples_are_uniform_over_the_union() -> None:
    n_a, n_b, size, repeats = 300, 900, 60, 400
    rows = torch.stack([torch.arange(n_a + n_b, dtype=torch.float32), torch.zeros(n_a + n_b)], 1)
    from_a, positions = [], np.zeros(n_a + n_b)
    moments_a, moments_b = moments_of(rows[:n_a]), moments_of(rows[n_a:])
    for t in range(repeats):
        a = synthetic_stats(rows[:n_a], size, seed=2 * t, moments=moments_a)
        b = synthetic_stats(rows[n_a:], size, seed=2 * t + 1, batch=101, moments=moments_b)
        merged = a.merge(b)
        sample = merged.samples(0, "value")[:, 0].long()
        assert sample.shape == (size,) and len(set(sample.tolist())) == size
        from_a.append(int((sample < n_a).sum()))
        np.add.at(positions, sample.numpy(), 1)
    assert merged.tokens == n_a + n_b and merged.meta.sample_size == size
    assert hypergeometric_p(from_a, n_a, n_b, size) > 1e-3
    assert chi_square_p(positions.reshape(12, -1).sum(1), np.full(12, repeats * size / 12)) > 1e-3
    assert hypergeometric_p([size // 2] * repeats, n_a, n_b, size) < 1e-3  # half from each side: biased


def test_merge_keeps_the_smaller_sample_and_none_without_samples(llama: nn.Module) -> None:
    first, second = padded_batches("right")
    a = headwidget.capture(llama, [first], samples=8, progress=False)
    b = headwidget.capture(llama, [second], samples=5, sample_seed=1, progress=False)
    none = headwidget.capture(llama, [second], progress=False)
    merged = a + b
    assert merged.meta.sample_size == 5 and merged.samples(0, "value").shape == (5, 16)
    reference = hooked_rows(llama, [first, second])
    key_tokens = match_exact(merged.samples(0, "key"), reference[(0, "key")][0])
    assert match_exact(merged.samples(0, "value"), reference[(0, "value")][0]) == key_tokens  # aligned
    with pytest.raises(NoSamplesError, match=r"capture with samples=R"):
        (a + none).samples(0, "key")


def _reduce_worker(rank: int, world: int, port: int, paths: list[str], outs: list[str]) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        KVStats.load(paths[rank]).all_reduce().save(outs[rank])
    finally:
        dist.destroy_process_group()


def test_all_reduce_draws_the_merge_on_every_rank(llama: nn.Module, tmp_path: Path) -> None:
    parts = [
        headwidget.capture(llama, [batch], rope="both", samples=12, sample_seed=rank, progress=False)
        for rank, batch in enumerate(padded_batches("left"))
    ]
    paths = [str(p.save(tmp_path / f"rank{i}.safetensors")) for i, p in enumerate(parts)]
    outs = [str(tmp_path / f"reduced{i}.safetensors") for i in range(2)]
    run_ranks(_reduce_worker, (2, free_port(), paths, outs))
    merged = parts[0] + parts[1]
    for out in outs:
        reduced = KVStats.load(out)
        assert reduced.meta.sample_size == 12 and reduced.meta.sample_seed == merged.meta.sample_seed
        for kind in merged.kinds:
            for layer in (0, 1):
                assert torch.equal(reduced.samples(layer, kind), merged.samples(layer, kind))


# ----------------------------------------------------------------------------- files
@pytest.fixture(scope="module")
def sampled(llama: nn.Module) -> KVStats:
    return headwidget.capture(
        llama, padded_batches("right"), rope="both", inputs=True, cross_layer=True, samples=20, progress=False
    )


def test_save_load_keeps_the_samples_bit_for_bit(sampled: KVStats, tmp_path: Path) -> None:
    loaded = KVStats.load(sampled.save(tmp_path / "s.safetensors"))
    assert loaded.meta.to_json() == sampled.meta.to_json()
    for layer in (0, 1):
        for kind in sampled.kinds:
            assert torch.equal(loaded.samples(layer, kind), sampled.samples(layer, kind))
    moved = loaded.to("meta")
    assert moved.samples(1, "input").device.type == "meta"
    assert loaded.samples(1, "input").device.type == "cpu"


def rewrite(good: Path, out: Path, edit: Callable[[dict[str, Any], dict[str, torch.Tensor]], None]) -> Path:
    """A copy of ``good`` with ``edit(meta, tensors)`` applied (``meta``: the parsed JSON)."""
    from safetensors import safe_open
    from safetensors.torch import load_file, save_file

    with safe_open(str(good), framework="pt") as fh:
        header = dict(fh.metadata())
    tensors = load_file(str(good))
    meta = json.loads(header["meta"])
    edit(meta, tensors)
    save_file(tensors, str(out), metadata={**header, "meta": json.dumps(meta)})
    return out


def test_files_written_without_samples_still_load(llama: nn.Module, tmp_path: Path) -> None:
    plain = headwidget.capture(llama, padded_batches("right"), progress=False)
    good = plain.save(tmp_path / "plain.safetensors")

    def older(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        del meta["sample_size"], meta["sample_seed"]  # as files were written before samples

    loaded = KVStats.load(rewrite(good, tmp_path / "old.safetensors", older))
    assert loaded.meta.sample_size == 0 and loaded.tokens == plain.tokens
    np.testing.assert_array_equal(loaded.covariance(1, "key"), plain.covariance(1, "key"))
    with pytest.raises(NoSamplesError, match=r"hold no token samples: capture with samples=R"):
        loaded.samples(1, "key")


def _tensor(name: str, change: Callable[[torch.Tensor], torch.Tensor]) -> Callable[..., None]:
    def edit(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        tensors[name] = change(tensors[name].clone())

    return edit


def _with_nan(t: torch.Tensor) -> torch.Tensor:
    t[3, 2] = float("nan")
    return t


def _far(t: torch.Tensor) -> torch.Tensor:
    t[4, 1] = 1e3
    return t


def _meta(**values: Any) -> Callable[..., None]:
    def edit(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        meta.update(values)

    return edit


def _drop(name: str) -> Callable[..., None]:
    def edit(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
        del tensors[name]

    return edit


def _no_sample_size(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    meta["sample_size"] = 0


def _more_rows_than_tokens(meta: dict[str, Any], tensors: dict[str, torch.Tensor]) -> None:
    meta["sample_size"] = 100  # a sample size above the 51 tokens
    for name in [n for n in tensors if n.endswith(".samples")]:
        t = tensors[name]
        tensors[name] = torch.cat([t, t, t[:12]])  # 52 rows


S = "layer1.value.samples"
BAD_SAMPLES = [
    ("float64", _tensor(S, lambda t: t.double()), rf"tensor {S} must be float32 of shape \(20, 16\)"),
    ("wrong width", _tensor(S, lambda t: t[:, :8].contiguous()), r"but is float32 of shape \(20, 8\)"),
    ("one dimension", _tensor(S, lambda t: t[:, 0].contiguous()), r"but is float32 of shape \(20,\)"),
    ("NaN", _tensor(S, _with_nan), rf"tensor {S} holds NaN or infinite values \(at \(3, 2\)\)"),
    (
        "more rows than sample_size",
        _tensor(S, lambda t: torch.cat([t, t[:1]])),
        rf"tensor {S} holds 21 rows, more than meta\.sample_size \(20\)",
    ),
    (
        "fewer rows",
        _tensor(S, lambda t: t[:10].contiguous()),
        r"holds 10 rows, but a sample of up to meta\.sample_size=20 rows of meta\.tokens=51 tokens holds 20",
    ),
    (
        "more rows than tokens",
        _more_rows_than_tokens,
        r"holds 52 rows, more than the 51 tokens captured \(meta\.tokens\)",
    ),
    ("far from every token", _tensor(S, _far), r"row 4 has 1000 on channel 1, .* the co-moment allows"),
    ("missing", _drop(S), rf"tensor {S} is missing"),
    ("samples without sample_size", _no_sample_size, r"holds token samples, but meta\.sample_size is 0"),
    ("negative sample_size", _meta(sample_size=-1), r"meta\.sample_size is -1, outside the allowed >= 0"),
    ("string sample_seed", _meta(sample_seed="7"), r"meta\.sample_seed must be an integer, not the string"),
    ("sample_seed too large", _meta(sample_seed=2**63), r"meta\.sample_seed is \d+, outside the allowed"),
]


@pytest.mark.parametrize(("edit", "message"), [c[1:] for c in BAD_SAMPLES], ids=[c[0] for c in BAD_SAMPLES])
def test_load_refuses_impossible_samples_naming_them(
    sampled: KVStats, tmp_path: Path, edit: Callable[..., None], message: str
) -> None:
    good = sampled.save(tmp_path / "good.safetensors")
    bad = rewrite(good, tmp_path / "bad.safetensors", edit)
    with pytest.raises(StatsFileError, match=message) as info:
        KVStats.load(bad)
    assert str(info.value).startswith(f"{bad} is corrupt or incomplete: ")


# ----------------------------------------------------------------------------- memory
@pytest.mark.parametrize("size", [300, 3000])
def test_estimate_counts_the_reservoirs(llama: nn.Module, size: int) -> None:
    batch_size, max_length = 4, 32
    tokens, channels, layer_kinds = batch_size * max_length, 16, 2 * 2  # keys and values of 2 layers
    plain = headwidget.estimate(llama, batch_size=batch_size, max_length=max_length)
    sampled = headwidget.estimate(llama, batch_size=batch_size, max_length=max_length, samples=size)
    reservoirs = size * channels * 4 * layer_kinds
    assert reservoir_bytes(size, channels) * layer_kinds == reservoirs
    # float64 model: 128 rows enter at most, gathered in float64 and float32, with two int64 indices
    write = min(size, tokens) * channels * (8 + 4) + 16 * min(size, tokens)
    assert sample_update_bytes(size, tokens, channels, 8) == max(write, size * channels * 4)
    keys = 8 * (5 * size + 4 * tokens)
    assert reservoir_key_bytes(size, tokens) == keys
    # the rows written into the reservoirs (or one reservoir reordered) are working memory beside the
    # larger of a kind's rows on their way into staging: the recorded tensor and its selected rows
    staging = 2 * tokens * channels * 8
    extra = max(write, size * channels * 4) - staging
    assert sampled - plain == reservoirs + max(extra, 0) + keys


def test_estimate_covers_the_measured_peak_with_samples() -> None:
    model = make_model("llama_gqa", dtype=torch.float32)
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1, VOCAB, (9, 64), generator=gen)
    batches = [{"input_ids": ids, "attention_mask": torch.ones_like(ids)}]
    options: dict[str, Any] = {"rope": "both", "inputs": True, "samples": 5000}
    need = headwidget.estimate(model, batch_size=4, max_length=64, **options)
    peak = allocated_peak(
        lambda: headwidget.capture(model, batches, batch_size=4, max_length=64, progress=False, **options)
    )
    assert peak <= need < 10 * peak


# ----------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"samples": -1}, r"samples must be a whole number of token rows .* got -1"),
        ({"samples": True}, r"samples must be a whole number .* got True"),
        ({"samples": 2.5}, r"samples must be a whole number .* got 2\.5"),
        (
            {"samples": 4, "sample_seed": -3},
            r"sample_seed must be an integer with 0 ≤ seed < 2\*\*63, got -3",
        ),
        ({"samples": 4, "sample_seed": 2**63}, r"sample_seed must be an integer .* got 9223372036854775808"),
    ],
)
def test_bad_sample_options_fail_before_any_hook(llama: nn.Module, options: dict, message: str) -> None:
    before = {k: v.clone() for k, v in llama.state_dict().items()}
    with pytest.raises(CaptureInputError, match=message):
        headwidget.capture(llama, padded_batches("right"), progress=False, **options)
    if "sample_seed" not in options:
        with pytest.raises(CaptureInputError, match=message):
            headwidget.estimate(llama, **options)
    assert no_hooks(llama) and not llama.training
    assert all(torch.equal(v, before[k]) for k, v in llama.state_dict().items())


def test_samples_of_what_was_not_captured_say_what_to_do(llama: nn.Module, sampled: KVStats) -> None:
    plain = headwidget.capture(llama, padded_batches("right"), progress=False)
    with pytest.raises(NoSamplesError, match=r"capture with samples=R \(for example samples=4096\)"):
        plain.samples(0, "key")
    assert issubclass(NoSamplesError, HeadwidgetError) and issubclass(NoSamplesError, ValueError)
    only_pre = headwidget.capture(llama, padded_batches("right"), samples=4, progress=False)
    with pytest.raises(UnknownKindError, match=r"capture with rope='post' or rope='both'"):
        only_pre.samples(0, "key_post")
    with pytest.raises(LayerIndexError, match=r"out of range"):
        sampled.samples(5, "key")
    assert no_hooks(llama)
