"""K/V quantizers (kv:int, kv:cq) as evaluation variants, against independent references.

The int quantizer against a float64 numpy loop over groups; k-means against its own objective and
exact recovery; bytes against the formulas by hand; the model-level behaviour (int16 ≈ the model,
fewer bits never lower the KL, padding, the per-layer sweep, nothing left behind) against forwards
run by hand.
"""

from __future__ import annotations

import itertools
import json

import numpy as np
import pytest
import torch
from torch.nn.functional import cross_entropy
from transformers import LlamaConfig, LlamaForCausalLM
from transformers.modeling_utils import AttentionInterface

import headwidget
from headwidget.adapters import attention_calls
from headwidget.analysis.quantizers import fit_codebooks, quantize_int_keys, quantize_int_values
from headwidget.errors import (
    HeadwidgetError,
    MechanismSpecError,
    MissingStatisticsError,
    UnsupportedConversionError,
)
from headwidget.evaluation import apply, evaluate
from headwidget.evaluation._quantize import KVQuantizer, fit_quantizer
from headwidget.texts import english_sample
from tiny_models import make_model, ragged_batches

F64 = torch.float64


# ---------------------------------------------------------------------------------------------- numpy
def np_fp16_down(v: float) -> float:
    h = np.float16(v)
    return float(h) if float(h) <= v else float(np.nextafter(h, np.float16(-np.inf)))


def np_fp16_up(v: float) -> float:
    h = np.float16(v)
    return float(h) if float(h) >= v else float(np.nextafter(h, np.float16(np.inf)))


def np_group(values: np.ndarray, bits: int) -> np.ndarray:
    """Quantize→dequantize one group (float64): fp16 zero (rounded down) and scale (rounded up)."""
    levels = 2**bits - 1
    zero = np_fp16_down(float(values.min()))
    scale = np_fp16_up((float(values.max()) - zero) / levels)
    if scale == 0.0:
        return np.full_like(values, zero)
    q = np.clip(np.round((values - zero) / scale), 0, levels)
    return q * scale + zero


