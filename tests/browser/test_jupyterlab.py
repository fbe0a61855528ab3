"""The widget in a real JupyterLab: the kernel's panels reach the canvas, and changes go both ways.

One notebook per module: its first cell shows ``explore()`` of a tiny random-init Llama (GQA,
2 layers, 16 key channels). Pixels are checked against the colour of the values the kernel holds
(read back by running cells in the page), so a panel drawn from the wrong data, the wrong layer or
the wrong channel window fails.
"""

from __future__ import annotations

import json
import time

import pytest

from .jupyter_fixtures import DASHBOARD_CELL, write_notebook

pytestmark = pytest.mark.browser

ROOT = '.hw-root[data-view="channels"]'

#: Hash of the pixels of every heatmap canvas of the channel view.
DIGEST = """(root) => {
  let h = 2166136261 >>> 0;
  for (const c of document.querySelectorAll(root + ' .hw-heatmap')) {
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    for (let i = 0; i < d.length; i += 1) h = Math.imul(h ^ d[i], 16777619) >>> 0;
    h = Math.imul(h ^ c.width, 16777619) >>> 0;
  }
  return h;
}"""

#: RGBA at the centre of cell (row, col) of a panel with `rows`×`cols` cells.
CELL_PIXEL = """([root, id, row, col, rows, cols]) => {
  const w = document.querySelector(`${root} .hw-panel[data-panel-id="${id}"]`);
  const p = JSON.parse(w.dataset.plotRect);
  const c = w.querySelector('.hw-heatmap');
  const k = c.width / c.getBoundingClientRect().width;
  const x = Math.floor((p.x + (col + 0.5) * p.w / cols) * k);
  const y = Math.floor((p.y + (row + 0.5) * p.h / rows) * k);
  return Array.from(c.getContext('2d').getImageData(x, y, 1, 1).data);
}"""

CELLS = [(0, 0), (0, 1), (3, 7), (9, 2), (11, 11)]


@pytest.fixture(scope="module")
def lab(lab_page):
    write_notebook(lab_page.lab.root_dir / "dashboard.ipynb", DASHBOARD_CELL)
    lab_page.open("dashboard.ipynb")
    lab_page.run_cell(0, timeout_s=90)
    lab_page.page.wait_for_selector(f"{ROOT} .hw-panel canvas.hw-heatmap", state="visible")
    yield lab_page
    assert lab_page.errors == [], f"page errors: {lab_page.errors}"


def digest(lab) -> int:
    return lab.page.evaluate(DIGEST, ROOT)


def wait_for_redraw(lab, before: int, timeout_ms: float = 30_000) -> int:
    lab.page.wait_for_function(f"(root) => ({DIGEST})(root) !== {before}", arg=ROOT, timeout=timeout_ms)
    return digest(lab)


def kernel_panels(lab) -> dict[str, list[list[float]]]:
    """The float64 matrices the channel view shows now, by panel id, read in the kernel."""
    out = lab.run(
        "import json; print(json.dumps({p.id: p.matrix.tolist() for p in dash.channels.grid.panels}))"
    )
    return json.loads(out.splitlines()[-1])


def assert_pixels_show(lab, colour_of, matrices: dict[str, list[list[float]]]) -> None:
    for panel_id, m in matrices.items():
        rows, cols = len(m), len(m[0])
        for r, c in CELLS:
            if r >= rows or c >= cols:
                continue
            got = lab.page.evaluate(CELL_PIXEL, [ROOT, panel_id, r, c, rows, cols])
            v = m[r][c]
            # float16 on the wire may move a value across a colormap step boundary: allow the neighbours.
            allowed = [[*colour_of("diverging", x, -1.0, 1.0), 255] for x in (v - 4e-3, v, v + 4e-3)]
            assert any(max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1 for want in allowed), (
                f"{panel_id} cell ({r}, {c}) = {v}: pixel {got}, expected one of {allowed}"
            )


def test_heatmap_pixels_are_the_kernels_values(lab, colour_of):
    panels = kernel_panels(lab)
    assert sorted(panels) == ["key-0", "value-0"]
    assert len(panels["key-0"]) == 16
    assert_pixels_show(lab, colour_of, panels)


