"""The README's Python examples run as written (with fewer tokens, to stay quick)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[2] / "README.md"


@pytest.mark.slow
def test_readme_python_examples_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)\n```", README.read_text(), flags=re.S)
    assert len(blocks) >= 4
    quickstart, analyses, costs, allocation, jupyter = blocks[:5]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(quickstart.replace("max_tokens=8192", "max_tokens=256"), namespace)
    exec(analyses, namespace)
    assert namespace["groups"] == [[0, 1, 2]]
    assert namespace["S"].shape == (9, 9)
    # fewer tokens and two variants (the per-layer sweep of six variants over 30 layers is the notebook's)
    costs = costs.replace("max_tokens=16384", "max_tokens=512").replace(
        "per_layer=True", "per_layer=True, layers=[0, 1]"
    )
    costs = costs.replace("stats=calibration)", "stats=calibration, layers=[0])")
    exec(re.sub(r"variants = \[.*\]", 'variants = ["model", "mqa"]', costs), namespace)
    report = namespace["report"]
    assert report.variants == ["model", "mqa"] and len(report.per_layer["mqa"]) == 2
    assert namespace["variant"].model.layers[0].self_attn.k_proj.out_features == 64  # one KV head
    assert {p.id for p in namespace["headwidget"].ConsequenceView(report).grid.panels} == {"damage"}
    # an allocation over three candidates on a few tokens (the full run is the allocation notebook's)
    allocation = re.sub(r"candidates=\[.*?\]", 'candidates=["model", "mqa+align", "kv:int4"]', allocation)
    allocation = allocation.replace("max_tokens=4096", "max_tokens=64").replace("refine=1", "refine=0")
    allocation = allocation.replace("max_tokens=16384", "max_tokens=128")
    exec(allocation, namespace)
    alloc = namespace["alloc"]
    assert alloc.kv_bytes_per_token <= alloc.model_bytes / 3 and alloc.spec in namespace["report"].variants
    jupyter = jupyter.replace("headwidget.explore()", "headwidget.explore(stats)")
    exec(
        jupyter.replace(
            "texts, tokenizer=tokenizer, max_tokens=8192", "[english_sample()[0]], tokenizer=tokenizer"
        ),
        namespace,
    )
    assert namespace["dash"].channels.layer == 0
