"""For every collected item, tests and doctests: the doctests' examples write their files (through
``tempfile.mkdtemp()``) under the test's own ``tmp_path``, which pytest cleans up, not in the system's
temporary folder, where each run of the suite would leave them."""

from __future__ import annotations

import tempfile

import pytest


@pytest.fixture(autouse=True)
def _doctest_files_under_tmp_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if type(request.node).__name__ == "DoctestItem":
        monkeypatch.setattr(tempfile, "tempdir", str(request.getfixturevalue("tmp_path")))
