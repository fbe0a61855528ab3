"""capture refuses what it cannot do exactly, and does exactly what it accepts.

Left padding, mask shapes, dict batches larger than ``batch_size``, long texts, activations that
overflow float32 second moments, token ids outside the vocabulary, and the memory estimate.
"""

from __future__ import annotations

import importlib
import random
import time
import tracemalloc

import numpy as np
import pytest
import torch

import headwidget
from headwidget.errors import CaptureInputError, NonFiniteActivationError
from memory_peak import allocated_peak
from tiny_models import FACTORIES, ROPE_FAMILIES, VOCAB, make_model, ragged_batches

inputs = importlib.import_module("headwidget.capture.inputs")


def no_hooks(model) -> bool:
    return all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())


def close_stats(a, b, atol: float = 1e-8, atol_post: float | None = None) -> None:
    """Same tokens, same moments (to ``atol``); the token splits may differ, so Grams are summed."""
    assert a.tokens == b.tokens and a.layers == b.layers and a.kinds == b.kinds
    for layer in a.layers:
        for kind in a.kinds:
            tol = atol_post if kind == "key_post" and atol_post is not None else atol
            ma, mb = a.moments(layer, kind), b.moments(layer, kind)
            assert ma.count == mb.count
            pairs = [(ma.mean, mb.mean), (ma.m2, mb.m2)]
            if ma.norm_gram is not None:
                pairs.append((ma.token_gram(), mb.token_gram()))
            for x, y in pairs:
                np.testing.assert_allclose(
                    x.numpy(), y.numpy(), rtol=1e-10, atol=tol, err_msg=f"{layer} {kind}"
                )
    if a.meta.cross_layers:
        for kind in ("key", "value"):
            ja, jb = a.head_moments(a.meta.cross_layers, kind), b.head_moments(b.meta.cross_layers, kind)
            np.testing.assert_allclose(ja.m2.numpy(), jb.m2.numpy(), rtol=1e-10, atol=atol)
    assert sorted(a._plane_norms) == sorted(b._plane_norms)
    for layer, na in a._plane_norms.items():  # the rotary-pair norm sums of queries and keys
        nb = b._plane_norms[layer]
        assert na.count == nb.count
        for x, y in ((na.query, nb.query), (na.key, nb.key)):
            np.testing.assert_allclose(x.numpy(), y.numpy(), rtol=1e-10, atol=atol, err_msg=f"{layer} norms")


# ---------------------------------------------------------------------------------- padding
def rows_of(batches: list[dict]) -> list[torch.Tensor]:
    out = []
    for b in batches:
        for ids, mask in zip(b["input_ids"], b["attention_mask"], strict=True):
            out.append(ids[mask.bool()])
    return out


def padded(rows: list[torch.Tensor], side: str, per_batch: int) -> list[dict]:
    batches = []
    for start in range(0, len(rows), per_batch):
        chunk = rows[start : start + per_batch]
        width = max(len(r) for r in chunk)
        ids = torch.zeros(len(chunk), width, dtype=torch.long)
        mask = torch.zeros(len(chunk), width, dtype=torch.long)
        for i, r in enumerate(chunk):
            where = slice(width - len(r), width) if side == "left" else slice(0, len(r))
            ids[i, where], mask[i, where] = r, 1
        batches.append({"input_ids": ids, "attention_mask": mask})
    return batches


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_left_and_right_padding_equal_unpadded(name):
    model = make_model(name)  # float64
    rows = rows_of(ragged_batches(lengths=((13, 7, 10), (9, 12, 3))))
    options = {
        "rope": "both" if name in ROPE_FAMILIES else "pre",
        "inputs": True,
        "cross_layer": True,
        "progress": False,
    }
    unpadded = headwidget.capture(model, [{"input_ids": r} for r in rows], **options)
    assert unpadded.tokens == sum(len(r) for r in rows)
    # DeepSeek-V2 rotates its keys with complex float32 arithmetic, whose rounding depends on the
    # batch's shape: right-padded keys differ from unpadded ones by ~5e-8 too.
    post = 1e-6 if name == "deepseek_v2" else None
    for side in ("left", "right"):
        close_stats(
            headwidget.capture(model, padded(rows, side, per_batch=3), **options), unpadded, atol_post=post
        )
    assert no_hooks(model)


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_a_budget_that_ends_inside_a_padded_batch_counts_the_unpadded_tokens(name):
    """max_tokens=25 over rows of 13, 7 and 10 tokens ends in the third row: left- and right-padded
    batches (cut to the rows and positions the budget counts) give the unpadded rows' statistics."""
    model = make_model(name)  # float64
    rows = rows_of(ragged_batches(lengths=((13, 7, 10), (9, 12, 3))))
    options = {"rope": "both" if name in ROPE_FAMILIES else "pre", "max_tokens": 25, "progress": False}
    unpadded = headwidget.capture(model, [{"input_ids": r} for r in rows], **options)
    assert unpadded.tokens == 25
    post = 1e-6 if name == "deepseek_v2" else None  # see test_left_and_right_padding_equal_unpadded
    for side in ("left", "right"):
        close_stats(
            headwidget.capture(model, padded(rows, side, per_batch=3), **options), unpadded, atol_post=post
        )


