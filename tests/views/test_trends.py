"""``LayerTrends``: per-layer numbers against KVStats and the analyses, and the link to a view's layer."""

from __future__ import annotations

import html

import numpy as np
import pytest
import torch
import traitlets

import headwidget
from headwidget.analysis import convert, head_diversity, operator_similarity
from headwidget.analysis.alignment import align
from headwidget.views import AlignmentView, ChannelView, TrendView
from headwidget.views.trends import layer_series
from headwidget.widget import LayerTrends
from headwidget.widget.trends import padded_range
from tiny_models import make_model, ragged_batches


@pytest.fixture(scope="module")
def llama():
    model = make_model("llama_gqa", dtype=torch.float32)
    stats = headwidget.capture(model, ragged_batches(), rope="both", inputs=True, progress=False)
    return model, stats


def test_layer_trends_numbers_and_linking(llama):
    model, stats = llama
    series = layer_series(stats, model=model, mechanisms=["mqa"])
    rho = stats.channel_corr(1, "value")
    assert series["V mean |channel corr|"][1] == pytest.approx(
        np.abs(rho[~np.eye(16, dtype=bool)]).mean(), abs=1e-12
    )
    before = align(stats, [1], kind="key").before
    assert series["K head similarity · before"][1] == pytest.approx(before[0, 1], abs=1e-12)
    after = align(stats, [1], kind="value", method="orthogonal").shown
    assert series["V head similarity · after"][1] == pytest.approx(after[0, 1], abs=1e-12)
    rank = head_diversity(operator_similarity(convert(model, 0, "mqa", stats), 0, "qk"))["effective_rank"]
    assert series["eff. rank · mqa"][0] == pytest.approx(rank, abs=1e-12)
    view = ChannelView(stats, layer=0)
    trends = LayerTrends(TrendView(stats, layer=0))
    traitlets.link((view, "layer"), (trends, "layer"))
    trends.points[0].selected = [1]  # a click on layer 1's point in the chart
    assert trends.layer == 1 and view.layer == 1 and trends.rule.x.tolist() == [1.0, 1.0]
    assert trends.points[0].selected is None
    view.layer = 0
    assert trends.rule.x.tolist() == [0.0, 0.0]


def test_y_range_follows_the_data_with_a_margin(llama):
    _, stats = llama
    trends = LayerTrends(TrendView(stats))
    left = [v for name, vs in trends.series.items() if not name.startswith("eff. rank") for v in vs]
    lo, hi = min(left), max(left)
    span = hi - lo
    assert trends.y_scale.min == pytest.approx(lo - 0.08 * span)
    assert trends.y_scale.max == pytest.approx(hi + 0.08 * span)
    assert trends.rule.y.tolist() == pytest.approx([trends.y_scale.min, trends.y_scale.max])
    # a series that dips below zero stays inside the plot
    assert padded_range([-0.177, 0.4])[0] < -0.177
    assert padded_range([0.3, 0.3]) == (-0.2, 0.8)
    assert padded_range([float("nan")]) == (0.0, 1.0)


def test_rank_axis_spans_the_ranks(llama):
    model, stats = llama
    trends = LayerTrends(TrendView(stats, model=model, mechanisms=["mqa"]))
    ranks = trends.series["eff. rank · mqa"]
    assert trends.rank_scale.min < min(ranks) <= max(ranks) < trends.rank_scale.max


def test_legend_sits_beside_the_plot_and_names_every_series(llama):
    _, stats = llama
    trends = LayerTrends(TrendView(stats))
    assert not any(getattr(m, "display_legend", False) for m in trends.figure.marks)
    title, row = trends.children
    assert title is trends.title and list(row.children) == [trends.figure, trends.legend]
    for name in trends.series:
        assert html.escape(name) in trends.legend.value
    assert trends.legend.value.count("stroke-dasharray") == sum("before" in n for n in trends.series)


