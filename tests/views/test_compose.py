"""Views put together (``notebook/_compose.py``): the trends above a tab per view in Jupyter and in
marimo, by one function; the state views share, declared by their states and moved by ``share``."""

from __future__ import annotations

import dataclasses

import ipywidgets
import numpy as np
import pytest
import torch
import traitlets as t

import headwidget
from headwidget.core.panels import Panel, PanelGrid
from headwidget.notebook import JUPYTER_DRAWINGS, Dashboard, compose, drawing, share
from headwidget.views import LayerState, LayerView, View, ViewState, select, shared_fields, state, view_class
from headwidget.widget import LayerTrends
from tiny_models import make_model, ragged_batches


@pytest.fixture(scope="module")
def stats():
    return headwidget.capture(make_model("llama_gqa", dtype=torch.float32), ragged_batches(), progress=False)


def test_each_view_declares_the_fields_it_shares():
    shared = {
        "channels": ["layer"],
        "alignment": ["layer", "metric", "alignment"],
        "mechanisms": ["layer"],
        "consequences": ["layer"],
        "healing": ["layer"],
        "quantization": ["layer"],
        "timeline": ["layer"],
        "trends": ["alignment", "metric", "layer"],
    }
    for name, fields in shared.items():
        assert shared_fields(view_class(name).State) == fields, name


@dataclasses.dataclass(frozen=True)
class PickState(LayerState):
    pick: str = state("a", select("Pick", options="picks"), shared=True)
    kind: str = "key"  # not shared, though another view has a field of that name


class Pick(LayerView[PickState]):
    picks = t.List(t.Unicode()).tag(sync=True)

    def __init__(self, picks: list[str], layers: int = 3) -> None:
        super().__init__()
        self.set_up(PickState(), num_layers=layers, picks=picks)

    def compute(self, state: PickState, resolution: int | None = None) -> PanelGrid:
        return PanelGrid([Panel("m", state.pick, np.eye(2) * state.layer)], -9.0, 9.0, "diverging", "")


@dataclasses.dataclass(frozen=True)
class LonerState(ViewState):
    layer: int = 0  # a field called layer that is not declared shared: left alone


class Loner(View[LonerState]):
    def compute(self, state: LonerState, resolution: int | None = None) -> PanelGrid:
        return PanelGrid([Panel("m", "m", np.eye(2))], -1.0, 1.0, "diverging", "")


def test_share_moves_the_declared_fields_where_the_value_is_offered_and_nothing_else():
    a, b, short, loner = Pick(["a", "b"]), Pick(["a", "b", "c"]), Pick(["a"], layers=2), Loner()
    untie = share([a, b, short, loner])
    a.layer = 2
    assert (b.layer, short.layer, loner.layer) == (2, 0, 0)  # short has layers 0..1: not offered
    b.pick = "c"
    assert (a.pick, short.pick) == ("a", "a")  # "c" is not among their options
    b.pick = "b"
    assert (a.pick, short.pick) == ("b", "a")
    a.kind = "value"
    assert b.kind == "key"  # not declared shared
    short.layer = 1
    assert a.layer == b.layer == 1
    untie()
    a.layer = 0
    assert b.layer == 1


def test_one_function_composes_the_views_above_over_a_tab_per_view_for_both_hosts(stats):
    from marimo._output.formatting import try_format

    trends, channels = headwidget.TrendView(stats), headwidget.ChannelView(stats, prefetch=False)
    assert {"trends": LayerTrends} == JUPYTER_DRAWINGS
    drawn = drawing(trends)
    assert isinstance(drawn, LayerTrends) and drawn.view is trends  # the one Jupyter drawing of its series
    assert drawing(trends, "marimo") is trends.widget and drawing(channels) is channels.widget
    jupyter = compose([drawn], {"Channels": channels.widget})
    assert isinstance(jupyter, ipywidgets.VBox) and jupyter.children[0] is drawn
    assert jupyter.children[1].titles == ("Channels",) and jupyter.children[1].children == (channels.widget,)
    shown = try_format(compose([trends.widget], {"Channels": channels.widget}, "marimo"))
    assert "<marimo-tabs" in shown.data and trends.widget.model_id in shown.data


def test_the_dashboard_places_views_by_their_declared_placement(stats):
    dash = Dashboard(stats)
    assert list(dash.above) == ["trends"] and dash.trend_view is dash.above["trends"]
    assert dash.trends.view is dash.trend_view and dash.widget.children[0] is dash.trends
    assert dash.channels is dash.views["channels"] and dash.mechanisms is None
    with pytest.raises(AttributeError, match="no attribute 'chanels'"):
        dash.chanels  # noqa: B018
    assert (
        dash._repr_mimebundle_()["application/vnd.jupyter.widget-view+json"]["model_id"]
        == dash.widget.model_id
    )