def np_keys(key: np.ndarray, real: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Per channel over groups of n consecutive real tokens of each row and head; padding unchanged."""
    out = key.astype(np.float64).copy()
    b_, g_, _, d_ = key.shape
    for b in range(b_):
        idx = np.nonzero(real[b])[0]
        for g in range(g_):
            for start in range(0, len(idx), n):
                pos = idx[start : start + n]
                for ch in range(d_):
                    out[b, g, pos, ch] = np_group(key[b, g, pos, ch].astype(np.float64), bits)
    return out


def np_values(value: np.ndarray, bits: int, n: int) -> np.ndarray:
    """Per token over groups of n contiguous channels of the heads-concatenated vector."""
    b_, g_, t_, d_ = value.shape
    out = np.empty_like(value, dtype=np.float64)
    for b in range(b_):
        for t in range(t_):
            vec = value[b, :, t, :].reshape(-1).astype(np.float64)
            res = np.empty_like(vec)
            for start in range(0, vec.size, n):
                res[start : start + n] = np_group(vec[start : start + n], bits)
            out[b, :, t, :] = res.reshape(g_, d_)
    return out


def ragged_mask(lengths: list[int], width: int, left: bool = False) -> torch.Tensor:
    mask = torch.zeros(len(lengths), width, dtype=torch.bool)
    for i, n in enumerate(lengths):
        if left:
            mask[i, width - n :] = True
        else:
            mask[i, :n] = True
    return mask


# ---------------------------------------------------------------------------------------------- kv:int
@pytest.mark.parametrize(("bits", "n"), [(1, 8), (3, 8), (4, 32), (8, 5), (16, 8)])
def test_int_keys_equal_a_numpy_loop_with_partial_groups_and_padding(bits: int, n: int) -> None:
    gen = torch.Generator().manual_seed(bits * 100 + n)
    key = (torch.randn(3, 2, 37, 6, generator=gen) * torch.linspace(0.1, 4.0, 6)).float()
    real = ragged_mask([37, 20, 3], 37)
    key[~real[:, None, :, None].expand_as(key)] = 1e4  # padding that must not touch a real group
    got = quantize_int_keys(key, bits, n, real).double().numpy()
    want = np_keys(key.numpy(), real.numpy(), bits, n)
    scale = float(key[real[:, None, :, None].expand_as(key)].abs().max())
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-7 * scale)
    padding = ~real[:, None, :, None].expand_as(key)
    assert (got[padding.numpy()] == 1e4).all()


def test_int_keys_group_the_real_tokens_so_left_and_right_padding_agree() -> None:
    gen = torch.Generator().manual_seed(3)
    rows = [torch.randn(2, n, 4, generator=gen) for n in (11, 5)]
    right = torch.zeros(2, 2, 11, 4)
    left = torch.zeros(2, 2, 11, 4)
    for i, r in enumerate(rows):
        right[i, :, : r.shape[1]] = r
        left[i, :, 11 - r.shape[1] :] = r
    a = quantize_int_keys(right, 2, 4, ragged_mask([11, 5], 11))
    b = quantize_int_keys(left, 2, 4, ragged_mask([11, 5], 11, left=True))
    assert torch.equal(a[1, :, :5], b[1, :, 6:]) and torch.equal(a[0], b[0])


@pytest.mark.parametrize(("bits", "n"), [(2, 8), (4, 10), (4, 32), (16, 7)])
def test_int_values_equal_a_numpy_loop(bits: int, n: int) -> None:
    """C = 2·12 = 24: g8 is whole groups (crossing heads), g10 and g7 end partial, g32 one group of 24."""
    gen = torch.Generator().manual_seed(bits + n)
    value = torch.randn(2, 2, 9, 12, generator=gen) * 3
    got = quantize_int_values(value, bits, n).double().numpy()
    np.testing.assert_allclose(got, np_values(value.numpy(), bits, n), rtol=0, atol=3e-6)


def test_int_quantizer_keeps_the_dtype_and_is_exact_on_its_own_grid() -> None:
    grid = torch.arange(16.0).reshape(1, 1, 16, 1)  # 0..15: 4 bits over one group of 16 are exact
    assert torch.equal(quantize_int_keys(grid, 4, 16), grid)
    half = torch.randn(1, 2, 40, 8).to(torch.bfloat16)
    assert quantize_int_keys(half, 4).dtype == torch.bfloat16
    assert quantize_int_values(half, 4).dtype == torch.bfloat16


# ---------------------------------------------------------------------------------------------- k-means
def test_cq_error_is_zero_when_the_codebook_can_hold_every_distinct_group_vector() -> None:
    gen = torch.Generator().manual_seed(0)
    groups, c = 3, 4
    for distinct, bits in ((5, 3), (8, 3), (2, 1), (16, 4)):
        atoms = torch.randint(-8, 9, (groups, distinct, c), generator=gen).double()
        pick = torch.randint(0, distinct, (400, groups), generator=gen)
        pick[:distinct] = torch.arange(distinct)[:, None]  # every distinct vector occurs
        samples = torch.stack([atoms[g, pick[:, g]] for g in range(groups)], 1).reshape(400, groups * c)
        for dtype in (torch.float32, F64):
            books = fit_codebooks(samples.to(dtype), c, bits, seed=1)
            assert books.objective[-1] == 0.0
            assert torch.equal(books.quantize(samples.to(dtype)), samples.to(dtype))


def correlated(n: int, channels: int, seed: int, dtype: torch.dtype = F64) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(channels, 4, generator=gen, dtype=F64)
    z = torch.randn(n, 4, generator=gen, dtype=F64)
    return (z @ mix.T + 0.2 * torch.randn(n, channels, generator=gen, dtype=F64)).to(dtype)


@pytest.mark.parametrize(("c", "bits"), [(2, 4), (4, 5), (8, 6)])
def test_kmeans_objective_never_rises(c: int, bits: int) -> None:
    samples = correlated(1500, 16, seed=c)
    books = fit_codebooks(samples, c, bits, iters=40, seed=2)
    obj = books.objective
    assert len(obj) >= 4
    assert all(b <= a for a, b in itertools.pairwise(obj)), obj
    # the objective is the mean squared distance to the fitted (unrounded) centroids, by hand
    x = samples.reshape(1500, 16 // c, c).transpose(0, 1)
    d = ((x[:, :, None, :] - books.centroids[:, None, :, :]) ** 2).sum(-1).min(-1).values
    assert float(d.mean()) == pytest.approx(obj[-1], rel=1e-9)


def test_kmeans_is_deterministic_for_a_seed_and_its_codebook_shapes() -> None:
    samples = correlated(600, 12, seed=5, dtype=torch.float32)
    a = fit_codebooks(samples, 3, 4, iters=8, seed=7)
    b = fit_codebooks(samples, 3, 4, iters=8, seed=7)
    assert torch.equal(a.centroids, b.centroids) and a.objective == b.objective
    assert tuple(a.centroids.shape) == (4, 16, 3) and a.nbytes == 4 * 16 * 3 * 2
    assert not torch.equal(a.centroids, fit_codebooks(samples, 3, 4, iters=8, seed=8).centroids)


@pytest.mark.parametrize("bits", [3, 8])
def test_cq_quantizer_picks_the_nearest_fp16_centroid_by_brute_force(bits: int) -> None:
    """KVQuantizer.quantize on (B, G, T, d) K/V: every c channels of the heads-concatenated vector →
    an fp16-stored centroid at the brute-force (numpy, float64) minimum distance, up to the documented
    near ties (a relative 2**(b − 23)); almost every pick is the brute-force argmin itself."""
    g, d, c = 2, 6, 4
    books = {
        kind: fit_codebooks(correlated(600, g * d, seed=i, dtype=torch.float32), c, bits, iters=5)
        for i, kind in enumerate(("key", "value"))
    }
    q = KVQuantizer(
        f"kv:cq4c{bits}b", "kv:cq", bits, c, [0], {"key": g * d, "value": g * d}, {0: 2 * g * d}, {0: books}
    )
    gen = torch.Generator().manual_seed(1)
    key, value = torch.randn(2, g, 40, d, generator=gen), torch.randn(2, g, 40, d, generator=gen)
    got = q.quantize(0, key, value)
    same = total = 0
    for kind, x, y in (("key", key, got[0]), ("value", value, got[1])):
        cent = books[kind].centroids.to(torch.float16).double().numpy()  # (G/c groups, 2**b, c)
        rows = x.transpose(1, 2).reshape(-1, g * d).double().numpy()
        picked = y.transpose(1, 2).reshape(-1, g * d).double().numpy()
        for r in range(rows.shape[0]):
            for j in range(cent.shape[0]):
                part, pick = rows[r, j * c : (j + 1) * c], picked[r, j * c : (j + 1) * c]
                dist = ((cent[j] - part) ** 2).sum(-1)
                hit = np.flatnonzero((np.abs(cent[j] - pick) < 1e-7).all(-1))
                assert hit.size, "the quantized group is one of the stored centroids"
                assert dist[hit].min() <= dist.min() * (1 + 2.0 ** (bits - 22)) + 1e-6
                same += int(np.argmin(dist) in hit)
                total += 1
    assert same >= total - 2


# ---------------------------------------------------------------------------------------------- bytes
def llama64() -> LlamaForCausalLM:
    """A real tiny config with C = 4 KV heads × 16 = 64 channels per kind and 2 layers."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=4,
    )
    return LlamaForCausalLM(config).float().eval()


