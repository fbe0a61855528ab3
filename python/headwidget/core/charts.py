"""Charts: points and lines on two numeric axes, beside a view's heatmaps.

A :class:`Chart` is what a trade-off plot (KV bytes against damage) or a curve (entropy against group
size) needs: series of (x, y) points, each with the text a reader sees on hover, drawn as points, as a
line through them in order, or both; either axis may be logarithmic. Views put charts in
:attr:`~headwidget.core.panels.PanelGrid.charts`; the widget draws them above the heatmaps (hover
names the point, a click on one is sent back), and the figure export draws them the same way.

Values that are not finite are not drawn (a point is skipped, a line is broken there); on a log axis
so is every value ≤ 0.

Example:
    >>> chart = Chart("tradeoff", "KV bytes against damage", "bytes / token", "ΔNLL",
    ...               [Series("variants", [512.0, 128.0], [0.0, 0.5], ["model", "mqa"])], x_log=True)
    >>> encode_chart(chart)["series"][0]["y"]
    [0.0, 0.5]
    >>> Series("s", [1.0], [float("nan")], ["a"]).finite_points()
    []
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from headwidget.core.protocol import CHART_FIELDS, SERIES_FIELDS
from headwidget.errors import ChartError

__all__ = ["SERIES_STYLES", "Chart", "ChartError", "Series", "encode_chart", "pareto_front"]

SeriesStyle = Literal["points", "line", "points+line"]
SERIES_STYLES: tuple[SeriesStyle, ...] = ("points", "line", "points+line")


@dataclass
class Series:
    """Points ``(x[i], y[i])`` named ``labels[i]`` on hover; ``color`` ``"#rrggbb"`` or ``""`` (the
    chart's palette, by series order); ``dashed`` draws its line dashed."""

    name: str
    x: list[float]
    y: list[float]
    labels: list[str]
    style: SeriesStyle = "points"
    color: str = ""
    dashed: bool = False

    def __post_init__(self) -> None:
        self.x = [float(v) for v in self.x]
        self.y = [float(v) for v in self.y]
        self.labels = [str(v) for v in self.labels]
        if not len(self.x) == len(self.y) == len(self.labels):
            raise ChartError(
                f"series {self.name!r}: x, y and labels must have one entry per point, got "
                f"{len(self.x)}, {len(self.y)} and {len(self.labels)}"
            )
        if self.style not in SERIES_STYLES:
            raise ChartError(
                f"series {self.name!r}: style must be one of {SERIES_STYLES}, got {self.style!r}"
            )

    def finite_points(self, x_log: bool = False, y_log: bool = False) -> list[int]:
        """Indices of the points that are drawn (finite, and > 0 on a log axis)."""
        return [
            i
            for i, (x, y) in enumerate(zip(self.x, self.y, strict=True))
            if math.isfinite(x) and math.isfinite(y) and (x > 0 or not x_log) and (y > 0 or not y_log)
        ]


@dataclass
class Chart:
    """One chart: a title, a subtitle saying what is drawn, axis labels, series and a note."""

    id: str
    title: str
    x_label: str
    y_label: str
    series: list[Series]
    subtitle: str = ""
    note: str = ""
    x_log: bool = False
    y_log: bool = False
    #: Draw a horizontal reference line at this y (None: none), e.g. the original model's ΔNLL of 0.
    y_reference: float | None = None
    #: Where the x-axis ticks go (empty: chosen from the range), e.g. the group sizes 1, 2, 4, 8.
    x_ticks: list[float] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)
    #: Whether a saved figure writes each point's name beside it (False: curves whose legend names them;
    #: the page's hover names every point either way).
    label_points: bool = True
    #: What a click on a point does, said only where a click does it (the live widget; a saved page
    #: and a figure leave it out).
    hint: str = ""
    #: The text of each of ``x_ticks`` (empty: the values, written out), e.g. "untrained" at the
    #: position a log axis draws its 0 at.
    x_tick_labels: list[str] = field(default_factory=list)
    #: The x-axis' ends before padding, (low, high) (empty: the data's): charts drawn one above the
    #: other over the same steps give the same, so that a step is at the same place in each.
    x_range: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.x_ticks = [float(v) for v in self.x_ticks]
        self.x_range = [float(v) for v in self.x_range]
        self.x_tick_labels = [str(v) for v in self.x_tick_labels]
        if self.x_tick_labels and len(self.x_tick_labels) != len(self.x_ticks):
            raise ChartError(
                f"chart {self.id!r}: x_tick_labels must name each of the {len(self.x_ticks)} x_ticks, "
                f"got {len(self.x_tick_labels)}"
            )
        if self.x_range and not (
            len(self.x_range) == 2
            and all(math.isfinite(v) for v in self.x_range)
            and self.x_range[0] <= self.x_range[1]
        ):
            raise ChartError(f"chart {self.id!r}: x_range must be (low, high), finite, got {self.x_range!r}")


def _finite_or_none(values: list[float]) -> list[float | None]:
    return [v if math.isfinite(v) else None for v in values]


def encode_chart(chart: Chart) -> dict[str, Any]:
    """The chart as the JSON the front end reads, its fields in the protocol's order (non-finite values
    become ``null``)."""
    series = [
        {f: _finite_or_none(getattr(s, f)) if f in ("x", "y") else getattr(s, f) for f in SERIES_FIELDS}
        for s in chart.series
    ]
    kept = [i for i, v in enumerate(chart.x_ticks) if math.isfinite(v)]
    computed = {
        "series": series,
        "x_ticks": [float(chart.x_ticks[i]) for i in kept],
        "x_tick_labels": [str(chart.x_tick_labels[i]) for i in kept] if chart.x_tick_labels else [],
        "x_range": [float(v) for v in chart.x_range],
    }
    return {f: computed[f] if f in computed else getattr(chart, f) for f in CHART_FIELDS}


def pareto_front(costs: list[float], damages: list[float]) -> list[int]:
    """Indices of the points no other point beats on both cost and damage, by increasing cost.

    A point is on the front when every point that costs no more does more damage (ties: the first).
    Non-finite points are never on it.

    Example:
        >>> pareto_front([512, 128, 256, 256], [0.0, 2.0, 0.5, 0.9])
        [1, 2, 0]
    """
    finite = [i for i in range(len(costs)) if math.isfinite(costs[i]) and math.isfinite(damages[i])]
    front: list[int] = []
    best = math.inf
    for i in sorted(finite, key=lambda i: (costs[i], damages[i], i)):
        if damages[i] < best:
            front.append(i)
            best = damages[i]
    return front
