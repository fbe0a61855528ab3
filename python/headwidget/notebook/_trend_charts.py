"""The trend chart of a dashboard as :class:`~headwidget.core.charts.Chart` s, for its offline page.

The notebook draws the per-layer trends with bqplot (:class:`~headwidget.widget.LayerTrends`); a saved
page has no kernel and no bqplot, so it draws the same series with the widget's own charts: means
(channel correlation, head similarity before and after alignment) on one chart, effective ranks (when
the dashboard has mechanism trends) on another, one line with points per series in the colour the
notebook's chart gives it, hover naming the series, the layer and the value.

Example:
    >>> from headwidget.widget.trends import TrendSeries
    >>> series = [TrendSeries("K mean |channel corr|", "channel_corr", [0.2, 0.3]),
    ...           TrendSeries("eff. rank · mqa", "effective_rank", [3.0, 2.5])]
    >>> charts = trend_charts(series, [0, 1], "head similarity: per-token cosine, auto alignment")
    >>> [c.id for c in charts], charts[0].series[0].labels[1], charts[0].x_ticks
    (['trend-means', 'trend-ranks'], 'K mean |channel corr|\\nlayer 1: 0.3000', [0.0, 1.0])
"""

from __future__ import annotations

from collections.abc import Sequence

from headwidget.core.charts import Chart, Series
from headwidget.widget.trends import COLOURS, RANK_ROLES, TrendSeries, layer_ticks

__all__ = ["trend_charts"]


def _series(trend: TrendSeries, layers: Sequence[int], colour: str) -> Series:
    name, values = trend.name, trend.values
    labels = [f"{name}\nlayer {layer}: {v:.4f}" for layer, v in zip(layers, values, strict=True)]
    xs = [float(x) for x in layers]
    return Series(name, xs, list(values), labels, style="points+line", dashed=trend.dashed, color=colour)


def trend_charts(series: Sequence[TrendSeries], layers: Sequence[int], subtitle: str) -> list[Chart]:
    """The means chart and (if any series is an effective rank) the ranks chart of ``series``; the
    i-th series in the i-th colour of :data:`~headwidget.widget.trends.COLOURS`, as in the notebook."""
    colours = {s.name: COLOURS[i % len(COLOURS)] for i, s in enumerate(series)}
    ticks = layer_ticks(layers).tolist()  # at layers, as the notebook's chart: no "layer 0.5"
    ranks = [s for s in series if s.role in RANK_ROLES]
    means = [s for s in series if s.role not in RANK_ROLES]
    charts = []
    if means:
        charts.append(
            Chart(
                "trend-means",
                "Per-layer summary",
                "layer",
                "mean |corr| / similarity",
                [_series(s, layers, colours[s.name]) for s in means],
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
                [_series(s, layers, colours[s.name]) for s in ranks],
                subtitle="entropy effective rank of the heads",
                x_ticks=ticks,
            )
        )
    return charts
