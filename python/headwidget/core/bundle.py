"""Where the built front end lives: ``static/widget.js``, made by ``npm run build``."""

from __future__ import annotations

from pathlib import Path

__all__ = ["STATIC", "bundle_path"]

STATIC = Path(__file__).resolve().parents[1] / "static"


def bundle_path() -> Path:
    """The built front-end bundle; a clear error when ``npm run build`` has not been run."""
    path = STATIC / "widget.js"
    if not path.is_file():
        raise FileNotFoundError(
            f"the widget bundle {path} is missing: build it with `npm ci && npm run build` in the "
            "repository (an installed wheel ships it)"
        )
    return path
