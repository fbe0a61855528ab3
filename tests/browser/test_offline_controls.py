"""Every control of every registered view works on its saved page, in chromium, with no kernel.

Each test saves a view, opens the page from a file:// URL, works each control the way a reader
would (a key on the slider, a click on a toggle or a checkbox, a choice in a drop-down) and checks
that the page then shows exactly what the view computes for the state the page is in: the same
panels (ids, titles, subtitles, the wire bytes of every matrix) and the same charts. The view itself
is never moved: the page's frames come from ``View.compute`` of each state.
"""

from __future__ import annotations

import base64
import json

import pytest
import torch

import headwidget
from headwidget.core.charts import encode_chart
from headwidget.core.panels import encode_panel
from headwidget.evaluation import evaluate
from headwidget.export import save
from headwidget.views import view_names
from tiny_models import make_model, ragged_batches, three_layer_llama

from .test_html_export import Page

pytestmark = pytest.mark.browser

MODEL = "window.headwidget.model"
#: What the page shows now: the state traits' values, the panels (data as base64) and the charts.
SHOWN = """(fields) => {
  const m = window.headwidget.model;
  const b64 = (v) => { const u = new Uint8Array(v.buffer, v.byteOffset, v.byteLength); let s = "";
                       for (const x of u) s += String.fromCharCode(x); return btoa(s); };
  return {
    state: Object.fromEntries(fields.map((f) => [f, m.get(f)])),
    error: m.get("error"),
    panels: m.get("panels").map((p) => [p.id, p.title, p.subtitle, p.rows, p.cols, b64(p.data)]),
    charts: m.get("charts"),
  };
}"""


@pytest.fixture(scope="module")
def tiny():
    model = make_model("llama_gqa", dtype=torch.float32)
    stats = headwidget.capture(model, ragged_batches(), rope="both", inputs=True, samples=256, progress=False)
    return model, stats


@pytest.fixture(scope="module")
def report(tiny):
    model, stats = tiny
    held_out = torch.randint(0, 96, (3, 20), generator=torch.Generator().manual_seed(5))
    return evaluate(
        model,
        held_out,
        ["model", "mqa", "kv:int4"],
        stats=stats,
        per_layer=True,
        dtype=torch.float32,
        progress=False,
    )


def make_view(name: str, tiny, report):
    model, stats = tiny
    if name == "channels":
        return headwidget.ChannelView(stats, layer=0, channel_start=0, channel_width=8, prefetch=False)
    if name == "alignment":
        return headwidget.AlignmentView(stats, layer=0)
    if name == "mechanisms":
        return headwidget.MechanismView(
            model, layer=0, mechanisms=["model", "mqa", "lrkv:2"], stats=stats, prefetch=False
        )
    if name == "consequences":
        return headwidget.ConsequenceView(report)
    if name == "quantization":
        return headwidget.QuantizationView(stats, report=report, bins=4)
    if name == "timeline":  # two snapshots (the model, and another seed's) and a logged loss
        later = make_model("llama_gqa", dtype=torch.float32, seed=1)
        snapshots = {0: stats, 10: headwidget.capture(later, ragged_batches(), rope="both", progress=False)}
        timeline = headwidget.Timeline(
            snapshots, logs={0: {"loss": 4.5}, 5: {"loss": 4.1}, 10: {"loss": 3.8}}
        )
        return headwidget.TimelineView(timeline, layer=0, prefetch=False)
    if name == "healing":  # two short healing runs of a tiny Llama
        from healing_cases import llama, small_heal

        original = llama()
        return headwidget.HealingView(
            {s: small_heal(headwidget.apply(original, s), original, tokens=128) for s in ("mqa", "mla:8")}
        )
    if name == "trends":
        return headwidget.TrendView(stats, layer=1)
    if name == "layer_similarity":  # the joint statistics of both layers
        cross = headwidget.capture(model, ragged_batches(), rope="both", cross_layer=True, progress=False)
        return headwidget.LayerSimilarityView(cross)
    raise AssertionError(f"no test view for {name!r}: add one here")


def expected(view, values: dict) -> dict:
    """What the view computes for the state the page reports (the view is not moved)."""
    state = view.current_state().replace(**values)
    grid = view.compute(state)
    panels = []
    for p in grid.panels:
        wire = encode_panel(p, vmin=grid.vmin, vmax=grid.vmax)
        panels.append(
            [
                p.id,
                p.title,
                p.subtitle,
                wire["rows"],
                wire["cols"],
                base64.b64encode(wire["data"]).decode("ascii"),
            ]
        )
    # (what a click does is left out of a page: there is no kernel to answer it)
    charts = json.loads(json.dumps([{**encode_chart(c), "hint": ""} for c in grid.charts]))
    return {"panels": panels, "charts": charts}


def shown(page: Page, fields: list[str]) -> dict:
    return page.js(SHOWN, fields)


def check(page: Page, view, fields: list[str]) -> dict:
    now = shown(page, fields)
    assert now["error"] == ""
    want = expected(view, now["state"])
    assert now["panels"] == want["panels"]
    assert now["charts"] == want["charts"]
    return now["state"]


def wait_for(page: Page, trait: str, value) -> None:
    page.page.wait_for_function(
        "([t, v]) => JSON.stringify(window.headwidget.model.get(t)) === JSON.stringify(v)", arg=[trait, value]
    )


