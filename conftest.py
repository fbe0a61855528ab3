"""For every collected item, tests and doctests: the doctests' examples write their files (through
``tempfile.mkdtemp()``) under the test's own ``tmp_path``, which pytest cleans up, not in the system's
temporary folder, where each run of the suite would leave them.

After collection, the package's public functions that share a name with a subpackage (``capture``) are
the functions again: pytest's ``--import-mode=importlib`` sets each parent package's attribute to the
module it imports for a doctest file (``headwidget.capture`` the subpackage), which ``import headwidget``
never does."""

from __future__ import annotations

import sys
import tempfile
import types

import pytest


@pytest.fixture(autouse=True)
def _doctest_files_under_tmp_path(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    if type(request.node).__name__ == "DoctestItem":
        monkeypatch.setattr(tempfile, "tempdir", str(request.getfixturevalue("tmp_path")))


def pytest_collection_finish(session: pytest.Session) -> None:
    package = sys.modules.get("headwidget")
    for name in getattr(package, "__all__", ()):
        value = getattr(package, name, None)
        if isinstance(value, types.ModuleType) and callable(getattr(value, name, None)):
            setattr(package, name, getattr(value, name))
