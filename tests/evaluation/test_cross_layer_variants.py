"""``share:g``, ``merge:2``, ``xkv:r/g``, each against a model or a cache built by hand for one group."""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import numpy as np
import pytest
import torch
from transformers import DynamicCache

import headwidget
from headwidget.analysis.variants import parse_variant
from headwidget.errors import (
    ArgumentError,
    HealingInputError,
    MechanismSpecError,
    UnsupportedConversionError,
    VariantSaveError,
)
from healing_cases import held_out, small_heal
from tiny_models import record_attention_inputs, reference_kv, sliding_window_gemma2, three_layer_llama

F64 = torch.float64
P = 8
D_H = 16
G = 2


@pytest.fixture(scope="module")
def llama() -> torch.nn.Module:
    return three_layer_llama(seed=7)


def ids(rows: int = 3, length: int = 18, seed: int = 1) -> torch.Tensor:
    return torch.randint(1, 96, (rows, length), generator=torch.Generator().manual_seed(seed))


@contextmanager
def reading_layer_0(model: torch.nn.Module) -> Iterator[None]:
    """CLA built by hand: layer 1's key and value projections output layer 0's (on layer 0's input);
    layer 1 applies RoPE itself at the same positions, so it attends to layer 0's keys and values."""
    held: dict[str, torch.Tensor] = {}
    attn0, attn1 = model.model.layers[0].self_attn, model.model.layers[1].self_attn
    handles = []
    for name in ("k_proj", "v_proj"):
        handles.append(
            getattr(attn0, name).register_forward_hook(lambda m, a, out, n=name: held.__setitem__(n, out))
        )
        handles.append(getattr(attn1, name).register_forward_hook(lambda m, a, out, n=name: held[n]))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def nll_of_logits(logits: torch.Tensor, x: torch.Tensor, first: int) -> float:
    out = torch.log_softmax(logits.to(F64), -1)
    return float(-out.gather(-1, x[:, first:, None]).mean())


def prefilled_nll(model: torch.nn.Module, x: torch.Tensor, edit: Callable[[DynamicCache], None]) -> float:
    """NLL of the targets from P + 1 on, scored from a cache of the first P tokens that ``edit`` changed."""
    cache = DynamicCache(config=model.config)
    with torch.no_grad():
        model(x[:, :P], cache=cache, use_cache=True)
        edit(cache)
        logits = model(x[:, P:], cache=cache, use_cache=True, attention_mask=torch.ones_like(x)).logits
    return nll_of_logits(logits[:, :-1], x, P + 1)


# ---------------------------------------------------------------------------------------------- share
@pytest.mark.parametrize("within", ["", "mqa+"])
def test_share_is_the_hand_built_cla_model_in_every_protocol(llama: torch.nn.Module, within: str) -> None:
    x = ids()
    spec = f"{within}share:2@0-1"
    hand = headwidget.apply(llama, "mqa@0-1") if within else llama
    with torch.no_grad(), reading_layer_0(hand):
        want_logits = hand(x).logits
    variant = headwidget.apply(llama, spec)
    with torch.no_grad():
        torch.testing.assert_close(variant(x).logits, want_logits, atol=1e-12, rtol=0)
    with reading_layer_0(hand):
        want_prefill = prefilled_nll(hand, x, lambda cache: None)
    report = headwidget.evaluate(llama, x, [spec], protocol="prefill:8", dtype=F64, progress=False)
    documents = headwidget.evaluate(llama, x, [spec], dtype=F64, progress=False)
    assert report.nll[spec] == pytest.approx(want_prefill, abs=1e-12)
    assert documents.nll[spec] == pytest.approx(nll_of_logits(want_logits[:, :-1], x, 1), abs=1e-12)
    per_layer_elements = G * 2 * D_H if not within else 2 * D_H  # a reader caches nothing
    assert report.kv_bytes_per_token[spec] == 8 * (per_layer_elements + 0 + G * 2 * D_H)
    assert variant.headwidget_variant.readers == {1: 0}


