"""The README's Python examples run as written (with fewer tokens, to stay quick)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"


@pytest.mark.slow
def test_readme_python_examples_run(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)\n```", README.read_text(), flags=re.S)
    assert len(blocks) >= 3
    quickstart, analyses, jupyter = blocks[:3]
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(quickstart.replace("max_tokens=8192", "max_tokens=256"), namespace)
    exec(analyses, namespace)
    assert namespace["groups"] == [[0, 1, 2]]
    assert namespace["S"].shape == (9, 9)
    jupyter = jupyter.replace("headwidget.explore()", "headwidget.explore(stats)")
    exec(
        jupyter.replace(
            "texts, tokenizer=tokenizer, max_tokens=8192", "[english_sample()[0]], tokenizer=tokenizer"
        ),
        namespace,
    )
    assert namespace["dash"].channels.layer == 0
