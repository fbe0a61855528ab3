"""The package version; package.json is its single source (pyproject reads it at build time)."""

from __future__ import annotations

import json
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path


def _read_version() -> str:
    try:
        return version("headwidget")
    except PackageNotFoundError:  # running from a source tree without installing
        package_json = Path(__file__).resolve().parents[2] / "package.json"
        return str(json.loads(package_json.read_text())["version"])


__version__ = _read_version()
