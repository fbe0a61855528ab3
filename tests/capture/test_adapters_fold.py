"""Every adapter folds per-KV-head rotations into its model's weights without changing what it computes.

For every tiny model of the test factory: random rotations that commute with RoPE (a 2×2 rotation per
declared rotary plane, a random orthogonal block on the other dims, the identity on dims shared by all
heads) for the keys and random orthogonal ones for the values are folded in; the float64 outputs must
stay equal, the per-head weights must become exactly the rotated originals, and a fold of scaled
(non-orthogonal) matrices must change the outputs, so the invariance check can fail.
"""

from __future__ import annotations

import copy
import math

import pytest
import torch

import headwidget
from headwidget.adapters._heads import FusedLayout, HeadProjections, HeadSlices, fold_into, head_index
from headwidget.core.layout import AttentionLayout
from headwidget.errors import StatsMismatchError, UnsupportedAlignmentError
from tiny_models import FACTORIES, VOCAB, make_model

F64 = torch.float64
#: Outputs are O(1); an exact fold moves them by float64 rounding only (measured ≤ 1e-15).
ATOL = 1e-10


def random_orthogonal(n: int, d: int, gen: torch.Generator) -> torch.Tensor:
    q, r = torch.linalg.qr(torch.randn(n, d, d, generator=gen, dtype=F64))
    return q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]


def rope_compatible(layout: AttentionLayout, shared: tuple[int, ...], gen: torch.Generator) -> torch.Tensor:
    """(G, d_h, d_h): a random angle per rotary plane, random orthogonal elsewhere, I on shared dims."""
    d, g = layout.head_dim, layout.num_kv_heads
    planes = [(p, q) for p, q in layout.rope.planes() if p not in shared and q not in shared]
    used = {i for plane in planes for i in plane} | set(shared)
    rot = torch.eye(d, dtype=F64).repeat(g, 1, 1)
    rest = torch.tensor([i for i in range(d) if i not in used], dtype=torch.long)
    if rest.numel():
        rot[:, rest[:, None], rest[None, :]] = random_orthogonal(g, int(rest.numel()), gen)
    for p, q in planes:
        angle = torch.rand(g, generator=gen, dtype=F64) * 2 * math.pi
        rot[:, p, p], rot[:, q, q] = angle.cos(), angle.cos()
        rot[:, p, q], rot[:, q, p] = angle.sin(), -angle.sin()
    return rot


def outputs(model: torch.nn.Module, ids: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(ids)[0]  # logits, or an encoder's last hidden state


@pytest.fixture(params=sorted(FACTORIES))
def case(request):
    model = make_model(request.param)
    adapter = headwidget.adapters.adapter_for(model)
    gen = torch.Generator().manual_seed(7)
    ids = torch.randint(1, VOCAB, (2, 20), generator=gen)
    return request.param, model, adapter, gen, ids


def test_folded_rotations_keep_the_outputs_and_rotate_the_weights(case):
    name, model, adapter, gen, ids = case
    layout, shared = adapter.layout(), adapter.shared_key_dims()
    if adapter.alignment_blocker() is not None:
        eye = torch.eye(layout.value_head_dim, dtype=F64).repeat(layout.num_kv_heads, 1, 1)
        with pytest.raises(UnsupportedAlignmentError):
            adapter.fold_rotations(0, rope_compatible(layout, shared, gen), eye)
        return
    folded = copy.deepcopy(model)
    target = headwidget.adapters.adapter_for(folded)
    rotations = {}
    for layer in range(layout.num_layers):
        rk = rope_compatible(layout, shared, gen)
        rv = random_orthogonal(layout.num_kv_heads, layout.value_head_dim, gen)
        target.fold_rotations(layer, rk, rv)
        rotations[layer] = rk, rv
    torch.testing.assert_close(outputs(folded, ids), outputs(model, ids), atol=ATOL, rtol=0)
    for layer, (rk, rv) in rotations.items():
        before, after = adapter.head_weights(layer), target.head_weights(layer)
        kv_of = before.kv_of
        expected = {
            "q": rk[kv_of].transpose(-2, -1) @ before.q,
            "k": rk.transpose(-2, -1) @ before.k,
            "v": rv.transpose(-2, -1) @ before.v,
            "o": before.o @ rv[kv_of],
        }
        for part, want in expected.items():
            got = getattr(after, part)
            torch.testing.assert_close(got, want, atol=1e-12, rtol=0, msg=f"{name} layer {layer} {part}")
            assert float((got - getattr(before, part)).abs().max()) > 1e-3, f"{name}: {part} did not change"
        for part, rot in (("k_bias", rk), ("v_bias", rv)):
            b0, b1 = getattr(before, part), getattr(after, part)
            if b0 is not None:
                torch.testing.assert_close(b1, (b0[:, None, :] @ rot)[:, 0], atol=1e-12, rtol=0)
        if before.o_bias is not None:
            torch.testing.assert_close(after.o_bias, before.o_bias, atol=0, rtol=0)


def test_folding_non_orthogonal_matrices_changes_the_outputs(case):
    """The control: the same fold with rotations scaled by 1.05 must move the outputs well past ATOL."""
    name, model, adapter, gen, ids = case
    if adapter.alignment_blocker() is not None:
        pytest.skip(f"{name} cannot fold rotations")
    layout, shared = adapter.layout(), adapter.shared_key_dims()
    folded = copy.deepcopy(model)
    scale = torch.ones(layout.head_dim, dtype=F64)
    scale[[i for i in range(layout.head_dim) if i not in shared]] = 1.05
    rk = rope_compatible(layout, shared, gen) * scale
    rv = random_orthogonal(layout.num_kv_heads, layout.value_head_dim, gen) * 1.05
    headwidget.adapters.adapter_for(folded).fold_rotations(0, rk, rv)
    assert float((outputs(folded, ids) - outputs(model, ids)).abs().max()) > 1e3 * ATOL


def test_a_rotation_that_does_not_commute_with_rope_changes_the_outputs():
    """Why key rotations must respect the rotary planes: a random orthogonal one breaks the function."""
    model = make_model("llama_gqa")
    adapter = headwidget.adapters.adapter_for(model)
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (2, 20), generator=gen)
    folded = copy.deepcopy(model)
    lay = adapter.layout()
    headwidget.adapters.adapter_for(folded).fold_rotations(
        0, random_orthogonal(lay.num_kv_heads, lay.head_dim, gen), torch.eye(lay.head_dim).repeat(2, 1, 1)
    )
    assert float((outputs(folded, ids) - outputs(model, ids)).abs().max()) > 1e3 * ATOL


