"""heal() against what an attacker tries: token ids outside the vocabulary, a caller's no_grad or
inference_mode, the largest seed, Unicode digits in ``trainable``, windows shorter than the overlap
guard's runs or longer than the model's context, a conversion that changed nothing, interrupts while the
last point is measured or the run is being made, and a healed model that must train further."""

from __future__ import annotations

import signal
from typing import Any

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

import headwidget
from headwidget.errors import ArgumentError, CaptureInputError, HealingInputError
from headwidget.healing import _heal
from headwidget.healing._data import TrainingWindows
from healing_cases import family, held_out, llama, small_heal, stream
from tiny_models import VOCAB

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def pair() -> tuple[torch.nn.Module, torch.nn.Module]:
    model = llama()
    return model, headwidget.apply(model, "mqa")


def _weights(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: t.detach().clone() for n, t in model.state_dict().items()}


def _same(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[n], b[n]) for n in a)


# ------------------------------------------------------------------------------------------ token ids
@pytest.mark.parametrize(
    ("where", "bad", "message"),
    [
        (
            "eval_texts",
            -3,
            r"eval_texts: batch 0: its smallest token id is -3, but token ids cannot be negative",
        ),
        (
            "eval_texts",
            VOCAB,
            rf"eval_texts: batch 0: its largest token id is {VOCAB}, but LlamaForCausalLM's",
        ),
        ("texts", -1, r"texts: its smallest token id is -1, but token ids cannot be negative"),
        ("texts", 500, rf"texts: its largest token id is 500, but LlamaForCausalLM's vocabulary has {VOCAB}"),
    ],
)
def test_token_ids_outside_the_vocabulary_are_refused_with_a_sentence(pair, where, bad, message) -> None:
    model, variant = pair
    before = _weights(variant)
    texts, eval_texts = stream(1), held_out()
    if where == "texts":
        texts[0, 700] = bad
    else:
        eval_texts[2, 5] = bad
    with pytest.raises(CaptureInputError, match=message):
        small_heal(variant, model, texts=texts, eval_texts=eval_texts)
    assert _same(_weights(variant), before)


# ---------------------------------------------------------------------------------------- grad modes
@pytest.mark.parametrize("mode", ["no_grad", "inference_mode"])
def test_healing_under_no_grad_or_inference_mode_is_the_plain_run(pair, mode) -> None:
    model, variant = pair
    plain = small_heal(variant, model)
    with getattr(torch, mode)():
        run = small_heal(variant, model)
        assert not torch.is_grad_enabled()  # the caller's mode is back
        assert torch.is_inference_mode_enabled() == (mode == "inference_mode")
    assert run == plain and run.losses == plain.losses
    assert _same(_weights(run.model), _weights(plain.model))


# --------------------------------------------------------------------------------------------- seeds
def test_the_largest_seed_heals_and_small_seeds_keep_their_window_order(pair) -> None:
    model, variant = pair
    run = small_heal(variant, model, seed=2**63 - 1)
    assert run.seed == 2**63 - 1 and run.steps == 4
    windows = TrainingWindows.of(stream(1)[0], max_length=16, batch_size=4, tokens=256, seed=5)
    for epoch in range(3):  # runs saved before keep their order: the seed formula is unchanged below 2**64
        want = torch.randperm(64, generator=torch.Generator().manual_seed(5 * 1_000_003 + epoch))
        assert torch.equal(windows.order(epoch), want)
    big = TrainingWindows.of(stream(1)[0], max_length=16, batch_size=4, tokens=256, seed=2**63 - 1)
    assert sorted(big.order(7).tolist()) == list(range(64))


@pytest.mark.parametrize("digits", ["８", "٣", "३", "𝟠"])
def test_trainable_lora_takes_ascii_digits_only(pair, digits) -> None:
    model, variant = pair
    with pytest.raises(ArgumentError, match=r"trainable='lora:.*' is not one of .* in ASCII digits"):
        small_heal(variant, model, trainable=f"lora:{digits}")


# --------------------------------------------------------------------------------- the overlap guard
def test_windows_shorter_than_a_run_are_judged_by_their_texts(pair) -> None:
    """max_length=2: each evaluation sequence is two tokens. Two tokens found in the healing text are
    no overlap when the texts they begin are not in it; the same texts still are."""
    model, variant = pair
    texts = stream(1)[0]
    other = torch.randint(1, VOCAB, (6, 38), generator=torch.Generator().manual_seed(77))
    starts = torch.stack([texts[100 * k + 3 : 100 * k + 5] for k in range(6)])
    eval_texts = torch.cat([starts, other], dim=1)  # rows of 40 whose first 2 tokens are healing text
    run = small_heal(variant, model, texts=texts.reshape(1, -1), eval_texts=eval_texts, max_length=2)
    assert run.evaluation_tokens == 12 and run.steps == 32  # 256 tokens in steps of 4 windows of 2
    same = torch.stack([texts[100 * k : 100 * k + 40] for k in range(6)])
    with pytest.raises(HealingInputError, match=r"overlap: 6 run\(s\) of 32 tokens of the evaluation texts"):
        small_heal(variant, model, texts=texts.reshape(1, -1), eval_texts=same, max_length=2)


