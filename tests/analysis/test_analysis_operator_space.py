"""Operator-space head similarity and diversity against dense d×d forms and closed forms."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from headwidget.analysis.conversions import convert
from headwidget.analysis.diversity import head_diversity
from headwidget.analysis.operator_space import operator_similarity
from headwidget.analysis.weights import HeadWeights, head_weights
from headwidget.errors import DegenerateHeadsError

F64 = torch.float64


def dense_similarity(q: np.ndarray, k: np.ndarray, centre: bool = True) -> np.ndarray:
    """Materialise every d×d form M_h = q_hᵀ k_h (q, k: (H, m, d)) and correlate them."""
    forms = np.stack([qh.T @ kh for qh, kh in zip(q, k, strict=True)]).reshape(len(q), -1)
    if centre:
        forms = forms - forms.mean(0)
    gram = forms @ forms.T
    std = np.sqrt(np.diag(gram))
    return gram / np.outer(std, std)


def llama(kv: int) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=96,
        num_hidden_layers=1,
        num_attention_heads=8,
        num_key_value_heads=kv,
    )
    return LlamaForCausalLM(cfg).eval()


@pytest.mark.parametrize("kv", [8, 2])
@pytest.mark.parametrize("centre", [True, False])
def test_matches_dense_forms(kv: int, centre: bool) -> None:
    model = llama(kv)
    w = head_weights(model, 0)
    q, k = w.q.numpy(), w.k[w.kv_of].numpy()
    o, v = w.o.numpy(), w.v[w.kv_of].numpy()
    np.testing.assert_allclose(
        operator_similarity(model, 0, "qk", centre=centre), dense_similarity(q, k, centre), atol=1e-12
    )
    # OV form W_O^h W_V^h = (W_O^hᵀ)ᵀ W_V^h
    np.testing.assert_allclose(
        operator_similarity(model, 0, "ov", centre=centre),
        dense_similarity(o.transpose(0, 2, 1), v, centre),
        atol=1e-12,
    )


def test_conversions_and_fused_models() -> None:
    model = llama(8)
    c = convert(model, 0, "lrkv:2")
    want = dense_similarity(c.q_weight.numpy(), c.k_weight.numpy())
    np.testing.assert_allclose(operator_similarity(c, 0, "qk"), want, atol=1e-12)
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4))
    w = head_weights(gpt2, 0)
    np.testing.assert_allclose(
        operator_similarity(gpt2, 0, "qk"), dense_similarity(w.q.numpy(), w.k.numpy()), atol=1e-12
    )
    mqa = operator_similarity(convert(model, 0, "mqa"), 0, "ov")
    assert mqa.shape == (8, 8)


def test_invariant_to_remixing_inside_a_head() -> None:
    w = head_weights(llama(8), 0)
    gen = torch.Generator().manual_seed(3)
    a = torch.randn(8, 8, 8, generator=gen, dtype=F64) + 3 * torch.eye(8, dtype=F64)  # invertible mixes
    orth = torch.linalg.qr(torch.randn(8, 8, 8, generator=gen, dtype=F64))[0]
    mixed = dataclasses.replace(
        w,
        q=torch.linalg.inv(a).transpose(-2, -1) @ w.q,
        k=a @ w.k,
        v=orth @ w.v,
        o=w.o @ orth.transpose(-2, -1),
    )
    assert not torch.allclose(mixed.k, w.k)
    for circuit in ("qk", "ov"):
        np.testing.assert_allclose(
            operator_similarity(mixed, 0, circuit), operator_similarity(w, 0, circuit), atol=1e-10
        )


def random_heads(heads: int, d: int, m: int, seed: int) -> HeadWeights:
    gen = torch.Generator().manual_seed(seed)
    r = lambda *s: torch.randn(*s, generator=gen, dtype=F64)  # noqa: E731
    return HeadWeights(q=r(heads, m, d), k=r(heads, m, d), v=r(heads, m, d), o=r(heads, d, m))


def test_unrelated_heads_give_minus_one_over_h_minus_one() -> None:
    for heads in (6, 16):
        s = operator_similarity(random_heads(heads, 256, 8, seed=heads), 0, "qk")
        off = s[~np.eye(heads, dtype=bool)]
        assert off.mean() == pytest.approx(-1 / (heads - 1), abs=0.004)
        assert np.abs(off + 1 / (heads - 1)).max() < 0.15
        div = head_diversity(s)
        assert div["effective_rank"] == pytest.approx(heads - 1, rel=0.02)


def test_identical_heads_raise_instead_of_nan() -> None:
    w = random_heads(4, 32, 4, seed=1)
    same = dataclasses.replace(w, q=w.q[:1].expand(4, -1, -1), k=w.k[:1].expand(4, -1, -1))
    with pytest.raises(DegenerateHeadsError, match="centre=False"):
        operator_similarity(same, 0, "qk")
    np.testing.assert_allclose(operator_similarity(same, 0, "qk", centre=False), np.ones((4, 4)), atol=1e-12)
    with pytest.raises(ValueError, match="circuit"):
        operator_similarity(w, 0, "qv")


def brute_diversity(m: np.ndarray) -> tuple[float, float, int]:
    lam = sorted(max(x, 0.0) for x in np.linalg.eigvalsh(m))[::-1]
    total = sum(lam)
    p = [x / total for x in lam]
    ent = -sum(x * np.log(x) for x in p if x > 0)
    acc, k = 0.0, 0
    while acc < 0.9 - 1e-12:
        acc += p[k]
        k += 1
    return float(np.exp(ent)), total**2 / sum(x * x for x in lam), k


def test_diversity_against_brute_force() -> None:
    rng = np.random.default_rng(0)
    for rank in (1, 3, 7):
        f = rng.normal(size=(7, rank)) * np.arange(1, rank + 1)
        gram = f @ f.T
        for centre in (False, True):
            d = head_diversity(gram, centre=centre)
            j = np.eye(7) - 1 / 7
            er, pr, k90 = brute_diversity(j @ gram @ j if centre else gram)
            assert d["effective_rank"] == pytest.approx(er, rel=1e-9)
            assert d["participation_ratio"] == pytest.approx(pr, rel=1e-9)
            assert d["k90"] == k90
            assert d["explained"].sum() == pytest.approx(1.0)
            assert (np.diff(d["explained"]) <= 1e-15).all()
    eq = head_diversity(np.eye(5) - 1 / 5)  # centred unrelated heads: 4 equal components
    assert (round(eq["effective_rank"], 9), round(eq["participation_ratio"], 9), eq["k90"]) == (4.0, 4.0, 4)
    with pytest.raises(DegenerateHeadsError):
        head_diversity(np.ones((4, 4)), centre=True)
