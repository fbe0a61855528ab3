"""``Dashboard.save("….html")`` opened from a file:// URL in headless chromium: every tab drawn, offline."""

from __future__ import annotations

import pytest
import torch

import headwidget
from headwidget.notebook import Dashboard
from tiny_models import make_model, ragged_batches

pytestmark = pytest.mark.browser


def test_dashboard_page_draws_every_tab_offline(browser, bundle, tmp_path):
    model = make_model("llama_gqa", dtype=torch.float32)
    stats = headwidget.capture(model, ragged_batches(), inputs=True, progress=False)
    dash = Dashboard(stats, model)
    (path,) = dash.save(tmp_path / "dash.html")
    context = browser.new_context(viewport={"width": 1100, "height": 900})
    page = context.new_page()
    requests: list[str] = []
    errors: list[str] = []
    page.on("request", lambda r: requests.append(r.url))
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
    page.goto(path.resolve().as_uri())
    labels = page.locator(".hw-tabs > label")
    assert labels.all_inner_texts() == ["Per-layer summary", *(v.title for v in dash.views.values())]
    summary = page.frame_locator("#hw-page-0 iframe")
    summary.locator("canvas.hw-chart").first.wait_for()
    assert summary.locator("canvas.hw-chart").evaluate_all("(cs) => cs.map((c) => c.dataset.chartId)") == [
        "trend-means"
    ]
    for i, view in enumerate(dash.views.values(), start=1):
        labels.nth(i).click()
        frame = page.frame_locator(f"#hw-page-{i} iframe")
        frame.locator(".hw-panel").first.wait_for()
        ids = frame.locator(".hw-panel").evaluate_all("(ps) => ps.map((p) => p.dataset.panelId)")
        assert ids == [p.id for p in view.grid.panels]
        assert page.locator(f"#hw-page-{i}").is_visible()
        assert (
            frame.locator("h1").inner_text()
            == f"{view.title} · {stats.meta.model_name or stats.meta.model_class}"
        )
    context.close()
    assert errors == []
    assert [u for u in requests if not u.startswith(("data:", "about:"))] == [path.resolve().as_uri()]