def test_left_padding_with_skip_first_token():
    model = make_model("llama_gqa")
    rows = rows_of(ragged_batches())
    unpadded = headwidget.capture(
        model, [{"input_ids": r} for r in rows], rope="both", skip_first_token=True, progress=False
    )
    left = headwidget.capture(
        model, padded(rows, "left", per_batch=5), rope="both", skip_first_token=True, progress=False
    )
    assert left.tokens == sum(len(r) - 1 for r in rows)
    close_stats(left, unpadded)


def test_batch_positions_follow_the_mask():
    mask = torch.tensor([[0, 0, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 1, 1, 0]])
    positions = inputs.Batch(torch.ones_like(mask), mask).position_ids()
    real = mask.bool()
    assert positions[0][real[0]].tolist() == [0, 1, 2]
    assert positions[1][real[1]].tolist() == [0, 1, 2]
    assert positions[2][real[2]].tolist() == [0, 1, 2]
    right = torch.tensor([[1, 1, 1, 0], [1, 1, 1, 1]])
    assert inputs.Batch(torch.ones_like(right), right).position_ids() is None


# ---------------------------------------------------------------------------------- masks and ids
@pytest.fixture(scope="module")
def llama():
    return make_model("llama_gqa", dtype=torch.float32)


@pytest.mark.parametrize(
    ("ids_shape", "mask_shape"), [((2, 6), (3, 4)), ((2, 6), (12,)), ((2, 6), (6, 2)), ((6,), (2, 3))]
)
def test_mask_of_another_shape_is_refused(llama, ids_shape, mask_shape):
    ids = torch.randint(1, VOCAB, ids_shape)
    mask = torch.ones(mask_shape, dtype=torch.long)
    with pytest.raises(CaptureInputError, match=r"attention_mask has shape .* but input_ids has shape"):
        headwidget.capture(llama, [{"input_ids": ids, "attention_mask": mask}], progress=False)
    assert no_hooks(llama)


def test_one_dimensional_ids_and_mask_are_one_row(llama):
    ids = torch.randint(1, VOCAB, (6,))
    stats = headwidget.capture(
        llama, [{"input_ids": ids, "attention_mask": torch.tensor([1, 1, 1, 1, 0, 0])}], progress=False
    )
    assert stats.tokens == 4


@pytest.mark.parametrize("bad", [2, -1, 0.5])
def test_mask_values_other_than_zero_and_one_are_refused(llama, bad):
    ids = torch.randint(1, VOCAB, (2, 4))
    mask = torch.tensor([[1, 1, 1, 0], [1, 1, bad, 1]])
    with pytest.raises(CaptureInputError, match=r"only 0 \(padding\) and 1"):
        headwidget.capture(llama, [{"input_ids": ids, "attention_mask": mask}], progress=False)


def test_float_token_ids_are_refused(llama):
    with pytest.raises(CaptureInputError, match=r"integer token ids, got torch.float32"):
        headwidget.capture(llama, [{"input_ids": torch.ones(2, 4)}], progress=False)


def embedding_calls(model) -> tuple[list[tuple[int, ...]], object]:
    shapes: list[tuple[int, ...]] = []
    handle = model.get_input_embeddings().register_forward_pre_hook(
        lambda m, args: shapes.append(tuple(args[0].shape))
    )
    return shapes, handle


