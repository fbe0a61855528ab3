"""Checks of a channel view shown by a notebook host (Notebook 7, marimo), read through the page.

Everything goes through Playwright locators, which see into open shadow roots (marimo renders its
outputs in them), and every check compares the canvas with values the kernel reports, so a panel
drawn from the wrong data or the wrong layer fails.
"""

from __future__ import annotations

import time

#: The root element of a channel view.
ROOT = '.hw-root[data-view="channels"]'

#: Hash of the pixels of every heatmap canvas under the root element.
DIGEST = """(root) => {
  let h = 2166136261 >>> 0;
  for (const c of root.querySelectorAll('.hw-heatmap')) {
    const d = c.getContext('2d').getImageData(0, 0, c.width, c.height).data;
    for (let i = 0; i < d.length; i += 1) h = Math.imul(h ^ d[i], 16777619) >>> 0;
    h = Math.imul(h ^ c.width, 16777619) >>> 0;
  }
  return h;
}"""

#: RGBA at the centre of cell (row, col) of a panel element with `rows`×`cols` cells.
CELL_PIXEL = """(w, [row, col, rows, cols]) => {
  const p = JSON.parse(w.dataset.plotRect);
  const c = w.querySelector('.hw-heatmap');
  const k = c.width / c.getBoundingClientRect().width;
  const x = Math.floor((p.x + (col + 0.5) * p.w / cols) * k);
  const y = Math.floor((p.y + (row + 0.5) * p.h / rows) * k);
  return Array.from(c.getContext('2d').getImageData(x, y, 1, 1).data);
}"""

#: The distinct RGBA values of a heatmap canvas inside its plot rectangle, at most 64 of them.
PLOT_COLOURS = """(w) => {
  const p = JSON.parse(w.dataset.plotRect);
  const c = w.querySelector('.hw-heatmap');
  const k = c.width / c.getBoundingClientRect().width;
  const d = c.getContext('2d').getImageData(
    Math.floor(p.x * k), Math.floor(p.y * k), Math.floor(p.w * k), Math.floor(p.h * k)).data;
  const seen = new Set();
  for (let i = 0; i < d.length && seen.size < 64; i += 4) seen.add(`${d[i]},${d[i+1]},${d[i+2]},${d[i+3]}`);
  return [...seen];
}"""

CELLS = [(0, 0), (0, 1), (3, 7), (9, 2), (11, 11)]


def root(page):
    return page.locator(ROOT).first


def panel(page, panel_id: str):
    return page.locator(f'{ROOT} .hw-panel[data-panel-id="{panel_id}"]').first


def digest(page) -> int:
    return root(page).evaluate(DIGEST)


def wait_for_redraw(page, before: int, timeout_s: float = 30) -> int:
    """Wait until the canvases differ from the digest ``before``; return the new digest."""
    deadline = time.monotonic() + timeout_s
    while (now := digest(page)) == before:
        if time.monotonic() > deadline:
            raise AssertionError(f"the canvases did not change in {timeout_s} s")
        time.sleep(0.1)
    return now


def panel_ids(page) -> list[str]:
    return sorted(page.locator(f"{ROOT} .hw-panel").evaluate_all("(ps) => ps.map((p) => p.dataset.panelId)"))


def assert_drawn(page, panel_id: str) -> None:
    """The panel's plot area is painted, opaque, with more than one colour (not a blank canvas)."""
    colours = panel(page, panel_id).evaluate(PLOT_COLOURS)
    assert len(colours) > 8, f"{panel_id}: the plot area has only the colours {colours}"
    assert all(c.endswith(",255") for c in colours), f"{panel_id}: transparent pixels in the plot area"


def assert_pixels_show(page, colour_of, matrices: dict[str, list[list[float]]]) -> None:
    """The colour at the centre of a few cells of each panel is the colour of the kernel's value."""
    for panel_id, m in matrices.items():
        rows, cols = len(m), len(m[0])
        checked = 0
        for r, c in CELLS:
            if r >= rows or c >= cols:
                continue
            got = panel(page, panel_id).evaluate(CELL_PIXEL, [r, c, rows, cols])
            v = m[r][c]
            # float16 on the wire may move a value across a colormap step boundary: allow the neighbours.
            allowed = [[*colour_of("diverging", x, -1.0, 1.0), 255] for x in (v - 4e-3, v, v + 4e-3)]
            assert any(max(abs(a - b) for a, b in zip(got, want, strict=True)) <= 1 for want in allowed), (
                f"{panel_id} cell ({r}, {c}) = {v}: pixel {got}, expected one of {allowed}"
            )
            checked += 1
        assert checked >= 3, f"{panel_id}: only {checked} cells checked ({rows}×{cols})"


def view_setup(tests_dir: str) -> str:
    """Python that builds ``view``: a ``ChannelView`` of statistics captured from a tiny random-init
    Llama (GQA, 2 layers, 16 key channels), layer 0 selected."""
    return f"""\
import sys
sys.path.insert(0, {tests_dir!r})
import torch
import headwidget
from tiny_models import make_model, ragged_batches
model = make_model("llama_gqa", dtype=torch.float32)
stats = headwidget.capture(model, ragged_batches(), progress=False)
view = headwidget.ChannelView(stats)"""


#: Python printing the float64 matrices ``view`` shows, by panel id, as one JSON line.
KERNEL_PANELS = "import json; print(json.dumps({p.id: p.matrix.tolist() for p in view.grid.panels}))"


def click_slider_end(page, trait: str = "layer") -> None:
    """Click the right end of the view's slider of ``trait`` (from its first position)."""
    slider = page.locator(f'{ROOT} input[data-trait="{trait}"]').first
    assert slider.input_value() == "0"
    box = slider.bounding_box()
    slider.click(position={"x": box["width"] - 3, "y": box["height"] / 2})
