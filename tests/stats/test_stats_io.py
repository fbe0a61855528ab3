"""KVStats files, merging and data-parallel reduction."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
import torch.distributed as dist

import headwidget
from headwidget import KVStats
from ports import free_port, run_ranks
from tiny_models import make_model, ragged_batches


@pytest.fixture(scope="module")
def llama_stats():
    model = make_model("llama_gqa")
    return model, headwidget.capture(
        model, ragged_batches(), rope="both", inputs=True, cross_layer=True, progress=False
    )


def assert_stats_equal(a: KVStats, b: KVStats, rtol: float = 0.0) -> None:
    assert a.meta.to_json() == b.meta.to_json()
    assert sorted(a._moments) == sorted(b._moments) and sorted(a._cross) == sorted(b._cross)
    pairs = [(a._moments[k], b._moments[k]) for k in a._moments] + [
        (a._cross[k], b._cross[k]) for k in a._cross
    ]
    for ma, mb in pairs:
        assert ma.count == mb.count and ma.split_count == mb.split_count
        for ta, tb in ((ma.mean, mb.mean), (ma.m2, mb.m2), (ma.norm_gram, mb.norm_gram)):
            if ta is None:
                assert tb is None
            elif rtol == 0.0:
                assert torch.equal(ta, tb)
            else:
                np.testing.assert_allclose(ta.numpy(), tb.numpy(), rtol=rtol, atol=1e-12)
    assert sorted(a._plane_norms) == sorted(b._plane_norms)
    for layer, na in a._plane_norms.items():
        nb = b._plane_norms[layer]
        assert na.count == nb.count
        for ta, tb in ((na.query, nb.query), (na.key, nb.key)):
            if rtol == 0.0:
                assert torch.equal(ta, tb)
            else:
                np.testing.assert_allclose(ta.numpy(), tb.numpy(), rtol=rtol, atol=1e-12)


def test_the_statistics_hold_rotary_pair_norms(llama_stats):
    _, stats = llama_stats  # inputs=True on a RoPE model: every layer's norms, compared below
    assert sorted(stats._plane_norms) == stats.layers


def test_save_load_round_trip_is_exact(llama_stats, tmp_path):
    _, stats = llama_stats
    path = stats.save(tmp_path / "s.safetensors")
    assert_stats_equal(stats, KVStats.load(path))


def test_saved_file_is_plain_safetensors_with_json_metadata(llama_stats, tmp_path):
    from safetensors import safe_open

    _, stats = llama_stats
    path = stats.save(tmp_path / "s.safetensors")
    with safe_open(str(path), framework="pt") as fh:
        meta = json.loads(fh.metadata()["meta"])
        keys = set(fh.keys())
    assert meta["layout"]["num_kv_heads"] == 2 and meta["tokens"] == stats.tokens
    assert "layer0.key.m2" in keys and "cross.value.norm_gram" in keys
    assert not path.read_bytes().startswith(b"\x80")  # not a pickle


def test_merge_of_two_captures_equals_capture_of_all(llama_stats):
    model, whole = llama_stats
    first, second = ragged_batches()
    a = headwidget.capture(model, [first], rope="both", inputs=True, cross_layer=True, progress=False)
    b = headwidget.capture(model, [second], rope="both", inputs=True, cross_layer=True, progress=False)
    merged = a + b
    assert merged.tokens == whole.tokens
    for layer in (0, 1):
        for kind in whole.kinds:
            np.testing.assert_allclose(
                merged.covariance(layer, kind), whole.covariance(layer, kind), rtol=1e-10, atol=1e-13
            )
            np.testing.assert_allclose(
                merged.channel_corr(layer, kind), whole.channel_corr(layer, kind), atol=1e-12
            )
        for metric in ("token_cosine", "pearson", "cka"):
            np.testing.assert_allclose(
                merged.head_similarity([0, 1], "key", metric),
                whole.head_similarity([0, 1], "key", metric),
                atol=1e-12,
            )


def test_to_device_keeps_values(llama_stats):
    _, stats = llama_stats
    assert_stats_equal(stats, stats.to("cpu"))


def _reduce_worker(rank: int, world: int, port: int, paths: list[str], out: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        stats = KVStats.load(paths[rank]).all_reduce()
        if rank == 0:
            stats.save(out)
    finally:
        dist.destroy_process_group()


def test_all_reduce_over_two_processes_equals_merge(llama_stats, tmp_path):
    model, _ = llama_stats
    first, second = ragged_batches()
    parts = [
        headwidget.capture(model, [batch], rope="both", inputs=True, cross_layer=True, progress=False)
        for batch in (first, second)
    ]
    paths = [str(p.save(tmp_path / f"rank{i}.safetensors")) for i, p in enumerate(parts)]
    out = str(tmp_path / "reduced.safetensors")
    run_ranks(_reduce_worker, (2, free_port(), paths, out))
    reduced, merged = KVStats.load(out), parts[0] + parts[1]
    assert_stats_equal(reduced, merged, rtol=1e-10)
