"""The widget in a real marimo app: ``mo.ui.anywidget(view.widget)`` draws the panels, the slider
reaches Python.

The test writes an app (``app.py``) into a temporary directory and serves it with ``marimo run``
on 127.0.0.1 (free port, random access token, its own config, state and cache dirs), then opens it
in chromium. The app's first cell shows a ``ChannelView`` of a tiny random-init Llama, its
``view.widget`` wrapped in ``mo.ui.anywidget``; a second cell reads the wrapper's ``value["layer"]``,
and so re-runs whenever the page changes the widget; it prints what Python holds then (the wrapper's
value, ``view.layer``, the panels' float64 matrices) as JSON. Pixels are compared with those matrices,
before and after a click on the layer slider; a ``mo.ui.button`` whose handler sets ``view.layer``
checks the way back.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import subprocess
import sys
import textwrap
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from .host_checks import (
    ROOT,
    assert_drawn,
    assert_pixels_show,
    click_slider_end,
    digest,
    panel_ids,
    view_setup,
    wait_for_redraw,
)
from .jupyter_fixtures import STARTUP_TIMEOUT_S, TESTS_DIR, free_port, require_modules

pytestmark = pytest.mark.browser


def app_source(tests_dir: str) -> str:
    setup = textwrap.indent(view_setup(tests_dir), " " * 4)
    return f"""\
import marimo

app = marimo.App()


@app.cell
def _():
    import html
    import json

    import marimo as mo
{setup}
    widget = mo.ui.anywidget(view.widget)

    def _back_to_layer_0(clicks):
        view.layer = 0
        return clicks + 1

    back = mo.ui.button(value=0, label="Back to layer 0", on_click=_back_to_layer_0)
    mo.vstack([widget, back])
    return back, html, json, mo, view, widget


@app.cell
def _(back, html, json, mo, view, widget):
    _python = {{
        "back_clicks": back.value,
        "value_layer": widget.value["layer"],
        "view_layer": view.layer,
        "panels": {{p.id: p.matrix.tolist() for p in view.grid.panels}},
    }}
    mo.Html('<pre id="hw-python">' + html.escape(json.dumps(_python)) + "</pre>")
    return


if __name__ == "__main__":
    app.run()
"""


@dataclass
class MarimoApp:
    url: str
    log: Path

    def log_tail(self, chars: int = 3000) -> str:
        return self.log.read_text(errors="replace")[-chars:] if self.log.exists() else ""


@contextlib.contextmanager
def running_marimo(app: Path, work_dir: Path) -> Iterator[MarimoApp]:
    """``marimo run app`` on a free loopback port with a random token; stopped on exit."""
    port, token = free_port(), secrets.token_hex(16)
    env = dict(
        os.environ,
        XDG_CONFIG_HOME=str(work_dir / "config"),
        XDG_STATE_HOME=str(work_dir / "state"),
        XDG_CACHE_HOME=str(work_dir / "cache"),
        MARIMO_SKIP_UPDATE_CHECK="1",
        PYTHONUNBUFFERED="1",
    )
    cmd = [
        sys.executable,
        "-m",
        "marimo",
        "run",
        str(app),
        "--headless",
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--token",
        "--token-password",
        token,
        "--no-sandbox",
    ]
    base = f"http://127.0.0.1:{port}"
    server = MarimoApp(f"{base}/?access_token={token}", work_dir / "marimo.log")
    with server.log.open("wb") as log:
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, cwd=app.parent)
    direct = urllib.request.build_opener(urllib.request.ProxyHandler({}))  # never through a proxy
    try:
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"marimo exited with {proc.returncode}:\n{server.log_tail()}")
            try:
                with direct.open(f"{base}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError(f"marimo did not answer in {STARTUP_TIMEOUT_S} s:\n{server.log_tail()}")
            time.sleep(0.2)
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)


@dataclass
class AppPage:
    page: object
    server: MarimoApp
    requests: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def python_state(self) -> dict:
        """What the app's second cell last printed: the state Python holds."""
        return json.loads(self.page.locator("#hw-python").first.inner_text())

    def wait_for_python(self, key: str, value, timeout_s: float = 60) -> dict:
        deadline = time.monotonic() + timeout_s
        while (state := self.python_state())[key] != value:
            if time.monotonic() > deadline:
                log = self.server.log_tail()
                raise AssertionError(f"Python's {key} is {state[key]}, not {value}, in {timeout_s} s:\n{log}")
            time.sleep(0.1)
        return state


@pytest.fixture(scope="module")
def marimo_app(tmp_path_factory) -> Iterator[MarimoApp]:
    require_modules("marimo")
    from importlib.metadata import version

    if not version("marimo").startswith("0.25."):
        pytest.fail(f"marimo {version('marimo')} is installed, the tests are for 0.25.x", pytrace=False)
    app_dir = tmp_path_factory.mktemp("marimo-app")
    app = app_dir / "app.py"
    app.write_text(app_source(str(TESTS_DIR)))
    with running_marimo(app, tmp_path_factory.mktemp("marimo")) as server:
        yield server


