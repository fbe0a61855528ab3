"""heal's memory: the trained copy shares every frozen tensor with the teacher (one copy in memory, the
original untouched), the head runs in chunks with the numbers of the whole logits, ``checkpoint=True``
recomputes each layer with the same numbers, the estimate holds the measured peak within 0.8–1.2, and a
budget too small is refused before any work."""

from __future__ import annotations

import gc
from typing import Any

import pytest
import torch

import headwidget
import headwidget.healing._chunked as chunked
import headwidget.healing._heal as heal_module
from headwidget.errors import MemoryBudgetError
from healing_cases import F64, held_out, llama, small_heal, stream
from memory_peak import allocated_peak
from tiny_models import make_model

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


class _Grab:
    """A healing callback that notes, when training begins, each parameter of the model being trained:
    the parameter, its storage and its ``requires_grad``."""

    def __init__(self) -> None:
        self.params: dict[str, tuple[torch.nn.Parameter, int, bool]] = {}

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.params = {n: (p, _storage(p), p.requires_grad) for n, p in model.named_parameters()}


@pytest.mark.parametrize("trainable", ["kv", "attention", "lora:2"])
def test_the_trained_copy_shares_every_unconverted_tensor_with_the_original(trainable: str) -> None:
    model = llama()
    variant = headwidget.apply(model, "mqa", layers=[1])
    before = {n: t.clone() for n, t in model.state_dict().items()}
    grab = _Grab()
    run = small_heal(variant, model, trainable=trainable, callbacks=[grab])
    theirs = dict(model.named_parameters())
    shared = own = 0
    for name, (p, storage, trained) in grab.params.items():
        if ".layers.1.self_attn." in name:  # the converted attention: the copy's own
            assert all(storage != _storage(t) for t in model.parameters()), name
            own += 1
        elif name in theirs:
            assert p is not theirs[name] and not trained, name
            assert storage == _storage(theirs[name]), name
            shared += 1
    assert shared == len(theirs) - 4 and own > 0  # every parameter but layer 1's q, k, v, o
    for name, t in model.state_dict().items():  # the original is bit-identical, its flags its own
        assert torch.equal(t, before[name]), name
    # the healed model shares its frozen tensors with the variant, never with the original
    mine = {_storage(t) for t in run.model.state_dict().values()}
    assert not mine & {_storage(t) for t in model.state_dict().values()}
    given = dict(variant.named_parameters())
    for name, p in run.model.named_parameters():
        if ".layers.1.self_attn." not in name:
            assert _storage(p) == _storage(given[name]), name


def test_training_everything_shares_nothing() -> None:
    model = llama()
    grab = _Grab()
    small_heal(headwidget.apply(model, "mqa", layers=[1]), model, trainable="all", callbacks=[grab])
    ours = {_storage(p) for p in model.parameters()}
    assert grab.params and all(storage not in ours for _, storage, _ in grab.params.values())