@pytest.mark.parametrize(
    ("bad_id", "message"),
    [
        (VOCAB, rf"largest token id is {VOCAB}, but LlamaForCausalLM's vocabulary has {VOCAB} ids"),
        (VOCAB + 1000, rf"largest token id is {VOCAB + 1000}.*{VOCAB} ids \(0\.\.{VOCAB - 1}\)"),
        (-100, r"smallest token id is -100, but token ids cannot be negative"),
    ],
)
def test_out_of_vocabulary_ids_are_refused_before_any_forward(llama, bad_id, message):
    ids = torch.randint(1, VOCAB, (3, 8))
    ids[1, 5] = bad_id
    shapes, handle = embedding_calls(llama)
    try:
        with pytest.raises(CaptureInputError, match=message):
            headwidget.capture(llama, ids, progress=False)
        with pytest.raises(CaptureInputError, match=r"batch 1: its"):
            headwidget.capture(llama, [{"input_ids": ids[:1]}, {"input_ids": ids}], progress=False)
    finally:
        handle.remove()
    assert shapes == [(1, 8)]  # only the good first batch of the second capture ran
    assert no_hooks(llama)


def test_out_of_vocabulary_padding_is_refused_too(llama):
    ids = torch.tensor([[5, 6, 7, VOCAB]])
    with pytest.raises(CaptureInputError, match="largest token id"):
        headwidget.capture(
            llama, [{"input_ids": ids, "attention_mask": torch.tensor([[1, 1, 1, 0]])}], progress=False
        )


# ---------------------------------------------------------------------------------- dict batches
def test_dict_batches_are_split_into_batch_size_rows(llama):
    gen = torch.Generator().manual_seed(3)
    ids = torch.randint(1, VOCAB, (10, 12), generator=gen)
    mask = torch.ones_like(ids)
    mask[3, 7:] = 0
    mask[8, :4] = 0
    shapes, handle = embedding_calls(llama)
    try:
        whole = headwidget.capture(
            llama, [{"input_ids": ids, "attention_mask": mask}], batch_size=4, inputs=True, progress=False
        )
    finally:
        handle.remove()
    assert shapes == [(4, 12), (4, 12), (2, 12)]
    pieces = [{"input_ids": ids[s : s + 4], "attention_mask": mask[s : s + 4]} for s in (0, 4, 8)]
    split = headwidget.capture(llama, pieces, batch_size=4, inputs=True, progress=False)
    for layer in whole.layers:
        for kind in whole.kinds:
            a, b = whole.moments(layer, kind), split.moments(layer, kind)
            assert torch.equal(a.m2, b.m2) and torch.equal(a.mean, b.mean)
            assert a.norm_gram is None or torch.equal(a.norm_gram, b.norm_gram)


# ---------------------------------------------------------------------------------- overflow
def test_keys_that_overflow_the_float32_co_moment_are_an_error(llama):
    k_proj = llama.model.layers[1].self_attn.k_proj
    saved = k_proj.weight.detach().clone()
    with torch.no_grad():
        k_proj.weight.mul_(1e21)  # keys around 1e20: finite, but their squares are not in float32
    try:
        with pytest.raises(NonFiniteActivationError, match=r"layer 1 key: activations so large"):
            headwidget.capture(llama, ragged_batches(), progress=False)
    finally:
        with torch.no_grad():
            k_proj.weight.copy_(saved)
    assert no_hooks(llama)


def test_keys_whose_head_norms_overflow_are_an_error(llama):
    """Constant keys of 1e20: a finite co-moment (0), but each head's norm is inf in float32."""
    v_proj = llama.model.layers[0].self_attn.v_proj
    saved = v_proj.weight.detach().clone(), v_proj.bias.detach().clone()
    with torch.no_grad():
        v_proj.weight.zero_()
        v_proj.bias.fill_(1e20)
    try:
        with pytest.raises(NonFiniteActivationError, match=r"layer 0 value: activations so large"):
            headwidget.capture(llama, ragged_batches(), progress=False)
    finally:
        with torch.no_grad():
            v_proj.weight.copy_(saved[0])
            v_proj.bias.copy_(saved[1])
    assert no_hooks(llama)


def test_nan_activations_name_layer_and_kind(llama):
    v_proj = llama.model.layers[1].self_attn.v_proj
    saved = v_proj.bias.detach().clone()
    with torch.no_grad():
        v_proj.bias[3] = float("nan")
    try:
        with pytest.raises(NonFiniteActivationError, match=r"layer 1 value: the model produced NaN"):
            headwidget.capture(llama, ragged_batches(), cross_layer=True, progress=False)
    finally:
        with torch.no_grad():
            v_proj.bias.copy_(saved)