def test_points_show_series_layer_and_value_on_hover(llama):
    _, stats = llama
    trends = LayerTrends(TrendView(stats))
    for name, dots in trends.dots.items():
        assert dots.interactions == {"click": "select", "hover": "tooltip"}
        assert dots.tooltip.fields == ["x", "y"]
        assert dots.tooltip.labels == ["layer", name]
        assert dots.tooltip.formats == ["d", ".3f"]
        assert dots.x.tolist() == [float(layer) for layer in stats.layers]
        assert dots.y.tolist() == pytest.approx(trends.series[name], nan_ok=True)


def test_trend_follows_the_alignment_views_method_and_metric(llama):
    _, stats = llama
    trends = LayerTrends(TrendView(stats))
    assert trends.subtitle == "head similarity: per-token cosine, auto alignment"
    assert trends.figure.title == ""  # (above the figure: bqplot's toolbar covers the end of its own)
    view = AlignmentView(stats, layer=0)
    traitlets.link((view, "alignment"), (trends, "alignment"))
    traitlets.link((view, "metric"), (trends, "metric"))
    view.metric = "pearson"
    view.alignment = "orthogonal"
    key = align(stats, [1], kind="key", method="orthogonal", metric="pearson")
    after = key.shown[~np.eye(len(key.shown), dtype=bool)].mean()
    assert trends.series["K head similarity · after"][1] == pytest.approx(after, abs=1e-12)
    assert trends.dots["K head similarity · after"].y[1] == pytest.approx(after, abs=1e-12)
    assert (
        trends.subtitle == "head similarity: Pearson, orthogonal alignment"
        and trends.subtitle in trends.title.value
    )
    left = [v for vs in trends.series.values() for v in vs]
    assert trends.y_scale.min < min(left) and trends.y_scale.max > max(left)
    view.alignment = "none"  # nothing aligned: after is before
    assert trends.series["V head similarity · after"] == trends.series["V head similarity · before"]
    with pytest.raises(ValueError, match="alignment must be one of"):
        layer_series(stats, alignment="sideways")


def test_the_layer_axis_ticks_at_layers_and_the_saved_page_keeps_the_colours(llama):
    """Two layers: ticks at 0 and 1 only (d3's own would be 0, 0.1, … read as "0 0 0 … 1 1"); each
    series on the saved page is drawn in the colour the notebook's chart gives it."""
    from headwidget.views.trends import trend_charts

    model, stats = llama
    trends = LayerTrends(TrendView(stats, model=model, mechanisms=["mqa"]))
    layer_axis = trends.figure.axes[0]
    assert layer_axis.label == "layer" and list(layer_axis.tick_values) == [0.0, 1.0]
    drawn = {s.name: s.color for c in trend_charts(trends.trend_series, stats.layers, "") for s in c.series}
    live = {name: line.colors[0] for name, line in trends.lines.items()}
    assert drawn == live and len(set(live.values())) == len(live)


def test_every_series_says_what_it_measures_and_is_drawn_by_that(llama):
    """A series' role, not its name, picks its axis, its line style and its chart on the saved page."""
    from headwidget.views.trends import layer_trends, trend_charts

    model, stats = llama
    found = layer_trends(stats, model=model, mechanisms=["mqa", "lrkv:1"])
    roles = {s.name: s.role for s in found}
    assert roles == {
        "K mean |channel corr|": "channel_corr",
        "K head similarity · before": "similarity_before",
        "K head similarity · after": "similarity_after",
        "V mean |channel corr|": "channel_corr",
        "V head similarity · before": "similarity_before",
        "V head similarity · after": "similarity_after",
        "eff. rank · mqa": "effective_rank",
        "eff. rank · lrkv:1": "effective_rank",
    }
    assert {s.name: s.values for s in found} == layer_series(stats, model=model, mechanisms=["mqa", "lrkv:1"])
    trends = LayerTrends(TrendView(stats, model=model, mechanisms=["mqa", "lrkv:1"]))
    assert trends.roles == roles
    for name, line in trends.lines.items():
        on_ranks = line.scales["y"] is trends.rank_scale
        assert on_ranks == (roles[name] == "effective_rank")
        assert (line.line_style == "dashed") == (roles[name] == "similarity_before")
    means, ranks = trend_charts(trends.trend_series, stats.layers, "")
    assert [s.name for s in ranks.series] == ["eff. rank · mqa", "eff. rank · lrkv:1"]
    assert all(s.dashed == (roles[s.name] == "similarity_before") for s in means.series)
    assert len(means.series) == 6