def test_bytes_equal_the_formulas_by_hand() -> None:
    model = llama64()
    c_kv, layers = 4 * 16, 2
    assert fit_quantizer(model, "kv:int4").layer_bytes_per_token(0) == 2 * (c_kv * 4 / 8 + 4 * c_kv / 32)
    assert fit_quantizer(model, "kv:int4").kv_bytes_per_token() == layers * 2 * (32 + 8)
    g16 = fit_quantizer(model, "kv:int2/g16").kv_bytes_per_token()
    assert g16 == layers * 2 * (c_kv * 2 / 8 + 4 * c_kv / 16)
    int3 = fit_quantizer(model, "kv:int3").kv_bytes_per_token()
    assert int3 == layers * 2 * (c_kv * 3 / 8 + 4 * c_kv / 32)
    # an unquantized layer costs its K/V in the dtype: 2·64 elements × 4 bytes (float32)
    assert fit_quantizer(model, "kv:int4", layers=[1]).kv_bytes_per_token(torch.float32) == 80 + 2 * 64 * 4
    # a fractional count stays fractional: g128 amortises 4·64/128 = 2 key bytes, the value group is whole
    assert fit_quantizer(model, "kv:int1/g128").layer_bytes_per_token(0) == 8 + 2 + 8 + 4
    assert fit_quantizer(model, "kv:int1/g256").layer_bytes_per_token(0) == 8 + 1 + 8 + 4
    assert fit_quantizer(model, "kv:int1/g512").layer_bytes_per_token(0) == 8 + 0.5 + 8 + 4
    # kv:cq{c}c{b}b: 2·(C/c)·b/8 per token and layer; codebooks 2**b·c fp16 per group, kind and layer
    spec, c, bits = "kv:cq4c8b", 4, 8
    books = fit_codebooks(torch.randn(300, c_kv), c, bits, iters=1)
    q = KVQuantizer(
        spec,
        "kv:cq",
        bits,
        c,
        [0, 1],
        {"key": c_kv, "value": c_kv},
        {0: 128, 1: 128},
        {layer: {"key": books, "value": books} for layer in (0, 1)},
    )
    assert q.layer_bytes_per_token(0) == 2 * (c_kv / c) * bits / 8 == 32
    assert q.kv_bytes_per_token() == layers * 32
    assert q.constant_bytes == layers * 2 * (c_kv // c) * 2**bits * c * 2


def test_evaluate_reports_the_bytes_and_no_constant_for_kv_int(tmp_path) -> None:
    model = llama64()
    ids = torch.randint(1, 96, (2, 20), generator=torch.Generator().manual_seed(0))
    report = evaluate(model, ids, ["model", "kv:int4", "kv:int2/g16"], dtype=torch.float32, progress=False)
    assert report.kv_bytes_per_token == {"model": 2 * 128 * 4, "kv:int4": 160, "kv:int2/g16": 128}
    assert report.constant_bytes == {"kv:int4": 0, "kv:int2/g16": 0}
    assert "constant bytes" not in report.table()
    assert [r["constant_bytes"] for r in report.rows()] == [0, 0, 0]
    loaded = type(report).load(report.save(tmp_path / "r.json"))
    assert loaded == report
    # the tiny GQA Llama has C = 2·8 = 16 < 32: its value vector is one partial group (4 bytes a token)
    gqa = make_model("llama_gqa", torch.float32)
    assert fit_quantizer(gqa, "kv:int8").layer_bytes_per_token(0) == 16 + 4 * 16 / 32 + 16 + 4


def test_reports_without_constant_bytes_still_load_and_show_the_column_when_set(tmp_path) -> None:
    model = llama64()
    ids = torch.randint(1, 96, (1, 12), generator=torch.Generator().manual_seed(1))
    report = evaluate(model, ids, ["model", "kv:int8"], dtype=torch.float32, progress=False)
    data = report.to_json()
    del data["constant_bytes"]  # a report file written before the field existed
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    old = type(report).load(path)
    assert old.constant_bytes == {} and old.rows()[1]["constant_bytes"] == 0
    report.constant_bytes["kv:int8"] = 1234
    head, _, _, row = report.table().splitlines()[:4]
    assert "constant bytes" in head and "| kv:int8 | 288 | 1234 |" in row


# ---------------------------------------------------------------------------------------------- model
def peaky_llama() -> LlamaForCausalLM:
    """Larger initial weights than the default, so the next-token distributions are far from uniform."""
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        initializer_range=0.2,
    )
    return LlamaForCausalLM(config).float().eval()


