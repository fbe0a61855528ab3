"""The consequences view's saved page in chromium: the trade-off chart and the damage map, offline."""

from __future__ import annotations

import math

import pytest
import torch

import headwidget
from headwidget.evaluation import evaluate
from headwidget.export import save
from tiny_models import make_model

from .test_html_export import Page

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def report():
    model = make_model("llama_gqa", dtype=torch.float32)
    stats = headwidget.capture(model, torch.randint(0, 96, (4, 24)), inputs=True, progress=False)
    held_out = torch.randint(0, 96, (4, 24), generator=torch.Generator().manual_seed(3))
    return evaluate(
        model,
        held_out,
        ["model", "mqa", "lrkv:4"],
        stats=stats,
        per_layer=True,
        dtype=torch.float32,
        progress=False,
    )


def test_hovering_a_point_names_the_variant_and_its_numbers(browser, report, tmp_path):
    page = Page(browser, save(headwidget.ConsequenceView(report), tmp_path / "c.html"))
    try:
        page.page.wait_for_selector("canvas.hw-chart")
        box = page.js(
            """() => { const c = document.querySelector('canvas.hw-chart'), r = c.getBoundingClientRect();
                       return { x: r.left, y: r.top, points: JSON.parse(c.dataset.points) }; }"""
        )
        drawn = {(s, i) for s, i, _, _ in box["points"]}
        assert drawn == {(0, 0), (0, 1), (0, 2)}  # model, mqa, lrkv:4 (the frontier is a line)
        # left to right by bytes, bottom to top by ΔNLL, as the report has them
        by_index = {i: (x, y) for _, i, x, y in box["points"]}
        specs = report.variants
        deltas = [report.nll[v] - report.nll["model"] for v in specs]
        by_bytes = sorted(range(3), key=lambda i: report.kv_bytes_per_token[specs[i]])
        assert sorted(range(3), key=lambda i: by_index[i][0]) == by_bytes
        assert sorted(range(3), key=lambda i: -by_index[i][1]) == sorted(range(3), key=lambda i: deltas[i])
        x, y = by_index[1]
        page.page.mouse.move(box["x"] + x, box["y"] + y)
        hover = page.js("JSON.parse(document.querySelector('.hw-charts').dataset.hover)")
        delta = report.nll["mqa"] - report.nll["model"]
        assert hover["series"] == "mechanisms" and hover["point"] == 1
        assert (
            math.isclose(hover["y"], delta, rel_tol=1e-12) and hover["x"] == report.kv_bytes_per_token["mqa"]
        )
        tip = page.text(".hw-charts .hw-tooltip")
        assert tip.startswith("mqa") and f"ΔNLL {delta:+.4f}" in tip
        # the damage map is drawn below, and its cell hover is the report's per-layer value
        assert page.panel_ids() == ["damage"]
        cx, cy = page.cell_centre("damage", 0, 1)
        page.page.mouse.move(cx, cy)
        cell = page.js("JSON.parse(document.querySelector('.hw-grid').dataset.hover)")
        assert cell["panel"] == "damage" and math.isclose(
            cell["value"], report.per_layer["mqa"][1], rel_tol=1e-3
        )
        # the tooltip names the variant, the layer and what the value is, as the colour scale does
        label = headwidget.ConsequenceView(report).grid.colorbar_label
        lines = [page.text(f".hw-grid .hw-tooltip .hw-tt-{part}") for part in ("row", "col", "value")]
        assert lines[:2] == ["variant: mqa", f"layer: {report.layers[1]}"], lines
        assert label and lines[2].startswith(f"{label}: "), lines
        assert [u for u in page.requests if not u.startswith("data:")] == [page.url]  # nothing else
    finally:
        page.close()
