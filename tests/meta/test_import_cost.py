"""``import headwidget`` leaves the widget libraries out until a view is shown or saved: a capture, an
evaluation, a training run or the command line does not pay for ipywidgets, bqplot, pandas and
matplotlib (about a third of the import)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

WIDGET_LIBRARIES = ("anywidget", "bqplot", "ipywidgets", "matplotlib", "pandas")


def _run(code: str) -> dict:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_a_view_imported_from_its_layer_is_displayed_by_the_notebook_layer_it_imports_on_first_use():
    out = _run(
        f"""
        import json, sys
        import torch
        import headwidget
        from transformers import LlamaConfig, LlamaForCausalLM
        loaded = lambda: sorted(m for m in {WIDGET_LIBRARIES!r} if m in sys.modules)
        after_import = loaded()
        model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
                                             num_hidden_layers=2, num_attention_heads=4,
                                             num_key_value_heads=2)).eval()
        stats = headwidget.capture(model, torch.randint(0, 64, (2, 16)), progress=False)
        after_capture = loaded()
        from headwidget.views import ChannelView  # the view's own layer, not headwidget's top level
        view = ChannelView(stats)
        bundle = view._repr_mimebundle_()
        print(json.dumps({{
            "after_import": after_import,
            "after_capture": after_capture,
            "after_display": loaded(),
            "widget": "application/vnd.jupyter.widget-view+json" in bundle[0],
            "same_class": headwidget.ChannelView is ChannelView,
            "in_dir": "ChannelView" in dir(headwidget) and "explore" in dir(headwidget),
        }}))
        """
    )
    assert out["after_import"] == [] and out["after_capture"] == []
    assert set(out["after_display"]) == set(WIDGET_LIBRARIES)
    assert out["widget"] and out["same_class"] and out["in_dir"]


def test_an_unknown_name_is_an_attribute_error():
    import headwidget

    with pytest.raises(AttributeError, match="ChannelVeiw"):
        headwidget.ChannelVeiw  # noqa: B018