def test_share_groups_are_cut_within_the_layers_a_part_names(llama: torch.nn.Module) -> None:
    parsed = parse_variant("mqa@0;mqa+share:2@1-2")
    variant = headwidget.apply(llama, parsed.text)
    assert variant.headwidget_variant.readers == {2: 1}
    assert variant.headwidget_variant.kv_elements == {0: 2 * D_H, 1: 2 * D_H, 2: 0}
    whole = headwidget.apply(llama, "share:2")  # layers 0-1 a pair, layer 2 alone
    assert whole.headwidget_variant.readers == {1: 0}
    assert whole.headwidget_variant.kv_bytes_per_token(torch.float32) == 4 * 2 * G * 2 * D_H


def test_per_layer_gives_each_layer_its_group_s_number(llama: torch.nn.Module) -> None:
    x = ids()
    mixed = "mqa@0;share:2@1-2"
    report = headwidget.evaluate(
        llama, x, ["model", mixed, "merge:2"], protocol="prefill:8", dtype=F64, progress=False, per_layer=True
    )
    base = report.nll["model"]
    alone = headwidget.evaluate(
        llama, x, ["mqa@0", "share:2@1-2", "merge:2@0-1"], protocol="prefill:8", dtype=F64, progress=False
    )
    assert report.per_layer[mixed][0] == pytest.approx(alone.nll["mqa@0"] - base, abs=1e-12)
    group = alone.nll["share:2@1-2"] - base
    assert report.per_layer[mixed][1:] == pytest.approx([group, group], abs=1e-12)
    pair = alone.nll["merge:2@0-1"] - base
    assert report.per_layer["merge:2"] == pytest.approx([pair, pair, 0.0], abs=1e-12)


@pytest.mark.parametrize("spec", ["share:2", "mqa+share:2"])
def test_share_heals_the_first_layer_s_projections(llama: torch.nn.Module, spec: str) -> None:
    """Plain ``share:2`` changes no weight and still changes the model: it heals like a conversion,
    training layer 0's K/V, which layer 1 reads. Layer 2, alone in its group, is trained only where the
    part converts it within the layer (``mqa``); under plain ``share:2`` it is the model's. The memory
    estimate from the spec is the applied variant's (from the spec it once counted no trained layer)."""
    variant = headwidget.apply(llama, spec)
    sizes = {"batch_size": 4, "max_length": 16}
    from_spec = headwidget.estimate_healing(spec, llama, trainable="kv", **sizes)
    assert from_spec == pytest.approx(
        headwidget.estimate_healing(variant, llama, trainable="kv", **sizes), rel=0.05
    )
    run = small_heal(variant, llama, trainable="kv")
    first = headwidget.evaluate(
        llama, held_out(), [spec], dtype=F64, batch_size=4, max_length=16, max_tokens=120, progress=False
    )
    assert run.curve[0]["nll"] == pytest.approx(first.nll[spec], rel=1e-12)
    assert run.kv_bytes_per_token == first.kv_bytes_per_token[spec]
    healed = run.model
    for layer, trained in ((0, True), (1, False), (2, spec == "mqa+share:2")):
        a, b = healed.model.layers[layer].self_attn, variant.model.layers[layer].self_attn
        for name in ("k_proj", "v_proj"):
            assert torch.equal(getattr(a, name).weight, getattr(b, name).weight) is not trained
        assert torch.equal(a.q_proj.weight, b.q_proj.weight)
    assert healed.headwidget_variant.readers == {1: 0}
    assert run.curve[-1]["kl"] < run.curve[0]["kl"]