def test_int16_is_within_a_thousandth_of_a_nat_of_the_model() -> None:
    for model in (make_model("llama_gqa", torch.float32), peaky_llama()):
        report = evaluate(
            model, ragged_batches(seed=5), ["model", "kv:int16"], dtype=torch.float32, progress=False
        )
        assert abs(report.nll["kv:int16"] - report.nll["model"]) < 1e-3
        assert abs(report.kl["kv:int16"]) < 1e-3


def test_fewer_bits_never_lower_the_kl() -> None:
    model = peaky_llama()
    specs = ["kv:int8", "kv:int4", "kv:int2", "kv:int1"]
    report = evaluate(model, ragged_batches(seed=5), specs, dtype=torch.float32, progress=False)
    kl = [report.kl[s] for s in specs]
    assert kl == sorted(kl) and kl[0] < kl[-1], kl


def hand_nll(model: torch.nn.Module, batches: list[dict]) -> float:
    rows, targets = [], []
    with torch.no_grad():
        for b in batches:
            pos = (b["attention_mask"].cumsum(-1) - 1).clamp(min=0)
            out = model(
                input_ids=b["input_ids"],
                attention_mask=b["attention_mask"],
                position_ids=pos,
                use_cache=False,
            ).logits
            m = b["attention_mask"].bool()
            keep = m[:, :-1] & m[:, 1:]
            rows.append(out[:, :-1][keep])
            targets.append(b["input_ids"][:, 1:][keep])
    return float(cross_entropy(torch.cat(rows).double(), torch.cat(targets)))


