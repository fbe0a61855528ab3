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