def move_layer_slider(lab, how: str) -> None:
    slider = lab.page.locator(f'{ROOT} input[data-trait="layer"]')
    assert slider.input_value() == "0"
    if how == "mouse":
        box = slider.bounding_box()
        slider.click(position={"x": box["width"] - 3, "y": box["height"] / 2})
    else:
        slider.focus()
        lab.page.keyboard.press("ArrowRight")


def check_layer_one_then_reset(lab, colour_of, before: int) -> None:
    after = wait_for_redraw(lab, before)
    # The kernel moved, and the dashboard's link moved the other views with it.
    assert lab.run("print(dash.channels.layer, dash.alignment.layer)").split() == ["1", "1"]
    panels = kernel_panels(lab)
    assert sorted(panels) == ["key-1", "value-1"]
    assert_pixels_show(lab, colour_of, panels)
    lab.run("dash.channels.layer = 0")
    wait_for_redraw(lab, after)
    assert lab.page.locator(f'{ROOT} input[data-trait="layer"]').input_value() == "0"


def test_layer_slider_mouse_reaches_the_kernel(lab, colour_of):
    before = digest(lab)
    move_layer_slider(lab, "mouse")
    check_layer_one_then_reset(lab, colour_of, before)


def test_layer_slider_keyboard_reaches_the_kernel(lab, colour_of):
    before = digest(lab)
    move_layer_slider(lab, "keyboard")
    try:
        wait_for_redraw(lab, before, timeout_ms=3_000)
    except Exception as err:
        raise AssertionError("the arrow key did not move the layer slider") from err
    check_layer_one_then_reset(lab, colour_of, before)


def test_python_change_redraws_the_canvas(lab, colour_of):
    before = digest(lab)
    lab.run("dash.channels.channel_start = 4")
    wait_for_redraw(lab, before)
    panels = kernel_panels(lab)
    assert len(panels["key-0"]) == 12  # channels 4..15
    assert_pixels_show(lab, colour_of, panels)
    # The window's first cell is channel 4 against itself, its neighbour channel 4 against 5.
    window = "dash.stats.channel_corr(0, 'key')[4:6, 4:6].tolist()"
    corr = json.loads(lab.run(f"import json; print(json.dumps({window}))"))
    assert panels["key-0"][0][:2] == pytest.approx(corr[0], nan_ok=True)
    shifted = digest(lab)
    lab.run("dash.channels.channel_start = 0")
    assert wait_for_redraw(lab, shifted) == before
    # Back to a window the page has drawn: the kernel sent its panels as frame keys alone (the page
    # said it holds them), and the page drew them from the cells it kept: the same pixels as before.
    sent = lab.run("print([(p['id'], len(p['data'])) for p in dash.channels.widget.panels])")
    assert sent.splitlines()[-1] == "[('key-0', 0), ('value-0', 0)]"


def test_clicking_a_layer_in_the_trend_chart_selects_it(lab):
    """The bqplot chart above the tabs is linked to the views: a click on layer 1's point moves them."""
    lab.run("dash.channels.layer = 0")
    slider = lab.page.locator(f'{ROOT} input[data-trait="layer"]')
    lab.page.wait_for_function(
        "(root) => document.querySelector(root + ' input[data-trait=\"layer\"]').value === '0'", arg=ROOT
    )
    lab.page.wait_for_timeout(300)  # let the layer-0 panels finish drawing before taking the digest
    before = digest(lab)
    dots = lab.page.locator(".bqplot .dot")
    lab.page.wait_for_function("() => document.querySelectorAll('.bqplot .dot').length >= 2", timeout=30_000)
    # points are drawn per series in layer order: the second dot of the first series is layer 1
    dots.nth(1).scroll_into_view_if_needed()
    # the browser's click event dispatched on the SVG point itself: earlier tests can leave a tooltip
    # or hover layer over the chart, which would take a click at those coordinates
    dots.nth(1).dispatch_event("click")
    lab.page.wait_for_function(
        "(root) => document.querySelector(root + ' input[data-trait=\"layer\"]').value === '1'",
        arg=ROOT,
        timeout=30_000,
    )
    assert slider.input_value() == "1"
    wait_for_redraw(lab, before)
    assert lab.run("print(dash.trends.layer, dash.channels.layer, dash.alignment.layer)").split() == ["1"] * 3
    lab.run("dash.channels.layer = 0")


