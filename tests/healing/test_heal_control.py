"""Stopping a healing run: an interrupt ends it at a step boundary with the weights of that step, a callback
can ask for a stop, a non-finite loss raises with the last good run; the Tracker plugs in as a callback."""

from __future__ import annotations

import math
import signal
from typing import Any

import pytest
import torch

import headwidget
from headwidget.errors import NonFiniteLossError
from healing_cases import held_out, llama, small_heal

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


class _Keeper:
    """Keeps each layer's K projection (the parametrized weight the forward uses) at every step's end,
    and does ``action`` at step ``at``."""

    def __init__(self, at: int, action: Any = None) -> None:
        self.at, self.action = at, action
        self.kept: dict[int, list[torch.Tensor]] = {}
        self.logged: list[float] = []

    def on_log(self, args: Any, state: Any, control: Any, logs: dict | None = None, **kwargs: Any) -> None:
        assert logs is not None
        self.logged.append(logs["loss"])

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.kept[state.global_step] = [
            a.self_attn.k_proj.weight.detach().clone() for a in model.model.layers
        ]
        if state.global_step == self.at and self.action is not None:
            self.action(control)


def _k_weights(model: torch.nn.Module) -> list[torch.Tensor]:
    return [layer.self_attn.k_proj.weight for layer in model.model.layers]


def test_an_interrupt_stops_at_the_step_boundary_with_that_steps_weights() -> None:
    model = llama()
    # what was installed before (Python's own handler, or SIG_IGN in a shell's background job)
    before = signal.getsignal(signal.SIGINT)
    keeper = _Keeper(2, lambda control: signal.raise_signal(signal.SIGINT))
    run = small_heal(headwidget.apply(model, "mqa"), model, tokens=512, callbacks=[keeper])
    assert run.stopped_early and run.steps == 2 and run.tokens_seen == 128
    assert [r["step"] for r in run.curve] == [0, 2]  # the stop measured the point it reached
    assert run.losses == keeper.logged
    for got, kept in zip(_k_weights(run.model), keeper.kept[2], strict=True):
        assert torch.equal(got, kept)
    assert signal.getsignal(signal.SIGINT) is before  # the handler is put back


def test_a_keyboard_interrupt_inside_a_callback_and_a_callback_asking_to_stop() -> None:
    model = llama()

    def interrupt(control: Any) -> None:
        raise KeyboardInterrupt

    run = small_heal(headwidget.apply(model, "mqa"), model, tokens=512, callbacks=[_Keeper(3, interrupt)])
    assert run.stopped_early and run.steps == 3 and run.curve[-1]["step"] == 3
    assert run.per_layer is not None and len(run.per_layer) == len(run.curve)

    def ask(control: Any) -> None:
        control.should_training_stop = True

    run = small_heal(headwidget.apply(model, "mqa"), model, tokens=512, callbacks=[_Keeper(1, ask)])
    assert run.stopped_early and run.steps == 1 and [r["step"] for r in run.curve] == [0, 1]


@pytest.mark.parametrize("micro_batch_size", [None, 2])
def test_a_non_finite_loss_raises_naming_the_step_with_the_last_good_run(micro_batch_size: Any) -> None:
    """(With micro-batches, the loss is read once a step, after the earlier ones' backward: their
    gradients are dropped with the step.)"""
    model = llama()

    def poison(control: Any) -> None:  # the original's head goes NaN: the next step's KD loss is NaN
        with torch.no_grad():
            model.lm_head.weight[0, 0] = math.nan

    keeper = _Keeper(2, poison)
    with pytest.raises(
        NonFiniteLossError, match=r"the healing loss is nan at step 3 of 4: training stopped"
    ) as err:
        small_heal(
            headwidget.apply(model, "mqa"), model, callbacks=[keeper], micro_batch_size=micro_batch_size
        )
    run = err.value.run
    assert isinstance(run, headwidget.HealingRun)
    assert run.steps == 2 and run.stopped_early
    for got, kept in zip(_k_weights(run.model), keeper.kept[2], strict=True):
        assert torch.equal(got, kept) and bool(torch.isfinite(got).all())


@pytest.mark.parametrize("micro_batch_size", [None, 2])
def test_a_non_finite_gradient_raises_naming_the_step_with_the_last_good_run(micro_batch_size: Any) -> None:
    """The loss stays finite; a trained tensor's gradient turns infinite from step 3 on: step 3 changes no
    weight (with micro-batches too, whose gradients are summed before the check)."""
    model = llama()

    class _Poison(_Keeper):
        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
            super().on_step_end(args, state, control, model=model, **kwargs)
            if state.global_step == self.at:
                trained = next(p for p in model.parameters() if p.requires_grad)
                trained.register_hook(lambda grad: torch.full_like(grad, math.inf))

    keeper = _Poison(2)
    message = r"the gradient norm is (inf|nan) \(loss [0-9.e-]+\) at step 3 of 4: training stopped"
    with pytest.raises(NonFiniteLossError, match=message) as err:
        small_heal(
            headwidget.apply(model, "mqa"), model, callbacks=[keeper], micro_batch_size=micro_batch_size
        )
    run = err.value.run
    assert run.steps == 2 and run.stopped_early and len(run.losses) == 2
    for got, kept in zip(_k_weights(run.model), keeper.kept[2], strict=True):
        assert torch.equal(got, kept) and bool(torch.isfinite(got).all())


def test_the_tracker_follows_a_healing_run_as_a_callback() -> None:
    model = llama()
    tracker = headwidget.Tracker(held_out(7), every=2, max_tokens=64)
    run = small_heal(headwidget.apply(model, "mqa"), model, callbacks=[tracker])
    timeline = tracker.timeline
    assert timeline.steps == [0, 2, 4]
    steps, losses = timeline.log_series("loss")
    assert steps == [1, 2, 3, 4] and losses == pytest.approx(run.losses)
    assert timeline[4].meta.layout.num_kv_heads == 1  # snapshots of the variant being healed
