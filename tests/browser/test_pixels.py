"""Pixels drawn by the bundle match colormaps.json for known values."""

import numpy as np
import pytest

pytestmark = pytest.mark.browser

VALUES = np.array(
    [
        [-1.0, -0.5, 0.0, 0.5],
        [1.0, 0.25, np.nan, -0.75],
        [0.123, 0.9, -0.3, 2.0],
    ],
    dtype=np.float32,
)


def f32_panel(pid, values, **extra):
    rows, cols = values.shape
    return {
        "id": pid,
        "title": pid,
        "rows": rows,
        "cols": cols,
        "dtype": "float32",
        "data": list(values.astype("<f4").tobytes()),
        **extra,
    }


def test_cells_have_colormap_colours(harness_dpr, colour_of):
    h = harness_dpr
    h.mount({"panels": [f32_panel("p", VALUES, pad=1)], "vmin": -1, "vmax": 1, "colormap": "diverging"})
    for r in range(3):
        for c in range(4):
            x, y = h.cell_centre("p", r, c, 3, 4)
            want = [*colour_of("diverging", float(VALUES[r, c]), -1, 1), 255]
            assert h.pixel("p", x, y) == want, (r, c, float(VALUES[r, c]))
    # exact landmarks of the table
    assert h.pixel("p", *h.cell_centre("p", 0, 2, 3, 4))[:3] == [255, 255, 255]  # 0 -> white
    assert h.pixel("p", *h.cell_centre("p", 1, 2, 3, 4))[:3] == [128, 128, 128]  # NaN -> grey


def test_scale_and_colormap_changes_recolour(harness, colour_of):
    h = harness
    h.mount({"panels": [f32_panel("p", VALUES)], "vmin": -1, "vmax": 1, "colormap": "diverging"})
    h.js("() => { model.kernelSet('colormap', 'magma'); model.kernelSet('vmin', 0); }")
    for r, c in [(0, 0), (0, 3), (1, 1), (1, 2), (2, 0), (2, 3)]:
        want = [*colour_of("magma", float(VALUES[r, c]), 0, 1), 255]
        assert h.pixel("p", *h.cell_centre("p", r, c, 3, 4)) == want


def test_float16_panels(harness, colour_of):
    h = harness
    half = np.array([[0.5, -0.25], [np.nan, 6e-8]], dtype="<f2")  # 6e-8 is a subnormal half
    h.mount(
        {
            "panels": [
                {
                    "id": "h",
                    "title": "h",
                    "rows": 2,
                    "cols": 2,
                    "dtype": "float16",
                    "data": list(half.tobytes()),
                    "pad": 3,
                },
            ],
            "vmin": -1,
            "vmax": 1,
            "colormap": "diverging",
        }
    )
    for r in range(2):
        for c in range(2):
            v = float(half[r, c])
            assert h.pixel("h", *h.cell_centre("h", r, c, 2, 2)) == [*colour_of("diverging", v, -1, 1), 255]


def test_large_panel_draws_every_row_band(harness, colour_of):
    """A 256×256 panel: cell centres sampled across the plot have the right colours."""
    h = harness
    n = 256
    vals = np.linspace(-1, 1, n * n, dtype=np.float32).reshape(n, n)
    h.mount({"panels": [f32_panel("big", vals)], "vmin": -1, "vmax": 1})
    rect = h.plot_rect("big")
    assert rect["w"] == rect["h"] >= 2 * n  # the 1000 px container has room for 2 px per cell
    root = h.rect("#root")
    assert rect["x"] + rect["w"] <= root["x"] + root["w"]
    for r, c in [(0, 0), (17, 200), (128, 128), (255, 255)]:
        x, y = h.cell_centre("big", r, c, n, n)
        assert h.pixel("big", x, y) == [*colour_of("diverging", float(vals[r, c]), -1, 1), 255]


