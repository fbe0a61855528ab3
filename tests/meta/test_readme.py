"""The README's Python examples run as written (with fewer tokens, to stay quick), block by block.

Each block runs in the namespace the blocks before it leave (as a reader running them in one session
would); the shared blocks run once per module (per worker), each test runs its own."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"

pytestmark = pytest.mark.slow


def _blocks() -> list[str]:
    """quickstart, analyses, costs, allocation, training, timeline view, jupyter."""
    blocks = re.findall(r"```python\n(.*?)\n```", README.read_text(), flags=re.S)
    assert len(blocks) >= 8
    return blocks[:8]


def _costs_block() -> str:
    """The costs block on fewer tokens and two variants (the six-variant sweep is the notebook's)."""
    costs = _blocks()[2].replace("max_tokens=16384", "max_tokens=128")
    costs = costs.replace("per_layer=True", "per_layer=True, layers=[0, 1]")
    costs = costs.replace("stats=calibration)", "stats=calibration, layers=[0])")
    return re.sub(r"variants = \[.*\]", 'variants = ["model", "mqa"]', costs)


@pytest.fixture(scope="module")
def quickstart(tmp_path_factory) -> dict[str, Any]:
    namespace: dict[str, Any] = {}
    with pytest.MonkeyPatch.context() as patch:  # the block saves its statistics where it runs
        patch.chdir(tmp_path_factory.mktemp("readme"))
        exec(_blocks()[0].replace("max_tokens=8192", "max_tokens=256"), namespace)
    return namespace


@pytest.fixture(scope="module")
def costs(quickstart) -> dict[str, Any]:
    namespace = dict(quickstart)
    exec(_costs_block(), namespace)
    return namespace


def test_the_quickstart_and_the_analyses_run(quickstart) -> None:
    namespace = dict(quickstart)
    assert namespace["stats"].tokens == 256
    exec(_blocks()[1], namespace)
    assert namespace["groups"] == [[0, 1, 2]]
    assert namespace["S"].shape == (9, 9)


def test_the_costs_example_runs(costs) -> None:
    report = costs["report"]
    assert report.variants == ["model", "mqa"] and len(report.per_layer["mqa"]) == 2
    assert costs["variant"].model.layers[0].self_attn.k_proj.out_features == 64  # one KV head
    assert {p.id for p in costs["headwidget"].ConsequenceView(report).grid.panels} == {"damage"}


def test_the_allocation_example_runs(costs) -> None:
    # three candidates on a few tokens (the full run is the allocation notebook's)
    allocation = re.sub(r"candidates=\[.*?\]", 'candidates=["model", "mqa", "kv:int4"]', _blocks()[3])
    allocation = allocation.replace("max_tokens=4096", "max_tokens=16").replace("refine=1", "refine=0")
    allocation = allocation.replace("max_tokens=16384", "max_tokens=32")
    namespace = dict(costs)
    exec(allocation, namespace)
    alloc = namespace["alloc"]
    assert alloc.kv_bytes_per_token <= alloc.model_bytes / 3 and alloc.spec in namespace["report"].variants


def test_the_training_example_runs(quickstart, tmp_path, monkeypatch) -> None:
    # 4 steps, a snapshot every 2, on 128 probe tokens (the block's 500 steps take minutes)
    training = _blocks()[4].replace("max_steps=500", "max_steps=4").replace("every=50", "every=2")
    training = training.replace("max_tokens=2048", "max_tokens=128").replace("logs[50]", "logs[2]")
    training = training.replace("timeline[50]", "timeline[2]").replace("logging_steps=10", "logging_steps=1")
    monkeypatch.chdir(tmp_path)
    namespace = dict(quickstart)
    exec(training, namespace)
    timeline = namespace["timeline"]
    assert timeline.steps == [0, 2, 4] and timeline[4].tokens == 128
    assert "loss" in timeline.logs[2] and len(timeline.summary()) == 3 * 4  # 3 steps × 4 layers
    # the timeline view block, with the run itself as the second timeline
    exec(_blocks()[5].replace("gqa_timeline", "timeline"), namespace)
    view = namespace["view"]
    assert view.step == 2 and view.grid.panels[0].title == "Keys · step 4"
    assert len(namespace["both"].grid.panels) == 4 and namespace["dash"].timeline is not None


def test_the_healing_example_runs(quickstart, tmp_path, monkeypatch) -> None:
    # one step of 2×64 tokens, a point after it on 64 held-out tokens (the block's 65,536 take minutes)
    healing = _blocks()[6].replace("tokens=65536", "tokens=128, batch_size=2, max_length=64, eval_tokens=64")
    healing = healing.replace("eval_every=16384", "eval_every=128")
    monkeypatch.chdir(tmp_path)
    namespace = dict(quickstart)
    exec(healing, namespace)
    run = namespace["run"]
    assert [r["tokens"] for r in run.curve] == [0, 128] and run.model.config.num_key_value_heads == 1
    assert namespace["headwidget"].HealingRun.load(tmp_path / "heal.json") == run
    assert namespace["view"].grid.charts[0].id == "recovery"


def test_the_jupyter_example_runs(quickstart) -> None:
    namespace = dict(quickstart)
    jupyter = _blocks()[7].replace("headwidget.explore()", "headwidget.explore(stats)")
    jupyter = jupyter.replace(
        "texts, tokenizer=tokenizer, max_tokens=8192", "[english_sample()[0]], tokenizer=tokenizer"
    )
    exec(jupyter, namespace)
    assert namespace["dash"].channels.layer == 0
