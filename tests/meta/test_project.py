"""Project-level invariants: one version, one supported-model table, README setup = CI."""

from __future__ import annotations

import json
import re
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

import headwidget

ROOT = Path(__file__).resolve().parents[2]


def test_version_single_sourced_from_package_json():
    package = json.loads((ROOT / "package.json").read_text())["version"]
    assert headwidget.__version__ == package
    assert version("headwidget") == package
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "version" in pyproject["project"]["dynamic"]
    assert pyproject["tool"]["hatch"]["version"]["path"] == "package.json"


def test_readme_model_table_matches_adapter_registry():
    readme = (ROOT / "README.md").read_text()
    section = readme.split("## Supported models", 1)[1].split("\n## ", 1)[0]
    rows = [
        line for line in section.splitlines() if line.startswith("| ") and not line.startswith("| family")
    ]
    table = {}
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        table[cells[0]] = tuple(t.strip() for t in cells[1].split(","))
    assert table == headwidget.supported_families()


def test_readme_setup_commands_are_what_ci_runs():
    readme = (ROOT / "README.md").read_text()
    commands = re.findall(r"```bash\n(.*?)\n```", readme, flags=re.S)
    assert commands[0] == "bash .ci/install && .venv/bin/headwidget demo"
    assert commands[1] == "bash .ci/run"
    ci = (ROOT / ".ci" / "run").read_text()
    assert "bash .ci/install --browser" in ci and "bash .ci/test" in ci
    install = (ROOT / ".ci" / "install").read_text()
    assert "apt-get install" in install and "chromium" in install
    assert "torch==2.13.0" in install and "npm ci" in install and "npm run" in install


def test_console_script_is_declared():
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pyproject["project"]["scripts"]["headwidget"] == "headwidget.cli:main"


def test_the_type_checker_and_linter_target_the_oldest_python_the_package_admits():
    """mypy and ruff check against the oldest Python ``requires-python`` admits, and that is the Python
    the tests run on here (3.11, Debian's): no version is claimed that nothing tested."""
    import sys

    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    oldest = re.fullmatch(r">=\s*3\.(\d+)", pyproject["project"]["requires-python"])
    assert oldest is not None, pyproject["project"]["requires-python"]
    minor = int(oldest.group(1))
    assert pyproject["tool"]["mypy"]["python_version"] == f"3.{minor}"
    assert pyproject["tool"]["ruff"]["target-version"] == f"py3{minor}"
    assert sys.version_info[:2] >= (3, minor)
    if sys.version_info[:2] != (3, minor):
        pytest.skip(f"the oldest admitted Python, 3.{minor}, is tested where it is the interpreter")


def test_the_formatter_is_configured_not_switched_off_line_by_line():
    """``ruff format`` lays out every line of the project's Python (``.ci/test`` checks it): no line
    keeps a hand layout with a formatter comment that skips it or switches the formatter off."""
    marker = re.compile(r"#\s*fmt:\s*(skip|off)\b")
    sources = [
        ROOT / "conftest.py",
        *(p for d in ("python", "tests", "bench") for p in (ROOT / d).rglob("*.py")),
    ]
    switched_off = [
        f"{path.relative_to(ROOT)}:{number}"
        for path in sources
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if marker.search(line)
    ]
    assert len(sources) > 100
    assert switched_off == []
