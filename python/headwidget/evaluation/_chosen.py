"""The specs :func:`~headwidget.allocate` chose in this process, and the fingerprints of the tokens it
chose them on: :func:`~headwidget.evaluation.evaluate` flags such a spec measured on those very tokens."""

from __future__ import annotations

__all__ = ["CHOSEN_ON"]

CHOSEN_ON: dict[str, set[str]] = {}