def test_deepseek_refuses_rotations_of_its_shared_rotary_key():
    model = make_model("deepseek_v3")
    adapter = headwidget.adapters.adapter_for(model)
    lay = adapter.layout()
    assert adapter.shared_key_dims() == tuple(range(8, 12))  # qk_nope_head_dim=8, qk_rope_head_dim=4
    gen = torch.Generator().manual_seed(0)
    rk = random_orthogonal(lay.num_kv_heads, lay.head_dim, gen)
    with pytest.raises(UnsupportedAlignmentError, match="shared by all heads"):
        adapter.fold_rotations(0, rk, torch.eye(lay.value_head_dim).repeat(4, 1, 1))


def test_rotations_of_the_wrong_shape_are_refused():
    model = make_model("gpt2")
    adapter = headwidget.adapters.adapter_for(model)
    with pytest.raises(StatsMismatchError, match=r"\(4, 12, 12\)"):
        adapter.fold_rotations(0, torch.eye(12).repeat(2, 1, 1), torch.eye(12).repeat(4, 1, 1))


def test_fused_layouts_match_a_brute_force_enumeration():
    """Each layout's indices against a feature list written out by walking the fused vector in order."""
    heads, kv, d = 4, 2, 3
    walk: dict[str, list[list[int]]] = {"q": [], "k": [], "v": []}
    feature = 0
    for _ in range(kv):  # grouped: per KV group, its query heads, then its key, then its value
        for part in ["q"] * (heads // kv) + ["k", "v"]:
            walk[part].append(list(range(feature, feature + d)))
            feature += d
    layout = FusedLayout.grouped(heads, kv, d)
    assert {p: getattr(layout, p).tolist() for p in walk} == walk
    assert FusedLayout.grouped(heads, 1, d).k.tolist() == FusedLayout.blocks(heads, 1, d).k.tolist()
    per_head = FusedLayout.per_head(2, 2)
    assert (per_head.q.tolist(), per_head.v.tolist()) == ([[0, 1], [6, 7]], [[4, 5], [10, 11]])


def test_fold_into_a_conv1d_writes_through_to_the_parameter():
    """GPT-2's Conv1D stores (in, out): head rows are its columns; folding must update the module."""
    from transformers.pytorch_utils import Conv1D

    torch.manual_seed(0)
    qkv, out = Conv1D(3 * 4, 4).double(), Conv1D(4, 4).double()
    fused = FusedLayout.blocks(2, 2, 2)
    p = HeadProjections(
        HeadSlices(qkv, fused.q),
        HeadSlices(qkv, fused.k),
        HeadSlices(qkv, fused.v),
        HeadSlices(out, head_index(2, 2)),
    )
    x = torch.randn(5, 4, dtype=F64)
    before = qkv(x)
    r = random_orthogonal(2, 2, torch.Generator().manual_seed(1))
    fold_into(p, r, torch.eye(2, dtype=F64).repeat(2, 1, 1))
    after = qkv(x)
    k0, k1 = before[:, 4:8].reshape(5, 2, 2), after[:, 4:8].reshape(5, 2, 2)
    torch.testing.assert_close(k1, torch.einsum("thi,hij->thj", k0, r), atol=1e-12, rtol=0)
    torch.testing.assert_close(after[:, 8:], before[:, 8:], atol=1e-12, rtol=0)
