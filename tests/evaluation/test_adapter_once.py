"""evaluate, allocate and heal resolve the given model's adapter once per call and pass it down (a copy
of the model has its own modules, so its adapter is its own)."""

from __future__ import annotations

import pytest
import torch

import headwidget
from headwidget.adapters import base
from tiny_models import make_model


@pytest.fixture
def adapters_of(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """The models an adapter is made for, in order."""
    made: list[object] = []
    init = base.Adapter.__init__

    def record(self: base.Adapter, model: torch.nn.Module) -> None:
        made.append(model)
        init(self, model)

    monkeypatch.setattr(base.Adapter, "__init__", record)
    return made


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])  # a shared copy, a cast copy
def test_evaluate_resolves_the_models_adapter_once(adapters_of: list[object], dtype: torch.dtype) -> None:
    model = make_model("llama_gqa", dtype=torch.float32)
    ids = torch.randint(0, 64, (4, 24), generator=torch.Generator().manual_seed(0))
    adapters_of.clear()
    headwidget.evaluate(model, ids, ["model", "mqa", "kv:int4"], dtype=dtype, per_layer=True, progress=False)
    assert sum(m is model for m in adapters_of) == 1


def test_allocate_resolves_the_models_adapter_once(adapters_of: list[object]) -> None:
    model = make_model("llama_gqa", dtype=torch.float32)
    ids = torch.randint(0, 64, (4, 24), generator=torch.Generator().manual_seed(0))
    adapters_of.clear()
    headwidget.allocate(
        model, ids, budget=0.6, candidates=["model", "mqa"], dtype=torch.float32, progress=False
    )
    assert sum(m is model for m in adapters_of) == 1


def test_heal_resolves_the_models_adapter_once(adapters_of: list[object]) -> None:
    model = make_model("llama_gqa", dtype=torch.float32)
    variant = headwidget.apply(model, "mqa")
    g = torch.Generator().manual_seed(0)
    adapters_of.clear()
    headwidget.heal(
        variant,
        model,
        torch.randint(0, 64, (1, 2048), generator=g),
        tokens=256,
        batch_size=4,
        max_length=32,
        eval_texts=torch.randint(0, 64, (4, 32), generator=g),
        eval_every=256,
        progress=False,
    )
    assert sum(m is model for m in adapters_of) == 1