def test_trend_points_name_series_layer_and_value_on_hover(lab):
    """Hovering a point of the trend chart shows a tooltip: the layer, and the series with its value."""
    lab.page.wait_for_function("() => document.querySelectorAll('.bqplot .dot').length >= 2", timeout=30_000)
    first = json.loads(lab.run("import json; print(json.dumps(list(dash.trends.series.items())[0]))"))
    name, values = first
    dot = lab.page.locator(".bqplot .dot").nth(1)  # the first series' point at layer 1
    dot.scroll_into_view_if_needed()
    dot.dispatch_event("mouseover")
    tip = lab.page.locator(".bqplot_tooltip_div")
    shown = (
        "() => [...document.querySelectorAll('.bqplot_tooltip_div')].some((t) => /layer/.test(t.innerText))"
    )
    lab.page.wait_for_function(shown, timeout=10_000)
    text = " ".join(tip.all_inner_texts())
    assert "layer" in text and name in text, text
    assert f"{values[1]:.3f}" in text, text
    dot.dispatch_event("mouseout")


def test_the_trend_charts_toolbar_covers_neither_its_title_nor_its_plot(lab):
    """bqplot shows its toolbar over the figure's top right on hover: the title sits above the figure,
    whole, and the plot starts below the toolbar."""
    figure = lab.page.locator(".bqplot.figure").first
    figure.scroll_into_view_if_needed()
    box = figure.bounding_box()
    lab.page.mouse.move(box["x"] + box["width"] / 2, box["y"] + box["height"] / 2)
    toolbar = lab.page.locator(".bqplot .toolbar_div").first
    toolbar.wait_for(state="visible", timeout=10_000)
    bar = toolbar.bounding_box()
    title = lab.page.locator(".hw-trend-title").first
    words = title.inner_text()
    assert "Per-layer summary" in words and "head similarity: per-token cosine, auto alignment" in words
    top = title.bounding_box()
    assert top["y"] + top["height"] <= bar["y"]  # the title ends above the toolbar
    plot = lab.page.locator(".bqplot.figure .plotarea_background").first.bounding_box()
    assert bar["y"] + bar["height"] <= plot["y"] + 1  # the toolbar ends where the plot begins
    lab.page.mouse.move(0, 0)


def test_a_spec_typed_into_the_mechanisms_bar_reaches_the_kernel_and_gets_a_panel(lab):
    """The entry of the mechanisms tab: Enter sends the spec, the kernel adds it, its panel is drawn."""
    lab.page.locator(".lm-TabBar-tab", has_text="Mechanisms").first.click()
    root = '.hw-root[data-view="mechanisms"]'
    field = lab.page.locator(f'{root} input[data-trait="add_mechanism"]')
    field.wait_for(state="visible", timeout=30_000)
    field.fill("gqa:1")
    field.press("Enter")
    lab.page.wait_for_selector(f'{root} .hw-panel[data-panel-id="gqa:1"]', timeout=30_000)
    assert field.input_value() == ""
    got = lab.run("print(dash.mechanisms.mechanisms[-1], repr(dash.mechanisms.add_mechanism))").split()
    assert got == ["gqa:1", "''"]
    checked = lab.page.locator(f'{root} input[type="checkbox"]').evaluate_all(
        "(cs) => cs.filter((c) => c.checked).map((c) => c.value)"
    )
    assert checked[-1] == "gqa:1"
    lab.page.locator(".lm-TabBar-tab", has_text="Channels").first.click()


WIDE_CELL = """\
from transformers import GPT2Config, GPT2LMHeadModel
torch.manual_seed(0)
gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=1024, n_layer=2, n_head=8)).eval()
wide = headwidget.ChannelView(headwidget.capture(gpt2, torch.randint(0, 64, (2, 16)), progress=False))
wide"""

