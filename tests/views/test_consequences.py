"""ConsequenceView and charts: every number drawn equals the report's, recomputed independently."""

from __future__ import annotations

import itertools
import json
import math
import re

import numpy as np
import pytest
import torch

import headwidget
from headwidget.core.charts import Chart, ChartError, Series, encode_chart, pareto_front
from headwidget.core.panels import Panel, PanelGrid
from headwidget.evaluation import EvaluationReport, evaluate
from headwidget.export import ExportError, page_data, save
from headwidget.export._cells import cell_format
from headwidget.views import ConsequenceView, ViewSourceError
from headwidget.views.consequences import UnknownDamageMeasureError
from tiny_models import make_model


@pytest.fixture(scope="module")
def tiny_report() -> tuple[torch.nn.Module, EvaluationReport]:
    model = make_model("llama_gqa", dtype=torch.float32)
    calib = torch.randint(0, 96, (4, 24), generator=torch.Generator().manual_seed(1))
    held_out = torch.randint(0, 96, (4, 24), generator=torch.Generator().manual_seed(2))
    stats = headwidget.capture(model, calib, inputs=True, progress=False)
    report = evaluate(
        model,
        held_out,
        ["model", "mqa", "mqa+align", "lrkv:4"],
        stats=stats,
        per_layer=True,
        dtype=torch.float32,
        progress=False,
    )
    return model, report


def made_up_report(**extra) -> EvaluationReport:
    measures = {
        "model": {"nll": 2.0, "perplexity": math.exp(2.0), "kl": 0.0, "top1": 1.0},
        "mqa": {"nll": 2.6, "perplexity": math.exp(2.6), "kl": 0.5, "top1": 0.7},
        "gqa:2": {"nll": 2.2, "perplexity": math.exp(2.2), "kl": 0.2, "top1": 0.9},
        "lrkv:8": {"nll": 2.3, "perplexity": math.exp(2.3), "kl": 0.25, "top1": 0.85},
        "kv:int4": {"nll": 2.05, "perplexity": math.exp(2.05), "kl": 0.04, "top1": 0.97},
    }
    fields = {
        "model": "tiny",
        "kind": "causal-lm",
        "variants": list(measures),
        "measures": measures,
        "kv_bytes_per_token": {"model": 1024, "mqa": 256, "gqa:2": 512, "lrkv:8": 640, "kv:int4": 320},
        "tokens": 1234,
        "sequences": 5,
        "fingerprint": "fedcba9876543210",
        "dtype": "torch.bfloat16",
    }
    fields.update(extra)
    return EvaluationReport(**fields)


# ---------------------------------------------------------------------- charts
def brute_front(costs: list[float], damages: list[float]) -> set[int]:
    """Points no other point weakly beats on both with a strict win on one (ties: the first)."""
    keep = set()
    for i in range(len(costs)):
        beaten = any(
            (costs[j] <= costs[i] and damages[j] <= damages[i])
            and (costs[j] < costs[i] or damages[j] < damages[i] or j < i)
            for j in range(len(costs))
            if j != i
        )
        if not beaten:
            keep.add(i)
    return keep


def test_pareto_front_matches_a_brute_force_search():
    rng = np.random.default_rng(0)
    for _ in range(200):
        n = int(rng.integers(1, 9))
        costs = rng.integers(1, 6, n).astype(float).tolist()  # ties on purpose
        damages = rng.integers(0, 5, n).astype(float).tolist()
        front = pareto_front(costs, damages)
        assert set(front) == brute_front(costs, damages)
        assert [costs[i] for i in front] == sorted(costs[i] for i in front)
    assert pareto_front([1.0, math.nan], [0.0, -1.0]) == [0]


def test_series_refuse_mismatched_lengths_and_unknown_styles():
    with pytest.raises(ChartError, match="one entry per point, got 2, 1 and 2"):
        Series("s", [1, 2], [1], ["a", "b"])
    with pytest.raises(ChartError, match="style must be one of"):
        Series("s", [1], [1], ["a"], style="bars")  # type: ignore[arg-type]
    encoded = encode_chart(Chart("c", "t", "x", "y", [Series("s", [1, math.inf], [math.nan, 2], ["a", "b"])]))
    assert encoded["series"][0]["x"] == [1.0, None] and encoded["series"][0]["y"] == [None, 2.0]
    json.dumps(encoded, allow_nan=False)  # valid JSON: no NaN