@pytest.mark.parametrize("metric", ["token_cosine", "cosine", "pearson"])
def test_the_unaligned_series_are_the_statistics_summary(llama, metric):
    """One function behind the demo's table, a timeline's series and the trend chart: the chart's
    channel-correlation and before-alignment series are ``KVStats.summary``'s numbers, exactly."""
    from headwidget.views.trends import layer_trends

    _, stats = llama
    rows = stats.summary(metric)
    found = {s.name: s.values for s in layer_trends(stats, metric=metric)}
    for kind, short in (("key", "K"), ("value", "V")):
        assert found[f"{short} mean |channel corr|"] == [r[f"{kind}_abs_corr"] for r in rows]
        assert found[f"{short} head similarity · before"] == [r[f"{kind}_head_cos"] for r in rows]
        for layer, before in zip(stats.layers, found[f"{short} head similarity · before"], strict=True):
            sim = stats.head_similarity(layer, kind, metric)  # against a plain numpy mean as well
            assert before == pytest.approx(sim[~np.eye(len(sim), dtype=bool)].mean(), abs=1e-12)
    only = layer_trends(stats, metric=metric, similarity_only=True)
    assert {s.role for s in only} == {"similarity_before", "similarity_after"}
    assert stats.summary(metric, channels=False) == [
        {k: v for k, v in r.items() if not k.endswith("_abs_corr")} for r in rows
    ]
    with pytest.raises(headwidget.ArgumentError, match="channels must be True or False"):
        stats.summary(channels="no")
    for wrong in ("cka", "l2"):  # refused before any layer is read, naming what the trends can align
        with pytest.raises(headwidget.UnknownMetricError, match="one of token_cosine, cosine, pearson,"):
            layer_trends(stats, metric=wrong)


# ---------------------------------------------------------------------- the trends as a registered view
def test_the_trend_view_draws_the_bqplot_charts_numbers_for_every_alignment_and_metric(llama):
    """``TrendView`` (the saved page's, marimo's and ``figure --view trends``' chart) draws the series
    the notebook's bqplot chart draws, for every method and metric it offers; the ranks on a chart of
    their own; the selected layer's values in the note."""
    from headwidget.views import TrendView, view_class
    from headwidget.views.trends import layer_trends

    model, stats = llama
    assert view_class("trends") is TrendView is headwidget.TrendView
    view = TrendView(stats, model=model, mechanisms=["mqa"])
    assert view.alignments_available == ["auto", "rope", "orthogonal", "none"]
    assert view.metrics_available == ["token_cosine", "cosine", "pearson"]
    for alignment in view.alignments_available:
        for metric in view.metrics_available:
            view.alignment, view.metric = alignment, metric
            assert view.error == ""
            expected = layer_trends(
                stats, model=model, mechanisms=["mqa"], alignment=alignment, metric=metric
            )
            means, ranks = view.grid.charts
            # each chart's last series: the marker of the selected layer
            drawn = [(s.name, s.y, s.dashed) for c in (means, ranks) for s in c.series[:-1]]
            assert drawn == [(s.name, s.values, s.dashed) for s in expected]
            assert [s.name for s in ranks.series[:-1]] == ["eff. rank · mqa"]
            trends = LayerTrends(TrendView(stats, alignment=alignment, metric=metric))
            assert trends.subtitle == means.subtitle and html.escape(means.subtitle) in trends.title.value
            assert {s.name: s.y for s in means.series[:-1]} == trends.series
    view.select_point("trend-means", 0, 1)
    assert view.layer == 1
    for chart in view.grid.charts:  # the selected layer is marked in each chart, across its values
        marker = chart.series[-1]
        lines = [y for s in chart.series[:-1] for y in s.y]
        assert (marker.name, marker.x, marker.style, marker.dashed) == (
            "layer 1 (selected)",
            [1.0, 1.0],
            "line",
            True,
        )
        assert marker.y == [min(lines), max(lines)]
    view.select_point("trend-means", len(view.grid.charts[0].series) - 1, 0)  # the marker: nothing
    assert view.layer == 1
    note = view.grid.charts[0].note
    after = next(s for s in view.grid.charts[0].series if s.name == "K head similarity · after")
    assert note.startswith("layer 1: K mean |channel corr| ") and f"after {after.y[1]:.3f}" in note
    view.select_point("trend-means", 0, 7)  # no such point: nothing moves
    assert view.layer == 1


