"""The public API documents itself: every exported name has a docstring, and every exported function
and class shows a runnable example (in its own docstring or its module's; pytest runs them as doctests).
The rest of the docstring rules (public methods and modules documented) are ruff's ``D1`` rules."""

from __future__ import annotations

import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest

import headwidget

PUBLIC = sorted(
    name
    for name in headwidget.__all__
    if inspect.isclass(getattr(headwidget, name)) or inspect.isfunction(getattr(headwidget, name))
)
ERRORS = [
    n
    for n in PUBLIC
    if inspect.isclass(getattr(headwidget, n)) and issubclass(getattr(headwidget, n), BaseException)
]


def test_the_public_api_is_found() -> None:
    assert {"capture", "KVStats", "align", "explore", "HeadwidgetError"} <= set(PUBLIC)


@pytest.mark.parametrize("name", PUBLIC)
def test_public_name_has_a_docstring(name: str) -> None:
    obj = getattr(headwidget, name)
    assert (inspect.getdoc(obj) or "").strip(), f"headwidget.{name} has no docstring"


@pytest.mark.parametrize("name", [n for n in PUBLIC if n not in ERRORS])
def test_public_function_or_class_shows_an_example(name: str) -> None:
    """Error types are exempt: what raises them shows them."""
    obj = getattr(headwidget, name)
    module = inspect.getmodule(obj)
    texts = [inspect.getdoc(obj) or "", (module.__doc__ or "") if module else ""]
    assert any(">>>" in t for t in texts), (
        f"headwidget.{name} ({module.__name__ if module else '?'}) has no runnable example: add a "
        "'>>>' example to its docstring"
    )


def test_doctests_leave_no_files_in_the_system_temporary_folder(tmp_path) -> None:
    """The examples that write files (``tempfile.mkdtemp()``) write them under pytest's own folders,
    which it cleans up (the root ``conftest.py``): the system's temporary folder stays as it was."""
    system_tmp = tmp_path / "system"
    system_tmp.mkdir()
    root = Path(__file__).resolve().parents[2]
    writers = [root / "python/headwidget/files.py", root / "python/headwidget/cli/_files.py"]
    env = {**os.environ, "TMPDIR": str(system_tmp)}
    argv = [
        sys.executable,
        "-m",
        "pytest",
        "-q",
        "-p",
        "no:cacheprovider",
        f"--basetemp={tmp_path / 'pytest'}",
        *map(str, writers),
    ]
    result = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True, timeout=300, check=False)
    assert result.returncode == 0, result.stdout[-2000:]
    assert " passed" in result.stdout
    assert sorted(p.name for p in system_tmp.iterdir()) == []