def test_evaluation_batches_from_an_iterator_with_windows_shorter_than_a_run(pair) -> None:
    model, variant = pair
    rows = held_out()
    batches = iter([{"input_ids": rows[:3]}, {"input_ids": rows[3:]}])  # read twice at max_length < 32
    run = small_heal(variant, model, eval_texts=batches, max_length=8)
    assert run.evaluation_tokens == 6 * 8


def test_a_window_longer_than_the_model_s_context_is_refused() -> None:
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=2, n_head=4, n_positions=16))
    gpt2 = gpt2.to(torch.float64).eval()
    with pytest.raises(HealingInputError, match=r"max_length=32 is longer than the model's context of 16"):
        small_heal(headwidget.apply(gpt2, "mqa"), gpt2, max_length=32)


def test_a_conversion_that_changed_nothing_is_refused() -> None:
    mqa_model = family("llama_mqa")  # one KV head already
    with pytest.raises(
        HealingInputError, match=r"the 'mqa' variant is the model itself: its layers \[0, 1\]"
    ):
        small_heal(headwidget.apply(mqa_model, "mqa"), mqa_model)
    gqa = family("llama_gqa")  # 2 KV heads: gqa:2 is the model, partial RoPE is not
    with pytest.raises(HealingInputError, match=r"nothing to recover"):
        small_heal(headwidget.apply(gqa, "gqa:2"), gqa)


# --------------------------------------------------------------------------------------- interrupts
class _Presser:
    """A callback that presses Ctrl-C (a real SIGINT) at the end of step ``at``."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.kept: dict[int, dict[str, torch.Tensor]] = {}

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.kept[state.global_step] = {
            f"{i}": a.self_attn.k_proj.weight.detach().clone() for i, a in enumerate(model.model.layers)
        }
        if state.global_step == self.at:
            signal.raise_signal(signal.SIGINT)


@pytest.fixture
def press_while_measuring(monkeypatch) -> list[int]:
    """Once armed (a list holding True), every evaluation point starts with a Ctrl-C (a real SIGINT)."""
    armed: list[int] = []
    point = _heal._Evaluation.point

    def pressed(self, *args: Any) -> None:
        if armed:
            armed.append(1)
            signal.raise_signal(signal.SIGINT)
        point(self, *args)

    monkeypatch.setattr(_heal._Evaluation, "point", pressed)
    return armed


def test_further_presses_while_the_last_point_is_measured_keep_the_run(pair, press_while_measuring) -> None:
    """Press 1 at step 1 (stop at the boundary), press 2 as that point is measured (dropped), press 3 as
    it is measured again: the run comes back, with step 1's weights and the curve as far as measured."""
    model, variant = pair
    presser = _Presser(1)

    class Arm:
        def on_step_end(self, *args: Any, **kwargs: Any) -> None:
            press_while_measuring.append(1)

    try:
        run = small_heal(variant, model, tokens=512, callbacks=[presser, Arm()])
    except KeyboardInterrupt:
        pytest.fail("a further Ctrl-C while the last point was measured lost the run")
    assert len(press_while_measuring) == 3  # armed, then two presses while measuring
    assert run.stopped_early and run.steps == 1 and [r["step"] for r in run.curve] == [0]
    assert run.per_layer is not None and len(run.per_layer) == 1
    for i, layer in enumerate(run.model.model.layers):
        assert torch.equal(layer.self_attn.k_proj.weight, presser.kept[1][f"{i}"])


def test_a_press_while_the_run_is_made_waits_for_it(pair, monkeypatch) -> None:
    model, variant = pair
    write_back = _heal.TrainableParts.write_back

    def pressed(self: Any) -> None:
        signal.raise_signal(signal.SIGINT)
        signal.raise_signal(signal.SIGINT)
        write_back(self)

    monkeypatch.setattr(_heal.TrainableParts, "write_back", pressed)
    try:
        run = small_heal(variant, model)
    except KeyboardInterrupt:
        pytest.fail("Ctrl-C while the weights were written back lost the run")
    assert run.steps == 4 and not run.stopped_early and [r["step"] for r in run.curve] == [0, 2, 4]


# ------------------------------------------------------------------------------------ the healed model
def test_the_healed_model_has_the_variant_s_flags_and_trains_further(pair) -> None:
    model, _ = pair
    variant = headwidget.apply(model, "mqa")
    variant.model.embed_tokens.weight.requires_grad_(False)  # frozen by its owner: stays frozen
    variant.train()
    flags = {n: p.requires_grad for n, p in variant.named_parameters()}
    run = small_heal(variant, model)
    healed = run.model
    assert {n: p.requires_grad for n, p in healed.named_parameters()} == flags
    assert sum(flags.values()) == len(flags) - 1
    assert healed.training and all(m.training for m in healed.modules())
    assert {n: p.requires_grad for n, p in variant.named_parameters()} == flags  # the variant untouched
    healed.eval()
    before = healed.model.layers[1].self_attn.k_proj.weight.detach().clone()
    optimizer = torch.optim.SGD([p for p in healed.parameters() if p.requires_grad], lr=1e-2)
    ids = held_out(5, rows=2, length=16)
    healed(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()
    assert not torch.equal(healed.model.layers[1].self_attn.k_proj.weight, before)
