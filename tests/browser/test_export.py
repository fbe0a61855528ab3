"""PNG export: 2× the figure's CSS size, with the heatmap, text and colorbar in it."""

import base64
import struct

import numpy as np
import pytest

pytestmark = pytest.mark.browser

VALUES = np.array([[-1.0, 0.0], [0.5, np.nan]], dtype=np.float32)


def png_size(data: bytes) -> tuple[int, int]:
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    assert data[12:16] == b"IHDR"
    return struct.unpack(">II", data[16:24])


def mount(h):
    panels = [
        {
            "id": f"p{i}",
            "title": f"head {i}",
            "subtitle": "mean",
            "note": "downsampled 4096→1024: mean of 4×4 blocks",
            "rows": 2,
            "cols": 2,
            "dtype": "float32",
            "data": list(VALUES.astype("<f4").tobytes()),
        }
        for i in range(3)
    ]
    h.mount(
        {
            "panels": panels,
            "vmin": -1,
            "vmax": 1,
            "colormap": "diverging",
            "colorbar_label": "cosine",
            "columns": 2,
        }
    )


def decoded_pixels(h, data_url, points):
    """Decode the PNG with the browser's own decoder and read pixels at (x, y) image points."""
    return h.js(
        """async ([url, pts]) => {
          const img = new Image();
          img.src = url;
          await img.decode();
          const c = document.createElement('canvas');
          c.width = img.naturalWidth; c.height = img.naturalHeight;
          const ctx = c.getContext('2d');
          ctx.drawImage(img, 0, 0);
          return pts.map(([x, y]) => Array.from(ctx.getImageData(x, y, 1, 1).data));
        }""",
        [data_url, points],
    )


def test_export_message_replies_with_png(harness, colour_of):
    h = harness
    mount(h)
    h.js("() => model.kernelSend({type: 'export_png'})")
    sent = h.sent_by_user()
    assert [m["type"] for m in sent] == ["png"]
    url = sent[0]["data_url"]
    assert url.startswith("data:image/png;base64,")
    w, hh = png_size(base64.b64decode(url.split(",", 1)[1]))
    g = h.rect(".hw-grid")
    assert (w, hh) == (round(2 * g["w"]), round(2 * g["h"]))

    # Heatmap cells of panel p2 (second grid row) at their exported positions, off the number
    # printed at each cell's centre (the export draws the numbers the screen shows).
    pts, want = [], []
    plot = h.plot_rect("p2")
    for r in range(2):
        for c in range(2):
            x, y = plot["x"] + (c + 0.15) * plot["w"] / 2, plot["y"] + (r + 0.15) * plot["h"] / 2
            pts.append([int(2 * (x - g["x"])), int(2 * (y - g["y"]))])
            want.append([*colour_of("diverging", float(VALUES[r, c]), -1, 1), 255])
    assert decoded_pixels(h, url, pts) == want
    labels = h.js("() => [...document.querySelectorAll('.hw-overlay')].map((c) => c.dataset.cellLabels)")
    centre = [int(2 * (v - g[k])) for v, k in zip(h.cell_centre("p2", 0, 0, 2, 2), ("x", "y"), strict=True)]
    if labels[1] != "0":  # the number at the centre: some pixel around it is not the cell's colour
        around = [[centre[0] + dx, centre[1] + dy] for dx in range(-8, 9, 2) for dy in range(-4, 5, 2)]
        assert any(p != want[0] for p in decoded_pixels(h, url, around))

    # Text is drawn: the title of panel p1 (first line of its box) is not blank white.
    wrap = h.rect(".hw-panel[data-panel-id=p1]")
    ox, oy = wrap["x"] - g["x"], wrap["y"] - g["y"]
    title_area = [[int(2 * (ox + x)), int(2 * (oy + y))] for x in range(6, 50) for y in range(8, 18, 2)]
    assert sum(p[:3] != [255, 255, 255] for p in decoded_pixels(h, url, title_area)) > 10

    # Colorbar: its label ("cosine", baseline at y=14 CSS px) is drawn, and stop i
    # fills CSS x 16+i .. 17+i, y 20..32.
    title_band = [[2 * x, 2 * y] for x in range(16, 60) for y in range(5, 14, 2)]
    bar = [[2 * (16 + 128) + 1, 2 * 26]]  # entry 128: white
    bar_ends = [[2 * 16 + 1, 2 * 26], [2 * (16 + 255) + 1, 2 * 26]]
    px = decoded_pixels(h, url, title_band + bar + bar_ends)
    assert sum(p[:3] != [255, 255, 255] for p in px[: len(title_band)]) > 10
    assert px[-3][:3] == [255, 255, 255]
    assert px[-2][:3] == colour_of("diverging", -1, -1, 1)
    assert px[-1][:3] == colour_of("diverging", 1, -1, 1)


def test_export_button_downloads_headwidget_png(harness, tmp_path):
    h = harness
    mount(h)
    with h.page.expect_download() as info:
        h.page.click("button.hw-export")
    d = info.value
    assert d.suggested_filename == "headwidget.png"
    path = tmp_path / "out.png"
    d.save_as(path)
    g = h.rect(".hw-grid")
    assert png_size(path.read_bytes()) == (round(2 * g["w"]), round(2 * g["h"]))
