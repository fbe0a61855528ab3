"""The trend chart of a dashboard as :class:`~headwidget.core.charts.Chart` s, for its offline page.

The notebook draws the per-layer trends with bqplot (:class:`~headwidget.widget.LayerTrends`); a saved
page has no kernel and no bqplot, so it draws the same series with the widget's own charts: means
(channel correlation, head similarity before and after alignment) on one chart, effective ranks (when
the dashboard has mechanism trends) on another, one line with points per series in the colour the
notebook's chart gives it, hover naming the series, the layer and the value.

Example:
    >>> charts = trend_charts({"K mean |channel corr|": [0.2, 0.3], "eff. rank · mqa": [3.0, 2.5]}, [0, 1],
    ...                       "head similarity: per-token cosine, auto alignment")
    >>> [c.id for c in charts], charts[0].series[0].labels[1], charts[0].x_ticks
    (['trend-means', 'trend-ranks'], 'K mean |channel corr|\\nlayer 1: 0.3000', [0.0, 1.0])
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from headwidget.core.charts import Chart, Series
from headwidget.widget.trends import COLOURS, layer_ticks

__all__ = ["trend_charts"]


def _series(name: str, values: Sequence[float], layers: Sequence[int], colour: str) -> Series:
    labels = [f"{name}\nlayer {layer}: {v:.4f}" for layer, v in zip(layers, values, strict=True)]
    dashed = name.endswith("· before")
    xs = [float(x) for x in layers]
    return Series(name, xs, list(values), labels, style="points+line", dashed=dashed, color=colour)


def trend_charts(series: Mapping[str, Sequence[float]], layers: Sequence[int], subtitle: str) -> list[Chart]:
    """The means chart and (if any series is an effective rank) the ranks chart of ``series``; the
    i-th series in the i-th colour of :data:`~headwidget.widget.trends.COLOURS`, as in the notebook."""
    colours = {name: COLOURS[i % len(COLOURS)] for i, name in enumerate(series)}
    ticks = layer_ticks(layers).tolist()  # at layers, as the notebook's chart: no "layer 0.5"
    ranks = {k: v for k, v in series.items() if k.startswith("eff. rank")}
    means = {k: v for k, v in series.items() if k not in ranks}
    charts = []
    if means:
        charts.append(
            Chart(
                "trend-means",
                "Per-layer summary",
                "layer",
                "mean |corr| / similarity",
                [_series(k, v, layers, colours[k]) for k, v in means.items()],
                subtitle=subtitle,
                x_ticks=ticks,
            )
        )
    if ranks:
        charts.append(
            Chart(
                "trend-ranks",
                "Head diversity per mechanism",
                "layer",
                "effective rank (QK operators)",
                [_series(k, v, layers, colours[k]) for k, v in ranks.items()],
                subtitle="entropy effective rank of the heads",
                x_ticks=ticks,
            )
        )
    return charts