#: Opaque overlay pixels inside cell (row, col): [count, brightest, darkest] by channel mean.
CELL_INK = """([id, row, col, rows, cols]) => {
  const w = document.querySelector(`.hw-panel[data-panel-id="${id}"]`);
  const p = JSON.parse(w.dataset.plotRect);
  const c = w.querySelector('.hw-overlay');
  const k = c.width / c.getBoundingClientRect().width;
  const x0 = Math.ceil((p.x + col * p.w / cols) * k), x1 = Math.floor((p.x + (col + 1) * p.w / cols) * k);
  const y0 = Math.ceil((p.y + row * p.h / rows) * k), y1 = Math.floor((p.y + (row + 1) * p.h / rows) * k);
  const d = c.getContext('2d').getImageData(x0, y0, x1 - x0, y1 - y0).data;
  let n = 0, hi = 0, lo = 255;
  for (let i = 0; i < d.length; i += 4) {
    if (d[i + 3] < 160) continue;
    const m = (d[i] + d[i + 1] + d[i + 2]) / 3;
    n++; hi = Math.max(hi, m); lo = Math.min(lo, m);
  }
  return [n, hi, lo];
}"""


def test_a_small_panel_prints_its_numbers_in_its_cells(harness_dpr):
    """A 3×3 magma panel: white digits on its near-black cell, dark ones on its pale cell; a 20×20
    panel beside it gets none (its cells are too small for a number)."""
    h = harness_dpr
    small = np.array([[0.02, 0.5, 1.0], [0.3, np.nan, 0.7], [0.9, 0.1, 0.6]], dtype=np.float32)
    big = np.full((20, 20), 0.5, dtype=np.float32)
    h.mount(
        {"panels": [f32_panel("s", small), f32_panel("b", big)], "vmin": 0, "vmax": 1, "colormap": "magma"}
    )
    h.page.wait_for_function("() => document.querySelectorAll('.hw-overlay[data-cell-labels]').length === 2")
    assert h.js("() => [...document.querySelectorAll('.hw-overlay')].map((c) => c.dataset.cellLabels)") == [
        "8",
        "0",
    ]
    count, brightest, _ = h.js(CELL_INK, ["s", 0, 0, 3, 3])
    assert count > 10 and brightest > 230  # white text on the near-black cell
    count, _, darkest = h.js(CELL_INK, ["s", 0, 2, 3, 3])
    assert count > 10 and darkest < 60  # dark text on the pale cell
    assert h.js(CELL_INK, ["s", 1, 1, 3, 3])[0] == 0  # undefined: no number
    assert all(h.js(CELL_INK, ["b", r, c, 20, 20])[0] == 0 for r, c in ((0, 0), (10, 10), (19, 5)))


def test_a_relayout_to_smaller_panels_keeps_the_canvases_and_draws_only_inside_the_panel(harness, colour_of):
    """Panels laid out smaller (two columns after one) are drawn into the canvases they have (no new
    pixels are allocated): each cell still has its colour, the canvas outside the panel is cleared, and
    the panel clips it (nothing shows or scrolls beyond the panel)."""
    h = harness
    big = np.linspace(-1, 1, 64 * 64, dtype=np.float32).reshape(64, 64)
    matrices = {"p": big, "q": -big.T}
    panels = [f32_panel(pid, m) for pid, m in matrices.items()]
    h.mount({"panels": panels, "vmin": -1, "vmax": 1, "colormap": "diverging", "columns": 1})
    sizes = "() => [...document.querySelectorAll('.hw-heatmap')].map((c) => [c.width, c.height])"
    large = h.js(sizes)
    h.js("() => model.kernelSet('columns', 2)")
    assert h.js(sizes) == large  # the same canvases, not resized
    for pid, m in matrices.items():
        panel = h.rect(f'.hw-panel[data-panel-id="{pid}"]')
        canvas = h.rect(f'.hw-panel[data-panel-id="{pid}"] .hw-heatmap')
        assert canvas["w"] > panel["w"] + 50  # larger than the panel now shown...
        clipped = h.js(
            f"""() => getComputedStyle(document.querySelector('.hw-panel[data-panel-id="{pid}"]')).overflow"""
        )
        assert clipped == "hidden"  # ...and clipped by it
        for r, c in [(0, 0), (0, 63), (17, 40), (63, 0), (63, 63)]:
            want = [*colour_of("diverging", float(m[r, c]), -1, 1), 255]
            assert h.pixel(pid, *h.cell_centre(pid, r, c, 64, 64)) == want, (pid, r, c)
        # beyond the panel's right edge, where the one-column layout drew: cleared
        outside = (panel["x"] + panel["w"] + 3, panel["y"] + panel["h"] / 2)
        assert h.pixel(pid, *outside)[3] == 0
