"""The widget's colour scales for matplotlib, read from ``colormaps.json`` (their single source).

The front end maps a value to one of 256 table entries with ``t = (v - vmin) / (vmax - vmin)``
clamped to [0, 1] and ``index = floor(t * 255 + 0.5)`` (``t = 0.5`` when ``vmax <= vmin``); NaN takes
``nan_color``. matplotlib's own lookup of a ``ListedColormap`` truncates ``t * 256`` instead, which
picks the neighbouring entry for about half of all values, so :class:`LutNorm` maps every value to
the centre of the entry the front end picks and the colormap then returns exactly that entry.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
from matplotlib.colors import ListedColormap, Normalize

__all__ = ["LutNorm", "colormap", "lut_color", "lut_index", "nan_color"]

COLORMAPS_JSON = Path(__file__).resolve().parents[1] / "colormaps.json"
LUT_SIZE = 256


@cache
def _tables() -> dict[str, Any]:
    tables: dict[str, Any] = json.loads(COLORMAPS_JSON.read_text())
    return tables


def _stops(name: str) -> np.ndarray:
    tables = _tables()
    if name == "nan_color" or name not in tables:
        known = sorted(k for k in tables if k != "nan_color")
        raise ValueError(f"unknown colormap {name!r}; colormaps.json defines {known}")
    stops = np.asarray(tables[name]["stops"], dtype=np.uint8)
    if stops.shape != (LUT_SIZE, 3):
        raise ValueError(f"colormap {name!r} in {COLORMAPS_JSON} has shape {stops.shape}, expected (256, 3)")
    return stops


def nan_color() -> tuple[int, int, int]:
    """The RGB colour of undefined (NaN) cells.

    Example:
        >>> nan_color()
        (128, 128, 128)
    """
    r, g, b = _tables()["nan_color"]
    return int(r), int(g), int(b)


def colormap(name: str) -> ListedColormap:
    """The 256-entry ``ListedColormap`` called ``name`` in ``colormaps.json``, with NaN → ``nan_color``.

    Example:
        >>> cmap = colormap("diverging")
        >>> cmap.N, cmap.name
        (256, 'headwidget.diverging')
    """
    r, g, b = (c / 255.0 for c in nan_color())
    table = ListedColormap(_stops(name) / 255.0, name=f"headwidget.{name}").with_extremes(bad=(r, g, b))
    assert isinstance(table, ListedColormap)  # (set_bad is on its way to deprecation)
    return table


def lut_index(values: Any, vmin: float, vmax: float) -> np.ndarray:
    """Table entry of each value by the front end's rule (``js/lib/colormap.ts``); -1 for NaN.

    Example:
        >>> lut_index([-1.0, -0.9, 0.0, 1.0, float("nan"), float("inf")], -1.0, 1.0).tolist()
        [0, 13, 128, 255, -1, 255]
    """
    v = np.asarray(values, dtype=np.float64)
    with np.errstate(invalid="ignore", divide="ignore", over="ignore"):
        t = (v - vmin) / (vmax - vmin) if vmax > vmin else np.full(v.shape, 0.5)
    t = np.where(np.isnan(t) & ~np.isnan(v), 0.5, t)  # infinite vmin/vmax
    index = np.floor(np.clip(t, 0.0, 1.0) * (LUT_SIZE - 1) + 0.5)
    return np.where(np.isnan(v), -1, np.nan_to_num(index)).astype(np.int64)


def lut_color(value: float, vmin: float, vmax: float, name: str) -> tuple[int, int, int]:
    """RGB colour (0–255) the widget gives ``value``: the reference for export tests.

    Example:
        >>> lut_color(0.0, -1.0, 1.0, "diverging"), lut_color(float("nan"), 0.0, 1.0, "magma")
        ((255, 255, 255), (128, 128, 128))
    """
    index = int(lut_index(value, vmin, vmax))
    if index < 0:
        return nan_color()
    r, g, b = _stops(name)[index]
    return int(r), int(g), int(b)


class LutNorm(Normalize):
    """Normalisation that makes a 256-entry colormap pick the entry the front end picks.

    Each value goes to the centre ``(index + 0.5) / 256`` of its table entry, so matplotlib's
    ``floor(x * 256)`` lookup lands on ``index``; NaN stays NaN (the colormap's "bad" colour).

    Example:
        >>> norm = LutNorm(-1.0, 1.0)
        >>> (colormap("diverging")(norm(np.array([0.0]))) * 255).round().tolist()
        [[255.0, 255.0, 255.0, 255.0]]
    """

    def __init__(self, vmin: float, vmax: float) -> None:
        super().__init__(vmin=vmin, vmax=vmax, clip=False)
        self._range = (float(vmin), float(vmax))

    def __call__(self, value: Any, clip: bool | None = None) -> Any:
        data = np.ma.getdata(value)
        mask = np.ma.getmaskarray(value) | np.isnan(np.asarray(data, dtype=np.float64))
        index = lut_index(np.where(mask, np.nan, data), *self._range)
        centre = (index.astype(np.float64) + 0.5) / LUT_SIZE
        result = np.ma.masked_array(np.where(mask, np.nan, centre), mask=mask)
        return result if np.ndim(value) else result.reshape(())

    def inverse(self, value: Any) -> Any:
        lo, hi = self._range
        return lo + np.asarray(value, dtype=np.float64) * (hi - lo)