def test_share_heals_with_its_curve_measured_after_a_prefill(llama: torch.nn.Module, tmp_path) -> None:
    """``heal(..., protocol="prefill:P")``: every point of the curve is evaluate's under prefill:P on the
    same held-out tokens (the untrained variant's, and the healed model's), and the run records the
    protocol, saved and loaded; training is unchanged (the same weights as under documents)."""
    variant = headwidget.apply(llama, "share:2")
    run = small_heal(variant, llama, trainable="kv", protocol="prefill:6", per_layer=False)
    options = {"dtype": F64, "batch_size": 4, "max_length": 16, "max_tokens": 120, "progress": False}
    first = headwidget.evaluate(llama, held_out(), ["share:2"], protocol="prefill:6", **options)
    last = headwidget.evaluate(run.model, held_out(), ["model"], protocol="prefill:6", **options)
    assert run.curve[0]["nll"] == pytest.approx(first.nll["share:2"], rel=1e-12)
    assert run.curve[0]["kl"] == pytest.approx(first.kl["share:2"], rel=1e-9, abs=1e-15)
    assert run.curve[-1]["nll"] == pytest.approx(last.nll["model"], rel=1e-12)
    assert run.protocol == "prefill:6" and run.evaluation_fingerprint == first.fingerprint
    run.save(tmp_path / "run.json")
    assert headwidget.HealingRun.load(tmp_path / "run.json").protocol == "prefill:6"
    documents = small_heal(variant, llama, trainable="kv", per_layer=False)
    assert documents.protocol == "documents" and documents.curve[0]["nll"] != run.curve[0]["nll"]
    for a, b in zip(run.model.parameters(), documents.model.parameters(), strict=True):
        assert torch.equal(a, b)
    with pytest.raises(ArgumentError, match=r"protocol='documents' or 'prefill:P'"):
        small_heal(variant, llama, protocol="chunks:8")
    with pytest.raises(ArgumentError, match=r"give max_length ≥ 17"):
        small_heal(variant, llama, protocol="prefill:15")


# ---------------------------------------------------------------------------------------------- merge
def minicache_by_hand(a: np.ndarray, b: np.ndarray, t: float = 0.6, gamma: float = 0.05) -> tuple:
    """MiniCache on one sequence's states a, b (G, T, d), a loop per state: SLERP of the directions at
    t, magnitudes kept, the states with d ≤ d_min + (d_max − d_min)·γ (d = angle / π) kept exact."""
    heads, tokens, _ = a.shape
    angle = np.zeros((heads, tokens))
    for g in range(heads):
        for i in range(tokens):
            cos = a[g, i] @ b[g, i] / (np.linalg.norm(a[g, i]) * np.linalg.norm(b[g, i]))
            angle[g, i] = math.acos(max(-1.0, min(1.0, cos)))
    d = angle / math.pi
    kept = d <= d.min() + (d.max() - d.min()) * gamma
    ra, rb = a.copy(), b.copy()
    for g in range(heads):
        for i in range(tokens):
            if kept[g, i]:
                continue
            w = angle[g, i]
            ua, ub = a[g, i] / np.linalg.norm(a[g, i]), b[g, i] / np.linalg.norm(b[g, i])
            e = math.sin((1 - t) * w) / math.sin(w) * ua + math.sin(t * w) / math.sin(w) * ub
            ra[g, i] = e * np.linalg.norm(a[g, i])
            rb[g, i] = e * np.linalg.norm(b[g, i])
    return ra, rb, kept


def test_merge_is_minicache_on_the_prefilled_pair(llama: torch.nn.Module) -> None:
    x = ids()
    kept_counts = {"key": [0, 0], "value": [0, 0]}

    def edit(cache: DynamicCache) -> None:
        for kind in ("keys", "values"):
            first, second = getattr(cache.layers[0], kind), getattr(cache.layers[1], kind)
            new_first, new_second = first.clone(), second.clone()
            for row in range(first.shape[0]):
                ra, rb, kept = minicache_by_hand(first[row].numpy(), second[row].numpy())
                new_first[row], new_second[row] = torch.from_numpy(ra), torch.from_numpy(rb)
                name = "key" if kind == "keys" else "value"
                kept_counts[name][0] += int(kept.sum())
                kept_counts[name][1] += kept.size
            setattr(cache.layers[0], kind, new_first)
            setattr(cache.layers[1], kind, new_second)

    want = prefilled_nll(llama, x, edit)
    spec = "merge:2@0-1"
    report = headwidget.evaluate(llama, x, [spec], protocol="prefill:8", dtype=F64, progress=False)
    assert report.nll[spec] == pytest.approx(want, abs=1e-12)
    share = {k: kept / total for k, (kept, total) in kept_counts.items()}
    assert 0 < share["key"] < 0.5
    pair = (G * D_H + G * D_H) / 2 + 2 * G + share["key"] * G * D_H + share["value"] * G * D_H
    assert report.kv_bytes_per_token[spec] == pytest.approx(8 * (2 * pair + 2 * G * D_H), abs=1e-9)


