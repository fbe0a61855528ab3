"""Head alignment (``headwidget.analysis.alignment``) against float64 brute force on materialised vectors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

import headwidget
from headwidget.analysis.alignment import align
from headwidget.core.layout import AttentionLayout, RopeLayout
from headwidget.errors import (
    CrossLayerMissingError,
    HeldOutSplitError,
    RopeAlignmentError,
    UnknownMetricError,
)
from headwidget.moments import Moments
from headwidget.stats import KVStats, StatsMeta

F64 = torch.float64


def synthetic_stats(x: torch.Tensor, head_dim: int, rope: RopeLayout, split_a: int) -> KVStats:
    """One-layer KVStats whose keys and values are the rows of ``x`` (N, C); rows [:split_a] are split 0."""
    n, c = x.shape
    layout = AttentionLayout(
        family="llama",
        mechanism="mha",
        num_layers=1,
        num_heads=c // head_dim,
        num_kv_heads=c // head_dim,
        head_dim=head_dim,
        value_head_dim=head_dim,
        hidden_size=c,
        rope=rope,
    )
    moments = {}
    for kind in ("key", "value"):
        m = Moments.empty(c, head_dim=head_dim)
        m.update(x, split_a=split_a)
        moments[(0, kind)] = m
    meta = StatsMeta("synthetic", "Synthetic", layout, [0], ["key", "value"], tokens=n)
    return KVStats(meta, moments)


def unit_heads(x: np.ndarray, head_dim: int) -> np.ndarray:
    """(N, C) → (P, N, d_h) per-head unit vectors."""
    n, c = x.shape
    heads = x.reshape(n, c // head_dim, head_dim).transpose(1, 0, 2)
    return heads / np.linalg.norm(heads, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def llama_run() -> dict:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(cfg).eval().double()
    ids = torch.randint(0, 64, (2, 48))
    acts: dict[str, list[torch.Tensor]] = {"key": [], "value": []}
    hooks = []
    for layer in model.model.layers:
        for kind, mod in (("key", layer.self_attn.k_proj), ("value", layer.self_attn.v_proj)):
            hooks.append(mod.register_forward_hook(lambda m, a, out, k=kind: acts[k].append(out.detach())))
    with torch.no_grad():
        model(ids)
    for h in hooks:
        h.remove()
    stats = headwidget.capture(model, ids, progress=False, cross_layer=True)
    flat = {k: torch.cat([a.reshape(-1, a.shape[-1]) for a in v], dim=1).numpy() for k, v in acts.items()}
    return {"stats": stats, "acts": flat, "model": model, "ids": ids}


@pytest.mark.parametrize("kind", ["key", "value"])
def test_orthogonal_after_equals_explicit_per_pair_svd(llama_run: dict, kind: str) -> None:
    x = unit_heads(llama_run["acts"][kind], 16)
    n = x.shape[1]
    res = align(llama_run["stats"], [0, 1], kind, method="orthogonal", heldout=False)
    p = x.shape[0]
    before = np.array([[np.mean(np.sum(x[i] * x[j], -1)) for j in range(p)] for i in range(p)])
    after = np.array(
        [[np.linalg.svd(x[i].T @ x[j], compute_uv=False).sum() / n for j in range(p)] for i in range(p)]
    )
    np.testing.assert_allclose(res.before, before, atol=1e-10)
    np.testing.assert_allclose(res.after, after, atol=1e-10)
    assert res.labels == ["L0·H0", "L0·H1", "L1·H0", "L1·H1"]
    assert res.token_count == n == 96
    assert res.after_heldout is None
    assert res.scoring == "in-sample"


def plane_grid_max(a: np.ndarray, b: np.ndarray, c: np.ndarray, e: np.ndarray) -> float:
    """max over a dense grid of θ of Σ_t (a,b)R(θ)·(c,e)."""
    theta = np.linspace(-np.pi, np.pi, 40001)
    cos, sin = np.cos(theta), np.sin(theta)
    return float(np.max(cos * np.sum(a * c + b * e) + sin * np.sum(a * e - b * c)))


def test_rope_after_equals_dense_angle_search(llama_run: dict) -> None:
    x = unit_heads(llama_run["acts"]["key"], 16)
    p, n = x.shape[:2]
    res = align(llama_run["stats"], [0, 1], "key")
    assert res.method == "rope"
    for i in range(p):
        for j in range(p):
            want = (
                sum(plane_grid_max(x[i][:, m], x[i][:, m + 8], x[j][:, m], x[j][:, m + 8]) for m in range(8))
                / n
            )
            assert res.after[i, j] == pytest.approx(want, abs=1e-7)
            q = res.rotation(i, j).numpy()
            assert np.mean(np.sum((x[i] @ q) * x[j], -1)) == pytest.approx(res.after[i, j], abs=1e-12)


def test_rope_rotations_are_proper_and_commute_with_rope(llama_run: dict) -> None:
    res = align(llama_run["stats"], [0, 1], "key")
    rot = res.rotations
    eye = torch.eye(16, dtype=F64)
    theta = 10000.0 ** (-torch.arange(8, dtype=F64) / 8) * 37  # position 37
    rope = torch.zeros(16, 16, dtype=F64)
    m = torch.arange(8)
    rope[m, m], rope[m + 8, m + 8], rope[m, m + 8], rope[m + 8, m] = (
        torch.cos(theta),
        torch.cos(theta),
        torch.sin(theta),
        -torch.sin(theta),
    )
    for i in range(4):
        assert torch.equal(rot[i, i], eye)
        for j in range(4):
            q = rot[i, j]
            torch.testing.assert_close(q @ q.T, eye, atol=1e-12, rtol=0)
            torch.testing.assert_close(q @ rope, rope @ q, atol=1e-12, rtol=0)
            torch.testing.assert_close(rot[j, i], q.T, atol=1e-12, rtol=0)
            assert torch.linalg.det(q[[0, 8]][:, [0, 8]]) == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["key", "value"])
def test_after_at_least_before_identity_diagonal(llama_run: dict, kind: str) -> None:
    res = align(llama_run["stats"], [0, 1], kind)
    assert (res.after >= res.before - 1e-12).all()
    np.testing.assert_allclose(np.diag(res.after), np.diag(res.before), atol=1e-12)
    np.testing.assert_allclose(res.after, res.after.T, atol=1e-12)
    assert res.scoring == "held-out"  # 96 tokens < 10·16²
    assert res.after_heldout is not None
    assert res.shown is res.after_heldout


def test_heldout_equals_fit_on_split0_score_on_split1() -> None:
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(300, 48, generator=gen, dtype=F64)
    x[:, 16:32] += 0.8 * x[:, :16] @ torch.linalg.qr(torch.randn(16, 16, generator=gen, dtype=F64))[0]
    rope = RopeLayout("half", rotary_dim=8, offset=4)  # planes (4, 8) .. (7, 11); dims 0-3, 12-15 free
    stats = synthetic_stats(x, 16, rope, split_a=130)
    u = unit_heads(x.numpy(), 16)
    a, b = u[:, :130], u[:, 130:]
    planes = rope.planes()
    rest = [k for k in range(16) if k not in {i for pl in planes for i in pl}]
    for method in ("orthogonal", "rope"):
        res = align(stats, 0, "key", method=method)
        for i in range(3):
            for j in range(3):
                if i == j:
                    q = np.eye(16)
                elif method == "orthogonal":
                    uu, _, vh = np.linalg.svd(a[i].T @ a[j])
                    q = uu @ vh
                else:
                    q = np.zeros((16, 16))
                    for pp, qq in planes:
                        blk = a[i][:, [pp, qq]].T @ a[j][:, [pp, qq]]
                        t = np.arctan2(blk[0, 1] - blk[1, 0], blk[0, 0] + blk[1, 1])
                        q[pp, pp] = q[qq, qq] = np.cos(t)
                        q[pp, qq], q[qq, pp] = np.sin(t), -np.sin(t)
                    uu, _, vh = np.linalg.svd(a[i][:, rest].T @ a[j][:, rest])
                    q[np.ix_(rest, rest)] = uu @ vh
                want = np.mean(np.sum((b[i] @ q) * b[j], -1))
                assert res.after_heldout[i, j] == pytest.approx(want, abs=1e-12)


@pytest.mark.parametrize("method", ["orthogonal", "rope"])
def test_rotated_copy_of_a_head_scores_one(method: str) -> None:
    gen = torch.Generator().manual_seed(2)
    h0 = torch.randn(200, 16, generator=gen, dtype=F64)
    rope = RopeLayout("interleaved", rotary_dim=10, offset=2)  # partial rotary with an offset
    if method == "orthogonal":
        q = torch.linalg.qr(torch.randn(16, 16, generator=gen, dtype=F64))[0]
    else:
        q = torch.zeros(16, 16, dtype=F64)
        free = [0, 1, 12, 13, 14, 15]
        q[np.ix_(free, free)] = torch.linalg.qr(torch.randn(6, 6, generator=gen, dtype=F64))[0]
        for p, r in rope.planes():
            t = torch.rand((), generator=gen, dtype=F64) * 6.28
            q[p, p] = q[r, r] = torch.cos(t)
            q[p, r], q[r, p] = torch.sin(t), -torch.sin(t)
    x = torch.cat([h0, h0 @ q, torch.randn(200, 16, generator=gen, dtype=F64)], dim=1)
    res = align(synthetic_stats(x, 16, rope, split_a=100), 0, "key", method=method)
    assert res.before[0, 1] < 0.5
    assert res.after[0, 1] == pytest.approx(1.0, abs=1e-12)
    assert res.after_heldout[0, 1] == pytest.approx(1.0, abs=1e-12)
    torch.testing.assert_close(res.rotation(0, 1), q, atol=1e-10, rtol=0)
    assert res.after[0, 2] < 0.5


@pytest.mark.parametrize(("tokens", "bias"), [(95, 0.49), (1000, 0.15)])
def test_random_heads_in_sample_bias_and_heldout_zero(tokens: int, bias: float) -> None:
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(tokens, 8 * 32, generator=gen, dtype=F64)
    res = align(synthetic_stats(x, 32, RopeLayout(), split_a=tokens // 2), 0, "value")
    off = ~np.eye(8, dtype=bool)
    assert res.after[off].mean() == pytest.approx(bias, abs=0.025)
    assert abs(res.after_heldout[off].mean()) < 0.02
    assert abs(res.before[off].mean()) < 0.02
    assert res.scoring == "held-out"  # fewer than 10·32² tokens


@pytest.mark.parametrize("metric", ["cosine", "pearson"])
def test_gram_metrics_after_are_nuclear_norms(metric: str) -> None:
    gen = torch.Generator().manual_seed(4)
    x = torch.randn(120, 24, generator=gen, dtype=F64) + 0.5
    res = align(synthetic_stats(x, 8, RopeLayout(), split_a=60), 0, "value", metric=metric)
    xc = x.numpy() - (x.numpy().mean(0) if metric == "pearson" else 0)
    h = [xc[:, 8 * i : 8 * i + 8] for i in range(3)]
    for i in range(3):
        for j in range(3):
            den = np.sqrt(np.sum(h[i] ** 2) * np.sum(h[j] ** 2))
            assert res.before[i, j] == pytest.approx(np.sum(h[i] * h[j]) / den, abs=1e-12)
            nuc = np.linalg.svd(h[i].T @ h[j], compute_uv=False).sum()
            assert res.after[i, j] == pytest.approx(nuc / den, abs=1e-12)
    assert res.after_heldout is None
    assert res.scoring == "in-sample"


def test_pairs_are_solved_in_batched_calls(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    real = torch.linalg.eigvalsh  # nuclear norms come from the eigenvalues of AᵀA, batched
    monkeypatch.setattr(torch.linalg, "eigvalsh", lambda a: calls.append(a.shape) or real(a))
    x = torch.randn(50, 12 * 4, dtype=F64)
    align(synthetic_stats(x, 4, RopeLayout(), split_a=25), 0, "value", heldout=False)
    assert sum(s[0] for s in calls) == 66  # 12·11/2 pairs
    assert len(calls) <= max(1, torch.get_num_threads())


def test_errors_say_what_to_do(llama_run: dict) -> None:
    model = llama_run["model"]
    stats = headwidget.capture(model, llama_run["ids"], progress=False)
    with pytest.raises(CrossLayerMissingError, match="cross_layer"):
        align(stats, [0, 1], "key")
    with pytest.raises(UnknownMetricError, match="CKA"):
        align(stats, 0, "key", metric="cka")
    with pytest.raises(RopeAlignmentError, match="orthogonal"):
        align(stats, 0, "value", method="rope")
    x = torch.randn(30, 8, dtype=F64)
    with pytest.raises(HeldOutSplitError, match="heldout=False"):
        align(synthetic_stats(x, 4, RopeLayout(), split_a=30), 0, "key", heldout=True)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4, n_positions=64))
    gstats = headwidget.capture(gpt2.eval(), torch.randint(0, 64, (2, 16)), progress=False)
    assert align(gstats, 0, "key").method == "orthogonal"
    with pytest.raises(RopeAlignmentError, match="method='orthogonal'"):
        align(gstats, 0, "key", method="rope")
