"""A saved page's content: a frame per state (``core/protocol.py``: ``FRAME_FIELDS``), each matrix
(``blobs``; a bitwise-symmetric one as its upper triangle) and each chart series (``series``) held once
and named by index: what many states show (a timeline's trend lines) costs once.

Example:
    >>> import numpy as np
    >>> from headwidget.core.charts import Chart, Series
    >>> from headwidget.core.panels import Panel, PanelGrid
    >>> trend = Chart("t", "T", "x", "y", [Series("s", [0.0, 1.0], [2.0, 3.0], ["a", "b"])])
    >>> frames = Frames(state={})
    >>> for k in (0, 1):
    ...     grid = PanelGrid([Panel("m", "M", np.eye(2))], -1.0, 1.0, "diverging", "", charts=[trend])
    ...     added = frames.add(state_key([k]), frame_json(grid, {"label": f"{k}"}))
    >>> len(frames.blobs), len(frames.series), frames.frames["[1]"]["charts"][0]["series"]
    (1, 1, [0])
"""

from __future__ import annotations

import base64
import json
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from headwidget.core.charts import encode_chart
from headwidget.core.panels import PanelGrid, encode_panel
from headwidget.export._axes import Axis

__all__ = ["Frames", "frame_json", "state_key"]


def state_key(values: Sequence[Any]) -> str:
    """The key of a state on the page: the JSON array of its traits' values, compact, as the page's
    ``JSON.stringify`` writes it (``js/lib/offline.ts``).

    Example:
        >>> state_key([3, "key_post", ["mha", "mqa"]])
        '[3,"key_post",["mha","mqa"]]'
    """
    return json.dumps(list(values), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def frame_json(grid: PanelGrid, traits: dict[str, Any] | None = None) -> dict[str, Any]:
    """A grid as the page's JSON before its matrices and series are pooled: the widget's traits,
    panels' data as base64 of the wire format, and ``traits``, the text traits that go with the
    state (the layer read-out, the heading...). What a click does (a panel's or chart's ``hint``) is
    left out: a click on a page has no kernel to select anything.

    Example:
        >>> import numpy as np
        >>> from headwidget.core.panels import Panel
        >>> frame = frame_json(PanelGrid([Panel("a", "A", np.eye(2))], -1.0, 1.0, "diverging", "r"))
        >>> frame["panels"][0]["dtype"], frame["panels"][0]["data"]
        ('float16', 'ADwAAAAAADw=')
    """
    panels = []
    for panel in grid.panels:
        encoded = encode_panel(panel, vmin=grid.vmin, vmax=grid.vmax)
        del encoded["key"]  # (a page holds every frame's cells: there is no kernel to spare)
        encoded["data"] = base64.b64encode(encoded["data"]).decode("ascii")
        encoded["hint"] = ""  # (a click on a page selects nothing: there is no kernel to ask)
        panels.append(encoded)
    charts = [{**encode_chart(c), "hint": ""} for c in grid.charts]
    return {
        "vmin": grid.vmin,
        "vmax": grid.vmax,
        "colormap": grid.colormap,
        "colorbar_label": grid.colorbar_label,
        "columns": grid.columns,
        "traits": dict(traits or {}),
        "panels": panels,
        "charts": charts,
    }


def _blob(panel: dict[str, Any]) -> tuple[str, str]:
    """A panel's matrix as the page stores it (base64) and how (``"upper"``: its upper triangle)."""
    raw = base64.b64decode(panel["data"])
    n = int(panel["rows"])
    if n == int(panel["cols"]) and n >= 2:
        bits = np.frombuffer(raw, dtype=np.uint16 if panel["dtype"] == "float16" else np.uint32).reshape(n, n)
        if np.array_equal(bits, bits.T):
            return base64.b64encode(bits[np.triu_indices(n)].tobytes()).decode("ascii"), "upper"
    return panel["data"], ""


class _Pool:
    """Items a page holds once each, by index: equal keys, one item."""

    def __init__(self) -> None:
        self.items: list[Any] = []
        self._index: dict[Hashable, int] = {}

    def new(self, items: dict[Hashable, Any]) -> int:
        """The characters of the JSON of the items not held yet."""
        return sum(len(json.dumps(item)) for key, item in items.items() if key not in self._index)

    def holds(self, key: Hashable) -> bool:
        return key in self._index

    def hold(self, key: Hashable, item: Any) -> int:
        if key not in self._index:
            self._index[key] = len(self.items)
            self.items.append(item)
        return self._index[key]


def _series_key(series: dict[str, Any]) -> Hashable:
    """What tells a chart's series apart (a tuple: hashing it is far cheaper than its JSON)."""
    return tuple(tuple(v) if isinstance(v, list) else v for v in series.values())


@dataclass
class Frames:
    """The page's content: its initial traits, a frame per state key, the pooled matrices and series,
    and why other states are missing (``errors``: the view's own message; ``note``: what the page
    leaves out, in words)."""

    state: dict[str, Any]
    axes: list[Axis] = field(default_factory=list)
    frames: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    nbytes: int = 0
    reachable: int = 1
    note: str = ""
    _blobs: _Pool = field(default_factory=_Pool, repr=False)
    _series: _Pool = field(default_factory=_Pool, repr=False)

    @property
    def blobs(self) -> list[str]:
        """The panels' matrices, each once (base64)."""
        return self._blobs.items

    @property
    def series(self) -> list[dict[str, Any]]:
        """The charts' series, each once."""
        return self._series.items

    def add(self, key: str, frame: dict[str, Any], most: float = float("inf")) -> bool:
        """Hold ``frame`` (:func:`frame_json`) under ``key``, unless the page would then hold more than
        ``most`` bytes; whether it did."""
        blobs = [_blob(p) for p in frame["panels"]]
        series = [[(_series_key(s), s) for s in c["series"]] for c in frame["charts"]]
        stored = {**frame, "charts": [{**c, "series": []} for c in frame["charts"]]}
        stored["panels"] = [{k: v for k, v in p.items() if k != "data"} for p in frame["panels"]]
        new_blobs = sum(len(text) for text in dict(blobs) if not self._blobs.holds(text))
        added = (
            len(json.dumps(stored)) + new_blobs + self._series.new({k: v for each in series for k, v in each})
        )
        if self.nbytes + added > most:
            return False
        self.nbytes += added
        for panel, (text, packed) in zip(stored["panels"], blobs, strict=True):
            panel.update(blob=self._blobs.hold(text, text), packed=packed)
        for chart, each in zip(stored["charts"], series, strict=True):
            chart["series"] = [self._series.hold(text, s) for text, s in each]
        self.frames[key] = stored
        return True

    def charts(self, key: str) -> list[dict[str, Any]]:
        """The charts of the frame under ``key`` with their series (what the page shows for it)."""
        return [{**c, "series": [self.series[i] for i in c["series"]]} for c in self.frames[key]["charts"]]
