"""``layer_similarity`` against float64 brute force on the raw K/V of every layer (tiny Llama models)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

import headwidget
from gram_routes import onednn_route
from headwidget.analysis.layer_similarity import cross_layer_bytes, layer_similarity
from headwidget.errors import ArgumentError, CrossLayerMissingError, UnknownKindError, UnknownMetricError
from tiny_models import ragged_batches, reference_activations, three_layer_llama


@pytest.fixture(scope="module", params=["blas", "onednn"])
def run(request: pytest.FixtureRequest) -> dict:
    """The capture of every layer, its Grams by batched BLAS products or (for every width here) by
    oneDNN's chunked products, the route of the joint Gram of many cross layers."""
    model = three_layer_llama(seed=3)
    batches = ragged_batches(seed=4, lengths=((40, 33, 37), (38, 29)))
    with onednn_route(request.param == "onednn"):
        stats = headwidget.capture(model, batches, rope="both", cross_layer=True, progress=False)
    acts = reference_activations("llama_gqa", model, batches)
    return {"stats": stats, "acts": acts, "layers": sorted(acts)}


def brute_cka(x: np.ndarray, y: np.ndarray) -> float:
    """xKV's notebook formula: centred linear CKA of two (N, C) token matrices."""
    x = x - x.mean(0)
    y = y - y.mean(0)
    return float(np.linalg.norm(x.T @ y) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)))


def brute_subspace(x: np.ndarray, y: np.ndarray, r: int) -> float:
    """The notebook's principal-angle overlap with exact SVDs: mean σ² of U_xᵀU_y over the top r."""
    ux = np.linalg.svd(x, full_matrices=False)[0][:, :r]
    uy = np.linalg.svd(y, full_matrices=False)[0][:, :r]
    sigma = np.linalg.svd(ux.T @ uy, compute_uv=False)
    return float((sigma**2).sum() / r)


@pytest.mark.parametrize("kind", ["key", "key_post", "value"])
def test_cka_equals_brute_force(run: dict, kind: str) -> None:
    acts = run["acts"]
    want = np.array([[brute_cka(acts[a][kind], acts[b][kind]) for b in run["layers"]] for a in run["layers"]])
    got = layer_similarity(run["stats"], kind, "cka")
    np.testing.assert_allclose(got, want, atol=1e-9)
    assert got.shape == (3, 3)


@pytest.mark.parametrize(("kind", "r"), [("key", 3), ("key_post", 8), ("value", 20)])
def test_subspace_equals_brute_force(run: dict, kind: str, r: int) -> None:
    acts = run["acts"]
    layers = run["layers"]
    want = np.array([[brute_subspace(acts[a][kind], acts[b][kind], r) for b in layers] for a in layers])
    got = layer_similarity(run["stats"], kind, "subspace", r=r)
    np.testing.assert_allclose(got, want, atol=1e-7)
    np.testing.assert_allclose(np.diagonal(got), 1.0, atol=1e-9)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_subspace_counts_directions_a_layer_lacks_as_no_overlap(dtype: torch.dtype) -> None:
    """Values of 2 heads × 16 channels fed by a hidden size of 16 span 16 of their 32 dimensions: at
    r = 20, 24 and 32 a layer scores 16/r against itself, and every entry is the brute force's with the
    zero singular values left out (the rounding of the captured Grams once gave those directions
    weight: 1.046 for a layer against itself at r = 24)."""
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=16,
    )
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).to(dtype).eval()
    ids = torch.randint(0, 96, (2, 100), generator=torch.Generator().manual_seed(1))
    values: dict[int, list[np.ndarray]] = {0: [], 1: []}
    hooks = [
        layer.self_attn.v_proj.register_forward_hook(
            lambda _m, _a, out, i=i: values[i].append(out.detach().double().reshape(-1, 32).numpy())
        )
        for i, layer in enumerate(model.model.layers)
    ]
    with torch.no_grad():
        model(input_ids=ids)
    for hook in hooks:
        hook.remove()
    stats = headwidget.capture(model, ids, cross_layer=True, progress=False)
    bases = []
    for i in (0, 1):
        u, sigma, _ = np.linalg.svd(np.concatenate(values[i]), full_matrices=False)
        rank = int((sigma > sigma[0] * 1e-5).sum())
        assert rank == 16
        bases.append(u[:, :rank])
    for r in (20, 24, 32):
        want = np.array([[np.sum((a[:, :r].T @ b[:, :r]) ** 2) / r for b in bases] for a in bases])
        got = layer_similarity(stats, "value", "subspace", r=r)
        np.testing.assert_allclose(got, want, atol=1e-6)
        np.testing.assert_allclose(np.diagonal(got), 16 / r, atol=1e-9)