def test_moments_update_flags_overflow():
    from headwidget.moments import Moments

    checks: list[torch.Tensor] = []
    m = Moments.empty(4, head_dim=2)
    m.update(torch.randn(10, 4), split_a=5, checks=checks)
    m.update(torch.full((10, 4), 3e19), split_a=5, checks=checks)  # norms overflow, co-moment is 0
    m.update(torch.randn(10, 4) * 1e20, split_a=5, checks=checks)  # co-moment overflows
    m.update(torch.full((10, 4), float("inf")), split_a=5, checks=checks)
    assert [c.tolist() for c in checks] == [[True, True], [True, False], [True, False], [False, False]]


# ---------------------------------------------------------------------------------- long texts
def tricky_text(seed: int, chars: int) -> str:
    """English prose with every kind of whitespace between the words, ``chars`` long."""
    from headwidget.texts import english_sample

    words = " ".join(english_sample()).split()
    rng = random.Random(seed)
    gaps = [" ", " ", " ", "  ", "\n", "\n\n", "\t", " \n ", "\u00a0", "   ", "\r\n"]
    out, size = [], 0
    while size < chars:
        w = rng.choice(words) + rng.choice(gaps)
        out.append(w)
        size += len(w)
    return "".join(out)[:chars]


#: The max_length values the long-text tests truncate to (special tokens longer than 2, 3 are refused
#: elsewhere; 511/512 straddle a power of two; 600 is beyond the models' usual 512).
LONG_TEXT_LENGTHS = (2, 3, 7, 64, 511, 512, 600)


@pytest.fixture(scope="module")
def long_texts() -> list[str]:
    return [tricky_text(seed, 40_000) for seed in range(3)]


@pytest.mark.slow
@pytest.mark.parametrize("cut", ["right", "left"])
@pytest.mark.parametrize("which", ["minilm", "smollm2"])
def test_long_text_keeps_the_tokens_whole_text_tokenization_keeps(which, cut, long_texts, request):
    _, tokenizer = request.getfixturevalue(which)
    side = tokenizer.truncation_side
    try:
        tokenizer.truncation_side = cut
        for text in long_texts:
            for max_length in LONG_TEXT_LENGTHS:
                # each text twice the length tokenized whole for this max_length: well past it, and no
                # longer (the reference below tokenizes the whole text)
                piece = text[: 2 * inputs._whole_text_limit(max_length) + 1]
                assert len(piece) > 2 * inputs._whole_text_limit(max_length)
                whole = tokenizer(piece, truncation=True, max_length=max_length)["input_ids"]
                assert inputs.tokenize_truncated(tokenizer, piece, max_length) == whole, (cut, max_length)
    finally:
        tokenizer.truncation_side = side


@pytest.mark.parametrize("cross_layer", [[1], [1, 1], [-1, 1]])
def test_a_cross_layer_list_of_one_layer_is_refused(cross_layer):
    """Joint statistics compare layers: a list naming one layer (once or twice, or as a negative index)
    is refused before any work, where it was once dropped without a word."""
    model = make_model("llama_gqa")
    with pytest.raises(CaptureInputError, match=r"names one layer.*give two or more"):
        headwidget.capture(model, ragged_batches(seed=2), cross_layer=cross_layer, progress=False)
    with pytest.raises(CaptureInputError, match=r"names one layer"):
        headwidget.estimate(model, cross_layer=cross_layer)
    assert no_hooks(model)


def test_a_left_padded_batch_cut_at_max_length_keeps_the_first_real_tokens_of_each_row():
    """Rows of 7 to 13 tokens, padded left, cut at 8 columns: each keeps its first 8 real tokens (as
    the same rows padded right do), and the statistics equal those of the rows cut by hand."""
    model = make_model("llama_gqa")
    right = ragged_batches(seed=2)
    left, by_hand = [], []
    for b in right:
        ids, mask = b["input_ids"], b["attention_mask"]
        n = mask.sum(1)
        shifted = [torch.roll(row, int(ids.shape[1] - k)) for row, k in zip(ids, n, strict=True)]
        left.append({"input_ids": torch.stack(shifted), "attention_mask": mask.flip(1)})
        by_hand.append({"input_ids": ids[:, :8], "attention_mask": mask[:, :8]})  # (real tokens first)
    stats = {
        name: headwidget.capture(model, batches, max_length=8, progress=False)
        for name, batches in (("left", left), ("right", right), ("by hand", by_hand))
    }
    kept = int(sum(b["attention_mask"].sum() for b in by_hand))
    assert stats["left"].tokens == stats["right"].tokens == stats["by hand"].tokens == kept
    for name in ("left", "right"):
        for layer in range(2):
            ours, want = stats[name].moments(layer, "value"), stats["by hand"].moments(layer, "value")
            assert torch.allclose(ours.m2, want.m2, rtol=1e-5, atol=1e-6), (name, layer)
            assert torch.allclose(ours.mean, want.mean, rtol=1e-6, atol=1e-7), (name, layer)