#: The longest plot side of the last channel view on the page, in device pixels.
PLOT_PIXELS = """() => {
  const roots = document.querySelectorAll('.hw-root[data-view="channels"]');
  const panels = roots[roots.length - 1].querySelectorAll('.hw-panel');
  const side = Math.max(...[...panels].map((p) => {
    const r = JSON.parse(p.dataset.plotRect); return Math.max(r.w, r.h); }));
  return Math.ceil(side * window.devicePixelRatio);
}"""


def test_the_kernel_sends_no_more_cells_than_the_page_draws(lab):
    """A 1024-channel view: the page reports its plot size, and the next layer comes at that size."""
    lab.run(WIDE_CELL, timeout_s=120)
    lab.page.wait_for_function(
        "() => document.querySelectorAll('.hw-root[data-view=\"channels\"] .hw-heatmap').length >= 4"
    )
    pixels = lab.page.evaluate(PLOT_PIXELS)
    assert 100 < pixels < 1024, pixels  # the plot is narrower than the 1024 channels
    deadline = time.monotonic() + 30
    while int(lab.run("print(wide.widget.panel_pixels)").splitlines()[-1]) != pixels:
        assert time.monotonic() < deadline, "the page never told the kernel its plot size"
    out = lab.run("wide.layer = 1\nprint(wide.widget.panels[0]['rows'], wide.widget.panels[0]['row_step'])")
    rows, step = map(int, out.splitlines()[-1].split())
    assert step == -(-1024 // pixels) and rows == -(-1024 // step) <= pixels
    lab.page.wait_for_function(
        """() => { const roots = document.querySelectorAll('.hw-root[data-view="channels"]');
          return roots[roots.length - 1].querySelector('.hw-panel').dataset.panelId === 'key-1'; }"""
    )
    # The kernel held its computing ahead (the layers beside) while the page drew: the page says when
    # it has drawn (``drawn``), and that lets it start; without a word it would stay held.
    deadline = time.monotonic() + 30
    while lab.run("print(wide._prefetcher._go.is_set())").splitlines()[-1] != "True":
        assert time.monotonic() < deadline, "the page never told the kernel it had drawn the panels"


def test_a_second_page_asks_for_the_frames_it_lacks_and_draws_the_kernels_values(lab, browser, colour_of):
    """A widget shown again in another page (another browser on the same kernel) is sent as frame keys
    the first page holds; the second page lacks them, asks (``missing``), and draws the panels the
    kernel then sends whole: the kernel's values, not an empty or stale figure."""
    from .jupyter_fixtures import open_lab_page

    before = digest(lab)
    lab.run("dash.channels.channel_start = 4")
    shifted = wait_for_redraw(lab, before)
    lab.run("dash.channels.channel_start = 0")
    assert wait_for_redraw(lab, shifted) == before
    sent = lab.run("print([len(p['data']) for p in dash.channels.widget.panels])")
    assert sent.splitlines()[-1] == "[0, 0]"  # keys alone: the first page holds them
    context, second = open_lab_page(browser, lab.lab)
    try:
        second.open("dashboard.ipynb")
        second.cells().last.locator(".cm-content").click()
        second.page.keyboard.press("Escape")
        second.page.keyboard.press("b")  # a new cell below the notebook's (it is not run here again)
        second.cells().nth(1).wait_for()
        second.run("dash.channels.widget")
        second.page.wait_for_selector(f"{ROOT} .hw-panel canvas.hw-heatmap", state="visible")
        second.page.wait_for_function(
            "(root) => document.querySelectorAll(root + ' .hw-panel').length === 2", arg=ROOT
        )
        sent = second.run("print([len(p['data']) for p in dash.channels.widget.panels])")
        assert sent.splitlines()[-1] == "[512, 512]"  # sent whole again: 16×16 float16 cells each
        assert_pixels_show(second, colour_of, kernel_panels(second))
        assert second.errors == []
    finally:
        context.close()