# ---------------------------------------------------------------------- the view
def test_tradeoff_points_are_the_reports_bytes_and_damage():
    report = made_up_report()
    view = ConsequenceView(report)
    chart = view.grid.charts[0]
    mech, quant, front = chart.series
    assert (mech.name, quant.name, front.name) == ("mechanisms", "quantizers", "Pareto frontier")
    specs = ["model", "mqa", "gqa:2", "lrkv:8"]
    assert mech.x == [report.kv_bytes_per_token[v] for v in specs]
    assert mech.y == pytest.approx([report.nll[v] - 2.0 for v in specs], abs=1e-15)
    assert quant.x == [320.0] and quant.y == pytest.approx([0.05], abs=1e-15)
    assert chart.x_log and chart.y_reference == 0.0
    # the frontier by brute force over all five variants
    all_specs = report.variants
    costs = [float(report.kv_bytes_per_token[v]) for v in all_specs]
    damages = [report.nll[v] - 2.0 for v in all_specs]
    want = sorted(brute_front(costs, damages), key=lambda i: costs[i])
    assert front.x == [costs[i] for i in want]
    assert chart.note == "frontier: " + ", ".join(all_specs[i] for i in want)
    assert "lrkv:8" not in chart.note  # beaten by gqa:2 on both counts
    hover = mech.labels[1].split("\n")
    assert hover == [
        "mqa",
        "KV 256 B/token over all layers (bf16) · 25.0% of the model's",
        "ΔNLL +0.6000 · perplexity 13.46",
        "KL 0.5000 · top-1 agreement 0.700",
    ]
    assert "1,234 held-out tokens in 5 sequences" in chart.subtitle and "bfloat16" in chart.x_label
    # no per-layer sweep: the chart alone
    assert view.grid.panels == []


@pytest.mark.parametrize(
    ("measure", "values"), [("kl", [0.0, 0.5, 0.2, 0.25]), ("top1", [0.0, 0.3, 0.1, 0.15])]
)
def test_the_damage_measure_switches_the_y_axis(measure, values):
    view = ConsequenceView(made_up_report(), measure=measure)
    assert view.grid.charts[0].series[0].y == pytest.approx(values, abs=1e-15)
    assert view.measures_available == ["nll", "kl", "top1"]
    view.measure = "perplexity"  # not a damage: reported, last chart kept
    assert "unknown damage measure 'perplexity'" in view.error
    with pytest.raises(UnknownDamageMeasureError, match="choose one of nll, kl, top1"):
        ConsequenceView(made_up_report(), measure="ppl")


def test_encoder_reports_draw_their_own_measures():
    measures = {
        "model": {"hidden_rel_error": 0.0, "embedding_cosine": 1.0},
        "mqa": {"hidden_rel_error": 0.4, "embedding_cosine": 0.9},
    }
    report = EvaluationReport(
        model="bert",
        kind="encoder",
        variants=["model", "mqa"],
        measures=measures,
        kv_bytes_per_token={"model": 100, "mqa": 25},
        tokens=10,
        sequences=1,
        fingerprint="0" * 16,
        dtype="torch.float32",
    )
    view = ConsequenceView(report)
    assert view.measures_available == ["hidden_rel_error", "embedding_cosine"]
    assert view.grid.charts[0].series[0].y == [0.0, 0.4]
    view.measure = "embedding_cosine"
    assert view.grid.charts[0].series[0].y == pytest.approx([0.0, 0.1], abs=1e-15)


def test_the_damage_map_is_the_per_layer_sweep(tiny_report):
    _, report = tiny_report
    view = ConsequenceView(report)
    (panel,) = view.grid.panels
    assert report.per_layer["model"] == [0.0] * len(report.layers)  # left out of the map
    specs = ["mqa", "mqa+align", "lrkv:4"]
    assert panel.row_labels == specs
    np.testing.assert_array_equal(panel.matrix, np.array([report.per_layer[v] for v in specs]))
    peak = max(abs(x) for v in specs for x in report.per_layer[v])
    assert (view.grid.vmin, view.grid.vmax) == (-peak, peak)
    assert panel.col_offset == report.layers[0] == 0
    assert (panel.row_axis, panel.col_axis) == ("variant", "layer")  # what the tooltip names them
    assert panel.axis_titles  # ... and what the axes are titled
    # The selected layer's column is outlined; what a click does is a hint (the live widget says it,
    # a figure and a saved page do not), never the note.
    assert (panel.mark_col, panel.mark_row) == (report.layers.index(view.layer), -1)
    assert panel.hint == "a click on a cell selects its layer" and "click" not in panel.note
    # the note names the selected layer's values and the most fragile layer, by hand
    view.select_cell("damage", 1, 1)
    assert view.layer == 1 and view.grid.panels[0].mark_col == report.layers.index(1)
    col = report.layers.index(1)
    expect = ", ".join(f"{v} {report.per_layer[v][col]:+.4f}" for v in specs)
    assert panel.note != view.grid.panels[0].note  # recomputed for the new layer
    assert view.grid.panels[0].note.startswith(f"layer 1: {expect}")
    worst = max(
        itertools.product(range(len(specs)), range(len(report.layers))),
        key=lambda ij: report.per_layer[specs[ij[0]]][ij[1]],
    )
    assert (
        f"most fragile: layer {report.layers[worst[1]]} under {specs[worst[0]]}" in view.grid.panels[0].note
    )
    view.select_cell("damage", 0, 99)  # outside the map: nothing happens
    view.select_cell("other", 0, 0)
    assert view.layer == 1


