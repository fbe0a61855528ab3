"""Strings are batched by length: the same tokens are counted as in text order, and far fewer padded
positions are computed (``capture.inputs.length_batches``, used by ``capture`` and ``evaluate``)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headwidget
from headwidget.adapters import adapter_for
from headwidget.capture.inputs import iter_batches, length_batches
from tiny_models import FACTORIES, ROPE_FAMILIES, VOCAB, attention_modules, make_model, reference_activations

#: Real tokens per text, in text order: an empty text among them, and a budget (30) that ends inside
#: the sixth text (13 + 3 + 9 + 2 + 0 = 27, then 3 of the 11 of "11").
LENGTHS = (13, 3, 0, 9, 2, 11, 5, 7)
BUDGET = 30


class IdTokenizer:
    """A tokenizer for texts of space-separated token ids (what ``capture`` calls on strings)."""

    pad_token_id = 0

    def __call__(self, texts, truncation=False, max_length=None, padding=False, add_special_tokens=True):
        rows = [[int(w) for w in t.split()] for t in texts]
        return {"input_ids": [r[:max_length] if truncation and max_length else r for r in rows]}


def id_texts(seed: int = 3) -> tuple[list[str], list[torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    rows = [torch.randint(1, VOCAB, (n,), generator=gen) for n in LENGTHS]
    return [" ".join(map(str, r.tolist())) for r in rows], rows


def one_row_batches(rows: list[torch.Tensor]) -> list[dict]:
    """Each non-empty row a batch of its own, in text order (nothing padded)."""
    return [
        {"input_ids": r[None], "attention_mask": torch.ones(1, len(r), dtype=torch.long)}
        for r in rows
        if len(r)
    ]


def test_rows_are_grouped_shortest_first_with_the_budgets_row_last():
    texts, rows = id_texts()
    batches = list(length_batches(texts, IdTokenizer(), batch_size=2, max_tokens=BUDGET))
    lengths = [b.attention_mask.sum(-1).tolist() for b in batches]
    assert lengths == [[2, 3], [9, 13], [11]]  # the 11-token text is where the budget ends
    for batch, got in zip(batches, lengths, strict=True):
        for ids, n in zip(batch.input_ids, got, strict=True):
            assert any(torch.equal(ids[:n], r) for r in rows)  # each row whole, right-padded
    in_order = list(iter_batches(texts, IdTokenizer(), batch_size=2))
    assert sum(b.input_ids.numel() for b in batches) < sum(b.input_ids.numel() for b in in_order[:3])
    # without a budget every non-empty text, shortest first; ids and dict batches are left as given
    every = [b.attention_mask.sum(-1).tolist() for b in length_batches(texts, IdTokenizer(), batch_size=3)]
    assert every == [[2, 3, 5], [7, 9, 11], [13]]
    given = one_row_batches(rows)
    assert [b.input_ids.shape[1] for b in length_batches(given, batch_size=3)] == [13, 3, 9, 2, 11, 5, 7]
    # skip_first_token counts one token fewer per row: 12 + 2 + 8 + 1 = 23, then the 11-token row
    skipped = list(length_batches(texts, IdTokenizer(), batch_size=8, max_tokens=26, skip_first_token=True))
    assert skipped[0].attention_mask.sum(-1).tolist() == [2, 3, 9, 13, 11]


@pytest.mark.parametrize("name", sorted(FACTORIES))
def test_a_capture_of_strings_counts_the_first_tokens_in_text_order(name):
    """The statistics of a budget over strings batched by length are the float64 reference's first
    ``BUDGET`` tokens in text order; the forwards compute fewer positions than batches in text order."""
    model = make_model(name)
    texts, rows = id_texts()
    shapes: list[tuple[int, int]] = []
    hook = attention_modules(model)[0].register_forward_pre_hook(
        lambda module, args, kwargs: shapes.append(
            tuple((args[0] if args else kwargs["hidden_states"]).shape[:2])
        ),
        with_kwargs=True,
    )
    rope = "both" if name in ROPE_FAMILIES else "pre"
    try:
        stats = headwidget.capture(
            model, texts, tokenizer=IdTokenizer(), batch_size=3, max_tokens=BUDGET, rope=rope, progress=False
        )
    finally:
        hook.remove()
    assert stats.tokens == BUDGET
    # rows of 2, 3, 9 then 13 and the budget's 11-token row (cut after its 3 counted tokens when causal)
    assert shapes == [(3, 9), (2, 13)]
    # in text order: rows (13, 3, empty), then (9, 2, 11), cut at position 9 when causal
    in_text_order = 3 * 13 + 3 * (9 if adapter_for(model).causal else 11)
    assert sum(b * t for b, t in shapes) == 53 < in_text_order
    ref = reference_activations(name, model, one_row_batches(rows))
    for layer in stats.layers:
        for kind in stats.kinds:
            x = ref[layer][kind][:BUDGET]
            # float32 RoPE tables (and DeepSeek's latent norm), as in test_capture_families
            rounded = kind == "key_post" or (name.startswith("deepseek") and kind != "input")
            atol = 1e-6 if rounded else 1e-8
            np.testing.assert_allclose(stats.covariance(layer, kind), np.cov(x.T), atol=atol, rtol=1e-6)


def test_evaluate_on_strings_equals_evaluate_on_the_same_rows_in_text_order():
    model = make_model("llama_gqa")
    texts, rows = id_texts()
    options = {"dtype": torch.float64, "max_tokens": BUDGET, "progress": False}
    by_length = headwidget.evaluate(
        model, texts, ["model", "mqa"], tokenizer=IdTokenizer(), batch_size=3, **options
    )
    first = []  # the first BUDGET tokens in text order, one row per batch
    left = BUDGET
    for r in rows:
        if len(r) and left > 0:
            first.append(r[:left])
            left -= min(left, len(r))
    alone = headwidget.evaluate(model, one_row_batches(first), ["model", "mqa"], batch_size=1, **options)
    assert by_length.tokens == alone.tokens == BUDGET - len(first)
    for spec in ("model", "mqa"):
        assert by_length.nll[spec] == pytest.approx(alone.nll[spec], rel=1e-12, abs=1e-12)
        assert by_length.kl[spec] == pytest.approx(alone.kl[spec], rel=1e-9, abs=1e-12)
