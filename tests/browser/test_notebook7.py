"""The widget in a real Notebook 7 (``jupyter notebook``): panels reach the canvas, the slider the kernel.

A Notebook 7 server is started on 127.0.0.1 (free port, random token, temporary root); a notebook
whose only cell shows a ``ChannelView`` of a tiny random-init Llama is opened in chromium and run.
Pixels are compared with the colour of the values the kernel holds (read back by running cells in
the page), and a click on the layer slider must change ``view.layer`` in the kernel.
"""

from __future__ import annotations

import json

import pytest

from .host_checks import (
    KERNEL_PANELS,
    ROOT,
    assert_drawn,
    assert_pixels_show,
    click_slider_end,
    digest,
    panel_ids,
    view_setup,
    wait_for_redraw,
)
from .jupyter_fixtures import TESTS_DIR, write_notebook

pytestmark = pytest.mark.browser

#: Notebook 7.6's keyboard-shortcut settings plugin throws this while the page starts, in an empty
#: notebook too (it reads the schema of a plugin that is not loaded): Notebook's own, not the widget's.
HOST_STARTUP_ERROR = "Cannot read properties of undefined (reading 'schema')"


def widget_errors(errors: list[tuple[str, str]]) -> list[str]:
    """The page errors but Notebook's own start-up error (thrown from its core bundle only)."""
    kept = []
    for message, stack in errors:
        # the frames that name a script (not "at async Promise.all (index 0)")
        frames = [line for line in stack.splitlines() if line.strip().startswith("at ") and ":" in line]
        own = bool(frames) and all("/static/notebook/" in f for f in frames)
        if not (message == HOST_STARTUP_ERROR and own):
            kept.append(f"{message}\n{stack}")
    return kept


@pytest.fixture(scope="module")
def nb(notebook7_page):
    errors: list[tuple[str, str]] = []
    notebook7_page.page.on("pageerror", lambda e: errors.append((e.message, e.stack or "")))
    write_notebook(notebook7_page.lab.root_dir / "view.ipynb", view_setup(str(TESTS_DIR)) + "\nview")
    notebook7_page.open("view.ipynb")
    # Notebook 7's own page, not JupyterLab's.
    assert notebook7_page.page.url.split("?")[0].endswith("/notebooks/view.ipynb")
    assert notebook7_page.page.locator("#main-panel .jp-NotebookPanel").count() == 1
    notebook7_page.run_cell(0, timeout_s=90)
    notebook7_page.page.wait_for_selector(f"{ROOT} .hw-panel canvas.hw-heatmap", state="visible")
    yield notebook7_page
    assert widget_errors(errors) == []
    assert notebook7_page.remote_requests() == []


def kernel_panels(nb) -> dict[str, list[list[float]]]:
    return json.loads(nb.run(KERNEL_PANELS).splitlines()[-1])


def test_panels_show_the_kernels_values(nb, colour_of):
    panels = kernel_panels(nb)
    assert sorted(panels) == ["key-0", "value-0"] == panel_ids(nb.page)
    assert len(panels["key-0"]) == 16
    for panel_id in panels:
        assert_drawn(nb.page, panel_id)
    assert_pixels_show(nb.page, colour_of, panels)


def test_layer_slider_reaches_the_kernel(nb, colour_of):
    before = digest(nb.page)
    click_slider_end(nb.page)
    after = wait_for_redraw(nb.page, before)
    assert nb.run("print(view.layer)") == "1"
    panels = kernel_panels(nb)
    assert sorted(panels) == ["key-1", "value-1"] == panel_ids(nb.page)
    assert_pixels_show(nb.page, colour_of, panels)
    # And back from the kernel: the slider and the canvases follow.
    nb.run("view.layer = 0")
    assert wait_for_redraw(nb.page, after) == before
    assert nb.page.locator(f'{ROOT} input[data-trait="layer"]').input_value() == "0"