def _whole_logits(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Record whether each heal ran its head in chunks; the second list entry onwards forced whole."""
    taken: list[bool] = []
    original = heal_module._chunked_heads

    def spy(*args: Any, **kwargs: Any) -> Any:
        heads = original(*args, **kwargs)
        taken.append(heads is not None)
        return heads if len(taken) == 1 else None

    monkeypatch.setattr(heal_module, "_chunked_heads", spy)
    return taken


@pytest.mark.parametrize(("name", "method"), [("llama", "kd"), ("llama", "lm"), ("gpt2", "kd")])
def test_a_heal_with_the_head_in_chunks_equals_the_whole_logits_heal(
    monkeypatch: pytest.MonkeyPatch, name: str, method: str
) -> None:
    """Float32 models, chunks of 3 rows: the losses, the curve and the healed weights equal the heal that
    forms every logit (the loss before this change) to float32 rounding."""
    monkeypatch.setattr(chunked, "CHUNK_BYTES", 3 * 4 * 96)
    model = (llama() if name == "llama" else make_model("gpt2", dtype=F64, seed=2)).float()
    taken = _whole_logits(monkeypatch)
    runs = [small_heal(headwidget.apply(model, "mqa"), model, method=method) for _ in range(2)]
    assert taken == [True, True]  # the first in chunks, the second forced whole
    chunks, whole = runs
    assert chunks.losses == pytest.approx(whole.losses, rel=1e-5)
    for got, want in zip(chunks.curve, whole.curve, strict=True):
        assert got == pytest.approx(want, rel=1e-4, abs=1e-6)
    for (n, x), (_, y) in zip(
        chunks.model.state_dict().items(), whole.model.state_dict().items(), strict=True
    ):
        assert torch.allclose(x, y, rtol=1e-4, atol=1e-6), n


class _MlpCalls:
    """A healing callback that counts the MLP forwards of the model being trained (a checkpointed layer
    runs its forward again in the backward: its MLP is called again)."""

    def __init__(self) -> None:
        self.calls = 0

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        for block in model.model.layers:
            block.mlp.register_forward_pre_hook(lambda *_: setattr(self, "calls", self.calls + 1))


def test_checkpointing_recomputes_each_layer_with_the_same_numbers() -> None:
    model = llama()
    counts = {checkpoint: _MlpCalls() for checkpoint in (False, True)}
    plain, again = (
        small_heal(headwidget.apply(model, "mqa"), model, checkpoint=c, callbacks=[counts[c]])
        for c in (False, True)
    )
    assert again.losses == plain.losses and again.curve == plain.curve and again.per_layer == plain.per_layer
    for (n, x), (_, y) in zip(
        plain.model.state_dict().items(), again.model.state_dict().items(), strict=True
    ):
        assert torch.equal(x, y), n
    # each training step runs each of the 3 layers once more, in its backward
    assert counts[True].calls - counts[False].calls == 3 * plain.steps
    assert "forward" not in vars(again.model.model.layers[0])  # the layers' own forwards are back


CASES = [
    ("llama", "mqa", {}),
    ("llama", "mqa", {"checkpoint": True}),
    ("llama", "mqa", {"method": "lm"}),
    ("llama", "mla:8@1-2", {"trainable": "attention"}),
    ("llama", "mqa", {"batch_size": 8, "max_length": 64, "eval_tokens": 512}),
    ("llama", "mqa", {"batch_size": 8, "max_length": 64, "checkpoint": True, "trainable": "lora:2"}),
    ("llama", "mqa", {"batch_size": 8, "max_length": 64, "eval_tokens": 64, "micro_batch_size": 2}),
    ("gpt2", "mqa", {}),
]


@pytest.mark.parametrize(("name", "spec", "options"), CASES)
def test_the_estimate_is_the_measured_peak(name: str, spec: str, options: dict) -> None:
    """The CPU allocator's peak during heal, above what it held before, within 0.8–1.2 of the estimate."""
    model = (llama() if name == "llama" else make_model("gpt2", dtype=F64, seed=2)).float()
    variant = headwidget.apply(model, spec)
    args: dict[str, Any] = {
        "batch_size": 4,
        "max_length": 32,
        "eval_tokens": 64,
        "eval_texts": held_out(rows=8, length=32),
        "tokens": 2 * 4 * 32,
        **options,
    }
    args["tokens"] = 2 * args["batch_size"] * args["max_length"]
    need = headwidget.estimate_healing(variant, model, **args)
    gc.collect()
    peak = allocated_peak(lambda: small_heal(variant, model, texts=stream(1, 4096), **args))
    print(f"\n{name} {spec} {options}: estimate {need / 2**20:.2f} MiB, peak {peak / 2**20:.2f} MiB")
    assert 0.8 <= peak / need <= 1.2


def test_the_estimate_holds_where_installing_is_the_peak() -> None:
    """One wide layer and a small vocabulary: the peak is reading the converted layer's weights in float64
    to install its trained parameters, not the step."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=256,
        intermediate_size=256,
        num_hidden_layers=1,
        num_attention_heads=8,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config).eval()
    variant = headwidget.apply(model, "mqa")
    args: dict[str, Any] = {
        "tokens": 64,
        "batch_size": 4,
        "max_length": 16,
        "eval_texts": held_out(rows=4, length=16),
        "eval_tokens": 32,
        "per_layer": False,
    }
    need = headwidget.estimate_healing(variant, model, **args)
    peak = allocated_peak(lambda: small_heal(variant, model, texts=stream(1, 1024), **args))
    assert 0.8 <= peak / need <= 1.2


def test_a_budget_too_small_is_refused_before_any_forward() -> None:
    model = llama()
    variant = headwidget.apply(model, "mqa")
    forwards: list[int] = []
    handles = [m.register_forward_pre_hook(lambda *_: forwards.append(1)) for m in (model, variant)]
    try:
        need = headwidget.estimate_healing(variant, model, batch_size=4, max_length=16, eval_tokens=120)
        with pytest.raises(
            MemoryBudgetError,
            match=r"batch_size or max_length.*checkpoint=True.*micro_batch_size.*max_memory",
        ):
            small_heal(variant, model, max_memory=need - 1)
        assert forwards == []
        run = small_heal(variant, model, max_memory=need)
        assert forwards and run.steps == 4
    finally:
        for handle in handles:
            handle.remove()


def test_the_default_budget_is_the_devices(monkeypatch: pytest.MonkeyPatch) -> None:
    from headwidget.capture import memory

    model = llama()
    variant = headwidget.apply(model, "mqa")
    need = headwidget.estimate_healing(variant, model, batch_size=4, max_length=16, eval_tokens=120)
    monkeypatch.setattr(memory, "default_budget", lambda device: need - 1)
    with pytest.raises(MemoryBudgetError, match="allowed \\(half the free memory"):
        small_heal(variant, model)


@pytest.mark.parametrize(
    ("options", "word"), [({"max_memory": 0}, "max_memory"), ({"checkpoint": 1}, "checkpoint")]
)
def test_memory_arguments_are_checked(options: dict, word: str) -> None:
    model = llama()
    with pytest.raises(headwidget.ArgumentError, match=word):
        small_heal(headwidget.apply(model, "mqa"), model, **options)
    with pytest.raises(headwidget.ArgumentError, match="batch_size"):
        headwidget.estimate_healing("mqa", model, batch_size="8")


def test_the_estimate_takes_a_spec_and_a_model_on_the_meta_device() -> None:
    """A model too large for the machine is sized from its config: the same estimate as the applied variant
    would have, from the spec (within the K/V rows the spec's merge removes)."""
    model = llama()
    real = headwidget.estimate_healing(headwidget.apply(model, "mqa"), model, batch_size=4, max_length=16)
    from_spec = headwidget.estimate_healing("mqa", model, batch_size=4, max_length=16)
    assert from_spec == pytest.approx(real, rel=0.05)
    with torch.device("meta"):
        ghost = type(model)(model.config).to(model.dtype)
    assert headwidget.estimate_healing("mqa", ghost, batch_size=4, max_length=16) == from_spec
