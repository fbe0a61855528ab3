"""What a saved page says and marks, in chromium: the model it is of, the selected layer outlined, no
click it cannot answer, and tooltips that stay inside the widget however long their lines."""

from __future__ import annotations

import pytest
import torch

import headwidget
from headwidget.evaluation import evaluate
from headwidget.export import save
from tiny_models import make_model

from .test_html_export import Page

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def sources():
    model = make_model("llama_gqa", dtype=torch.float32)
    stats = headwidget.capture(model, torch.randint(0, 96, (4, 24)), inputs=True, samples=64, progress=False)
    held_out = torch.randint(0, 96, (4, 24), generator=torch.Generator().manual_seed(3))
    report = evaluate(
        model, held_out, ["model", "mqa"], stats=stats, per_layer=True, dtype=torch.float32, progress=False
    )
    return stats, report


def test_the_damage_maps_page_names_the_model_and_outlines_the_layer_it_shows(browser, sources, tmp_path):
    _, report = sources
    top_of_column_1 = []
    for layer in (1, 0):
        view = headwidget.ConsequenceView(report, layer=layer)
        page = Page(browser, save(view, tmp_path / f"layer{layer}.html"))
        try:
            assert page.text("h1") == f"Consequences · {report.model}" and page.page.title() == page.text(
                "h1"
            )
            assert page.text(".hw-heading") == view.caption
            shown = page.js(
                "(() => { const m = window.headwidget.model; return [m.get('panels'), m.get('charts')]; })()"
            )
            # a click on a page selects nothing: no panel or chart says it does
            assert [p["hint"] for p in shown[0]] == [""] and [c["hint"] for c in shown[1]] == [""]
            assert view.grid.panels[0].hint  # (the live widget's does)
            plot = page.js(
                """() => JSON.parse(
                       document.querySelector('.hw-panel[data-panel-id="damage"]').dataset.plotRect)"""
            )
            x, y = page.cell_centre("damage", 0, 1)
            top = y - (plot["h"] / shown[0][0]["rows"]) / 2 + 0.5  # just inside the plot's top edge
            top_of_column_1.append(page.pixel("damage", x, top))
        finally:
            page.close()
    marked, unmarked = top_of_column_1
    assert marked == [0, 0, 0]  # layer 1's column outlined (dark, a white line inside)
    assert unmarked != [0, 0, 0]  # layer 0 shown: column 1 is its cell's colour


def test_a_long_tooltip_stays_inside_the_chart_it_points_at(browser, sources, tmp_path):
    """The coupling chart's hover lines run longer than the chart is wide: the tooltip wraps and moves
    left as far as it must, wherever the pointer is."""
    stats, _ = sources
    page = Page(browser, save(headwidget.QuantizationView(stats, layer=0), tmp_path / "q.html"))
    try:
        page.page.wait_for_selector("canvas.hw-chart")
        charts = page.js(
            """() => [...document.querySelectorAll('canvas.hw-chart')].map((c) => {
                 const r = c.getBoundingClientRect();
                 return { x: r.left, y: r.top, points: JSON.parse(c.dataset.points) };
               })"""
        )
        strip = page.js(
            """() => { const r = document.querySelector('.hw-charts').getBoundingClientRect();
                       return [r.left, r.right]; }"""
        )
        widest = 0.0
        for chart in charts:
            for _, _, px, py in chart["points"]:
                page.page.mouse.move(chart["x"] + px, chart["y"] + py)
                tip = page.js(
                    """() => { const t = document.querySelector('.hw-charts .hw-tooltip');
                               const r = t.getBoundingClientRect(); return [r.left, r.right, t.hidden]; }"""
                )
                assert not tip[2]
                assert strip[0] - 1 <= tip[0] and tip[1] <= strip[1] + 1, (tip, strip)
                widest = max(widest, tip[1] - tip[0])
        assert widest > (strip[1] - strip[0]) / 2  # (long lines were hovered: the case that ran over)
    finally:
        page.close()
