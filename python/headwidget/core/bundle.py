"""Where the built front end lives: ``static/widget.js`` (the widget) and ``static/offline.js`` (the
model a saved page runs in place of a kernel), made by ``npm run build``."""

from __future__ import annotations

from pathlib import Path

__all__ = ["STATIC", "bundle_path", "offline_path"]

STATIC = Path(__file__).resolve().parents[1] / "static"


def bundle_path() -> Path:
    """The built front-end bundle; a clear error when ``npm run build`` has not been run."""
    return _built("widget.js")


def offline_path() -> Path:
    """The built script of a saved page (``js/offline.ts``); a clear error when it is not built."""
    return _built("offline.js")


def _built(name: str) -> Path:
    path = STATIC / name
    if not path.is_file():
        raise FileNotFoundError(
            f"the front-end file {path} is missing: build it with `npm ci && npm run build` in the "
            "repository (an installed wheel ships it)"
        )
    return path