def unit_heads(x: np.ndarray, head_dim: int) -> np.ndarray:
    n, c = x.shape
    heads = x.reshape(n, c // head_dim, head_dim).transpose(1, 0, 2)
    return heads / np.linalg.norm(heads, axis=-1, keepdims=True)


def test_aligned_values_equal_mean_procrustes_scores(run: dict) -> None:
    """Values: orthogonal Procrustes per pair of heads (nuclear norm of the cross Gram / N), averaged
    over each layer pair's head pairs."""
    acts, layers = run["acts"], run["layers"]
    heads = {layer: unit_heads(acts[layer]["value"], 16) for layer in layers}
    n = heads[0].shape[1]

    def mean_score(a: int, b: int) -> float:
        scores = [np.linalg.svd(i.T @ j, compute_uv=False).sum() / n for i in heads[a] for j in heads[b]]
        return float(np.mean(scores))

    want = np.array([[mean_score(a, b) for b in layers] for a in layers])
    got = layer_similarity(run["stats"], "value", "aligned", heldout=False)
    np.testing.assert_allclose(got, want, atol=1e-7)


def test_aligned_keys_equal_mean_rope_plane_scores(run: dict) -> None:
    """Keys of a RoPE model: per rotary plane the best proper rotation's closed form
    sqrt(α² + β²), summed over planes / N, averaged over head pairs."""
    acts, layers = run["acts"], run["layers"]
    heads = {layer: unit_heads(acts[layer]["key"], 16) for layer in layers}
    n = heads[0].shape[1]

    def score(i: np.ndarray, j: np.ndarray) -> float:
        total = 0.0
        for m in range(8):
            a, b, c, e = i[:, m], i[:, m + 8], j[:, m], j[:, m + 8]
            total += np.hypot(np.sum(a * c + b * e), np.sum(a * e - b * c))
        return total / n

    want = np.array(
        [[np.mean([score(i, j) for i in heads[a] for j in heads[b]]) for b in layers] for a in layers]
    )
    got = layer_similarity(run["stats"], "key", "aligned", heldout=False)
    np.testing.assert_allclose(got, want, atol=1e-7)


def test_a_layer_subset_is_the_submatrix_in_layer_order(run: dict) -> None:
    whole = layer_similarity(run["stats"], "value", "cka")
    part = layer_similarity(run["stats"], "value", "cka", layers=[2, 0])
    np.testing.assert_allclose(part, whole[np.ix_([0, 2], [0, 2])], atol=1e-14)
    # three layers given out of order: a matrix in the given order would permute the off-diagonal cells
    shuffled = layer_similarity(run["stats"], "value", "cka", layers=[2, 0, 1])
    np.testing.assert_allclose(shuffled, whole, atol=1e-14)
    assert not np.allclose(whole[np.ix_([2, 0, 1], [2, 0, 1])], whole)
    sub = layer_similarity(run["stats"], "key", "subspace", r=4, layers=[1, 2])
    whole_sub = layer_similarity(run["stats"], "key", "subspace", r=4)
    np.testing.assert_allclose(sub, whole_sub[1:, 1:], atol=1e-12)


def test_consecutive_cross_layers_are_views_equal_to_the_gathered_moments(run: dict) -> None:
    """head_moments of consecutive cross layers reads the stored moments in place (the aligned metric
    of every layer copied both joint matrices first); any other order gathers a copy. Both agree."""
    stats = run["stats"]
    joint, cross = stats.cross_moments("value")
    width = joint.channels // len(cross)
    for layers in ([0, 1, 2], [1, 2]):
        view = stats.head_moments(layers, "value")
        index = torch.cat([torch.arange(width) + cross.index(layer) * width for layer in layers])
        copy = joint.select(index)
        assert view.m2.untyped_storage().data_ptr() == joint.m2.untyped_storage().data_ptr()
        for name in ("mean", "m2", "norm_gram"):
            assert torch.equal(getattr(view, name), getattr(copy, name)), name
        assert (view.count, view.split_count, view.head_dim) == (copy.count, copy.split_count, copy.head_dim)
    gathered = stats.head_moments([2, 0], "value")
    assert gathered.m2.untyped_storage().data_ptr() != joint.m2.untyped_storage().data_ptr()
    with pytest.raises(ValueError, match=r"channels \[4, 2\) are not within"):
        joint.window(4, 2)


def test_bad_arguments_are_refused_with_what_to_change(run: dict) -> None:
    stats = run["stats"]
    with pytest.raises(UnknownMetricError, match="cka, aligned, subspace"):
        layer_similarity(stats, "key", "pearson")
    with pytest.raises(ArgumentError, match="give r"):
        layer_similarity(stats, "key", "subspace")
    with pytest.raises(ArgumentError, match="r is the rank"):
        layer_similarity(stats, "key", "cka", r=4)
    with pytest.raises(ArgumentError, match="r must be"):
        layer_similarity(stats, "key", "subspace", r=33)
    with pytest.raises(UnknownKindError):
        layer_similarity(stats, "input")
    model = three_layer_llama(seed=3)
    partial = headwidget.capture(model, ragged_batches(seed=4), cross_layer=[0, 1], progress=False)
    with pytest.raises(CrossLayerMissingError, match=r"cross_layer=\[0, 1, 2\]"):
        layer_similarity(partial, "key", layers=[0, 2])
    plain = headwidget.capture(model, ragged_batches(seed=4), progress=False)
    with pytest.raises(CrossLayerMissingError, match="cross_layer=True"):
        layer_similarity(plain, "key")


def test_cross_layer_bytes_is_capture_s_accumulator_size() -> None:
    """The joint statistics' bytes equal those of the moments a capture allocates (three (n·C)² float64
    matrices and the means), and the 8B figure in the docstring."""
    model = three_layer_llama(seed=3)
    stats = headwidget.capture(model, ragged_batches(seed=4), cross_layer=True, progress=False)
    moments, cross = stats.cross_moments("key")
    held = sum(t.numel() * t.element_size() for t in (moments.mean, moments.m2, moments.norm_gram))
    assert cross_layer_bytes(len(cross), 32, 16) == held
    assert cross_layer_bytes(32, 1024, 128, kinds=2) == 2 * 8 * (32 * 1024 + 3 * (32 * 1024) ** 2)
    assert isinstance(moments.m2, torch.Tensor)