# ---------------------------------------------------------------------------------------------- xKV
def rope_as_llama(k: torch.Tensor, theta: float = 10000.0) -> torch.Tensor:
    """HF half-split RoPE of (T, G, d) keys at positions 0..T−1, with the angles' cosines and sines
    formed in float32 as transformers' Llama forms them (then widened), so that the reference rotates
    exactly as the model's cache does."""
    inv = 1.0 / theta ** (torch.arange(0, D_H, 2, dtype=torch.int64).float() / D_H)
    angles = torch.arange(k.shape[0]).float()[:, None] * inv[None, :]
    emb = torch.cat([angles, angles], -1)
    cos, sin = emb.cos().to(F64)[:, None, :], emb.sin().to(F64)[:, None, :]
    half = D_H // 2
    rotated = torch.cat([-k[..., half:], k[..., :half]], -1)
    return k * cos + rotated * sin


def hand_built_xkv(llama: torch.nn.Module, x: torch.Tensor, groups: list[list[int]], ranks: tuple[int, int]):
    """An edit of the prefilled cache that does xKV by hand: each group's keys before RoPE (recomputed
    from each layer's attention input and weights) and values, side by side per sequence, truncated to
    their rank (keys', values') by numpy's SVD; the keys rotated again; written into the cache."""
    by_kind = dict(zip(("key", "value"), ranks, strict=True))
    inputs = record_attention_inputs(llama, [{"input_ids": x[:, :P], "attention_mask": torch.ones(3, P)}])

    def edit(cache: DynamicCache) -> None:
        for group in groups:
            for row in range(x.shape[0]):
                modules = [llama.model.layers[i].self_attn for i in group]
                kv = [
                    reference_kv("llama_gqa", llama, m, inputs[i][0][row])
                    for i, m in zip(group, modules, strict=True)
                ]
                for kind in ("key", "value"):
                    joint = np.concatenate([part[kind].reshape(P, -1).numpy() for part in kv], axis=1)
                    u, s, vh = np.linalg.svd(joint, full_matrices=False)
                    rank = by_kind[kind]
                    approx = (u[:, :rank] * s[:rank]) @ vh[:rank]
                    for layer, part in zip(group, np.split(approx, len(group), axis=1), strict=True):
                        block = torch.from_numpy(part.copy()).reshape(P, G, D_H)
                        if kind == "key":
                            cache.layers[layer].keys[row] = rope_as_llama(block).transpose(0, 1)
                        else:
                            cache.layers[layer].values[row] = block.transpose(0, 1)

    return edit


@pytest.mark.parametrize(
    ("spec", "groups", "ranks"),
    [
        ("xkv:5/2@0-1", [[0, 1]], (5, 5)),
        ("xkv:k3v6/2@0-1", [[0, 1]], (3, 6)),
        ("xkv:3/2", [[0, 1], [2]], (3, 3)),  # the last layer left over: compressed alone, as xKV's authors do
        ("xkv:4/1@1-2", [[1], [2]], (4, 4)),  # one layer a group: their single-layer SVD
    ],
)
def test_xkv_is_one_svd_of_the_group_s_pre_rope_keys_and_values(
    llama: torch.nn.Module, spec: str, groups: list[list[int]], ranks: tuple[int, int]
) -> None:
    """xKV against the cache edited by hand (:func:`hand_built_xkv`), one rank for both kinds or xKV's
    rank_k and rank_v, for a pair, a pair and a layer left over, and single layers; bytes by the
    authors' count r/g + r·C/P per kind and layer."""
    x = ids()
    want = prefilled_nll(llama, x, hand_built_xkv(llama, x, groups, ranks))
    report = headwidget.evaluate(llama, x, [spec], protocol="prefill:8", dtype=F64, progress=False)
    assert report.nll[spec] == pytest.approx(want, abs=1e-12)
    grouped = {layer: len(group) for group in groups for layer in group}
    c = G * D_H
    per_layer = [
        sum(r / grouped[layer] + r * c / P for r in ranks) if layer in grouped else 2 * c
        for layer in range(3)
    ]
    assert report.kv_bytes_per_token[spec] == pytest.approx(8 * sum(per_layer), abs=1e-9)


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_xkv_of_a_rank_that_holds_the_prefill_leaves_the_cache_as_it_is(
    llama: torch.nn.Module, dtype: torch.dtype
) -> None:
    """A rank at or above the prefill's length keeps the whole of each group's matrix: the cache is the
    prefill's own, to the bit (no SVD's rounding, no turning the keys back and again)."""
    from headwidget.evaluation._cache_transforms import SharedSVDCache, transforming_prefill

    model = copy.deepcopy(llama).to(dtype)
    x = ids()[:, :P]
    caches = []
    for transforms in ([], [SharedSVDCache(f"xkv:{P}/2", [[0, 1]], P)]):
        cache = DynamicCache(config=model.config)
        with torch.no_grad(), transforming_prefill(model, transforms):
            model(x, cache=cache, use_cache=True)
        caches.append(cache)
    for plain, kept in zip(caches[0].layers, caches[1].layers, strict=True):
        assert torch.equal(plain.keys, kept.keys) and torch.equal(plain.values, kept.values)