def test_the_trend_view_refuses_what_it_cannot_draw(llama):
    from headwidget.views import TrendView

    model, stats = llama
    with pytest.raises(headwidget.UnknownMetricError, match="CKA is rotation-invariant"):
        TrendView(stats, metric="cka")
    with pytest.raises(headwidget.ArgumentError, match="alignment must be one of auto, rope"):
        TrendView(stats, alignment="sideways")
    with pytest.raises(headwidget.ArgumentError, match="pass model="):
        TrendView(stats, mechanisms=["mqa"])
    with pytest.raises(headwidget.ArgumentError, match="a list of specs"):
        TrendView(stats, model=model, mechanisms="mqa")
    with pytest.raises(headwidget.ArgumentError, match="a list of specs"):
        TrendView(stats, model=model, mechanisms=3)
    with pytest.raises(headwidget.LayerIndexError, match="layer 9 is out of range: the model has 2 layers"):
        TrendView(stats, layer=9)
    view = TrendView(stats)
    grid = view.grid
    view.metric = "cka"  # set later: said in ``error``, the last charts kept
    assert "CKA is rotation-invariant" in view.error and view.grid is grid


def test_figure_view_trends_draws_the_trends_of_saved_statistics(llama, tmp_path):
    from headwidget.cli import main

    _, stats = llama
    path = stats.save(tmp_path / "tiny.safetensors")
    out = tmp_path / "trends.svg"
    assert main(["figure", str(path), "--view", "trends", "--out", str(out)]) == 0
    svg = out.read_text()
    assert "Per-layer summary" in svg and "head similarity: per-token cosine, auto alignment" in svg


def test_the_bqplot_chart_draws_its_trend_views_series_computed_once(llama, monkeypatch):
    """In a dashboard, the bqplot chart (Jupyter) and the trend view (marimo, a saved page) are one
    source of numbers: the series are computed once, when the dashboard is built, and once more per
    new alignment method, whichever of the two is asked."""
    import headwidget.views.trends as trend_module

    _, stats = llama
    calls: list[bool] = []
    original = trend_module.layer_trends

    def counted(*args, **kwargs):
        calls.append(bool(kwargs.get("similarity_only")))
        return original(*args, **kwargs)

    monkeypatch.setattr(trend_module, "layer_trends", counted)
    dash = headwidget.explore(stats)
    assert calls == [False] and dash.trend_view is dash.trends.view
    grid = dash.trend_grid()
    assert calls == [False]  # the page's charts: the same series, not computed again
    means = grid.charts[0]
    assert [(s.name, list(s.y)) for s in means.series[:-1]] == [  # (the last: the layer's marker)
        (n, list(v)) for n, v in dash.trends.series.items()
    ]
    dash.trends.alignment = "none"
    assert calls == [False, True] and dash.trend_view.alignment == "none"
    assert dash.trend_view.grid.charts[0].series[0].y == list(dash.trends.series[means.series[0].name])
    before = {n: v for n, v in dash.trends.series.items() if "before" in n}
    after = {n.replace("after", "before"): v for n, v in dash.trends.series.items() if "after" in n}
    assert after == before  # no alignment: after is before
    dash.trend_view.alignment = "orthogonal"  # set on the view (the page's select): the chart follows
    assert calls == [False, True, True] and dash.trends.alignment == "orthogonal"
