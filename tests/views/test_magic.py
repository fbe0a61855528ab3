"""The IPython extension, driven through IPython's own API."""

from __future__ import annotations

import pytest
import torch
from IPython.core.interactiveshell import InteractiveShell

import headwidget
from headwidget.notebook import Dashboard
from headwidget.views import AlignmentView, ChannelView, MechanismView
from tiny_models import make_model, ragged_batches

WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


@pytest.fixture(scope="module")
def shell():
    ip = InteractiveShell.instance()
    ip.run_line_magic("load_ext", "headwidget")
    model = make_model("llama_gqa", dtype=torch.float32)
    ip.user_ns.update(model=model, batches=ragged_batches())
    ip.user_ns["stats"] = headwidget.capture(model, ragged_batches(), cross_layer=True, progress=False)
    yield ip
    ip.run_line_magic("unload_ext", "headwidget")


def test_channels_view_with_pinned_layers(shell):
    view = shell.run_line_magic("headwidget", "model --texts batches --view channels --layers 1,0")
    assert isinstance(view, ChannelView)
    assert (view.layer, view.pinned) == (1, [0])
    assert [p.id for p in view.grid.panels] == ["key-0", "key-1", "value-0", "value-1"]


def test_alignment_over_layers_captures_cross_layer_statistics(shell):
    view = shell.run_line_magic("headwidget", "model --texts batches --view alignment --layers 0,1")
    assert isinstance(view, AlignmentView) and view.error == ""
    assert view.grid.panels[0].matrix.shape == (4, 4)


def test_saved_statistics_and_default_dashboard(shell):
    view = shell.run_line_magic("headwidget", "stats --view alignment --layers 0,1")
    assert view.grid.panels[0].row_labels[2] == "L1·H0"
    dash = shell.run_line_magic("headwidget", "model --texts batches")
    assert isinstance(dash, Dashboard) and dash.mechanisms is not None
    assert isinstance(shell.run_line_magic("headwidget", "model --view mechanisms --layers 1"), MechanismView)


def test_the_quantization_view_captures_the_samples_it_needs(shell):
    view = shell.run_line_magic("headwidget", "model --texts batches --view quantization --layers 1")
    assert isinstance(view, headwidget.QuantizationView) and view.layer == 1
    assert view.stats.meta.sample_size == 4096 and "key_post" in view.stats.kinds
    assert [s.name for s in view.grid.charts[0].series][2] == "K post-RoPE · joint"


def test_the_views_of_a_report_and_of_runs_take_the_notebooks_variables(shell):
    """--report and --runs name the sources of the consequences and healing views (and the tabs of
    the explorer), as the command line's options do."""
    report = headwidget.evaluate(
        shell.user_ns["model"], ragged_batches(), ["model", "mqa"], per_layer=True, progress=False
    )
    shell.user_ns["report"] = report
    view = shell.run_line_magic("headwidget", "stats --view consequences --report report --layers 1")
    assert isinstance(view, headwidget.ConsequenceView) and view.report is report and view.layer == 1
    dash = shell.run_line_magic("headwidget", "stats --report report")
    assert isinstance(dash, Dashboard) and dash.consequences is not None
    with pytest.raises(headwidget.HeadwidgetError, match="'runs' is not defined"):
        shell.run_line_magic("headwidget", "stats --view healing --runs runs")


def test_usage_errors_name_the_problem(shell):
    with pytest.raises(headwidget.HeadwidgetError, match="'nothing' is not defined"):
        shell.run_line_magic("headwidget", "nothing")
    with pytest.raises(headwidget.HeadwidgetError, match="needs --texts"):
        shell.run_line_magic("headwidget", "model --view channels")
    with pytest.raises(headwidget.HeadwidgetError, match="comma-separated integers"):
        shell.run_line_magic("headwidget", "stats --layers one,two")


def test_kvstats_displays_as_the_explorer(shell):
    data, _ = shell.display_formatter.format(shell.user_ns["stats"])
    assert WIDGET_MIME in data
    assert "text/plain" in data and "KVStats(" in data["text/plain"]


def test_embedded_model_names_work_as_on_the_command_line(shell):
    """``%headwidget minilm-l6`` / ``smollm2-135m``: the names ``headwidget capture --model`` takes."""
    from headwidget import cli
    from headwidget.embedded import EMBEDDED_MODELS

    assert cli.EMBEDDED == tuple(EMBEDDED_MODELS) == ("smollm2-135m", "minilm-l6")
    mech = shell.run_line_magic("headwidget", "minilm-l6 --view mechanisms --layers 3")
    assert isinstance(mech, MechanismView) and mech.layer == 3 and "all-MiniLM-L6-v2" in mech.caption
    mech.close()
    view = shell.run_line_magic("headwidget", "smollm2-135m --view channels --max-tokens 64 --layers 2")
    assert isinstance(view, ChannelView) and view.error == "" and view.layer == 2
    assert view.stats.meta.model_name.startswith("SmolLM2-135M") and 64 <= view.stats.tokens < 64 + 256
    assert view.stats.meta.layout.num_kv_heads == 3
    view.close()
    with pytest.raises(
        headwidget.HeadwidgetError, match=r"'gpt-9' is not defined .*\(smollm2-135m, minilm-l6\)"
    ):
        shell.run_line_magic("headwidget", "gpt-9 --view channels")