def test_an_applied_xkv_model_compresses_its_prefill_in_generate(llama: torch.nn.Module) -> None:
    """``apply``'s model transforms the cache its first (prefill) forward builds: its next forward reads
    what evaluate's prefill:P reads; a forward without a cache is the model's."""
    x = ids(rows=2)
    variant = headwidget.apply(llama, "xkv:3/2")
    with torch.no_grad():
        torch.testing.assert_close(variant(x).logits, llama(x).logits, atol=0, rtol=0)
        cache = DynamicCache(config=llama.config)
        variant(x[:, :P], cache=cache, use_cache=True)
        logits = variant(x[:, P:], cache=cache, use_cache=True, attention_mask=torch.ones_like(x)).logits
    report = headwidget.evaluate(llama, x, ["xkv:3/2"], protocol="prefill:8", dtype=F64, progress=False)
    assert report.nll["xkv:3/2"] == pytest.approx(nll_of_logits(logits[:, :-1], x, P + 1), abs=1e-12)
    generated = variant.generate(x, max_new_tokens=2, do_sample=False, attention_mask=torch.ones_like(x))
    assert generated.shape == (2, 20)


# ---------------------------------------------------------------------------------------------- refusals
def test_no_checkpoint_holds_a_cross_layer_variant(llama: torch.nn.Module, tmp_path: object) -> None:
    from pathlib import Path

    for spec in ("share:2", "mqa+merge:2", "xkv:4/2@1-2"):
        variant = headwidget.apply(llama, spec)
        out = Path(str(tmp_path)) / spec.replace(":", "_").replace("/", "_").replace("@", "_")
        with pytest.raises(VariantSaveError, match="across layers") as err:
            variant.save_pretrained(out)
        assert "without its share/merge/xkv parts saves" in str(err.value)
        assert not out.exists()


def test_xkv_takes_a_rank_for_keys_and_one_for_values() -> None:
    """``xkv:k{r_k}v{r_v}/g`` (xKV's rank_k and rank_v); equal ranks are written ``xkv:r/g``."""
    for text, canonical, ranks in (
        ("xkv:k192v288/2", "xkv:k192v288/2", {"key": 192, "value": 288}),
        ("mqa+xkv:k8v8/4", "mqa+xkv:8/4", {"key": 8, "value": 8}),
        ("xkv:16/2", "xkv:16/2", {"key": 16, "value": 16}),
    ):
        parsed = parse_variant(text)
        assert parsed.text == canonical
        assert parsed.cross is not None and parsed.cross.ranks == ranks
    for bad, match in (
        ("xkv:k0v4/2", "keys' shared rank"),
        ("xkv:k4v/2", "cannot read variant spec"),
        ("xkv:k4v4/0", "1 ≤ g"),
    ):
        with pytest.raises(MechanismSpecError, match=match):
            parse_variant(bad)


def test_cross_layer_specs_say_what_they_need(llama: torch.nn.Module) -> None:
    for bad, match in (
        ("merge:3", "g = 2 only"),
        ("share:1", "g ≥ 2"),
        ("mla:16+xkv:4/2", "caches factors or a latent"),
        ("kv:int4+share:2", "follows a conversion"),
    ):
        with pytest.raises(MechanismSpecError, match=match):
            parse_variant(bad)
    x = ids()
    with pytest.raises(UnsupportedConversionError, match="protocol='prefill:P'"):
        headwidget.evaluate(llama, x, ["merge:2"], progress=False)
    merged = headwidget.apply(llama, "mqa+merge:2")
    with pytest.raises(HealingInputError, match="transforms the cache a prefill builds"):
        small_heal(merged, llama)
    with pytest.raises(UnsupportedConversionError, match="already shares or transforms"):
        headwidget.apply(headwidget.apply(llama, "share:2"), "mqa")


