"""capture leaves the model exactly as it was, whatever happens inside it."""

from __future__ import annotations

import pytest
import torch

import headwidget
from tiny_models import make_model, ragged_batches


def hook_counts(model: torch.nn.Module) -> tuple[int, int]:
    fwd = sum(len(m._forward_hooks) for m in model.modules())
    pre = sum(len(m._forward_pre_hooks) for m in model.modules())
    return fwd, pre


def attention_registry() -> dict:
    from transformers.modeling_utils import AttentionInterface

    return dict(AttentionInterface._global_mapping)


@pytest.mark.parametrize("name", ["llama_gqa", "gpt2", "deepseek_v2", "bert"])
def test_outputs_bitwise_identical_and_hooks_gone(name):
    model = make_model(name, dtype=torch.float32)
    batch = ragged_batches()[0]
    with torch.no_grad():
        before = model(**batch)[0].clone()
    registry = attention_registry()
    rope = "both" if name in ("llama_gqa", "deepseek_v2") else "pre"
    headwidget.capture(model, [batch], rope=rope, inputs=True, cross_layer=True, progress=False)
    assert hook_counts(model) == (0, 0)
    assert attention_registry() == registry
    with torch.no_grad():
        after = model(**batch)[0]
    assert torch.equal(before, after)


def test_outputs_identical_while_hooked():
    """The forward pass that capture runs is the model's own: compare attention outputs inside it."""
    model = make_model("llama_gqa", dtype=torch.float32)
    batch = ragged_batches()[0]
    attn = model.model.layers[1].self_attn
    seen = []
    handle = attn.register_forward_hook(lambda m, a, out: seen.append(out[0].clone()))
    try:
        with torch.no_grad():
            model(**batch)
        headwidget.capture(model, [batch], rope="both", progress=False)
    finally:
        handle.remove()
    assert len(seen) == 2 and torch.equal(seen[0], seen[1])


def test_forward_stops_after_the_last_captured_layer():
    model = make_model("llama_gqa", dtype=torch.float32)
    calls = []
    handles = [
        model.model.layers[1].self_attn.register_forward_pre_hook(lambda *a: calls.append("attn1")),
        model.model.layers[1].mlp.register_forward_pre_hook(lambda *a: calls.append("mlp1")),
        model.lm_head.register_forward_hook(lambda *a: calls.append("lm_head")),
    ]
    try:
        headwidget.capture(model, ragged_batches(), layers=[0], progress=False)
        assert calls == []
        headwidget.capture(model, ragged_batches(), progress=False)
        assert calls == ["attn1", "attn1"]  # the last attention runs; its MLP and the LM head do not
    finally:
        for h in handles:
            h.remove()


def test_training_flags_and_requires_grad_untouched():
    model = make_model("llama_gqa", dtype=torch.float32)
    model.train()
    model.model.layers[0].eval()
    model.lm_head.weight.requires_grad_(False)
    flags = {n: m.training for n, m in model.named_modules()}
    grads = {n: p.requires_grad for n, p in model.named_parameters()}
    stats = headwidget.capture(model, ragged_batches(), progress=False)
    assert {n: m.training for n, m in model.named_modules()} == flags
    assert {n: p.requires_grad for n, p in model.named_parameters()} == grads
    assert all(p.grad is None for p in model.parameters())
    # Dropout is off during capture: two captures of the same data agree exactly.
    again = headwidget.capture(model, ragged_batches(), progress=False)
    assert torch.equal(stats.moments(0, "key").m2, again.moments(0, "key").m2)
    assert not stats.moments(0, "key").m2.requires_grad


class Boom(Exception):
    pass


def failing_batches(exc: BaseException):
    yield ragged_batches()[0]
    raise exc


@pytest.mark.parametrize("exc", [Boom("data loader failed"), KeyboardInterrupt()])
def test_hooks_removed_after_exception_inside_capture(exc):
    model = make_model("llama_gqa", dtype=torch.float32)
    model.train()
    registry = attention_registry()
    with pytest.raises(type(exc)):
        headwidget.capture(model, failing_batches(exc), rope="both", progress=False)
    assert hook_counts(model) == (0, 0)
    assert attention_registry() == registry
    assert model.training and all(m.training for m in model.modules())


def test_error_raised_from_inside_a_hook_removes_hooks():
    model = make_model("llama_gqa", dtype=torch.float32)
    with torch.no_grad():
        model.model.layers[1].self_attn.v_proj.weight[0, 0] = float("inf")
    with pytest.raises(headwidget.NonFiniteActivationError, match="layer 1"):
        headwidget.capture(model, ragged_batches(), progress=False)
    assert hook_counts(model) == (0, 0)


def test_statistics_live_on_the_layer_device():
    model = make_model("gpt2", dtype=torch.float32)
    stats = headwidget.capture(model, ragged_batches(), progress=False)
    assert stats.moments(0, "key").m2.device == next(model.parameters()).device
    assert stats.moments(0, "key").m2.dtype == torch.float64