@contextlib.contextmanager
def opened_app(browser, server: MarimoApp, *shown: str) -> Iterator[AppPage]:
    """The app in a fresh browser context, once every selector in ``shown`` is on the page; on exit,
    no page error was raised and no request left the machine."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.set_default_timeout(60_000)
    ap = AppPage(page=page, server=server)
    page.on("request", lambda r: ap.requests.append(r.url))
    page.on("websocket", lambda ws: ap.requests.append(ws.url))
    page.on("pageerror", lambda e: ap.errors.append(f"{e.message}\n{e.stack}"))
    page.goto(server.url)
    try:
        for selector in shown:
            page.locator(selector).first.wait_for(timeout=120_000)
    except Exception as err:
        raise AssertionError(f"the app did not show {shown}:\n{server.log_tail()}") from err
    yield ap
    context.close()
    assert ap.errors == [], f"page errors: {ap.errors}"
    local = ("http://127.0.0.1:", "ws://127.0.0.1:", "blob:", "data:")
    assert [u for u in ap.requests if not u.startswith(local)] == []


@pytest.fixture(scope="module")
def app_page(browser, marimo_app) -> Iterator[AppPage]:
    with opened_app(browser, marimo_app, f"{ROOT} canvas.hw-heatmap", "#hw-python") as ap:
        yield ap


def test_panels_show_pythons_values(app_page, colour_of):
    state = app_page.python_state()
    assert state["value_layer"] == state["view_layer"] == 0
    panels = state["panels"]
    assert sorted(panels) == ["key-0", "value-0"] == panel_ids(app_page.page)
    assert len(panels["key-0"]) == 16
    for panel_id in panels:
        assert_drawn(app_page.page, panel_id)
    assert_pixels_show(app_page.page, colour_of, panels)


def test_fields_and_buttons_keep_their_borders_under_the_hosts_css(app_page):
    """marimo's CSS reset sets every border to 0: the widget's number fields and buttons keep theirs."""
    fields = app_page.page.locator(f"{ROOT} input.hw-number, {ROOT} button.hw-export")  # (in a shadow root)
    borders = fields.evaluate_all("(all) => all.map((e) => getComputedStyle(e).borderTopWidth)")
    assert borders and set(borders) == {"1px"}, borders


def test_layer_slider_reaches_python(app_page, colour_of):
    before = digest(app_page.page)
    click_slider_end(app_page.page)
    wait_for_redraw(app_page.page, before)
    state = app_page.wait_for_python("value_layer", 1)
    assert state["view_layer"] == 1  # the wrapper's value and the view itself
    panels = state["panels"]
    assert sorted(panels) == ["key-1", "value-1"] == panel_ids(app_page.page)
    assert_pixels_show(app_page.page, colour_of, panels)
    # And back from Python (a button whose handler sets view.layer): the slider and canvases follow.
    after = digest(app_page.page)
    app_page.page.get_by_role("button", name="Back to layer 0").click()
    assert wait_for_redraw(app_page.page, after) == before
    assert app_page.page.locator(f'{ROOT} input[data-trait="layer"]').first.input_value() == "0"
    state = app_page.wait_for_python("back_clicks", 1)
    assert state["view_layer"] == state["value_layer"] == 0


# ------------------------------------------------------------------------------------ explore()
def explore_source(tests_dir: str) -> str:
    """An app whose one cell shows ``explore(...)`` of the tiny Llama: the dashboard itself as output."""
    setup = textwrap.indent(view_setup(tests_dir).split("\nstats = ")[0], " " * 4)
    return f"""\
import marimo

app = marimo.App()


@app.cell
def _():
{setup}
    dash = headwidget.explore(model, ragged_batches(), progress=False)
    dash
    return (dash,)


if __name__ == "__main__":
    app.run()
"""


@pytest.fixture(scope="module")
def explore_page(browser, tmp_path_factory) -> Iterator[AppPage]:
    require_modules("marimo")
    app = tmp_path_factory.mktemp("marimo-explore") / "explore.py"
    app.write_text(explore_source(str(TESTS_DIR)))
    with (
        running_marimo(app, tmp_path_factory.mktemp("marimo-explore-run")) as server,
        opened_app(browser, server, f"{ROOT} canvas.hw-heatmap") as ap,
    ):
        yield ap


def test_explore_shows_the_trends_and_every_tab_sharing_the_layer(explore_page):
    page = explore_page.page
    trends = page.locator('.hw-root[data-view="trends"]').first
    trends.locator("canvas").first.wait_for()
    assert trends.locator("canvas").count() >= 1  # the per-layer summary, drawn by the widget's charts
    tabs = {"Channels": "channels", "Head alignment": "alignment", "Mechanisms": "mechanisms"}
    for title, view in tabs.items():
        page.get_by_role("tab", name=title).click()
        page.locator(f'.hw-root[data-view="{view}"] canvas.hw-heatmap').first.wait_for(state="visible")
    # The layer moved in one tab moves the others (through Python: the views' layers are linked).
    page.get_by_role("tab", name="Channels").click()
    before = digest(page)
    click_slider_end(page)
    wait_for_redraw(page, before)
    for title, view in list(tabs.items())[1:]:
        page.get_by_role("tab", name=title).click()
        slider = page.locator(f'.hw-root[data-view="{view}"] input[data-trait="layer"]').first
        deadline = time.monotonic() + 30
        while slider.input_value() != "1":
            assert time.monotonic() < deadline, f"the {view} tab stayed at layer {slider.input_value()}"
            time.sleep(0.1)