def test_share_heals_the_same_with_checkpoints(llama: torch.nn.Module) -> None:
    """A checkpointed layer computed again in the backward pass reads its group's K/V as in the forward."""
    variant = headwidget.apply(llama, "share:2")
    plain = small_heal(variant, llama, trainable="kv")
    again = small_heal(variant, llama, trainable="kv", checkpoint=True)
    for a, b in zip(plain.model.parameters(), again.model.parameters(), strict=True):
        assert torch.equal(a, b)
    assert not torch.equal(
        plain.model.model.layers[0].self_attn.k_proj.weight, variant.model.layers[0].self_attn.k_proj.weight
    )


def test_a_padded_prefill_is_refused_before_the_forward(llama: torch.nn.Module) -> None:
    """A transform acts on each sequence's whole prefilled cache: a left-padded ``generate`` batch is
    refused, saying why, and the same rows unpadded still generate."""
    x = ids(rows=2)
    mask = torch.ones_like(x)
    mask[0, :3] = 0
    for spec in ("xkv:3/2", "merge:2"):
        variant = headwidget.apply(llama, spec)
        with pytest.raises(UnsupportedConversionError, match="pads 1 of its 2 sequences"):
            variant.generate(x, max_new_tokens=1, do_sample=False, attention_mask=mask)
        generated = variant.generate(x, max_new_tokens=1, do_sample=False, attention_mask=torch.ones_like(x))
        assert generated.shape == (2, 19)


SLIDING, FULL = "sliding_attention", "full_attention"


def sliding_then_full(dtype: torch.dtype = torch.float32) -> torch.nn.Module:
    """A Gemma 2 whose layers 0–1 attend through a sliding window of 4 tokens and 2–3 to every token."""
    return sliding_window_gemma2([SLIDING, SLIDING, FULL, FULL], dtype)


def test_layers_that_attend_differently_are_not_grouped() -> None:
    """Gemma 2 alternates sliding-window and full layers, whose caches hold different tokens: a group
    mixing them is refused for every cross-layer part, naming the layers' kinds; groups of alike
    layers are built."""
    model = sliding_then_full()
    x = ids(rows=2, length=14)
    for spec in ("share:2@1-2", "merge:2@1-2", "xkv:2/2@1-2"):
        with pytest.raises(UnsupportedConversionError, match=r"layers 1 and 2 attend differently") as err:
            headwidget.evaluate(model, x, [spec], protocol="prefill:8", progress=False)
        assert "sliding_attention: 0-1; full_attention: 2-3" in str(err.value)
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.modules())
    alternating = sliding_window_gemma2([SLIDING, FULL] * 2, torch.float32)
    with pytest.raises(UnsupportedConversionError, match=r"no two adjacent layers attend alike .*xkv:r/1"):
        headwidget.evaluate(alternating, x, ["share:2"], progress=False)
    report = headwidget.evaluate(model, x, ["share:2", "xkv:2/2"], protocol="prefill:8", progress=False)
    assert all(math.isfinite(report.nll[s]) for s in ("share:2", "xkv:2/2"))