def test_layers_and_the_per_layer_sweep_equal_forwards_by_hand() -> None:
    model, batches = peaky_llama(), ragged_batches(seed=5)
    base = hand_nll(model, batches)
    report = evaluate(model, batches, ["model", "kv:int2"], layers=[1], dtype=torch.float32, progress=False)
    q = fit_quantizer(model, "kv:int2", layers=[1])
    with q.active(model):
        assert report.nll["kv:int2"] == pytest.approx(hand_nll(model, batches), abs=1e-6)
    swept = evaluate(model, batches, ["kv:int2", "mqa"], per_layer=True, dtype=torch.float32, progress=False)
    full = fit_quantizer(model, "kv:int2")
    for layer in (0, 1):
        with full.active(model, [layer]):
            want = hand_nll(model, batches) - base
        assert swept.per_layer is not None
        assert swept.per_layer["kv:int2"][layer] == pytest.approx(want, abs=1e-6)
        assert want != 0.0


def left_padded(batches: list[dict]) -> list[dict]:
    out = []
    for b in batches:
        ids, mask = torch.zeros_like(b["input_ids"]), torch.zeros_like(b["attention_mask"])
        for i in range(ids.shape[0]):
            n = int(b["attention_mask"][i].sum())
            ids[i, ids.shape[1] - n :] = b["input_ids"][i, :n]
            mask[i, ids.shape[1] - n :] = 1
        out.append({"input_ids": ids, "attention_mask": mask})
    return out


def test_padding_never_enters_a_quantized_group() -> None:
    """Right and left padding give the same numbers; so does every sequence run alone, unpadded.

    In float64: in float32 the padded and unpadded forwards round differently (by kernel: AVX-512,
    AVX2 and plain kernels differ), enough to move a key across a 2-bit bin edge now and then.
    """
    model, batches = peaky_llama(), ragged_batches(seed=5)
    specs = ["kv:int2", "kv:int3/g4"]
    f64 = torch.float64
    right = evaluate(model, batches, specs, dtype=f64, progress=False)
    left = evaluate(model, left_padded(batches), specs, dtype=f64, progress=False)
    alone = [
        {"input_ids": b["input_ids"][i : i + 1, : int(b["attention_mask"][i].sum())]}
        for b in batches
        for i in range(b["input_ids"].shape[0])
    ]
    single = evaluate(model, alone, specs, dtype=f64, progress=False, batch_size=1)
    for spec in specs:
        assert left.nll[spec] == pytest.approx(right.nll[spec], abs=1e-12)
        assert single.nll[spec] == pytest.approx(right.nll[spec], abs=1e-12)


def state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def test_weights_and_the_attention_registry_are_left_as_they_were(monkeypatch) -> None:
    model = peaky_llama()
    before, mapping = state(model), dict(AttentionInterface._global_mapping)
    evaluate(
        model,
        ragged_batches(seed=5),
        ["model", "kv:int4"],
        per_layer=True,
        dtype=torch.float32,
        progress=False,
    )
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert AttentionInterface._global_mapping == mapping and not attention_calls._INSTALLED

    calls = []

    def boom(self, layer, key, value, real=None):
        calls.append(layer)
        if layer == 1:
            raise RuntimeError("boom in the middle of the forward")
        return key, value

    monkeypatch.setattr(KVQuantizer, "quantize", boom)
    with pytest.raises(RuntimeError, match="boom"):
        evaluate(model, ragged_batches(seed=5), ["kv:int4"], dtype=torch.float32, progress=False)
    assert calls == [0, 1]
    assert AttentionInterface._global_mapping == mapping and not attention_calls._INSTALLED
    with pytest.raises(RuntimeError, match="boom"), fit_quantizer(model, "kv:int4").active(model):
        model(torch.tensor([[1, 2, 3]]))
    assert AttentionInterface._global_mapping == mapping and not attention_calls._INSTALLED
    assert not model._forward_hooks and not model._forward_pre_hooks
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


