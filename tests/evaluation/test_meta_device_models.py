"""A model on the meta device (shapes without weights) is refused with a sentence by every function that
computes with it, before any work; the estimates, which need shapes only, still take it."""

from __future__ import annotations

import pytest
import torch

import headwidget
from headwidget.errors import ArgumentError
from tiny_models import VOCAB, make_model, three_layer_llama

MESSAGE = (
    r"model has no weights to compute with: its parameter model\.embed_tokens\.weight is on the meta "
    r"device .* Load its weights first"
)


@pytest.fixture(scope="module")
def meta() -> torch.nn.Module:
    with torch.device("meta"):
        return make_model("llama_gqa", dtype=torch.float32)


IDS = torch.randint(1, VOCAB, (2, 24), generator=torch.Generator().manual_seed(0))
CALLS = {
    "capture": lambda m: headwidget.capture(m, IDS, progress=False),
    "evaluate": lambda m: headwidget.evaluate(m, IDS, ["model", "mqa"], progress=False),
    "apply": lambda m: headwidget.apply(m, "mqa"),
    "allocate": lambda m: headwidget.allocate(m, IDS, budget=0.5, candidates=["mqa"], progress=False),
}


@pytest.mark.parametrize("name", list(CALLS))
def test_a_meta_model_is_refused(meta, name) -> None:
    with pytest.raises(ArgumentError, match=MESSAGE):
        CALLS[name](meta)


def test_healing_a_meta_model_or_variant_is_refused(meta) -> None:
    model = three_layer_llama(seed=0)
    variant = headwidget.apply(model, "mqa")
    with pytest.raises(ArgumentError, match=r"model has no weights to compute with"):
        headwidget.heal(variant, meta, IDS, eval_texts=IDS, progress=False)
    variant.to("meta")
    with pytest.raises(ArgumentError, match=r"variant has no weights to compute with"):
        headwidget.heal(variant, model, IDS, eval_texts=IDS, progress=False)


def test_the_estimates_still_take_a_meta_model(meta) -> None:
    """A meta model stands for one on an accelerator: its evaluate estimate is the CPU model's less the
    fits, which are made and kept in the host's memory (checked apart), as many bytes as the variant's
    own attention modules hold in ``dtype`` (the estimate's bound on them is within 1 % here)."""
    real = make_model("llama_gqa", dtype=torch.float32)
    assert headwidget.estimate(meta) == headwidget.estimate(real)
    variant = headwidget.apply(real, "mqa")
    attention = [layer.self_attn for layer in variant.model.layers]
    fitted = sum(p.numel() * p.element_size() for module in attention for p in module.parameters())
    for variants in (["model", "mqa"], ["mqa"]):
        on_cpu = headwidget.estimate_evaluation(real, variants, dtype=torch.float32, batch_size=8)
        on_device = headwidget.estimate_evaluation(meta, variants, dtype=torch.float32, batch_size=8)
        assert fitted <= on_cpu - on_device <= 1.01 * fitted, variants
        # where="host": the fits, and the float64 fitting beside them (more than the fits themselves)
        host = headwidget.estimate_evaluation(meta, variants, dtype=torch.float32, where="host")
        assert host > on_cpu - on_device
        assert headwidget.estimate_evaluation(real, variants, dtype=torch.float32, where="host") == 0
    options = {"candidates": ["model", "mqa"], "dtype": torch.float32, "max_tokens": 512}
    assert headwidget.estimate_allocation(meta, where="host", **options) > fitted
    assert headwidget.estimate_allocation(real, where="host", **options) == 0
    with pytest.raises(ArgumentError, match=r"where must be 'device' or 'host' .*, got 'gpu'"):
        headwidget.estimate_evaluation(meta, ["mqa"], where="gpu")