def test_xkv_of_sliding_window_layers_turns_the_keys_their_caches_hold() -> None:
    """A sliding-window layer caches its last tokens only: xkv turns those keys back by their own
    positions' angles (transformers' RoPE, inverted by the opposite angles), takes the shared SVD, and
    turns them again; checked in float64 against that reference built from the plain prefill's cache.
    (Angles of positions shifted alike give the same cache, RoPE being relative: what is checked is that
    each cached token is turned by its own angle, where the prefill's angles of all its tokens did not
    fit the window's cache.)"""
    from transformers.models.gemma2.modeling_gemma2 import apply_rotary_pos_emb

    from headwidget.analysis.cross_layer import shared_svd
    from headwidget.evaluation._cache_transforms import SharedSVDCache, transforming_prefill

    model = sliding_then_full(F64)
    x = ids(rows=2, length=P)
    caches = []
    for transforms in ([], [SharedSVDCache("xkv:2/2", [[0, 1]], 2)]):
        cache = DynamicCache(config=model.config)
        with torch.no_grad(), transforming_prefill(model, transforms):
            model(x, cache=cache, use_cache=True)
        caches.append(cache)
    plain, done = caches
    held = int(plain.layers[0].keys.shape[2])
    assert held < P  # (the window keeps fewer tokens than the prefill)
    positions = torch.arange(P - held, P).expand(2, held)
    cos, sin = model.model.rotary_emb(plain.layers[0].keys, positions)
    before = [apply_rotary_pos_emb(plain.layers[i].keys, plain.layers[i].keys, cos, -sin)[0] for i in (0, 1)]
    keys = [apply_rotary_pos_emb(k, k, cos, sin)[0] for k in shared_svd(before, 2)]
    values = shared_svd([plain.layers[i].values for i in (0, 1)], 2)
    for i in (0, 1):
        torch.testing.assert_close(done.layers[i].keys, keys[i], atol=1e-6, rtol=0)  # (float32 angles)
        torch.testing.assert_close(done.layers[i].values, values[i], atol=1e-12, rtol=0)
    for i in (2, 3):  # (not in the group: the prefill's own)
        assert torch.equal(done.layers[i].keys, plain.layers[i].keys)


def test_an_xkv_rank_that_keeps_the_whole_cache_counts_the_model_s_bytes(llama: torch.nn.Module) -> None:
    """A rank at or above min(P, g·C) leaves the cache as it is: its scores and its bytes are the
    model's (r/g + r·C/P would count 40/2 + 40·64/8 = 340 elements a token and kind, against 32);
    a rank that keeps the keys' whole matrix and not the values' counts the keys as the model's."""
    x = ids()
    report = headwidget.evaluate(
        llama, x, ["model", "xkv:40/2", "xkv:k8v3/2"], protocol=f"prefill:{P}", dtype=F64, progress=False
    )
    assert report.kv_bytes_per_token["xkv:40/2"] == report.kv_bytes_per_token["model"]
    assert report.nll["xkv:40/2"] == report.nll["model"] and report.kl["xkv:40/2"] == 0.0
    c = 2 * D_H
    grouped = (c + (3 / 2 + 3 * c / P)) * 8  # keys whole (8 ≥ P), values at rank 3; per layer
    alone = (c + (3 + 3 * c / P)) * 8  # layer 2 on its own SVD
    assert report.kv_bytes_per_token["xkv:k8v3/2"] == pytest.approx(2 * grouped + alone, rel=1e-12)
    applied = headwidget.apply(llama, "xkv:40/2").headwidget_variant
    assert applied.kv_bytes_per_token(F64, prefill=P) == report.kv_bytes_per_token["model"]


def test_an_applied_xkv_model_counts_its_basis_over_the_prefill_as_evaluate_does(
    llama: torch.nn.Module,
) -> None:
    """xKV holds r coefficients a token per kind and group, and a rank-r basis of the group's channels
    per sequence: over a prefill of P tokens, r/g + r·C/P elements a token per layer and kind (the
    authors' count). The applied model's count, given P, is evaluate's under prefill:P; without P it
    leaves the basis out, and says so."""
    x = ids()
    r, g, c = 3, 2, 2 * D_H  # 2 KV heads of 16 in each of the group's two layers
    grouped = 2 * (r / g + r * c / P) * 8  # per layer (K and V), in float64
    alone = 2 * (r + r * c / P) * 8  # layer 2, left over: its own SVD
    report = headwidget.evaluate(llama, x, ["xkv:3/2"], protocol=f"prefill:{P}", dtype=F64, progress=False)
    applied = headwidget.apply(llama, "xkv:3/2").headwidget_variant
    assert report.kv_bytes_per_token["xkv:3/2"] == pytest.approx(2 * grouped + alone, rel=1e-12)
    assert applied.kv_bytes_per_token(F64, prefill=P) == pytest.approx(2 * grouped + alone, rel=1e-12)
    assert applied.layer_bytes(F64) == pytest.approx([2 * r / g * 8] * 2 + [2 * r * 8], rel=1e-12)