@pytest.mark.slow
@pytest.mark.parametrize("which", ["minilm", "smollm2"])
def test_long_and_short_texts_in_one_batch_keep_their_tokens(which, long_texts, request):
    _, tokenizer = request.getfixturevalue(which)
    mixed = [long_texts[0], "A short one.", long_texts[1]]
    assert min(len(long_texts[0]), len(long_texts[1])) > 2 * inputs._whole_text_limit(600)
    batch = next(inputs.iter_batches(mixed, tokenizer, batch_size=3, max_length=40))
    for row, text in zip(batch.input_ids, mixed, strict=True):
        want = tokenizer(text, truncation=True, max_length=40)["input_ids"]
        assert row[: len(want)].tolist() == want


@pytest.mark.slow
def test_long_text_without_whitespace_is_tokenized_whole(minilm):
    _, tokenizer = minilm
    text = "x" * 40_000 + " end"
    assert (
        inputs.tokenize_truncated(tokenizer, text, 8)
        == tokenizer(text, truncation=True, max_length=8)["input_ids"]
    )


@pytest.mark.slow
def test_max_length_below_the_special_tokens_is_refused(minilm):
    _, tokenizer = minilm
    for text in ("short text here", tricky_text(0, 50_000)):
        with pytest.raises(CaptureInputError, match=r"cannot truncate that short.*Raise max_length"):
            next(inputs.iter_batches([text], tokenizer, max_length=1))


@pytest.mark.slow
def test_memory_of_a_long_one_line_text_is_bounded_by_what_is_kept(minilm):
    """A 30 MB one-line text, max_tokens=64: Python allocations stay far below the text's size."""
    model, tokenizer = minilm
    text = tricky_text(1, 2_000_000).replace("\n", " ").replace("\r", " ")
    text = text * 15  # 30 MB
    tracemalloc.start()
    start = time.perf_counter()
    try:
        stats = headwidget.capture(model, text, tokenizer=tokenizer, max_tokens=64, progress=False)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    seconds = time.perf_counter() - start
    print(f"\n{len(text) / 1e6:.0f} MB text: capture {seconds:.2f} s, Python peak {peak / 2**20:.2f} MiB")
    assert stats.tokens == 64
    # whole-text tokenization alone would hold ~6 M token ids as Python ints (hundreds of MiB)
    assert peak < 16 * 2**20


# ---------------------------------------------------------------------------------- memory estimate
CASES = [
    ("llama_gqa", torch.float32, 8, 96, {"rope": "both", "inputs": True, "cross_layer": True}),
    ("llama_gqa", torch.float64, 4, 128, {}),
    ("gpt2", torch.float32, 8, 128, {"cross_layer": True}),
    ("bert", torch.float64, 4, 128, {"inputs": True}),
    ("falcon_mqa", torch.float32, 8, 128, {}),
    ("deepseek_v2", torch.float64, 8, 128, {"rope": "both"}),
    ("gpt_neox", torch.float32, 8, 96, {"inputs": True}),  # queries split out of the fused output
]


@pytest.mark.parametrize(("name", "dtype", "batch_size", "max_length", "options"), CASES)
def test_estimate_covers_the_measured_peak(name, dtype, batch_size, max_length, options):
    model = make_model(name, dtype=dtype)
    gen = torch.Generator().manual_seed(0)
    rows = 3 * batch_size + 1  # one dict batch, split into batch_size rows
    ids = torch.randint(1, VOCAB, (rows, max_length + 9), generator=gen)
    mask = torch.ones_like(ids)
    mask[0, max_length // 2 :] = 0  # right padding
    mask[1, : max_length // 3] = 0  # left padding
    batches = [{"input_ids": ids, "attention_mask": mask}]
    need = headwidget.estimate(model, batch_size=batch_size, max_length=max_length, **options)
    peak = allocated_peak(
        lambda: headwidget.capture(
            model, batches, batch_size=batch_size, max_length=max_length, progress=False, **options
        )
    )
    print(
        f"\n{name} {dtype} {batch_size}×{max_length} {options}: estimate {need / 2**20:.2f} MiB, "
        f"measured peak {peak / 2**20:.2f} MiB ({peak / need:.2f} of the estimate)"
    )
    assert peak <= need
    assert need < 10 * peak  # an upper bound, but not a useless one
