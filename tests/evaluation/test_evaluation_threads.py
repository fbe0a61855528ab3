"""evaluate and other threads: its hooks see only its own forwards, so its numbers equal a lone run.

Another thread runs forwards of the very same model (or a second ``evaluate`` of it) for the whole
time one ``evaluate`` runs; the per-layer sweep records the original's hidden states, so a hook that
also recorded the other thread's forwards would pair a layer with another batch's states.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import pytest
import torch

import headwidget
from tiny_models import make_model

VARIANTS = ["model", "mqa", "lrkv:2", "kv:int4"]


def ids(seed: int, rows: int = 4, length: int = 16) -> torch.Tensor:
    return torch.randint(1, 96, (rows, length), generator=torch.Generator().manual_seed(seed))


def run(model: torch.nn.Module, texts: torch.Tensor) -> headwidget.EvaluationReport:
    return headwidget.evaluate(
        model, texts, VARIANTS, per_layer=True, dtype=torch.float32, batch_size=2, progress=False
    )


def same(a: headwidget.EvaluationReport, b: headwidget.EvaluationReport) -> None:
    assert a.measures == b.measures
    assert a.per_layer == b.per_layer
    assert a.kv_bytes_per_token == b.kv_bytes_per_token


def while_other_thread(work: Callable[[], object], other: Callable[[], None]) -> tuple[object, int]:
    """Run ``work`` here while ``other`` runs again and again in a thread; how often it ran meanwhile."""
    stop, started = threading.Event(), threading.Event()
    count = [0]
    errors: list[BaseException] = []

    def loop() -> None:
        try:
            while not stop.is_set():
                other()
                count[0] += 1
                started.set()
        except BaseException as exc:
            errors.append(exc)
            started.set()

    thread = threading.Thread(target=loop, daemon=True)
    thread.start()
    assert started.wait(60)
    before = count[0]
    try:
        result = work()
    finally:
        stop.set()
        thread.join(60)
    assert not errors, errors
    return result, count[0] - before


@pytest.mark.parametrize("shape", [(4, 16), (3, 9)], ids=["same-shape", "other-shape"])
def test_per_layer_damage_is_exact_while_another_thread_runs_the_model(shape: tuple[int, int]) -> None:
    model = make_model("llama_gqa", dtype=torch.float32).eval()
    texts = ids(0)
    alone = run(model, texts)
    other_ids = ids(1, *shape)

    def forward() -> None:
        with torch.no_grad():
            model(other_ids)

    report, overlapped = while_other_thread(lambda: run(model, texts), forward)
    assert overlapped > 0  # the other thread really ran during the evaluation
    same(report, alone)  # type: ignore[arg-type]


def test_two_concurrent_evaluations_of_one_model_each_equal_the_sequential_result() -> None:
    model = make_model("llama_gqa", dtype=torch.float32).eval()
    first, second = ids(2), ids(3)
    alone_first, alone_second = run(model, first), run(model, second)
    results: list[headwidget.EvaluationReport] = []
    report, overlapped = while_other_thread(
        lambda: run(model, first), lambda: results.append(run(model, second))
    )
    assert overlapped > 0
    same(report, alone_first)  # type: ignore[arg-type]
    for r in results:
        same(r, alone_second)


def test_a_thread_switching_the_model_to_training_mode_changes_no_number() -> None:
    model = make_model("llama_gqa", dtype=torch.float32)
    model.config.attention_dropout = 0.5
    for module in model.modules():
        if hasattr(module, "attention_dropout"):
            module.attention_dropout = 0.5
    model.eval()
    texts = ids(4)
    alone = run(model, texts)

    def flip() -> None:
        model.train()
        model.eval()
        time.sleep(0.001)  # a pure-Python loop would hold the GIL and starve the evaluation (20 s)

    report, overlapped = while_other_thread(lambda: run(model, texts), flip)
    assert overlapped > 0
    same(report, alone)  # type: ignore[arg-type]
    assert not model.training
