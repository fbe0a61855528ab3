"""Hover, click, keyboard and two-way trait binding in a real browser."""

import json

import numpy as np
import pytest

pytestmark = pytest.mark.browser

VALUES = np.array([[0.25, -0.5, np.nan], [0.123456, 1.0, -1.0]], dtype=np.float32)


def mount(h, **state):
    base = {
        "panels": [
            {
                "id": "attn",
                "title": "layer 3 · head 5",
                "rows": 2,
                "cols": 3,
                "row_labels": ["q_first", "q_second"],
                "col_offset": 64,
                "col_step": 4,
                "dtype": "float32",
                "data": list(VALUES.astype("<f4").tobytes()),
            }
        ],
        "vmin": -1,
        "vmax": 1,
        "colormap": "diverging",
        "colorbar_label": "cosine",
        "num_layers": 30,
        "layer": 3,
        "layer_label": "layer 3 of 0–29",
        "num_channels": 128,
        "channel_start": 0,
        "channel_width": 64,
        "kinds_available": ["key", "value"],
        "kind": "key",
        "metrics_available": ["mean", "max"],
        "metric": "mean",
    }
    base.update(state)
    h.mount(base)


def tooltip_lines(h):
    return h.js("() => document.querySelector('.hw-tooltip').innerText").split("\n")


def test_hover_shows_tooltip_crosshair_and_data_hover(harness):
    h = harness
    mount(h)
    x, y = h.cell_centre("attn", 0, 0, 2, 3)
    before = h.pixel("attn", x, y)
    h.page.mouse.move(x, y)
    assert tooltip_lines(h) == ["layer 3 · head 5", "row: q_first", "col: 64–67", "cosine: 0.2500"]
    assert json.loads(h.js("() => document.querySelector('.hw-grid').dataset.hover")) == {
        "panel": "attn",
        "row": 0,
        "col": 0,
        "value": 0.25,
    }
    # crosshair on the overlay, heatmap untouched
    assert h.pixel("attn", x, y, "hw-overlay")[3] > 0
    rect = h.plot_rect("attn")
    assert h.pixel("attn", rect["x"] + rect["w"] - 2, rect["y"] + rect["h"] - 2, "hw-overlay")[3] == 0
    assert h.pixel("attn", x, y) == before

    h.page.mouse.move(*h.cell_centre("attn", 1, 0, 2, 3))
    assert tooltip_lines(h)[1:] == ["row: q_second", "col: 64–67", "cosine: 0.1235"]
    h.page.mouse.move(*h.cell_centre("attn", 0, 2, 2, 3))
    assert tooltip_lines(h)[3] == "cosine: undefined"
    assert json.loads(h.js("() => document.querySelector('.hw-grid').dataset.hover"))["value"] is None

    h.page.mouse.move(*h.cell_centre("attn", 0, 0, 2, 3))
    guide = (rect["x"] + rect["w"] - 4, y)  # the crosshair's line across the row, far from any number
    assert h.pixel("attn", *guide, "hw-overlay")[3] > 0
    h.page.mouse.move(5, 5)  # outside every plot
    assert h.js("() => document.querySelector('.hw-tooltip').hidden") is True
    assert h.pixel("attn", *guide, "hw-overlay")[3] == 0


def test_click_sends_cell(harness):
    h = harness
    mount(h)
    h.page.mouse.click(*h.cell_centre("attn", 1, 2, 2, 3))
    assert h.sent_by_user() == [{"type": "click", "panel": "attn", "row": 1, "col": 2}]


def test_layer_slider_arrow_key_commits(harness):
    h = harness
    mount(h)
    h.page.focus('input[data-trait="layer"]')
    h.page.keyboard.press("ArrowRight")
    h.page.wait_for_function("model.saves.length >= 1", timeout=5000)
    assert h.js("() => model.get('layer')") == 4
    assert h.js("() => model.saves[model.saves.length - 1].layer") == 4
    # three steps in one task (as quick as a user can be, however loaded the machine): at most one
    # commit at once and one for the latest value after the hold-off
    n = h.js("() => model.saves.length")
    h.js(
        """() => {
            const input = document.querySelector('input[data-trait="layer"]');
            for (let i = 0; i < 3; i++) {
                input.stepUp();
                input.dispatchEvent(new Event("input", { bubbles: true }));
                input.dispatchEvent(new Event("change", { bubbles: true }));
            }
        }"""
    )
    h.page.wait_for_function("model.get('layer') === 7", timeout=5000)
    h.page.wait_for_timeout(300)
    assert n + 1 <= h.js("() => model.saves.length") <= n + 2


def test_ui_follows_python(harness):
    h = harness
    mount(h)
    h.js("""() => {
      model.kernelSet('layer', 12); model.kernelSet('layer_label', 'layer 12 of 0–29');
      model.kernelSet('kind', 'value'); model.kernelSet('metric', 'max');
      model.kernelSet('error', 'capture failed: <b>out of memory</b>');
      model.kernelSet('status', 'computing…');
    }""")
    assert h.js("() => document.querySelector('input[data-trait=layer]').value") == "12"
    assert h.js("() => document.querySelector('.hw-controls output').textContent") == "layer 12 of 0–29"
    assert (
        h.js("() => document.querySelector('button[data-value=value]').getAttribute('aria-pressed')")
        == "true"
    )
    assert h.js("() => document.querySelector('select[data-trait=metric]').value") == "max"
    err = h.page.locator(".hw-error")
    assert err.is_visible()
    assert err.inner_text() == "capture failed: <b>out of memory</b>"
    assert h.page.locator(".hw-error b").count() == 0
    assert h.page.locator(".hw-status").inner_text() == "computing…"
    h.js("() => model.kernelSet('num_channels', 0)")
    assert not h.page.locator('input[data-trait="channel_start"]').is_visible()
    # the grid still works with an error shown
    h.page.mouse.move(*h.cell_centre("attn", 0, 1, 2, 3))
    assert tooltip_lines(h)[3] == "cosine: -0.5000"


def test_keyboard_only_controls(harness):
    h = harness
    mount(h)
    h.page.focus('button[data-value="value"]')
    h.page.keyboard.press("Enter")
    assert h.js("() => model.get('kind')") == "value"
    h.page.focus('select[data-trait="metric"]')
    h.page.keyboard.press("ArrowDown")
    h.page.wait_for_function("model.get('metric') === 'max'", timeout=5000)
    h.page.focus(".hw-panels")
    h.page.keyboard.press("ArrowRight")
    assert json.loads(h.js("() => document.querySelector('.hw-grid').dataset.hover"))["col"] == 1
    h.page.keyboard.press("Enter")
    assert h.sent_by_user() == [{"type": "click", "panel": "attn", "row": 0, "col": 1}]