def test_the_mqa_point_is_evaluates_delta_nll(tiny_report):
    _, report = tiny_report
    chart = ConsequenceView(report).grid.charts[0]
    mech = chart.series[0]
    i = report.variants.index("mqa")
    assert mech.y[i] == pytest.approx(report.nll["mqa"] - report.nll["model"], abs=1e-12)
    assert mech.x[i] == report.kv_bytes_per_token["mqa"] < report.kv_bytes_per_token["model"]


def test_the_view_refuses_what_is_not_a_report():
    with pytest.raises(ViewSourceError, match="needs an evaluation report"):
        ConsequenceView({"model": 1})  # type: ignore[arg-type]
    with pytest.raises(ViewSourceError, match=r"report=headwidget\.evaluate"):
        ConsequenceView.create()


# ---------------------------------------------------------------------- widget, dashboard, export
def test_the_widget_sends_the_charts_and_a_cell_click_selects_the_layer(tiny_report):
    _, report = tiny_report
    view = headwidget.ConsequenceView(report)
    widget = view.widget
    assert widget.view == "consequences" and [c["trait"] for c in widget.controls] == ["measure"]
    assert widget.charts[0]["id"] == "tradeoff" and widget.panels[0]["id"] == "damage"
    assert widget.charts[0]["series"][0]["y"] == view.grid.charts[0].series[0].y
    caption = f"{report.model} · {len(report.variants)} variants on {report.tokens} held-out tokens"
    assert widget.heading == view.caption == caption
    widget._handle_message(widget, {"type": "click", "panel": "damage", "row": 0, "col": 1}, [])
    assert view.layer == 1 and widget.layer == 1
    points = []
    widget.on_click(points.append)
    widget._handle_message(widget, {"type": "chart_click", "chart": "tradeoff", "series": 0, "point": 2}, [])
    assert points[-1] == {"chart": "tradeoff", "series": 0, "point": 2}


def test_a_dashboard_with_a_report_has_the_consequences_tab_linked_by_layer(tiny_report):
    model, report = tiny_report
    stats = headwidget.capture(model, torch.randint(0, 96, (2, 16)), progress=False)
    dash = headwidget.explore(stats, report=report)
    assert list(dash.views) == ["channels", "alignment", "consequences"]
    assert dash.consequences is not None and dash.tabs.titles[-1] == "Consequences"
    tab = dash.consequences.widget
    tab._handle_message(tab, {"type": "click", "panel": "damage", "row": 0, "col": 1}, [])
    assert dash.channels.layer == dash.alignment.layer == dash.trends.layer == 1
    dash.channels.layer = 0
    assert dash.consequences.layer == 0
    assert headwidget.explore(stats).consequences is None


def test_exports_draw_the_chart_and_the_map(tiny_report, tmp_path):
    _, report = tiny_report
    view = ConsequenceView(report)
    png = save(view, tmp_path / "c.png", dpi=60)
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = save(view, tmp_path / "c.svg").read_text()
    assert 'id="tradeoff"' in svg and 'id="damage"' in svg and "KV bytes against damage" in svg
    assert "mqa+align" in svg  # points are labelled by spec in a static figure
    assert "click" not in svg  # a figure cannot be clicked
    # Each damage-map cell carries its value, as the widget prints it (two decimals of the largest).
    (panel,) = view.grid.panels
    write = cell_format(float(np.nanmax(np.abs(panel.matrix))))
    cells = re.findall(r"font-size: 6px[^>]*>([^<]*)</text>", svg)
    assert sorted(cells) == sorted(write(v) for v in panel.matrix.ravel())
    pdf = save(view, tmp_path / "c.pdf").read_bytes()
    assert pdf.startswith(b"%PDF")
    chart_only = ConsequenceView(made_up_report())
    assert 'id="damage"' not in save(chart_only, tmp_path / "o.svg").read_text()
    data = page_data(view)
    frame = data["frames"][str(next(iter(data["frames"])))]
    charts = [
        {**c, "series": [data["series"][i] for i in c["series"]]} for c in frame["charts"]
    ]  # (held once)
    assert charts[0]["series"][0]["labels"] == view.grid.charts[0].series[0].labels
    assert data["state"]["charts"] == charts
    with pytest.raises(ExportError, match="no panels or charts"):
        save(PanelGrid([], 0.0, 1.0, "magma", ""), tmp_path / "e.png")


def test_a_grid_of_panels_alone_exports_as_before(tmp_path):
    grid = PanelGrid([Panel("k", "Keys", np.eye(3))], -1.0, 1.0, "diverging", "r")
    svg = save(grid, tmp_path / "k.svg").read_text()
    assert 'id="k"' in svg and "tradeoff" not in svg


def test_a_dashboard_with_a_tab_without_a_layer_slider_saves_its_page_over_the_layers(tiny_report, tmp_path):
    """``Dashboard.save(..., layers=[...])`` gives the layers to the tabs that have a layer slider; the
    consequences tab has none, and the save used to be refused ("has no layer slider")."""
    model, report = tiny_report
    stats = headwidget.capture(model, torch.randint(0, 96, (2, 16)), progress=False)
    (page,) = headwidget.explore(stats, report=report).save(tmp_path / "dash.html", layers=[1])
    assert page.read_text().count("<iframe") == 4  # the trends and three tabs
