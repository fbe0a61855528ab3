"""Fixtures for the real-browser tests of the front-end bundle.

The page tests/browser/harness.html loads the built bundle
python/headwidget/static/widget.js from a local HTTP server (127.0.0.1,
ephemeral port) and renders it with a small fake anywidget model.

* The bundle must be built first (`npm ci && npm run build`); without it the
  tests fail with that instruction.
* Chromium is /usr/bin/chromium (or $HEADWIDGET_CHROMIUM).  When it or the
  playwright package is missing the tests are skipped, except under CI=true,
  where they fail.
"""

from __future__ import annotations

import functools
import http.server
import json
import os
import threading
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BUNDLE = ROOT / "python" / "headwidget" / "static" / "widget.js"
COLORMAPS = ROOT / "python" / "headwidget" / "colormaps.json"
CHROMIUM = Path(os.environ.get("HEADWIDGET_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def _unavailable(reason: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: browser tests must run)", pytrace=False)
    pytest.skip(reason)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):
        pass


@pytest.fixture(scope="session")
def bundle() -> Path:
    if not BUNDLE.is_file():
        pytest.fail(
            f"{BUNDLE.relative_to(ROOT)} is missing: run `npm ci && npm run build` before the browser tests",
            pytrace=False,
        )
    return BUNDLE


@pytest.fixture(scope="session")
def server():
    handler = functools.partial(_QuietHandler, directory=str(ROOT))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="session")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("the playwright Python package is not installed")
    if not CHROMIUM.exists():
        _unavailable(f"chromium not found at {CHROMIUM}")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture(scope="session")
def colormaps() -> dict:
    return json.loads(COLORMAPS.read_text())


@dataclass
class Harness:
    page: object
    base_url: str
    requests: list = field(default_factory=list)
    errors: list = field(default_factory=list)
    dialogs: list = field(default_factory=list)

    def mount(self, state: dict) -> None:
        """Render the widget with `state`; panels' `data` may be a list of
        byte values (put in a DataView at byte offset `pad`, default 1)."""
        self.page.evaluate(
            """(state) => {
              state.panels = (state.panels || []).map((p) =>
                hw.panel({ ...p, data: hw.u8(p.data, p.pad ?? 1) }));
              hw.mount(state);
            }""",
            state,
        )

    def js(self, expr: str, arg=None):
        return self.page.evaluate(expr, arg)

    def sent_by_user(self) -> list[dict]:
        """What the page sent the kernel, less its reports of what it drew (``drawn``, one after each
        frame of new panels): the messages a user's clicks and exports make."""
        return [m for m in self.js("() => model.sent") if m.get("type") != "drawn"]

    def rect(self, selector: str) -> dict:
        """Bounding box of the first element matching `selector`, in page CSS px."""
        return self.js(
            """(sel) => {
              const r = document.querySelector(sel).getBoundingClientRect();
              return { x: r.left, y: r.top, w: r.width, h: r.height };
            }""",
            selector,
        )

    def plot_rect(self, panel_id: str) -> dict:
        """Plot rectangle of a panel, in page CSS px."""
        return self.js(
            """(id) => {
              const w = document.querySelector(`.hw-panel[data-panel-id="${id}"]`);
              const p = JSON.parse(w.dataset.plotRect);
              const r = w.getBoundingClientRect();
              return { x: r.left + p.x, y: r.top + p.y, w: p.w, h: p.h };
            }""",
            panel_id,
        )

    def cell_centre(self, panel_id: str, row: int, col: int, rows: int, cols: int) -> tuple[float, float]:
        r = self.plot_rect(panel_id)
        return r["x"] + (col + 0.5) * r["w"] / cols, r["y"] + (row + 0.5) * r["h"] / rows

    def pixel(self, panel_id: str, x: float, y: float, layer: str = "hw-heatmap") -> list[int]:
        """RGBA of the canvas pixel under page point (x, y)."""
        return self.js(
            """([id, x, y, cls]) => {
              const w = document.querySelector(`.hw-panel[data-panel-id="${id}"]`);
              const c = w.querySelector("." + cls);
              const r = c.getBoundingClientRect();
              const k = c.width / r.width;
              const px = Math.floor((x - r.left) * k);
              const py = Math.floor((y - r.top) * k);
              return Array.from(c.getContext("2d").getImageData(px, py, 1, 1).data);
            }""",
            [panel_id, x, y, layer],
        )


def _page(browser, server, bundle, device_scale_factor: float):
    context = browser.new_context(
        viewport={"width": 1100, "height": 900},
        device_scale_factor=device_scale_factor,
        accept_downloads=True,
    )
    page = context.new_page()
    h = Harness(page=page, base_url=server)
    page.on("request", lambda r: h.requests.append(r.url))
    page.on("pageerror", lambda e: h.errors.append(str(e)))

    def on_dialog(d):
        h.dialogs.append(d.message)
        d.dismiss()

    page.on("dialog", on_dialog)
    page.goto(f"{server}/tests/browser/harness.html")
    page.wait_for_function("window.hwReady === true")
    return context, h


def _check_clean(h: Harness) -> None:
    assert h.errors == [], f"page errors: {h.errors}"
    assert h.dialogs == [], f"dialogs opened: {h.dialogs}"
    # No request may leave the local server (blob:/data: URLs are not network requests).
    remote = [
        u for u in h.requests if not (u.startswith(h.base_url + "/") or u.startswith(("blob:", "data:")))
    ]
    assert remote == [], f"requests outside the local server: {remote}"


@pytest.fixture
def harness(browser, server, bundle):
    context, h = _page(browser, server, bundle, 1)
    yield h
    context.close()
    _check_clean(h)


@pytest.fixture(params=[1, 2], ids=["dpr1", "dpr2"])
def harness_dpr(request, browser, server, bundle):
    context, h = _page(browser, server, bundle, request.param)
    yield h
    context.close()
    _check_clean(h)


def lut_colour(colormaps: dict, name: str, value: float, vmin: float, vmax: float) -> list[int]:
    """Colour of `value` by the rule documented in js/lib/colormap.ts."""
    import math

    if math.isnan(value):
        return list(colormaps["nan_color"])
    t = (value - vmin) / (vmax - vmin) if vmax > vmin else 0.5
    t = min(max(t, 0.0), 1.0)
    return list(colormaps[name]["stops"][math.floor(t * 255 + 0.5)])


@pytest.fixture(scope="session")
def colour_of(colormaps):
    return functools.partial(lut_colour, colormaps)


# JupyterLab and Notebook 7 end to end (a server per session, notebook pages): see jupyter_fixtures.py.
from .jupyter_fixtures import jupyterlab, lab_page, notebook7, notebook7_page  # noqa: E402, F401
