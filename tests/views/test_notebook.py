"""The displayable views: one class per view, shown by a widget shell that sends exactly the view's
panels and mirrors its traits both ways; explore."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headwidget
from headwidget import views
from headwidget.core.panels import encode_panel
from headwidget.notebook import Dashboard, ViewShell, explore, shell_class
from headwidget.views import AlignmentView, ChannelView, MechanismView
from headwidget.widget import HeadWidget
from tiny_models import make_model, ragged_batches


@pytest.fixture(scope="module")
def llama():
    model = make_model("llama_gqa", dtype=torch.float32)
    stats = headwidget.capture(
        model, ragged_batches(), rope="both", inputs=True, cross_layer=True, progress=False
    )
    return model, stats


def decode(panel: dict) -> np.ndarray:
    dtype = {"float16": "<f2", "float32": "<f4"}[panel["dtype"]]
    return np.frombuffer(panel["data"], dtype=dtype).reshape(panel["rows"], panel["cols"]).astype(np.float64)


def test_one_class_per_view_name_and_its_widget_is_a_shell():
    assert headwidget.ChannelView is ChannelView is views.view_class("channels")
    assert headwidget.explore is explore and headwidget.HeadWidget is HeadWidget
    for name in views.view_names():
        cls = views.view_class(name)
        assert not issubclass(cls, HeadWidget)  # a view is not a widget: it has one
        shell = shell_class(cls)
        assert (
            shell is shell_class(cls)
            and issubclass(shell, ViewShell)
            and shell.__name__ == f"{cls.__name__}Widget"
        )
        synced = set(cls.class_trait_names(sync=True))
        assert synced <= set(shell.class_trait_names(sync=True))


def test_the_widget_sends_the_views_panels_and_controls(llama):
    _, stats = llama
    view = ChannelView(stats, layer=1, channel_start=3, channel_width=9)
    widget = view.widget
    assert widget is view.widget and widget.shows is view
    assert widget.view == "channels"
    assert widget.controls == [c.to_json() for c in views.ChannelView.view_controls()]
    sent = widget.panels[0]
    assert (sent["row_offset"], sent["row_step"], sent["rows"]) == (3, 1, 9)
    assert np.abs(decode(sent) - stats.channel_corr(1, "key")[3:12, 3:12]).max() <= 4.9e-4
    grid = view.grid
    assert widget.panels == [encode_panel(p, vmin=grid.vmin, vmax=grid.vmax) for p in grid.panels]
    assert (widget.vmin, widget.vmax, widget.colormap, widget.columns) == (-1.0, 1.0, "diverging", 1)
    assert widget.layer_label == "layer 1 of 0–1 (51 tokens)" and widget.status == ""
    assert (widget.channel_start, widget.channel_width, widget.num_layers) == (3, 9, 2)
    model_name = stats.meta.model_name or stats.meta.model_class
    assert widget.heading == f"{model_name} · layer 1"  # shown above the controls
    view.layer = 0  # from Python: the widget follows
    assert [p["id"] for p in widget.panels] == ["key-0", "value-0"] and widget.layer == 0
    assert widget.heading == f"{model_name} · layer 0" and widget.layer_label.startswith("layer 0 of")
    view.layer = 9  # a layer the model has not: the error says so, the heading still says what is shown
    assert "layer 9 is out of range" in widget.error and widget.panels[0]["title"] == "Keys · layer 0"
    assert widget.heading == view.caption == f"{model_name} · layer 0"
    view.layer = 0
    window = stats.channel_corr(0, "value")[3:12, 3:12]
    np.testing.assert_array_equal(decode(widget.panels[1]), window.astype("<f2").astype(np.float64))
    widget.layer = 1  # what the slider's commit does
    assert view.layer == 1 and [p["id"] for p in widget.panels] == ["key-1", "value-1"]
    mechanisms = MechanismView(make_model("llama_mqa"), mechanisms=["model"]).widget
    assert [c["trait"] for c in mechanisms.controls] == ["layer", "circuit", "mechanisms", "add_mechanism"]
    assert mechanisms.circuits_available == ["qk", "ov"] and "circuit" in mechanisms.keys
    view.close()


def test_a_view_displays_as_its_widget_in_jupyter_and_in_marimo(llama):
    _, stats = llama
    view = ChannelView(stats, layer=1, prefetch=False)
    bundle = view._repr_mimebundle_()
    bundle = bundle[0] if isinstance(bundle, tuple) else bundle  # (data, metadata), as IPython allows
    assert bundle["application/vnd.jupyter.widget-view+json"]["model_id"] == view.widget.model_id
    assert bundle["text/plain"].splitlines()[:2] == [
        f"ChannelView: {view.caption}",
        "panels: Keys · layer 1; Values · layer 1",
    ]
    assert view._display_() is view.widget  # marimo's display protocol
    # marimo draws it as the widget: a view as a cell's last expression is the anywidget element
    from marimo._output.formatters.formatters import register_formatters
    from marimo._output.formatting import try_format

    register_formatters()
    shown = try_format(view)
    assert shown.mimetype == "text/html" and "<marimo-anywidget" in shown.data
    assert view.widget.model_id in shown.data


def test_an_entry_typed_in_the_page_reaches_the_view_and_clears(llama):
    view = MechanismView(make_model("llama_mqa"), mechanisms=["model"], prefetch=False)
    widget = view.widget
    widget.add_mechanism = " mqa "  # what the entry sends on Enter
    assert view.mechanisms == ["model", "mqa"] and widget.mechanisms == ["model", "mqa"]
    assert view.add_mechanism == "" and widget.add_mechanism == ""
    assert [p["title"].split(" · ")[0] for p in widget.panels][:2] == [
        p.title.split(" · ")[0] for p in view.grid.panels
    ][:2]


def test_a_value_the_view_refuses_from_the_page_is_said_and_undone(llama):
    _, stats = llama
    view = ChannelView(stats, layer=1, prefetch=False)
    widget = view.widget
    before = widget.panels
    widget.layer = 0.5  # not a layer: the view's trait refuses it
    assert view.layer == 1 and widget.layer == 1 and widget.panels == before
    assert "expected an int" in view.error and widget.error == view.error
    widget.layer = 0
    assert view.layer == 0 and view.error == "" and widget.error == ""


def test_a_closed_widget_leaves_the_view_usable_and_a_new_one_is_made(llama):
    _, stats = llama
    view = ChannelView(stats, layer=1, prefetch=False)
    first = view.widget
    first.close()
    view.layer = 0  # no closed widget is told
    assert first.layer == 1 and view.grid.panels[0].id == "key-0"
    second = view.widget
    assert second is not first and second.layer == 0 and second.panels[0]["id"] == "key-0"
    view.close()
    assert second.comm is None and view._widget is None


def test_a_bad_state_shows_the_error_and_keeps_the_sent_panels(llama):
    _, stats = llama
    view = ChannelView(stats, layer=0)
    widget = view.widget
    before = widget.panels
    view.layer = 9
    assert "out of range" in view.error and widget.error == view.error and widget.panels == before
    view.layer = 1
    assert widget.error == "" and widget.panels[0]["id"] == "key-1"


def test_status_says_computing_while_the_panels_are_computed(llama):
    _, stats = llama
    view = AlignmentView(stats, layer=0)
    seen = []
    view.widget.observe(lambda change: seen.append(change["new"]), names=["status"])
    view.metric = "pearson"
    assert seen == ["computing…", ""]


def test_computing_is_said_only_when_there_is_some_and_ends_with_the_panels(llama):
    """A first visit of a layer says "computing…" and clears it in the message that brings the panels;
    a revisit (the window matrices are kept) is not announced: one message, the panels."""
    _, stats = llama
    view = views.ChannelView(stats, layer=0, prefetch=False)
    widget = view.widget
    messages: list[set[str]] = []
    sent = widget._send  # what ipywidgets sends to the page: one call per message

    def record(msg, buffers=None):
        messages.append(set(msg.get("state", {})))
        return sent(msg, buffers)

    widget._send = record
    try:
        view.layer = 1  # a first visit
        saying = [m for m in messages if "status" in m]
        assert len(saying) == 2 and saying[0] == {"status"} and widget.status == ""
        assert "panels" in saying[1]  # the panels, and "computing" over, in one message
        assert view.ready(view.current_state()) and not view.ready(
            view.current_state().replace(channel_start=4)
        )
        messages.clear()
        view.layer = 0  # a revisit
        assert all("status" not in m for m in messages), messages
        assert any({"panels", "layer_label", "heading"} <= m for m in messages), messages  # one message
    finally:
        widget._send = sent


def test_a_new_view_class_is_displayed_without_a_widget_class_of_its_own(llama):
    _, stats = llama

    class Plain(views.ChannelView):
        """A channel view under another name."""

    view = Plain(stats, layer=1, prefetch=False)
    widget = view.widget
    assert isinstance(widget, shell_class(Plain)) and type(widget).__name__ == "PlainWidget"
    assert widget.view == "channels" and widget.panels[0]["id"] == "key-1"
    assert repr(widget).startswith("Plain: ")
    with pytest.raises(headwidget.UnknownViewError, match="unknown view 'plain'"):
        views.view_class("plain")


def test_explore_links_the_layer_across_tabs():
    model = make_model("llama_gqa", dtype=torch.float32)
    dash = explore(model, ragged_batches(), progress=False, mechanisms_trend=True)
    assert dash.mechanisms is not None
    ranks = dash.trends.series[f"eff. rank · {dash.mechanisms.mechanisms[3]}"]
    assert len(ranks) == 2 and all(r > 0 for r in ranks)
    dash.channels.layer = 1
    assert dash.alignment.layer == 1 and dash.mechanisms is not None and dash.mechanisms.layer == 1
    assert dash.alignment.grid.panels[0].row_labels == ["L1·H0", "L1·H1"]
    dash.mechanisms.layer = 0
    assert dash.channels.layer == 0
    dash.trends.points[1].selected = [1]
    assert dash.channels.layer == 1 and dash.alignment.layer == 1
    assert dash.tabs.titles == ("Channels", "Head alignment", "Mechanisms")
    assert list(dash.views) == [  # every view but the trends, which the dashboard draws above the tabs
        n
        for n in views.view_names()
        if views.view_class(n).sources.main in ("stats", "model")
        and views.view_class(n).shows(dash.stats)
        and n != "trends"
    ]


def test_the_dashboard_in_marimo_is_the_trend_chart_over_tabs_of_the_views_widgets(llama):
    """marimo runs anywidgets, not ipywidgets or bqplot: the dashboard shows the trend chart drawn by
    the front end's charts (the bqplot chart's series, the same numbers) over a tab per view."""
    from marimo._output.formatting import try_format

    from headwidget.views.trends import trend_charts

    model, stats = llama
    dash = Dashboard(stats, model)
    trend = dash.trend_widget
    assert trend is dash.trend_widget and trend.view == "trends" and trend.panels == []
    expected = trend_charts(dash.trends.trend_series, stats.layers, dash.trends.subtitle)
    assert [c["id"] for c in trend.charts] == [c.id for c in expected] == ["trend-means"]
    assert trend.charts[0]["x_ticks"] == [float(layer) for layer in stats.layers]  # ticks at layers
    *lines, marker = trend.charts[0]["series"]
    for sent, series in zip(lines, expected[0].series, strict=True):
        assert sent["name"] == series.name and sent["y"] == series.y == dash.trends.series[series.name]
    assert (marker["name"], marker["x"]) == ("layer 0 (selected)", [0.0, 0.0])  # the selected layer
    # A click on a point selects its layer in every tab (the trends' layer is linked to them).
    trend._handle_message(trend, {"type": "chart_click", "chart": "trend-means", "series": 0, "point": 1}, [])
    assert dash.channels.layer == dash.alignment.layer == dash.trends.layer == 1
    assert dash.channels.widget.layer == 1
    assert trend.charts[0]["series"][-1]["x"] == [1.0, 1.0]  # the marker moved with it
    trend._handle_message(trend, {"type": "chart_click", "chart": "trend-means", "series": 0, "point": 7}, [])
    assert dash.channels.layer == 1  # no such layer: nothing moves
    # The alignment tab's method moves the chart's similarity series, as it moves the bqplot chart's.
    dash.alignment.alignment = "orthogonal"
    assert dash.trends.alignment == "orthogonal" and "orthogonal" in trend.charts[0]["subtitle"]
    drawn = {s["name"]: s["y"] for s in trend.charts[0]["series"][:-1]}  # (the last: the marker)
    assert drawn == {name: list(values) for name, values in dash.trends.series.items()}
    shown = try_format(dash)  # what a marimo cell whose last expression is the dashboard shows
    assert shown.mimetype == "text/html" and "<marimo-tabs" in shown.data
    for widget in (trend, *(v.widget for v in dash.views.values())):
        assert widget.model_id in shown.data


def test_explore_of_statistics_has_no_tab_that_needs_weights(llama):
    _, stats = llama
    dash = Dashboard(stats, options={"channels": {"channel_width": 4}})
    assert dash.mechanisms is None and "mechanisms" not in dash.views
    assert dash.tabs.titles == tuple(
        views.view_class(n).title
        for n in views.view_names()
        if views.view_class(n).sources.main == "stats"
        and views.view_class(n).shows(stats)
        and n != "trends"  # drawn above the tabs
    )
    assert dash.channels.grid.panels[0].matrix.shape == (4, 4)


def test_the_trend_chart_follows_the_alignment_tabs_method_and_metric(llama):
    from headwidget.views.trends import layer_series

    _, stats = llama
    dash = Dashboard(stats)
    assert (dash.trends.alignment, dash.trends.metric) == ("auto", "token_cosine")
    dash.alignment.metric = "pearson"
    dash.alignment.alignment = "orthogonal"
    assert (dash.trends.alignment, dash.trends.metric) == ("orthogonal", "pearson")
    expected = layer_series(stats, alignment="orthogonal", metric="pearson", similarity_only=True)
    for name, values in expected.items():
        np.testing.assert_allclose(dash.trends.series[name], values)
    assert "Pearson" in dash.trends.subtitle and "orthogonal" in dash.trends.title.value
    metric = next(c for c in dash.alignment.widget.controls if c["trait"] == "metric")
    assert dict(metric["labels"])["token_cosine"] == "per-token cosine"  # the drop-down's words, too
    dash.alignment.metric = "cka"  # rotation-invariant: the chart stays on the metric it names
    assert dash.alignment.error == "" and dash.trends.metric == "pearson"
    assert "Pearson" in dash.trends.subtitle


def test_dashboard_saves_every_tab(llama, tmp_path):
    import html
    import json
    import re

    model, stats = llama
    dash = Dashboard(stats, model)
    pngs = dash.save(tmp_path / "dash.png", dpi=40)
    assert [p.name for p in pngs] == [
        "dash-channels.png",
        "dash-alignment.png",
        "dash-mechanisms.png",
        "dash-layer_similarity.png",  # (the statistics hold cross-layer moments)
    ]
    assert all(p.read_bytes()[:4] == b"\x89PNG" for p in pngs)
    svgs = dash.save(tmp_path / "dash.svg")
    for svg, view in zip(svgs, dash.views.values(), strict=True):
        text = svg.read_text()
        assert view.caption in text and view.grid.panels[0].title in text
    (small,) = dash.save(tmp_path / "small.html", layers=[0, 1], max_states=2)  # what the page advises
    assert "holds 2 of the" in html.unescape(small.read_text()) and "max_states=" in html.unescape(
        small.read_text()
    )
    with pytest.raises(headwidget.export.ExportError, match=r"max_states= applies to \.html"):
        dash.save(tmp_path / "dash.png", max_states=2)
    (page,) = dash.save(tmp_path / "dash.html", layers=[0, 1])
    text = page.read_text()
    summary, *frames = [html.unescape(m) for m in re.findall(r'srcdoc="([^"]*)"', text)]
    assert len(frames) == len(dash.views) == 4
    # the trend chart, offline: every series of the notebook's bqplot chart, the same numbers
    blob = summary.split('<script type="application/json" id="headwidget-data">')[1].split("</script>")[0]
    charts = json.loads(blob)["state"]["charts"]
    drawn = {s["name"]: s["y"] for c in charts for s in c["series"]}
    assert drawn.pop("layer 0 (selected)")  # the selected layer's marker
    assert drawn.keys() == dash.trends.series.keys()
    assert all(c["hint"] == "" and "click" not in c["note"] for c in charts)  # a page's click selects nothing
    for name, values in dash.trends.series.items():
        assert drawn[name] == pytest.approx(values, abs=0, nan_ok=True)
    assert all(s["x"] == [float(x) for x in stats.layers] for c in charts for s in c["series"][:-1])
    for frame, view in zip(frames, dash.views.values(), strict=True):
        data = frame.split('<script type="application/json" id="headwidget-data">')[1].split("</script>")[0]
        assert (
            f"<h1>{html.escape(view.title)} · {stats.meta.model_name or stats.meta.model_class}</h1>" in frame
        )
        page = json.loads(data)
        assert page["axes"][0]["trait"] == "layer"  # every tab's page: both layers, by its slider
        assert {json.loads(key)[0] for key in page["frames"]} == {0, 1}
    assert "://" not in text  # nothing to fetch
    with pytest.raises(headwidget.HeadwidgetError, match=r"use \.html, \.png, \.svg or \.pdf"):
        dash.save(tmp_path / "dash.gif")


@pytest.fixture(scope="module")
def wide_stats():
    """Statistics of a GPT-2 with 256 key channels (two layers): enough cells to fit to a screen."""
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=256, n_layer=2, n_head=4)).eval()
    return headwidget.capture(model, torch.randint(0, 64, (4, 24)), progress=False)


def block_means(matrix: np.ndarray, block: int) -> np.ndarray:
    """Float64 mean of each block × block square, by a loop (partial edge blocks included)."""
    n = -(-matrix.shape[0] // block)
    out = np.empty((n, n))
    for i in range(n):
        for j in range(n):
            out[i, j] = matrix[i * block : (i + 1) * block, j * block : (j + 1) * block].mean()
    return out


def test_a_shown_view_sends_no_more_cells_than_the_page_draws(wide_stats):
    view = ChannelView(wide_stats, layer=0, prefetch=False)
    widget = view.widget
    assert widget.panels[0]["rows"] == 256 and view.resolution is None  # no page yet: the view's own limit
    widget.panel_pixels = 100  # what the front end reports: a plot 100 device pixels wide
    assert widget.panels[0]["rows"] == 256  # the page has these already: nothing resent
    view.layer = 1
    for sent, kind in zip(widget.panels, ("key", "value"), strict=True):
        block = -(-256 // 100)
        assert (sent["rows"], sent["row_step"], sent["col_step"]) == (86, block, block)
        expected = block_means(wide_stats.channel_corr(1, kind), block)
        assert np.abs(decode(sent) - expected).max() <= 4.9e-4 + 1e-12  # float16 on the wire
        assert f"downsampled 256→86: mean of {block}×{block}" in sent["note"]
    # A wider plot asks for more at once; a narrower one waits for the next change.
    widget.panel_pixels = 200
    assert widget.panels[0]["rows"] == 128
    widget.panel_pixels = 150
    assert widget.panels[0]["rows"] == 128
    view.channel_width = 64  # a window narrower than the plot is sent whole
    assert (widget.panels[0]["rows"], widget.panels[0]["row_step"]) == (64, 1)
    view.close()


def test_saving_a_shown_view_keeps_the_full_resolution(wide_stats, tmp_path):
    from headwidget.export import grid_of
    from headwidget.export._source import collect_frames

    view = ChannelView(wide_stats, layer=1, prefetch=False)
    widget = view.widget
    widget.panel_pixels = 60
    view.layer = 0
    shown = widget.panels
    assert shown[0]["rows"] == 52
    grid = grid_of(view)
    np.testing.assert_array_equal(grid.panels[0].matrix, wide_stats.channel_corr(0, "key"))
    frames = collect_frames(view, None, 2**30)
    assert {p["rows"] for f in frames.frames.values() for p in f["panels"]} == {256}
    view.save(tmp_path / "channels.html")
    assert widget.panels == shown and view.resolution == 60 and view.layer == 0  # the screen's again
    view.close()


@pytest.mark.parametrize("reported", [-5, 0, 10**9])
def test_a_nonsense_plot_size_means_not_known(wide_stats, reported):
    view = ChannelView(wide_stats, layer=0, prefetch=False)
    widget = view.widget
    widget.panel_pixels = 50
    widget.panel_pixels = reported
    assert widget.panel_pixels == 0 and view.resolution is None and widget.panels[0]["rows"] == 256
    view.close()
