"""The saved HTML page, opened from a file:// URL in headless chromium: offline, drawn, interactive."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headwidget
from headwidget.export import save
from headwidget.views import ChannelView
from tiny_models import make_model, ragged_batches

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def stats():
    model = make_model("llama_gqa", dtype=torch.float32)
    return headwidget.capture(model, ragged_batches(), rope="both", progress=False)


class Page:
    """A saved page open in chromium, with what it requested and any script error."""

    def __init__(self, browser, path):
        self.url = path.resolve().as_uri()
        self.context = browser.new_context(viewport={"width": 1100, "height": 900}, device_scale_factor=1)
        self.page = self.context.new_page()
        self.requests: list[str] = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r.url))
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))
        self.page.on("console", lambda m: self.errors.append(m.text) if m.type == "error" else None)
        self.page.goto(self.url)
        self.page.wait_for_function("() => document.documentElement.dataset.headwidgetReady")
        assert self.js("document.documentElement.dataset.headwidgetReady") == "true", self.text(".hw-root")

    def js(self, expr: str, arg=None):
        return self.page.evaluate(expr, arg)

    def text(self, selector: str) -> str:
        return self.js("(s) => document.querySelector(s)?.textContent ?? document.body.textContent", selector)

    def panel_ids(self) -> list[str]:
        return self.js("[...document.querySelectorAll('.hw-panel')].map((p) => p.dataset.panelId)")

    def cell_centre(self, panel_id: str, row: int, col: int) -> tuple[float, float]:
        r = self.js(
            """(id) => {
              const w = document.querySelector(`.hw-panel[data-panel-id="${id}"]`);
              const p = JSON.parse(w.dataset.plotRect), b = w.getBoundingClientRect();
              return { x: b.left + p.x, y: b.top + p.y, w: p.w, h: p.h };
            }""",
            panel_id,
        )
        rows, cols = self.js(
            """(id) => {
              const p = window.headwidget.model.get("panels").find((q) => q.id === id);
              return [p.rows, p.cols];
            }""",
            panel_id,
        )
        return r["x"] + (col + 0.5) * r["w"] / cols, r["y"] + (row + 0.5) * r["h"] / rows

    def pixel(self, panel_id: str, x: float, y: float) -> list[int]:
        return self.js(
            """([id, x, y]) => {
              const c = document.querySelector(`.hw-panel[data-panel-id="${id}"] .hw-heatmap`);
              const r = c.getBoundingClientRect(), k = c.width / r.width;
              const px = Math.floor((x - r.left) * k), py = Math.floor((y - r.top) * k);
              const d = c.getContext("2d").getImageData(px, py, 1, 1).data;
              return [d[0], d[1], d[2]];
            }""",
            [panel_id, x, y],
        )

    def close(self) -> None:
        self.context.close()
        assert self.errors == [], f"script errors: {self.errors}"
        # The page itself is the only file it loads; the bundle comes from an inline data: URL.
        assert [u for u in self.requests if not u.startswith("data:")] == [self.url]


@pytest.fixture
def open_page(browser, bundle):
    pages: list[Page] = []

    def opener(path):
        pages.append(Page(browser, path))
        return pages[-1]

    yield opener
    for page in pages:
        page.close()


def wire(value: float) -> float:
    """The value the browser draws: the panel data travels as float16 (values inside [-1, 1])."""
    return float(np.float16(value))


def test_page_draws_hovers_and_switches_layers_offline(stats, open_page, colour_of, tmp_path):
    view = ChannelView(stats, layer=0)
    path = save(view, tmp_path / "channels.html", title="Channel correlation")
    page = open_page(path)
    assert page.text("h1") == "Channel correlation"
    assert page.panel_ids() == ["key-0", "value-0"]

    key0 = stats.channel_corr(0, "key")
    off = np.abs(key0 - np.eye(len(key0)))
    r, c = np.unravel_index(np.nanargmax(off), off.shape)  # the strongest off-diagonal correlation
    x, y = page.cell_centre("key-0", r, c)
    assert page.pixel("key-0", x, y) == colour_of("diverging", wire(key0[r, c]), -1.0, 1.0)

    page.page.mouse.move(x, y)
    tooltip = page.page.locator(".hw-tooltip")
    assert tooltip.is_visible()
    hd = stats.meta.layout.head_dim  # the tooltip names each channel by head and dimension
    assert tooltip.inner_text().split("\n") == [
        "Keys · layer 0",
        f"K h{r // hd}·d{r % hd} × h{c // hd}·d{c % hd} = {wire(key0[r, c]):#.4g}",
        f"index {r} × {c}",
    ]

    slider = page.page.locator("input[data-trait=layer]")
    slider.focus()
    page.page.keyboard.press("ArrowRight")  # input + change; the commit follows after the debounce
    page.page.wait_for_selector('.hw-panel[data-panel-id="key-1"]')
    assert page.js("window.headwidget.model.get('layer')") == 1
    assert "layer 1 of 0–1" in page.text(".hw-controls output")
    key1 = stats.channel_corr(1, "key")
    x, y = page.cell_centre("key-1", r, c)
    assert page.pixel("key-1", x, y) == colour_of("diverging", wire(key1[r, c]), -1.0, 1.0)
    # (nothing but the page's reports that it drew: no kernel reads them)
    assert {m["type"] for m in page.js("window.headwidget.model.sent")} <= {"drawn"}


def test_layers_left_out_say_how_to_add_them(stats, open_page, tmp_path):
    view = ChannelView(stats, layer=0, channel_width=4)
    page = open_page(save(view, tmp_path / "layer1.html", layers=[1]))
    assert page.js("window.headwidget.model.get('layer')") == 1  # opens on the first exported layer
    assert page.panel_ids() == ["key-1", "value-1"]
    page.page.locator("input[data-trait=layer]").focus()
    page.page.keyboard.press("ArrowLeft")
    page.page.wait_for_function("() => window.headwidget.model.get('error') !== ''")
    assert "layer 0 is not in this file (it holds layers 1)" in page.text(".hw-error")
    assert page.panel_ids() == ["key-1", "value-1"]


def test_network_requests_are_refused_by_the_page(stats, open_page, tmp_path):
    page = open_page(save(ChannelView(stats, layer=0, channel_width=4), tmp_path / "p.html"))
    blocked = page.js(
        """async () => {
          try { await fetch("http://127.0.0.1:9/x"); return "fetched"; } catch (e) { return "blocked"; }
        }"""
    )
    assert blocked == "blocked"
    assert any("Content Security Policy" in e for e in page.errors), page.errors  # refused, not just failed
    page.errors.clear()
    page.requests[:] = [u for u in page.requests if not u.startswith("http://127.0.0.1:9/")]


def test_the_page_runs_under_a_csp_without_unsafe_inline_scripts(stats, open_page, tmp_path):
    page = open_page(save(ChannelView(stats, layer=0, channel_width=4), tmp_path / "csp.html"))
    csp = page.js("document.querySelector('meta[http-equiv=Content-Security-Policy]').content")
    script_src = next(d.split()[1:] for d in csp.split(";") if d.split()[:1] == ["script-src"])
    assert "'unsafe-inline'" not in script_src and any(s.startswith("'sha256-") for s in script_src)
    assert page.panel_ids() == ["key-0", "value-0"]  # drawn: the hash let the page's own module run
    assert not [e for e in page.errors if "Content Security Policy" in e], page.errors
    # An inline script or handler added later is refused (reported as a violation, then cleared).
    page.js(
        """() => { const s = document.createElement('script'); s.textContent = 'window.__ran = 1';
                   document.body.append(s); }"""
    )
    assert page.js("window.__ran === undefined")
    assert any("Content Security Policy" in e for e in page.errors), page.errors
    page.errors.clear()


def test_the_channel_window_sliders_work_offline(stats, open_page, tmp_path):
    """The page holds each layer's whole matrices and crops them to the window, as the kernel does."""
    view = ChannelView(stats, layer=1, channel_start=4, channel_width=8)
    page = open_page(save(view, tmp_path / "window.html"))
    model = "window.headwidget.model"
    assert page.js(f"[{model}.get('channel_start'), {model}.get('channel_width')]") == [4, 8]
    panel = page.js(f"{model}.get('panels')[0]")
    assert (panel["rows"], panel["cols"], panel["row_offset"]) == (8, 8, 4)
    assert panel["subtitle"] == view.grid.panels[0].subtitle  # "channels 4–11 · …", as the kernel says
    key1 = stats.channel_corr(1, "key")
    page.page.mouse.move(*page.cell_centre("key-1", 2, 5))  # channels 6 × 9
    hover = page.js("JSON.parse(document.querySelector('.hw-grid').dataset.hover)")
    assert hover["value"] == pytest.approx(wire(key1[6, 9]), abs=1e-6)
    # the start field: type 0, the page re-crops to channels 0–7 (no kernel needed)
    field = page.page.locator('input.hw-number[data-number="channel_start"]')
    field.fill("0")
    field.press("Tab")  # the field commits on change
    page.page.wait_for_function(f"() => {model}.get('panels')[0].row_offset === 0")
    view.channel_start = 0
    assert page.js(f"{model}.get('panels')[0].subtitle") == view.grid.panels[0].subtitle
    page.page.mouse.move(*page.cell_centre("key-1", 2, 5))
    hover = page.js("JSON.parse(document.querySelector('.hw-grid').dataset.hover)")
    assert hover["value"] == pytest.approx(wire(key1[2, 5]), abs=1e-6)
    # another layer keeps the window
    page.page.locator("input[data-trait=layer]").focus()
    page.page.keyboard.press("ArrowLeft")
    page.page.wait_for_selector('.hw-panel[data-panel-id="key-0"]')
    assert page.js(f"[{model}.get('panels')[0].rows, {model}.get('panels')[0].row_offset]") == [8, 0]