# ---------------------------------------------------------------------------------------------- errors
@pytest.mark.parametrize(
    ("spec", "allowed"),
    [
        ("kv:int0", "1 ≤ b ≤ 16"),
        ("kv:int17", "1 ≤ b ≤ 16"),
        ("kv:int4/g0", "1 ≤ n ≤ 1048576"),
        ("kv:int4/g99999999999999999999", "1 ≤ n ≤ 1048576"),
        ("kv:int", "kv:int{b}"),
        ("kv:int4/32", "kv:int{b}/g{n}"),
        ("kv:cq0c8b", "1 ≤ c ≤ 1048576"),
        ("kv:cq4c0b", "1 ≤ b ≤ 12"),
        ("kv:cq4c13b", "1 ≤ b ≤ 12"),
        ("kv:cq4c", "kv:cq{c}c{b}b"),
        ("kv:fp8", "kv:int{b}"),
        ("kv:int4+align", "combines with nothing"),
        ("mqa+kv:int4", "kv:int{b}"),
    ],
)
def test_ill_formed_specs_name_what_is_allowed(spec: str, allowed: str) -> None:
    with pytest.raises(MechanismSpecError, match=allowed.replace("{", r"\{").replace("}", r"\}")):
        headwidget.evaluation.evaluate(
            make_model("llama_gqa", torch.float32), torch.tensor([[1, 2, 3]]), [spec], progress=False
        )


def test_spec_canonical_forms() -> None:
    from headwidget.analysis.variants import parse_variant

    assert parse_variant("kv:int4/g32").text == "kv:int4"
    assert parse_variant(" KV:INT2/G64 ").text == "kv:int2/g64"
    assert parse_variant("kv:cq8c8b").bits_per_channel == 1.0
    assert parse_variant("mqa").quantizer is False and parse_variant("kv:int4").base is None


def test_model_dependent_refusals() -> None:
    gqa = make_model("llama_gqa", torch.float32)  # C = 16
    with pytest.raises(MechanismSpecError, match="allowed c: 1, 2, 4, 8, 16"):
        fit_quantizer(gqa, "kv:cq3c8b")
    with pytest.raises(MissingStatisticsError, match="rope='post' and samples=R"):
        evaluate(gqa, torch.tensor([[1, 2, 3]]), ["kv:cq4c8b"], progress=False)
    pre = headwidget.capture(gqa, torch.tensor([[1, 2, 3, 4]]), progress=False)
    with pytest.raises(MissingStatisticsError, match="rope='post' and samples=R"):
        evaluate(gqa, torch.tensor([[1, 2, 3]]), ["kv:cq4c8b"], stats=pre, progress=False)
    with pytest.raises(UnsupportedConversionError, match="latent"):
        fit_quantizer(make_model("deepseek_v2", torch.float32), "kv:int4")
    with pytest.raises(UnsupportedConversionError, match="latent"):
        apply(make_model("deepseek_v2", torch.float32), "kv:int4@1")
    for err in (MechanismSpecError, MissingStatisticsError, UnsupportedConversionError):
        assert issubclass(err, HeadwidgetError)


