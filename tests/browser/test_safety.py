"""Hostile text stays text; nothing is fetched from the network."""

import numpy as np
import pytest

pytestmark = pytest.mark.browser

XSS = "<img src=x onerror=alert(1)>"


def test_hostile_strings_render_as_text(harness):
    h = harness
    data = list(np.zeros((2, 2), dtype="<f4").tobytes())
    h.mount(
        {
            "panels": [
                {
                    "id": XSS,
                    "title": XSS,
                    "subtitle": XSS,
                    "note": XSS,
                    "rows": 2,
                    "cols": 2,
                    "row_labels": [XSS, "<script>alert(2)</script>"],
                    "col_labels": ["<b>a</b>", "b"],
                    "dtype": "float32",
                    "data": data,
                }
            ],
            "colorbar_label": XSS,
            "error": XSS,
            "status": XSS,
            "metrics_available": [XSS],
            "metric": XSS,
            "kinds_available": [XSS],
            "kind": XSS,
            "mechanisms_available": [XSS],
            "mechanisms": [],
        }
    )
    h.page.mouse.move(*h.cell_centre(XSS, 1, 0, 2, 2))
    h.page.wait_for_timeout(100)
    assert h.page.locator("img").count() == 0
    assert h.page.locator(".hw-root script, .hw-root b").count() == 0
    assert h.page.locator(".hw-error").inner_text() == XSS
    assert h.page.locator(".hw-tooltip .hw-tt-title").inner_text() == XSS
    assert h.page.locator(".hw-tooltip .hw-tt-row").inner_text() == "row: <script>alert(2)</script>"
    assert XSS in h.page.locator(".hw-sr li").first.text_content()
    assert h.dialogs == []


def test_only_local_requests(harness):
    h = harness
    n = 64
    data = list(np.random.default_rng(0).standard_normal((n, n)).astype("<f4").tobytes())
    h.mount(
        {
            "panels": [{"id": "a", "title": "a", "rows": n, "cols": n, "dtype": "float32", "data": data}],
            "num_layers": 4,
            "kinds_available": ["key"],
            "kind": "key",
        }
    )
    h.page.mouse.move(*h.cell_centre("a", 3, 3, n, n))
    h.js("() => model.kernelSend({type: 'export_png'})")
    with h.page.expect_download():
        h.page.click("button.hw-export")
    h.page.wait_for_timeout(200)
    paths = sorted({u[len(h.base_url) :] for u in h.requests if u.startswith(h.base_url)})
    assert set(paths) <= {
        "/tests/browser/harness.html",
        "/tests/browser/harness.js",
        "/python/headwidget/static/widget.js",
        "/favicon.ico",
    }
    assert "/python/headwidget/static/widget.js" in paths
    others = [u for u in h.requests if not u.startswith(h.base_url)]
    assert all(u.startswith(("blob:", "data:")) for u in others), others
