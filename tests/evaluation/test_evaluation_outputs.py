"""What evaluate keeps of a forward: the head computes only the predicted rows, which equal the rows of the
model's full logits (bit for bit in float32), in every family, with a rescaled head, and only in the
runner's own thread."""

from __future__ import annotations

import threading

import pytest
import torch
from transformers import CohereConfig, CohereForCausalLM, Gemma2Config, Gemma2ForCausalLM

from headwidget.capture.inputs import Batch
from headwidget.evaluation._inputs import forward_kwargs
from headwidget.evaluation._outputs import OutputRunner, _head_on_rows
from headwidget.evaluation.measures import predicted_positions
from tiny_models import FACTORIES, VOCAB, make_model

CAUSAL = [name for name in FACTORIES if name != "bert"]


def ragged_scored_batch() -> Batch:
    """Right and left padding, and a ``scored`` mask that leaves some real tokens unscored (as a
    sliding window does)."""
    gen = torch.Generator().manual_seed(4)
    ids = torch.randint(1, VOCAB, (3, 11), generator=gen)
    mask = torch.ones(3, 11, dtype=torch.long)
    mask[0, 8:] = 0
    mask[2, :3] = 0
    scored = mask.clone()
    scored[1, :6] = 0
    return Batch(ids, mask, scored)


def full_rows(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """The predicted rows picked out of the model's whole (B, T, V) logits, and their targets."""
    runner = OutputRunner.for_model(model)
    with torch.no_grad():
        logits = model(**forward_kwargs(model, batch, runner.device)).logits
    keep = predicted_positions(batch.attention_mask, batch.scored)
    return logits[:, :-1][keep], batch.input_ids[:, 1:][keep]


def head_outputs(model: torch.nn.Module) -> tuple[list[tuple[int, ...]], torch.utils.hooks.RemovableHandle]:
    shapes: list[tuple[int, ...]] = []
    handle = model.get_output_embeddings().register_forward_hook(
        lambda m, a, out: shapes.append(tuple(out.shape))
    )
    return shapes, handle


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("name", CAUSAL)
def test_the_head_computes_only_the_predicted_rows(name: str, dtype: torch.dtype) -> None:
    model = make_model(name, dtype=dtype)
    batch = ragged_scored_batch()
    want, targets = full_rows(model, batch)
    shapes, handle = head_outputs(model)
    try:
        out = OutputRunner.for_model(model)(model, batch)
    finally:
        handle.remove()
    assert shapes == [(1, targets.numel(), VOCAB)]  # no (B, T, V) logits were made
    assert torch.equal(out.targets, targets)
    if dtype == torch.float32:
        assert torch.equal(out.values, want)
    else:  # float64 products of other shapes may round apart
        torch.testing.assert_close(out.values, want, rtol=1e-13, atol=1e-13)
    assert out.values.is_contiguous() and out.values.shape == want.shape


@pytest.mark.parametrize(
    "model",
    [
        lambda: Gemma2ForCausalLM(
            Gemma2Config(
                vocab_size=VOCAB,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                head_dim=8,
                final_logit_softcapping=2.0,
            )
        ),
        lambda: CohereForCausalLM(
            CohereConfig(
                vocab_size=VOCAB,
                hidden_size=32,
                intermediate_size=64,
                num_hidden_layers=2,
                num_attention_heads=4,
                num_key_value_heads=2,
                logit_scale=0.5,
            )
        ),
    ],
    ids=["gemma2-softcap", "cohere-scale"],
)
def test_a_rescaled_head_output_is_rescaled_row_by_row(model) -> None:
    torch.manual_seed(0)
    m = model().eval()
    batch = ragged_scored_batch()
    want, _ = full_rows(m, batch)
    out = OutputRunner.for_model(m)(m, batch)
    assert torch.equal(out.values, want)
    assert float(want.abs().max()) > 0


def test_a_head_not_called_on_the_hidden_states_gives_the_full_logits_rows() -> None:
    model = make_model("llama_gqa", dtype=torch.float32)
    batch = ragged_scored_batch()
    want, _ = full_rows(model, batch)
    model.get_output_embeddings = lambda: torch.nn.Identity()  # a module the forward never calls
    out = OutputRunner.for_model(model)(model, batch)
    assert torch.equal(out.values, want)


def test_the_head_picks_rows_only_in_the_runners_thread() -> None:
    model = make_model("gpt2", dtype=torch.float32)
    batch = ragged_scored_batch()
    keep = predicted_positions(batch.attention_mask, batch.scored)
    seen: list[tuple[int, ...]] = []

    def other() -> None:
        with torch.no_grad():
            seen.append(tuple(model(batch.input_ids, attention_mask=batch.attention_mask).logits.shape))

    with _head_on_rows(model, keep) as picked:
        thread = threading.Thread(target=other)
        thread.start()
        thread.join()
        assert picked == []
        with torch.no_grad():
            mine = model(batch.input_ids, attention_mask=batch.attention_mask).logits
    assert seen == [(3, 11, VOCAB)]  # another thread's forward is the model's own
    assert picked == [True] and tuple(mine.shape) == (1, int(keep.sum()), VOCAB)
    after = model(batch.input_ids, attention_mask=batch.attention_mask).logits
    assert tuple(after.shape) == (3, 11, VOCAB)  # the hook is gone


def test_after_a_prefill_the_head_computes_only_the_predicted_rows() -> None:
    """prefill:P: the prefill's forward keeps one position's logits, the scored forward its predicted rows
    alone, the same rows as the model's whole forward (to float32 rounding: another attention path)."""
    from headwidget.evaluation._prefill import PrefillRunner, prefill_batches

    model = make_model("llama_gqa", dtype=torch.float32)
    ids = torch.randint(1, VOCAB, (3, 12), generator=torch.Generator().manual_seed(6))
    mask = torch.ones_like(ids)
    mask[1, 9:] = 0
    [batch] = prefill_batches([Batch(ids, mask)], 4)
    shapes, handle = head_outputs(model)
    try:
        out = PrefillRunner.for_model(model, 4)(model, batch)
    finally:
        handle.remove()
    want, targets = full_rows(model, batch)
    assert shapes == [(3, 1, VOCAB), (1, targets.numel(), VOCAB)]
    assert torch.equal(out.targets, targets)
    torch.testing.assert_close(out.values, want, rtol=1e-5, atol=1e-5)