def test_an_attention_that_computes_its_own_attention_is_refused(monkeypatch) -> None:
    # what FalconAttention was before its transformers release called AttentionInterface: a forward
    # that never looks up ALL_ATTENTION_FUNCTIONS, so no quantizer could reach the K/V it uses
    from transformers.models.falcon.modeling_falcon import FalconAttention

    computes_itself = FalconAttention.forward

    def forward(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return computes_itself(self, *args, **kwargs)

    monkeypatch.setattr(FalconAttention, "forward", forward)
    model = make_model("falcon_new", torch.float32)
    assert not headwidget.adapters.adapter_for(model).routes_through_interface
    before = state(model)
    with pytest.raises(UnsupportedConversionError, match="AttentionInterface"):
        evaluate(model, torch.tensor([[1, 2, 3]]), ["kv:int4"], progress=False)
    with pytest.raises(UnsupportedConversionError, match="AttentionInterface"):
        apply(model, "kv:int4")
    with pytest.raises(headwidget.RopeCaptureError, match="AttentionInterface"):
        headwidget.capture(model, torch.tensor([[1, 2, 3]]), rope="both", progress=False)
    assert all(torch.equal(before[n], t) for n, t in state(model).items())


@pytest.mark.parametrize("name", ["falcon_new", "falcon_mqa", "falcon_mha"])
def test_falcon_attention_gets_the_kivi_of_its_post_rope_keys_and_values(monkeypatch, name: str) -> None:
    # Falcon's three fused layouts: what the attention function receives in the quantized layer is
    # quantize_int_keys / quantize_int_values (tested against numpy loops above) of K and V computed by
    # hand from the layer's input (the projection rows, RoPE in float64), over the real tokens only
    from tiny_models import reference_kv

    model = make_model(name, torch.float64)
    batch = ragged_batches(seed=2)[0]
    impl = model.config._attn_implementation
    original = AttentionInterface._global_mapping[impl]
    seen: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def recording(module, query, key, value, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen[module.layer_idx] = (key.detach().clone(), value.detach().clone())
        return original(module, query, key, value, *args, **kwargs)

    monkeypatch.setitem(AttentionInterface._global_mapping, impl, recording)
    attention = headwidget.adapters.adapter_for(model).attention_modules()[1]
    inputs: list[torch.Tensor] = []
    handle = attention.register_forward_pre_hook(
        lambda m, args, kwargs: inputs.append(kwargs.get("hidden_states", args[0] if args else None)),
        with_kwargs=True,
    )
    try:
        with fit_quantizer(model, "kv:int2/g4", layers=[1]).active(model), torch.no_grad():
            model(**batch, use_cache=False)
    finally:
        handle.remove()
    key, value = seen[1]
    real = batch["attention_mask"].bool()
    b, t = real.shape
    hand = [reference_kv(name, model, attention, inputs[0][i, : int(real[i].sum())]) for i in range(b)]
    heads, d = hand[0]["key"].shape[1:]
    k_post = torch.zeros(b, heads, t, d, dtype=torch.float64)
    v = torch.zeros_like(k_post)
    for i, ref in enumerate(hand):
        n = ref["key_post"].shape[0]
        k_post[i, :, :n], v[i, :, :n] = ref["key_post"].transpose(0, 1), ref["value"].transpose(0, 1)
    want_k, want_v = quantize_int_keys(k_post, 2, 4, real), quantize_int_values(v, 2, 4)
    tokens = real[:, None, :].expand(b, heads, t)  # padding slots are left as the model gave them
    # transformers builds its RoPE cos/sin tables in float32 even in a float64 model, so the keys carry
    # float32 rounding the float64 reference does not (as in the capture tests); values are float64
    np.testing.assert_allclose(key[tokens].numpy(), want_k[tokens].numpy(), atol=1e-6)
    np.testing.assert_allclose(value[tokens].numpy(), want_v[tokens].numpy(), atol=1e-9)


@pytest.mark.parametrize(
    "name", ["gpt2", "gpt_neox", "falcon_new", "falcon_mqa", "falcon_mha", "bigcode_mqa", "bert"]
)
def test_other_families_run_with_quantized_kv(name: str) -> None:
    model = make_model(name, torch.float32)
    report = evaluate(
        model, ragged_batches(seed=2), ["model", "kv:int16", "kv:int2"], dtype=torch.float32, progress=False
    )
    if report.kind == "causal-lm":
        assert abs(report.nll["kv:int16"] - report.nll["model"]) < 1e-3
        assert report.kl["kv:int2"] > report.kl["kv:int16"]
    else:
        assert report.hidden_rel_error["kv:int16"] < 1e-3 < report.hidden_rel_error["kv:int2"]


# ---------------------------------------------------------------------------------------------- kv:cq
def test_cq_end_to_end_fits_on_the_calibration_samples() -> None:
    model = peaky_llama()  # C = 2·16 = 32
    gen = torch.Generator().manual_seed(11)
    calibration = torch.randint(1, 96, (8, 64), generator=gen)
    evaluation = torch.randint(1, 96, (4, 32), generator=gen)
    stats = headwidget.capture(model, calibration, rope="post", samples=400, progress=False)
    quantizer = fit_quantizer(model, "kv:cq4c8b", stats)
    for layer in (0, 1):
        for kind, source in (("key", "key_post"), ("value", "value")):
            rows = stats.samples(layer, source)
            assert tuple(rows.shape) == (400, 32)
            own = fit_codebooks(rows, 4, 8)
            assert torch.equal(quantizer.codebooks[layer][kind].centroids, own.centroids)
    specs = ["model", "kv:int16", "kv:cq4c8b", "kv:cq8c8b", "kv:cq1c8b"]
    report = evaluate(
        model, evaluation, specs, stats=stats, dtype=torch.float32, per_layer=True, progress=False
    )
    assert report.kv_bytes_per_token["kv:cq4c8b"] == 2 * 2 * (32 / 4) * 8 / 8
    assert report.kv_bytes_per_token["kv:cq8c8b"] == 2 * 2 * (32 / 8) * 8 / 8
    assert report.constant_bytes["kv:cq4c8b"] == 2 * 2 * (32 // 4) * 256 * 4 * 2
    assert report.kl["kv:cq8c8b"] > report.kl["kv:cq4c8b"] > 0  # 1 bit per channel vs 2
    assert "constant bytes" in report.table()
    assert report.per_layer is not None and all(np.isfinite(report.per_layer["kv:cq4c8b"]))


@pytest.mark.slow
def test_smollm2_int16_is_the_model_and_int2_is_not(smollm2) -> None:
    model, tok = smollm2
    before = {k: v.clone() for k, v in model.state_dict().items()}
    texts = english_sample(split="evaluation")
    report = evaluate(
        model,
        texts,
        ["model", "kv:int16", "kv:int2"],
        tokenizer=tok,
        dtype=torch.float32,
        batch_size=2,
        max_length=128,
        max_tokens=256,
        progress=False,
    )
    assert report.tokens >= 250
    assert abs(report.nll["kv:int16"] - report.nll["model"]) < 1e-3 and report.kl["kv:int16"] < 1e-3
    assert report.kl["kv:int2"] > 10 * report.kl["kv:int16"]
    c_kv = 3 * 64
    assert report.kv_bytes_per_token["kv:int2"] == 30 * 2 * (c_kv * 2 / 8 + 4 * c_kv / 32)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_packed_nearest_search_agrees_with_the_exact_argmin(dtype: torch.dtype) -> None:
    """The forward's integer-packed minimum: the exact argmin (float64 brute force) up to near ties of
    a relative 2**(b − 23), each row's own centroid when it is one; the exact path where packing does
    not apply."""
    from headwidget.analysis.quantizers import nearest_centroids

    gen = torch.Generator().manual_seed(3)
    centroids = torch.randn(5, 256, 4, generator=gen, dtype=dtype)
    x = torch.randn(5, 700, 4, generator=gen, dtype=dtype)
    x[:, :256] = centroids  # exact matches: distance 0 (or a rounding-negative one) must win
    got = nearest_centroids(x, centroids, packed=True)
    assert torch.equal(got[:, :256], torch.arange(256).expand(5, 256))
    dist = ((x.double()[:, :, None, :] - centroids.double()[:, None]) ** 2).sum(-1)
    best = dist.min(-1).values
    picked = dist.gather(-1, got[..., None]).squeeze(-1)
    assert bool((picked <= best * (1 + 2.0 ** (8 - 22)) + 1e-6).all())
    assert float((got == dist.argmin(-1)).double().mean()) > 0.999
    # K not a power of two, or more than 256 centroids: the exact path
    assert torch.equal(
        nearest_centroids(x, centroids[:, :200], packed=True), nearest_centroids(x, centroids[:, :200])
    )