def test_the_kind_toggle_switches_between_keys_before_and_after_rope_offline(stats, open_page, tmp_path):
    """Both key kinds are on the page: the toggle swaps the key panels (values stay), the hover reads
    the other kind's numbers, and the window and the layer carry over."""
    view = ChannelView(stats, layer=1, channel_start=0, channel_width=8)
    page = open_page(save(view, tmp_path / "kinds.html"))
    model = "window.headwidget.model"
    assert page.panel_ids() == ["key-1", "value-1"]
    pressed = page.js("document.querySelector('button[data-value=key]').getAttribute('aria-pressed')")
    assert pressed == "true"
    buttons = page.page.locator("button[data-trait=kind]")
    assert buttons.all_text_contents() == ["keys, pre-RoPE", "keys, post-RoPE"]  # words, not kind names
    page.page.locator("button[data-trait=kind][data-value=key_post]").click()
    page.page.wait_for_selector('.hw-panel[data-panel-id="key_post-1"]')
    assert page.panel_ids() == ["key_post-1", "value-1"]
    view.kind = "key_post"
    assert page.js(f"{model}.get('panels')[0].title") == view.grid.panels[0].title
    post = stats.channel_corr(1, "key_post")
    page.page.mouse.move(*page.cell_centre("key_post-1", 3, 6))
    hover = page.js("JSON.parse(document.querySelector('.hw-grid').dataset.hover)")
    assert hover["value"] == pytest.approx(wire(post[3, 6]), abs=1e-6)
    assert hover["value"] != pytest.approx(wire(stats.channel_corr(1, "key")[3, 6]), abs=1e-6)
    # the layer slider keeps the kind; the window stays
    page.page.locator("input[data-trait=layer]").focus()
    page.page.keyboard.press("ArrowLeft")
    page.page.wait_for_selector('.hw-panel[data-panel-id="key_post-0"]')
    assert page.js(f"{model}.get('panels')[0].rows") == 8
    page.page.locator("button[data-trait=kind][data-value=key]").click()
    page.page.wait_for_selector('.hw-panel[data-panel-id="key-0"]')
    assert page.errors == []
