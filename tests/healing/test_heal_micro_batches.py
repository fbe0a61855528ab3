"""``heal(micro_batch_size=m)`` runs a step's windows m at a time and sums their gradients: the same steps
as the whole batch (float64 models: to float64 rounding), with one micro-batch's activations alive."""

from __future__ import annotations

from typing import Any

import pytest
import torch

import headwidget
from healing_cases import family, llama, small_heal


def _same_run(got: headwidget.HealingRun, want: headwidget.HealingRun) -> None:
    assert got.losses == pytest.approx(want.losses, rel=1e-12)
    for got_row, want_row in zip(got.curve, want.curve, strict=True):
        assert got_row == pytest.approx(want_row, rel=1e-10, abs=1e-12)
    for (name, x), (_, y) in zip(
        got.model.state_dict().items(), want.model.state_dict().items(), strict=True
    ):
        assert torch.allclose(x, y, rtol=0, atol=1e-12), name


class _Forwards:
    """Callback: the batch sizes the trained model's first layer sees in its forwards with gradients
    (training; the evaluation points run without)."""

    def __init__(self) -> None:
        self.rows: list[int] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        first = model.encoder.layer[0] if hasattr(model, "encoder") else model.model.layers[0]
        first.register_forward_pre_hook(self.seen)

    def seen(self, _module: Any, args: tuple[Any, ...]) -> None:
        if torch.is_grad_enabled():
            self.rows.append(int(args[0].shape[0]))


@pytest.mark.parametrize(
    ("name", "spec", "options"),
    [
        ("llama", "mqa", {}),
        ("llama", "mqa", {"method": "lm"}),
        ("llama", "mla:8@1-2", {"trainable": "lora:2", "checkpoint": True}),
        ("llama", "share:2@0-1", {"checkpoint": True}),
        ("bert", "mqa", {}),
    ],
)
@pytest.mark.parametrize("micro", [1, 3])
def test_micro_batches_train_the_steps_of_the_whole_batch(
    name: str, spec: str, options: dict, micro: int
) -> None:
    """4 windows a step in micro-batches of 1 (four equal parts) or 3 (parts of 3 and 1 windows, weighted
    3/4 and 1/4): the losses, the curve and the healed weights of the whole-batch heal."""
    model = llama() if name == "llama" else family(name)
    whole = small_heal(headwidget.apply(model, spec), model, **options)
    seen = _Forwards()
    parts = small_heal(
        headwidget.apply(model, spec), model, micro_batch_size=micro, callbacks=[seen], **options
    )
    _same_run(parts, whole)
    # every step's forwards (and a checkpoint's recomputation) run micro-batches, never the whole batch
    assert 4 not in seen.rows and max(seen.rows) == micro


@pytest.mark.parametrize("micro", [0, 5, 2.5, "2"])
def test_a_micro_batch_size_outside_the_step_is_refused(micro: Any) -> None:
    model = llama()
    with pytest.raises(headwidget.ArgumentError, match="micro_batch_size"):
        small_heal(headwidget.apply(model, "mqa"), model, micro_batch_size=micro)


def test_the_estimate_counts_one_micro_batch() -> None:
    model = llama()
    whole, parts = (
        headwidget.estimate_healing("mqa", model, batch_size=8, max_length=64, micro_batch_size=m)
        for m in (None, 2)
    )
    assert parts < whole
    assert headwidget.estimate_healing("mqa", model, batch_size=8, max_length=64, micro_batch_size=8) == whole
