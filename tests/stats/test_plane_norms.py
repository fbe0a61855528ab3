"""Rotary-pair norms of queries and keys (partial RoPE's ranking), against float64 brute force.

The references recompute every query and key head from each layer's attention input and the raw
weights (the model's q/k norms applied by hand), one row at a time without padding, and sum each rotary
pair's 2-norm in a plain loop over the tokens.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

import headwidget
from headwidget import KVStats
from headwidget.analysis.variant_fits import rope_keep
from headwidget.errors import MissingStatisticsError
from headwidget.evaluation import apply
from headwidget.stats import PlaneNorms
from tiny_models import D, make_model, qk_norm_model, ragged_batches, record_attention_inputs

F64 = torch.float64
LENGTHS = ((13, 7, 10), (9, 12, 3))


def model_of(name: str) -> nn.Module:
    return qk_norm_model(name) if name in ("qwen3", "olmo2") else make_model(name)


def linear(x: torch.Tensor, module: nn.Module) -> torch.Tensor:
    y = x @ module.weight.detach().double().T
    return y if module.bias is None else y + module.bias.detach().double()


def rms_norm(x: torch.Tensor, norm: nn.Module) -> torch.Tensor:
    eps = norm.variance_epsilon
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * norm.weight.detach().double()


def reference_qk(
    name: str, model: nn.Module, layer: int, x: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Queries (T, H, d) and keys (T, G, d) as the model rotates them, from one row's attention input."""
    t = x.shape[0]
    c = model.config
    if name in ("llama_gqa", "llama_mqa", "qwen3", "olmo2"):
        attn = model.model.layers[layer].self_attn
        q, k = linear(x, attn.q_proj), linear(x, attn.k_proj)
        h, g = c.num_attention_heads, c.num_key_value_heads
        d = q.shape[-1] // h
        if name == "olmo2":  # one norm over all heads' dims
            q, k = rms_norm(q, attn.q_norm), rms_norm(k, attn.k_norm)
        q, k = q.reshape(t, h, d), k.reshape(t, g, d)
        if name == "qwen3":  # one norm per head
            q, k = rms_norm(q, attn.q_norm), rms_norm(k, attn.k_norm)
        return q, k
    if name == "gpt_neox":
        attn = model.gpt_neox.layers[layer].attention
        h = c.num_attention_heads
        hd = D // h
        w = attn.query_key_value.weight.detach().double().reshape(h, 3, hd, D)
        b = attn.query_key_value.bias.detach().double().reshape(h, 3, hd)
        q = torch.einsum("td,hed->the", x, w[:, 0]) + b[:, 0]
        k = torch.einsum("td,hed->the", x, w[:, 1]) + b[:, 1]
        return q, k
    if name == "falcon_new":  # per KV group [q … q | k | v]
        attn = model.transformer.h[layer].self_attention
        h, g = c.num_attention_heads, c.num_kv_heads
        hd = D // h
        w = attn.query_key_value.weight.detach().double().reshape(g, h // g + 2, hd, D)
        q = torch.einsum("td,ged->tge", x, w[:, : h // g].reshape(h, hd, D))
        k = torch.einsum("td,ged->tge", x, w[:, -2])
        return q, k
    raise KeyError(name)


#: The rotary planes of each model, by hand: (m, m + rotary/2) for m < rotary/2.
PLANES = {
    "llama_gqa": [(m, m + 4) for m in range(4)],
    "llama_mqa": [(m, m + 6) for m in range(6)],
    "qwen3": [(m, m + 4) for m in range(4)],
    "olmo2": [(m, m + 4) for m in range(4)],
    "gpt_neox": [(m, m + 3) for m in range(3)],  # rotary_pct 0.5 of 12 dims
    "falcon_new": [(m, m + 4) for m in range(4)],
}
FAMILIES = sorted(PLANES)


def rows_of(batches: list[dict]) -> list[torch.Tensor]:
    return [
        ids[mask.bool()]
        for b in batches
        for ids, mask in zip(b["input_ids"], b["attention_mask"], strict=True)
    ]


def left_padded(rows: list[torch.Tensor], per_batch: int) -> list[dict]:
    batches = []
    for start in range(0, len(rows), per_batch):
        chunk = rows[start : start + per_batch]
        width = max(len(r) for r in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for i, r in enumerate(chunk):
            ids[i, width - len(r) :], mask[i, width - len(r) :] = r, 1
        batches.append({"input_ids": ids, "attention_mask": mask})
    return batches


def brute_force_sums(
    name: str, model: nn.Module, rows: list[torch.Tensor], skip_first: bool
) -> dict[int, tuple[np.ndarray, np.ndarray, int]]:
    """Per layer: (Σ_t ‖q_{h,m}‖ (H, P), Σ_t ‖k_{g,m}‖ (G, P), tokens), token by token."""
    planes = PLANES[name]
    out: dict[int, tuple[np.ndarray, np.ndarray, int]] = {}
    inputs = record_attention_inputs(
        model, [{"input_ids": r[None], "attention_mask": torch.ones(1, len(r))} for r in rows]
    )
    for layer, per_row in enumerate(inputs):
        q_sum = k_sum = None
        tokens = 0
        for x in per_row:
            q, k = reference_qk(name, model, layer, x[0].double())
            if q_sum is None or k_sum is None:
                q_sum, k_sum = np.zeros((q.shape[1], len(planes))), np.zeros((k.shape[1], len(planes)))
            for t in range(1 if skip_first else 0, q.shape[0]):
                tokens += 1
                for m, (a, b) in enumerate(planes):
                    for h in range(q.shape[1]):
                        q_sum[h, m] += math.hypot(float(q[t, h, a]), float(q[t, h, b]))
                    for g in range(k.shape[1]):
                        k_sum[g, m] += math.hypot(float(k[t, g, a]), float(k[t, g, b]))
        assert q_sum is not None and k_sum is not None
        out[layer] = (q_sum, k_sum, tokens)
    return out


def brute_force_kept(q_sum: np.ndarray, k_sum: np.ndarray, tokens: int, r: int) -> list[list[int]]:
    """The r planes of each KV head with the largest ``mean‖k_m‖ · Σ_{h of the group} mean‖q_{h,m}‖``."""
    per = q_sum.shape[0] // k_sum.shape[0]
    kept = []
    for g in range(k_sum.shape[0]):
        scores = [
            (k_sum[g, m] / tokens) * sum(q_sum[h, m] / tokens for h in range(g * per, (g + 1) * per))
            for m in range(k_sum.shape[1])
        ]
        order = sorted(range(len(scores)), key=lambda m: (-scores[m], m))
        kept.append(sorted(order[:r]))
    return kept


@pytest.fixture(scope="module", params=FAMILIES)
def case(request: pytest.FixtureRequest) -> dict:
    name = request.param
    model = model_of(name)
    rows = rows_of(ragged_batches(seed=5, lengths=LENGTHS))
    stats = headwidget.capture(model, left_padded(rows, per_batch=4), inputs=True, progress=False)
    return {
        "name": name,
        "model": model,
        "rows": rows,
        "stats": stats,
        "reference": brute_force_sums(name, model, rows, skip_first=False),
    }


def rtol_of(name: str) -> float:
    """The tolerance of a float64 model's sums: HF's q/k RMSNorms normalise in float32, even in float64."""
    return 1e-6 if name in ("qwen3", "olmo2") else 1e-10


def test_sums_equal_a_token_loop(case: dict) -> None:
    stats, rtol = case["stats"], rtol_of(case["name"])
    assert headwidget.adapters.adapter_for(case["model"]).layout().rope.planes() == PLANES[case["name"]]
    for layer, (q_sum, k_sum, tokens) in case["reference"].items():
        norms = stats.plane_norms(layer)
        assert norms.count == tokens == stats.tokens
        np.testing.assert_allclose(norms.query.numpy(), q_sum, rtol=rtol, atol=1e-12)
        np.testing.assert_allclose(norms.key.numpy(), k_sum, rtol=rtol, atol=1e-12)
        np.testing.assert_allclose(norms.query_mean().numpy(), q_sum / tokens, rtol=rtol, atol=1e-14)


@pytest.mark.parametrize("name", ["llama_gqa", "qwen3"])
def test_skip_first_token_leaves_each_rows_first_token_out(name: str) -> None:
    model = model_of(name)
    rows = rows_of(ragged_batches(seed=5, lengths=LENGTHS))
    stats = headwidget.capture(
        model, left_padded(rows, per_batch=4), inputs=True, skip_first_token=True, progress=False
    )
    for layer, (q_sum, k_sum, tokens) in brute_force_sums(name, model, rows, skip_first=True).items():
        norms = stats.plane_norms(layer)
        assert norms.count == tokens == sum(len(r) - 1 for r in rows)
        np.testing.assert_allclose(norms.query.numpy(), q_sum, rtol=rtol_of(name), atol=1e-12)
        np.testing.assert_allclose(norms.key.numpy(), k_sum, rtol=rtol_of(name), atol=1e-12)


@pytest.mark.parametrize("r", [1, 2, 3])
def test_kept_planes_equal_a_brute_force_ranking(case: dict, r: int) -> None:
    model, stats = case["model"], case["stats"]
    adapter = headwidget.adapters.adapter_for(model)
    planes = adapter.layout().rope.planes()
    for layer, (q_sum, k_sum, tokens) in case["reference"].items():
        _, kept = rope_keep(adapter.head_weights(layer), stats, layer, r, planes)
        assert kept.tolist() == brute_force_kept(q_sum, k_sum, tokens, r)


def test_a_steady_pair_outranks_a_noisy_pair_of_larger_rms() -> None:
    """The criterion is the mean of the norms, not their root mean square.

    On layer 0 every query head's plane 1 is a copy of its plane 0, so the queries score both alike;
    each KV head's plane-0 key is the random projection and its plane-1 key a constant of norm between
    the plane-0 norms' mean and their RMS; planes 2 and 3 are scaled down. The mean keeps plane 1, the
    RMS (Cauchy-Schwarz's bound) would keep plane 0.
    """
    model = make_model("llama_gqa")
    attn = model.model.layers[0].self_attn
    batches = ragged_batches(seed=3)
    x = torch.cat(
        [
            x[i, : int(b["attention_mask"][i].sum())]
            for x, b in zip(record_attention_inputs(model, batches)[0], batches, strict=True)
            for i in range(x.shape[0])
        ]
    )
    with torch.no_grad():
        q_w, q_b = attn.q_proj.weight.view(6, 8, D), attn.q_proj.bias.view(6, 8)
        q_w[:, [1, 5]], q_b[:, [1, 5]] = q_w[:, [0, 4]], q_b[:, [0, 4]]
        k_w, k_b = attn.k_proj.weight.view(2, 8, D), attn.k_proj.bias.view(2, 8)
        k_b[:, [0, 4]] = 0.0
        k_w[:, [2, 3, 6, 7]] *= 0.01
        k_b[:, [2, 3, 6, 7]] *= 0.01
        k = linear(x, attn.k_proj).reshape(len(x), 2, 8)
        noisy = torch.hypot(k[..., 0], k[..., 4])  # (T, G)
        mean, rms = noisy.mean(0), noisy.pow(2).mean(0).sqrt()
        assert bool((rms > 1.05 * mean).all())
        k_w[:, [1, 5]] = 0.0
        k_b[:, 1], k_b[:, 5] = (mean + rms) / 2, 0.0
    stats = headwidget.capture(model, batches, inputs=True, progress=False)
    fit = apply(model, "rope:1", stats=stats).headwidget_variant.fits[0]
    assert fit.kept_planes.tolist() == [[1], [1]]


def test_merge_save_load_and_to_keep_the_sums(tmp_path: Path) -> None:
    model = make_model("llama_gqa")
    first, second = ragged_batches(seed=5, lengths=LENGTHS)
    whole = headwidget.capture(model, [first, second], inputs=True, progress=False)
    a = headwidget.capture(model, [first], inputs=True, progress=False)
    b = headwidget.capture(model, [second], inputs=True, progress=False)
    merged = a + b
    loaded = KVStats.load(merged.save(tmp_path / "merged.safetensors"))
    for layer in whole.layers:
        want = whole.plane_norms(layer)
        for got in (
            merged.plane_norms(layer),
            loaded.plane_norms(layer),
            merged.to("cpu").plane_norms(layer),
        ):
            assert got.count == want.count == a.tokens + b.tokens
            torch.testing.assert_close(got.query, want.query, rtol=1e-12, atol=0)
            torch.testing.assert_close(got.key, want.key, rtol=1e-12, atol=0)
        assert torch.equal(loaded.plane_norms(layer).query, merged.plane_norms(layer).query)
    assert apply(model, "rope:2", stats=loaded).headwidget_variant.fits[1].kept_planes.tolist() == (
        apply(model, "rope:2", stats=whole).headwidget_variant.fits[1].kept_planes.tolist()
    )


def test_statistics_without_them_refuse_partial_rope_and_say_how_to_recapture(tmp_path: Path) -> None:
    from safetensors import safe_open
    from safetensors.torch import save_file

    model = make_model("llama_gqa")
    stats = headwidget.capture(model, ragged_batches(), inputs=True, progress=False)
    path = stats.save(tmp_path / "new.safetensors")
    with safe_open(str(path), framework="pt") as fh:  # the file an older headwidget wrote
        header = fh.metadata()
        tensors = {n: fh.get_tensor(n) for n in fh.keys() if ".plane_norms." not in n}  # noqa: SIM118
    save_file(tensors, str(tmp_path / "old.safetensors"), metadata=header)
    old = KVStats.load(tmp_path / "old.safetensors")
    assert old.moments(0, "input").count == stats.tokens
    for no_norms in (old, old + stats, stats + old):
        with pytest.raises(MissingStatisticsError, match=r"rope:2 .*capture again with inputs=True"):
            apply(model, "rope:2", stats=no_norms)
        with pytest.raises(MissingStatisticsError, match=r"capture again with inputs=True"):
            apply(model, "mla:10+rope:2", stats=no_norms)
    without_inputs = headwidget.capture(model, ragged_batches(), progress=False)
    with pytest.raises(MissingStatisticsError, match=r"without inputs=True"):
        without_inputs.plane_norms(0)


@pytest.mark.parametrize("name", ["gpt2", "bert", "deepseek_v2"])
def test_models_without_rope_or_without_queries_keep_none(name: str) -> None:
    stats = headwidget.capture(make_model(name), ragged_batches(), inputs=True, progress=False)
    with pytest.raises(MissingStatisticsError, match="per-pair query/key norms"):
        stats.plane_norms(0)


def test_non_finite_queries_are_an_error() -> None:
    model = make_model("llama_gqa")
    with torch.no_grad():
        model.model.layers[1].self_attn.q_proj.bias[3] = math.nan
    with pytest.raises(headwidget.NonFiniteActivationError, match=r"layer 1 query/key rotary-pair norms"):
        headwidget.capture(model, ragged_batches(), inputs=True, progress=False)
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def test_estimate_counts_the_sums_and_their_working_memory() -> None:
    from headwidget.capture.plan import CapturePlan

    def plan(name: str, inputs: bool) -> CapturePlan:
        adapter = headwidget.adapters.adapter_for(make_model(name))
        return CapturePlan.make(adapter, layers=None, rope="pre", inputs=inputs, cross_layer=None)

    assert plan("gpt_neox", True).plane_norms and plan("falcon_new", True).plane_norms
    assert not plan("gpt_neox", False).plane_norms
    assert not any(plan(name, True).plane_norms for name in ("gpt2", "bert", "deepseek_v2"))
    neox = plan("gpt_neox", True)  # 4 heads of 12 dims, 3 rotary planes, 2 layers
    with_norms = sum(neox.bytes_by_device(2, 16).values())
    neox.plane_norms = False
    assert with_norms - sum(neox.bytes_by_device(2, 16).values()) >= 2 * PlaneNorms.nbytes(4, 4, 3)
