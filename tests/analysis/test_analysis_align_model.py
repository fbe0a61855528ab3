"""``align_model``: rotated copies compute the same outputs while grouped heads become more similar.

The Llama cases check the fitted rotations in detail; the family cases run every tiny model of the test
factory end to end (or check that its refusal names the adapter's reason).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import (
    LlamaConfig,
    LlamaForCausalLM,
    OlmoConfig,
    OlmoForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

import headwidget
from headwidget.analysis.align_model import align_model
from headwidget.analysis.alignment import align
from headwidget.analysis.grouping import group_heads
from headwidget.analysis.weights import head_weights
from headwidget.errors import GroupCountError, UnsupportedAlignmentError
from tiny_models import FACTORIES, VOCAB, make_model

F64 = torch.float64


def tiny_llama(kv_heads: int, bias: bool = False) -> LlamaForCausalLM:
    torch.manual_seed(0)
    cfg = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=kv_heads,
        attention_bias=bias,
    )
    return LlamaForCausalLM(cfg).eval()


def within_sum(sim: np.ndarray, groups: list[list[int]]) -> float:
    return sum(sim[i, j] for g in groups for a, i in enumerate(g) for j in g[a + 1 :])


@pytest.mark.parametrize(("kv_heads", "bias"), [(4, False), (4, True), (2, False)])
def test_logits_unchanged_and_groups_more_similar(kv_heads: int, bias: bool) -> None:
    model = tiny_llama(kv_heads, bias)
    ids = torch.randint(0, 64, (4, 48), generator=torch.Generator().manual_seed(1))
    stats = headwidget.capture(model, ids, progress=False)
    groups = {layer: group_heads(align(stats, layer, "key").after, kv_heads // 2) for layer in (0, 1)}
    original = {k: v.clone() for k, v in model.state_dict().items()}
    aligned = align_model(model, stats, groups)
    with torch.no_grad():
        torch.testing.assert_close(aligned(ids).logits, model(ids).logits, atol=1e-5, rtol=0)
    for k, v in model.state_dict().items():
        assert torch.equal(v, original[k]), f"{k} of the input model changed"
    after = headwidget.capture(aligned, ids, progress=False)
    gained = 0.0
    for layer in (0, 1):
        for kind in ("key", "value"):
            b = within_sum(stats.head_similarity(layer, kind), groups[layer])
            a = within_sum(after.head_similarity(layer, kind), groups[layer])
            assert a >= b - 1e-6
            gained += a - b
    assert gained > 0.1


def test_rotations_act_on_the_captured_keys() -> None:
    """Re-captured keys of the aligned model are the old keys times the fitted rotations."""
    model = tiny_llama(4)
    ids = torch.randint(0, 64, (2, 32), generator=torch.Generator().manual_seed(2))
    keys: list[torch.Tensor] = []
    stats = headwidget.capture(model, ids, progress=False)
    aligned = align_model(model, stats, {0: [[0, 1, 2, 3]]})
    for m in (model, aligned):
        hook = m.model.layers[0].self_attn.k_proj.register_forward_hook(
            lambda mod, a, out: keys.append(out.detach().double().reshape(-1, 4, 16))
        )
        with torch.no_grad():
            m(ids)
        hook.remove()
    old, new = keys
    for h in range(4):
        q = torch.linalg.lstsq(old[:, h], new[:, h]).solution
        torch.testing.assert_close(q @ q.T, torch.eye(16, dtype=torch.float64), atol=1e-4, rtol=0)
        torch.testing.assert_close(old[:, h] @ q, new[:, h], atol=1e-4, rtol=0)
        torch.testing.assert_close(q[:8, :8], q[8:, 8:], atol=1e-4, rtol=0)  # 2×2 plane rotations
        torch.testing.assert_close(q[:8, 8:], -q[8:, :8], atol=1e-4, rtol=0)
    torch.testing.assert_close(
        aligned.model.layers[1].self_attn.k_proj.weight, model.model.layers[1].self_attn.k_proj.weight
    )


def test_refuses_models_it_cannot_rotate_exactly() -> None:
    ids = torch.randint(0, 64, (2, 16))
    cfg = Qwen3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        head_dim=8,
    )
    qwen = Qwen3ForCausalLM(cfg).eval()
    with pytest.raises(UnsupportedAlignmentError, match="k_norm") as err:
        align_model(qwen, headwidget.capture(qwen, ids, progress=False), [[0, 1], [2, 3]])
    assert "align()" in str(err.value)
    olmo_cfg = OlmoConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=4,
        clip_qkv=2.0,
    )
    olmo = OlmoForCausalLM(olmo_cfg).eval()
    with pytest.raises(UnsupportedAlignmentError, match=r"clip_qkv=2\.0"):
        align_model(olmo, headwidget.capture(olmo, ids, progress=False), [[0, 1], [2, 3]])
    llama = tiny_llama(4)
    stats = headwidget.capture(llama, ids, progress=False)
    with pytest.raises(GroupCountError, match="disjoint"):
        align_model(llama, stats, [[0, 1], [1, 2]])
    packed = torch.nn.Parameter(
        torch.zeros_like(llama.model.layers[1].self_attn.k_proj.weight, dtype=torch.int8), requires_grad=False
    )
    llama.model.layers[1].self_attn.k_proj.weight = packed  # what a quantised checkpoint looks like
    with pytest.raises(UnsupportedAlignmentError, match=r"torch\.int8.*quantised"):
        align_model(llama, stats, [[0, 1]])


def key_rotation_from_weights(before: torch.Tensor, after: torch.Tensor) -> torch.Tensor:
    """The R with ``after = R^T before`` per head, by least squares on the (d_h, d) weight blocks."""
    rt = torch.linalg.lstsq(before.transpose(-2, -1), after.transpose(-2, -1)).solution.transpose(-2, -1)
    return rt.transpose(-2, -1)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_every_family_keeps_its_outputs_and_rotates_what_it_says(name: str) -> None:
    model = make_model(name)
    adapter = headwidget.adapters.adapter_for(model)
    ids = torch.randint(1, VOCAB, (3, 40), generator=torch.Generator().manual_seed(4))
    stats = headwidget.capture(model, ids, progress=False)
    lay = adapter.layout()
    groups = [list(range(lay.num_kv_heads))]
    reason = adapter.alignment_blocker()
    if reason is not None:
        with pytest.raises(UnsupportedAlignmentError) as err:
            align_model(model, stats, groups)
        assert str(err.value) == reason
        return
    aligned = align_model(model, stats, groups)
    with torch.no_grad():
        torch.testing.assert_close(aligned(ids)[0], model(ids)[0], atol=1e-10, rtol=0)
    if lay.num_kv_heads == 1:  # one KV head: nothing to align, and nothing may change
        for a, b in zip(aligned.parameters(), model.parameters(), strict=True):
            assert torch.equal(a, b)
        return
    after = headwidget.capture(aligned, ids, progress=False)
    shared = list(adapter.shared_key_dims())
    for layer in stats.layers:
        w0, w1 = head_weights(model, layer), head_weights(aligned, layer)
        for kind, d, w_before, w_after in (
            ("key", lay.head_dim, w0.k, w1.k),
            ("value", lay.value_head_dim, w0.v, w1.v),
        ):
            r = key_rotation_from_weights(w_before, w_after)
            eye = torch.eye(d, dtype=F64)
            torch.testing.assert_close(r.transpose(-2, -1) @ r, eye.expand_as(r), atol=1e-9, rtol=0)
            assert float((r - eye).abs().max()) > 1e-3, f"{name} layer {layer}: {kind}s were not rotated"
            if kind == "key":
                for p, q in lay.rope.planes():  # a 2×2 rotation on every rotary plane (commutes with RoPE)
                    if p not in shared:
                        torch.testing.assert_close(r[:, p, p], r[:, q, q], atol=1e-9, rtol=0)
                        torch.testing.assert_close(r[:, p, q], -r[:, q, p], atol=1e-9, rtol=0)
                torch.testing.assert_close(
                    r[:, shared][:, :, shared],
                    eye[shared][:, shared].expand(r.shape[0], -1, -1),
                    atol=1e-9,
                    rtol=0,
                )
            # The model's own K/V (captured, not read from weights) turned by the same rotations.
            g0 = stats.moments(layer, kind).gram().double().reshape(-1, d, lay.num_kv_heads, d)
            g1 = after.moments(layer, kind).gram().double().reshape(-1, d, lay.num_kv_heads, d)
            want = torch.einsum("iab,iajc,jcd->ibjd", r, g0, r)
            torch.testing.assert_close(g1, want, atol=1e-8 * float(g0.abs().max()), rtol=0)
            b = within_sum(stats.head_similarity(layer, kind), groups)
            a = within_sum(after.head_similarity(layer, kind), groups)
            assert a > b, f"{name} layer {layer}: {kind} heads did not become more similar"


def one_problem_fit(gram: torch.Tensor, split, groups, sweeps: int = 100) -> tuple[torch.Tensor, list[int]]:
    """The block-coordinate ascent of ``fit_group_rotations`` written out for one Gram, one head update
    at a time (the loop the batched fit replaced); also the sweeps each group took."""
    from headwidget.analysis.procrustes import fit_rotations
    from headwidget.moments.head_metrics import head_blocks

    d = split.head_dim
    blocks = head_blocks(gram.to(F64), d)
    rot = torch.eye(d, dtype=F64).repeat(blocks.shape[0], 1, 1)
    taken = []
    for members in groups:
        if len(members) < 2:
            continue
        idx = torch.tensor(members)
        sub = blocks[idx][:, idx]

        def score(sub=sub, idx=idx) -> float:
            r = rot[idx]
            off = sum(
                torch.trace(r[i].T @ sub[i, j] @ r[j])
                for i in range(len(idx))
                for j in range(len(idx))
                if i != j
            )
            return float(off)

        last, sweep = score(), 0
        for sweep in range(sweeps):  # noqa: B007 (the count is read after the loop)
            for a, head in enumerate(members):
                target = sum(sub[a, b] @ rot[idx[b]] for b in range(len(members)) if b != a)
                rot[head] = fit_rotations(target[None], split)[0]
            value = score()
            if value - last <= 1e-12 * max(1.0, abs(value)):
                break
            last = value
        taken.append(sweep + 1)
    return rot, taken


@pytest.mark.parametrize("rope", [False, True])
def test_rotations_fitted_together_are_each_problems_own_fit(rope: bool) -> None:
    """Five Grams (as five layers' would be) fitted in one batched loop give each Gram's own fit, though
    a group of three heads needs different numbers of sweeps in each; groups of three and of two heads,
    RoPE planes or none."""
    from headwidget.analysis.align_model import fit_group_rotations_many
    from headwidget.analysis.procrustes import HeadSplit

    d, heads = 8, 4
    split = HeadSplit.make(d, [(i, i + d // 2) for i in range(d // 2)] if rope else [])
    gen = torch.Generator().manual_seed(5)
    grams = []
    for n in range(5):
        base = torch.randn(64, d, generator=gen, dtype=F64)
        # heads that share a random rotation of one signal, under more noise from problem to problem
        x = torch.cat(
            [
                base @ torch.linalg.qr(torch.randn(d, d, generator=gen, dtype=F64))[0]
                + 0.5 * n * torch.randn(64, d, generator=gen, dtype=F64)
                for _ in range(heads)
            ],
            1,
        )
        x = x / x.reshape(64, heads, d).norm(dim=-1).repeat_interleave(d, 1)  # per-head normalised
        grams.append(x.T @ x)
    for groups in ([[0, 1, 2], [3]], [[0, 2], [1, 3]]):
        together = fit_group_rotations_many(grams, split, groups)
        sweeps = set()
        for gram, got in zip(grams, together, strict=True):
            want, taken = one_problem_fit(gram, split, groups)
            sweeps.add(tuple(taken))
            np.testing.assert_allclose(got.numpy(), want.numpy(), atol=1e-9)
            if groups[1] == [3]:  # a head in no group keeps the identity
                assert torch.equal(got[3], torch.eye(d, dtype=F64))
        if groups[1] == [3]:  # three heads: the problems stopped after different numbers of sweeps
            assert len(sweeps) > 1, sweeps
