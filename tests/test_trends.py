"""``LayerTrends``: per-layer numbers against KVStats and the analyses, and the link to a view's layer."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import traitlets

import headwidget
from headwidget.analysis import convert, head_diversity, operator_similarity
from headwidget.analysis.alignment import align
from headwidget.notebook import ChannelView
from headwidget.widget import LayerTrends, layer_series
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
    trends = LayerTrends(stats, layer=0)
    traitlets.link((view, "layer"), (trends, "layer"))
    trends.points[0].selected = [1]  # a click on layer 1's point in the chart
    assert trends.layer == 1 and view.layer == 1 and trends.rule.x.tolist() == [1.0, 1.0]
    assert trends.points[0].selected is None
    view.layer = 0
    assert trends.rule.x.tolist() == [0.0, 0.0]
