"""capture and other threads: each capture sees only its own forwards, other forwards are untouched.

Every test runs real threads on a tiny model and makes them overlap for sure: the capture's batches
are produced by a generator that waits for the other thread at each batch.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator

import pytest
import torch

import headwidget
from headwidget.errors import CaptureConflictError
from tiny_models import make_model

TIMEOUT = 60  # seconds a thread may wait for the other; only reached when something is broken


def id_batches(seed: int, n: int = 6, rows: int = 4, length: int = 24) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    return [{"input_ids": torch.randint(1, 96, (rows, length), generator=gen)} for _ in range(n)]


def same_stats(a, b) -> None:
    assert a.tokens == b.tokens
    assert a.layers == b.layers and a.kinds == b.kinds
    for layer in a.layers:
        for kind in a.kinds:
            ma, mb = a.moments(layer, kind), b.moments(layer, kind)
            assert ma.count == mb.count
            assert torch.equal(ma.mean, mb.mean) and torch.equal(ma.m2, mb.m2)
            if ma.norm_gram is not None:
                assert torch.equal(ma.norm_gram, mb.norm_gram)
    assert a.meta.cross_layers == b.meta.cross_layers
    if a.meta.cross_layers:
        for kind in ("key", "value"):
            ma, mb = a.head_moments(a.meta.cross_layers, kind), b.head_moments(b.meta.cross_layers, kind)
            assert torch.equal(ma.m2, mb.m2) and torch.equal(ma.norm_gram, mb.norm_gram)


def in_lockstep(batches: list[dict], barrier: threading.Barrier) -> Iterator[dict]:
    for batch in batches:
        barrier.wait(TIMEOUT)
        yield batch


def run_threads(*targets: Callable[[], None]) -> None:
    """Run the targets in threads; re-raise the first error any of them raised."""
    errors: list[BaseException] = []

    def wrap(fn: Callable[[], None]) -> Callable[[], None]:
        def run() -> None:
            try:
                fn()
            except BaseException as exc:  # handed to the main thread below
                errors.append(exc)

        return run

    threads = [threading.Thread(target=wrap(t)) for t in targets]
    for t in threads:
        t.start()
    for t in threads:
        t.join(4 * TIMEOUT)
    assert not any(t.is_alive() for t in threads), "a thread hung"
    if errors:
        raise errors[0]


OPTIONS = {"rope": "both", "inputs": True, "cross_layer": True, "progress": False}


def test_two_concurrent_captures_of_one_model_are_each_exact():
    model = make_model("llama_gqa", dtype=torch.float32)
    data = [id_batches(1), id_batches(2)]
    alone = [headwidget.capture(model, d, **OPTIONS) for d in data]
    barrier = threading.Barrier(2)
    got: dict[int, headwidget.KVStats] = {}

    def capture(i: int) -> Callable[[], None]:
        def run() -> None:
            got[i] = headwidget.capture(model, in_lockstep(data[i], barrier), **OPTIONS)

        return run

    run_threads(capture(0), capture(1))
    same_stats(got[0], alone[0])
    same_stats(got[1], alone[1])
    assert got[0].tokens == 6 * 4 * 24


@pytest.mark.parametrize("second_impl", ["sdpa", "eager"])
def test_post_rope_captures_of_two_models_overlap_and_the_registry_is_restored(second_impl):
    """The second capture ends while the first still runs: the first keeps its post-RoPE keys."""
    from transformers.modeling_utils import AttentionInterface

    registry = dict(AttentionInterface._global_mapping)
    sdpa_model = make_model("llama_gqa", dtype=torch.float32)
    eager_model = make_model("gpt_neox", dtype=torch.float32)
    eager_model.config._attn_implementation = second_impl
    long, short = id_batches(3, n=8), id_batches(4, n=2)
    alone = [
        headwidget.capture(sdpa_model, long, rope="both", progress=False),
        headwidget.capture(eager_model, short, rope="both", progress=False),
    ]
    short_done = threading.Event()
    got: dict[int, headwidget.KVStats] = {}

    def first_waits_for_second() -> Iterator[dict]:
        for i, batch in enumerate(long):
            if i == 4:
                assert short_done.wait(TIMEOUT)
            yield batch

    def run_long() -> None:
        got[0] = headwidget.capture(sdpa_model, first_waits_for_second(), rope="both", progress=False)

    def run_short() -> None:
        got[1] = headwidget.capture(eager_model, short, rope="both", progress=False)
        short_done.set()

    run_threads(run_long, run_short)
    same_stats(got[0], alone[0])
    same_stats(got[1], alone[1])
    assert dict(AttentionInterface._global_mapping) == registry


def forwards_until(model, x: torch.Tensor, stop: threading.Event, turns: threading.Semaphore, seen: list):
    """Forward ``x`` again and again until ``stop``; record whether each output equals the first."""
    with torch.no_grad():
        reference = model(x).logits.clone()
    while not stop.is_set():
        with torch.no_grad():
            out = model(x).logits
        seen.append(torch.equal(out, reference))
        turns.release()


def test_plain_forwards_in_another_thread_are_untouched():
    model = make_model("llama_gqa", dtype=torch.float32)
    data = id_batches(5, n=8)
    alone = headwidget.capture(model, data, **OPTIONS)
    stop, turns, seen = threading.Event(), threading.Semaphore(0), []
    got = {}

    def after_other_forwards() -> Iterator[dict]:
        for batch in data:
            assert turns.acquire(timeout=TIMEOUT)  # one forward of the other thread per batch
            yield batch

    def run_capture() -> None:
        try:
            got["stats"] = headwidget.capture(model, after_other_forwards(), **OPTIONS)
        finally:
            stop.set()

    x = id_batches(6, n=1, rows=2)[0]["input_ids"]
    run_threads(run_capture, lambda: forwards_until(model, x, stop, turns, seen))
    assert len(seen) >= len(data) and all(seen)
    same_stats(got["stats"], alone)


def with_dropout(model: torch.nn.Module) -> torch.nn.Module:
    """GPT-2 with every dropout (embeddings, attention weights, residuals) at p = 0.5."""
    for m in model.modules():
        if isinstance(m, torch.nn.Dropout):
            m.p = 0.5
    return model


def test_training_loop_in_another_thread_keeps_its_dropout():
    """A training-mode model is captured without dropout while another thread trains it with dropout."""
    model = with_dropout(make_model("gpt2", dtype=torch.float32))
    data = id_batches(7, n=6)
    alone = headwidget.capture(model, data, progress=False)  # eval mode
    model.train()
    x = id_batches(8, n=1, rows=2)[0]["input_ids"]
    with torch.no_grad():
        eval_out = model.eval()(x).logits.clone()
        model.train()
        references = []
        for seed in range(len(data)):
            torch.manual_seed(seed)
            references.append(model(x).logits.clone())
    assert not torch.equal(references[0], eval_out)  # dropout is on in training mode
    barrier = threading.Barrier(2)
    got, seen = {}, []

    def train_steps() -> None:
        for seed in range(len(data)):
            barrier.wait(TIMEOUT)
            torch.manual_seed(seed)
            with torch.no_grad():
                out = model(x).logits
            seen.append((torch.equal(out, references[seed]), model.training))

    def run_capture() -> None:
        got["stats"] = headwidget.capture(model, in_lockstep(data, barrier), progress=False)

    run_threads(run_capture, train_steps)
    assert seen == [(True, True)] * len(data)
    same_stats(got["stats"], alone)  # no dropout in the capture
    assert all(m.training for m in model.modules())


def test_dropout_of_an_attention_function_outside_torch_is_zero_for_the_capture_only():
    """Attention kernels outside torch (flash attention) get their dropout from AttentionInterface."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.modeling_utils import AttentionInterface

    received: list[tuple[bool, float]] = []
    capturing: set[int] = set()

    def recording(module, query, key, value, attention_mask, dropout=0.0, **kwargs):
        received.append((threading.get_ident() in capturing, float(dropout)))
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=0.0, **kwargs)

    AttentionInterface.register("headwidget_test_recording", recording)
    try:
        model = make_model("llama_gqa", dtype=torch.float32)
        model.config.attention_dropout = 0.25
        for m in model.modules():
            if hasattr(m, "attention_dropout"):
                m.attention_dropout = 0.25
        model.config._attn_implementation = "headwidget_test_recording"
        model.train()
        barrier = threading.Barrier(2)
        x = id_batches(9, n=1, rows=2)[0]["input_ids"]

        def run_capture() -> None:
            capturing.add(threading.get_ident())
            headwidget.capture(model, in_lockstep(id_batches(10, n=3), barrier), progress=False)

        def train_steps() -> None:
            for _ in range(3):
                barrier.wait(TIMEOUT)
                with torch.no_grad():
                    model(x)

        run_threads(run_capture, train_steps)
    finally:
        AttentionInterface._global_mapping.pop("headwidget_test_recording", None)
    mine = [d for c, d in received if c]
    theirs = [d for c, d in received if not c]
    assert mine and all(d == 0.0 for d in mine)
    assert theirs and all(d == 0.25 for d in theirs)


def test_model_switched_to_training_between_batches_is_still_captured_without_dropout():
    model = with_dropout(make_model("gpt2", dtype=torch.float32))
    data = id_batches(11, n=4)
    alone = headwidget.capture(model, data, progress=False)

    def switching() -> Iterator[dict]:
        for i, batch in enumerate(data):
            if i == 2:
                model.train()
            yield batch

    try:
        same_stats(headwidget.capture(model, switching(), progress=False), alone)
    finally:
        model.eval()


def test_model_switched_to_training_during_a_forward_is_an_error():
    model = make_model("gpt2", dtype=torch.float32)

    def switch(*args) -> None:
        model.train()

    handle = model.transformer.h[0].register_forward_pre_hook(switch)
    try:
        with pytest.raises(CaptureConflictError, match=r"switched to training mode.*batch 0"):
            headwidget.capture(model, id_batches(12, n=2), progress=False)
    finally:
        handle.remove()
        model.eval()
    assert all(not m._forward_hooks and not m._forward_pre_hooks for m in model.modules())
