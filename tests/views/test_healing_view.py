"""HealingView: the recovery curves are the runs' curves, the map is a run's per-layer errors, toggles and
clicks do what they say; a dashboard's healing tab shares the layer; figures and pages export."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import headwidget
from headwidget.export import page_data, save
from headwidget.views import HealingView, ViewSourceError
from healing_cases import llama, small_heal

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


@pytest.fixture(scope="module")
def runs() -> dict[str, headwidget.HealingRun]:
    model = llama()
    return {
        "mqa": small_heal(headwidget.apply(model, "mqa"), model),
        "mla:8": small_heal(headwidget.apply(model, "mla:8", layers=[0, 2]), model),
    }


def test_the_curves_are_the_runs_curves_with_the_untrained_point_at_the_left_edge(runs) -> None:
    view = headwidget.HealingView(runs)  # the widget: its controls are what the browser shows
    chart = view.grid.charts[0]
    assert chart.id == "recovery" and chart.x_log and chart.y_reference == 0.0
    assert [s.name for s in chart.series] == ["mqa", "mla:8"]
    for series, run in zip(chart.series, runs.values(), strict=True):
        assert series.x == [64.0, 128.0, 256.0]  # 0 drawn at half the first evaluation's 128 tokens
        assert series.y == [row["kl"] for row in run.curve]
        assert series.labels[0].startswith(f"{run.spec} · untrained (0 tokens) · step 0\nKL ")
    # The untrained point's tick says 0 (not the 64 it is drawn at); the others, the tokens seen.
    assert (chart.x_ticks, chart.x_tick_labels) == ([64.0, 128.0, 256.0], ["0", "128", "256"])
    first = next(iter(runs.values()))
    assert first.method == first.loss and f"{first.method}, trainable" in chart.subtitle
    assert f"({first.loss})" not in chart.subtitle  # the loss named once where it is the method
    assert not chart.label_points  # the legend names the runs: no point's name across the lines
    view.measure = "delta_nll"
    assert view.grid.charts[0].series[0].y == [row["delta_nll"] for row in runs["mqa"].curve]
    view.measure = "top1"
    assert view.grid.charts[0].series[1].y == [1 - row["top1"] for row in runs["mla:8"].curve]
    assert view.view_controls()[0].trait == "measure" and view.measures_available == [
        "kl",
        "delta_nll",
        "top1",
    ]


def test_the_map_is_a_runs_per_layer_errors_and_a_click_selects_the_layer(runs) -> None:
    """Evaluation points × converted layers (a strip as wide as the damage map, its axes titled), the
    selected layer's column outlined; a click on a column selects its layer."""
    view = headwidget.HealingView(runs)
    panel = view.grid.panels[0]
    assert np.array_equal(panel.matrix, np.array(runs["mqa"].per_layer))
    assert panel.row_labels == ["0", "128", "256"] and panel.col_offset == 0
    assert (panel.row_axis, panel.col_axis, panel.axis_titles) == ("healing tokens", "layer", True)
    assert panel.mark_col == runs["mqa"].layers.index(view.layer) and panel.mark_row == -1
    errors = np.array(runs["mqa"].per_layer)
    left = errors[-1] / errors[0]
    assert panel.note.startswith(f"recovers last: layer {int(np.argmax(left))} ")
    assert "click" not in panel.note and panel.hint == "a click on a column selects its layer"
    view.run = "mla:8"
    panel = view.grid.panels[0]
    assert panel.col_labels == ["0", "2"] and np.array_equal(panel.matrix, np.array(runs["mla:8"].per_layer))
    view.widget._handle_message(view.widget, {"type": "click", "panel": "layers", "row": 0, "col": 1}, [])
    assert view.layer == 2 and view.grid.panels[0].mark_col == 1
    assert view.grid.vmax == max(v for r in runs.values() for row in r.per_layer or [] for v in row)


def test_bad_sources_and_states_are_refused(runs) -> None:
    with pytest.raises(ViewSourceError, match=r"needs healing runs"):
        HealingView({})
    with pytest.raises(ViewSourceError, match=r"run 'x' is a str, not a HealingRun"):
        HealingView({"x": "run"})
    with pytest.raises(ViewSourceError, match=r"unknown recovery measure 'nll'"):
        HealingView(runs, measure="nll")
    view = HealingView(runs)
    view.run = "gqa:2"
    assert "no run named 'gqa:2'" in view.error
    assert list(HealingView(runs["mqa"]).runs) == ["mqa"]  # one run: named by its spec


def test_a_list_of_runs_is_refused_naming_how_to_name_them(runs) -> None:
    """A list names its runs by spec: two runs of one spec would share a name (issue 44, defect 7)."""
    for listed in ([runs["mqa"]], list(runs.values()), (runs["mqa"],)):
        with pytest.raises(
            ViewSourceError, match=r"got a list: name each run, \{run.spec: run for run in runs\}"
        ):
            HealingView(listed)
    with pytest.raises(ViewSourceError, match="got a list"):
        headwidget.explore(
            headwidget.capture(llama(), torch.randint(1, 96, (2, 16)), progress=False), healing=[runs["mqa"]]
        )


def test_a_layer_outside_the_runs_is_refused_when_built_and_said_when_set(runs) -> None:
    """Issue 44, defect 7: ``HealingView(layer=99)`` and ``layer=-1`` are refused; set later, the layer
    is the error line over the last good panels, in the widget too."""
    for layer in (99, -1, 3):  # the runs convert layers 0..2
        with pytest.raises(headwidget.LayerIndexError, match=f"layer {layer} is out of range: the runs"):
            HealingView(runs, layer=layer)
    view = HealingView(runs, layer=2)
    grid, widget = view.grid, view.widget
    view.layer = 99
    assert "layer 99 is out of range" in view.error and view.grid is grid and widget.error == view.error


def test_a_dashboard_with_healing_runs_has_the_tab_linked_by_layer(runs) -> None:
    stats = headwidget.capture(llama(), torch.randint(1, 96, (2, 16)), progress=False)
    dash = headwidget.explore(stats, healing=runs)
    assert dash.healing is not None and dash.tabs.titles[-1] == "Healing"
    tab = dash.healing.widget
    tab._handle_message(tab, {"type": "click", "panel": "layers", "row": 0, "col": 2}, [])
    assert dash.channels.layer == dash.trends.layer == 2
    assert headwidget.explore(stats).healing is None
    with pytest.raises(ViewSourceError, match=r"needs healing runs"):
        headwidget.explore(stats, healing=[])


def test_figures_and_the_page_export(runs, tmp_path: Path) -> None:
    view = headwidget.HealingView(runs)
    assert save(view, tmp_path / "h.png", dpi=60).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    svg = save(view, tmp_path / "h.svg").read_text(encoding="utf-8")
    assert 'id="recovery"' in svg and 'id="layers"' in svg and "Recovery while healing" in svg
    assert save(view, tmp_path / "h.pdf").read_bytes().startswith(b"%PDF")
    data = page_data(view)
    assert len(data["frames"]) == 6  # 3 measures × 2 runs: every state the toggles reach
    html = view.save(tmp_path / "h.html").read_text(encoding="utf-8")
    assert "Recovery while healing" in html