def work(page: Page, control: dict, state: dict) -> object:
    """Work one control as a reader would; returns the value it gave its trait."""
    trait, kind = control["trait"], control["type"]
    if kind == "slider":
        count = page.js(f"{MODEL}.get({json.dumps(control['count'])})")
        key, value = (
            ("ArrowRight", state[trait] + 1) if state[trait] + 1 < count else ("ArrowLeft", state[trait] - 1)
        )
        page.page.locator(f"input[data-trait={trait}]").focus()
        page.page.keyboard.press(key)
    elif kind == "toggles":
        options = page.js(f"{MODEL}.get({json.dumps(control['options'])})")
        value = next(o for o in options if o != state[trait])
        page.page.locator(f'button[data-trait={trait}][data-value="{value}"]').click()
    elif kind == "select":
        options = page.js(f"{MODEL}.get({json.dumps(control['options'])})")
        value = options[-1] if options[-1] != state[trait] else options[0]
        page.page.select_option(f"select[data-trait={trait}]", value)
    elif kind == "checklist":
        first = state[trait][0]
        value = [o for o in state[trait] if o != first]
        page.page.locator(f'input[type=checkbox][data-trait={trait}][value="{first}"]').click()
    elif kind == "window":
        value = state[trait] + 8  # the next head's channels
        field = page.page.locator(f'input.hw-number[data-number="{trait}"]')
        field.fill(str(value))
        field.press("Tab")
    else:
        raise AssertionError(f"no way to work a {kind} control here")
    wait_for(page, trait, value)
    return value


@pytest.mark.parametrize("name", view_names())
def test_every_control_of_the_view_works_on_its_saved_page(name, tiny, report, browser, bundle, tmp_path):
    view = make_view(name, tiny, report)
    saved = view.current_state()
    page = Page(browser, save(view, tmp_path / f"{name}.html"))
    try:
        controls = page.js(f"{MODEL}.get('controls')")
        offline = [c for c in controls if c["type"] != "entry"]
        fields = [c["trait"] for c in offline]  # the state the page's controls set (the rest: as saved)
        every = [c.to_json() for c in type(view).view_controls() if c.type != "entry"]
        assert fields == [c["trait"] for c in every]  # every control but a text entry is on the page
        state = check(page, view, fields)  # the saved state, as the view shows it
        for control in offline:
            value = work(page, control, state)
            state = check(page, view, fields)
            assert state[control["trait"]] == value
        # Once more in a combination: two controls away from the saved state.
        if len(offline) > 1:
            work(page, offline[0], state)
            check(page, view, fields)
        assert view.current_state() == saved  # saving and the page's moves left the view alone
        if any(c.type == "entry" for c in type(view).view_controls()):
            assert "needs Python" in page.js(f"{MODEL}.get('status')")
    finally:
        page.close()


def test_the_play_button_moves_a_saved_timeline_through_its_steps(tiny, report, browser, bundle, tmp_path):
    view = make_view("timeline", tiny, report)
    page = Page(browser, save(view, tmp_path / "timeline.html"))
    try:
        fields = [c.trait for c in type(view).view_controls()]
        button = page.page.locator("button[data-play=step]")
        assert button.get_attribute("aria-label") == "Play step"
        button.click()
        wait_for(page, "step", 1)  # the next snapshot, from the page's own frames
        assert check(page, view, fields)["step"] == 1
        page.page.wait_for_function(
            "() => document.querySelector('button[data-play=step]').ariaPressed === 'false'"
        )
        assert page.errors == []
    finally:
        page.close()


def test_the_layer_sliders_of_a_saved_layer_view_stop_at_its_cross_layers(browser, bundle, tmp_path):
    """Joint statistics of layers 1 and 2 of three: both sliders run over those two alone, say them as
    the model numbers them, and every state they reach is one the view computes."""
    model = three_layer_llama(seed=3)
    stats = headwidget.capture(model, ragged_batches(), cross_layer=[1, 2], progress=False)
    view = headwidget.LayerSimilarityView(stats)
    page = Page(browser, save(view, tmp_path / "layers_1_2.html"))
    try:
        fields = ["layer", "paired", "metric"]  # (one kind of keys: no kind toggles)
        assert check(page, view, fields) == {"layer": 1, "paired": 2, "metric": "cka"}
        for trait, label in (("layer", "layer 1 of 1, 2"), ("paired", "layer 2 of 1, 2")):
            slider = page.page.locator(f"input[data-trait={trait}]")
            assert (slider.get_attribute("min"), slider.get_attribute("max")) == ("0", "1")
            assert label in page.text(f"label:has(input[data-trait={trait}]) output")
        slider = page.page.locator("input[data-trait=layer]")
        slider.focus()
        page.page.keyboard.press("ArrowLeft")  # at the first captured layer: nowhere lower to go
        page.page.keyboard.press("End")
        wait_for(page, "layer", 2)
        assert check(page, view, fields)["layer"] == 2
        page.page.locator("input[data-trait=paired]").focus()
        page.page.keyboard.press("Home")
        wait_for(page, "paired", 1)
        assert check(page, view, fields) == {"layer": 2, "paired": 1, "metric": "cka"}
        assert "layer 1 of 1, 2" in page.text("label:has(input[data-trait=paired]) output")
        assert page.errors == []
    finally:
        page.close()
