"""Layout in a real browser: panels fill the container and wrap, the controls stay in view, head
boundaries and head tooltips, and the control bar's glitches (a moving Export button, stale tooltips,
a width slider that skips values)."""

import numpy as np
import pytest

pytestmark = pytest.mark.browser

#: Channels of the synthetic layer, and channels per head.
C, HEAD = 192, 64


def half_panel(pid: str, values: np.ndarray, **extra) -> dict:
    rows, cols = values.shape
    return {
        "id": pid,
        "title": pid,
        "rows": rows,
        "cols": cols,
        "dtype": "float16",
        "data": list(values.astype("<f2").tobytes()),
        **extra,
    }


def corr(seed: int, n: int = C) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, 3 * n))
    return np.corrcoef(x)


def channel_state(layers: int, width: int = C, **extra) -> dict:
    """What a channel view with `layers` layers sends: keys over values, one column per layer."""
    panels = [
        half_panel(f"{kind}-{i}", corr(10 * i + (kind == "value")), subtitle=f"channels 0–{width - 1}")
        for kind in ("key", "value")
        for i in range(layers)
    ]
    return {
        "panels": panels,
        "columns": layers,
        "vmin": -1,
        "vmax": 1,
        "colorbar_label": "Pearson correlation",
        "num_layers": 30,
        "layer": 3,
        "layer_label": "layer 3 of 0–29",
        "num_channels": width,
        "channel_start": 0,
        "channel_width": width,
        "kinds_available": ["key", "key_post"],
        "kind": "key",
        **extra,
    }


def set_width(h, px: int) -> None:
    h.js("(w) => { document.getElementById('root').style.width = w + 'px'; }", px)


def settle(h) -> None:
    """Two animation frames: resize observers have run and the page is drawn."""
    h.js("() => new Promise((r) => requestAnimationFrame(() => requestAnimationFrame(() => r())))")


def panel_boxes(h) -> list[dict]:
    return h.js(
        """() => [...document.querySelectorAll('.hw-panel')].map((w) => {
          const r = w.getBoundingClientRect(), p = JSON.parse(w.dataset.plotRect);
          return { id: w.dataset.panelId, x: r.left, y: r.top, right: r.right, plot: p };
        })"""
    )


def overflow(h) -> dict:
    return h.js(
        """() => Object.fromEntries(['#root', '.hw-root', '.hw-figure'].map((s) => {
          const e = document.querySelector(s); return [s, e ? [e.scrollWidth, e.clientWidth] : [0, 0]];
        }))"""
    )


def test_five_layers_wrap_in_a_notebook_cell_and_nothing_scrolls_sideways(harness):
    h = harness
    set_width(h, 968)
    h.mount(channel_state(5))
    settle(h)
    for selector, (scroll, client) in overflow(h).items():
        assert scroll <= client, (selector, scroll, client)
    root = h.rect("#root")
    boxes = panel_boxes(h)
    assert all(b["right"] <= root["x"] + root["w"] + 0.5 for b in boxes)
    lines = sorted({round(b["y"]) for b in boxes})
    assert len(lines) == 4  # keys wrap onto two lines, values onto the next two
    first_value = next(b for b in boxes if b["id"] == "value-0")
    assert round(first_value["x"]) == round(boxes[0]["x"]) and round(first_value["y"]) == lines[2]
    # every control and the export button lie inside the cell
    for sel in ("input[data-trait=layer]", "input[data-trait=channel_width]", "button.hw-export"):
        r = h.rect(sel)
        assert root["x"] <= r["x"] and r["x"] + r["w"] <= root["x"] + root["w"], sel


def test_a_large_layer_gets_the_pixels_of_a_wide_cell(harness, colour_of):
    h = harness
    set_width(h, 1060)
    values = corr(3)
    h.mount({"panels": [half_panel("k", values)], "vmin": -1, "vmax": 1})
    settle(h)
    rect = h.plot_rect("k")
    assert rect["w"] / C >= 3 and rect["h"] / C >= 3, rect
    assert rect["x"] + rect["w"] <= h.rect("#root")["x"] + 1060
    half = values.astype("<f2").astype(float)
    for r, c in [(0, 0), (5, 180), (100, 101), (191, 191), (64, 63)]:
        x, y = h.cell_centre("k", r, c, C, C)
        assert h.pixel("k", x, y) == [*colour_of("diverging", float(half[r, c]), -1, 1), 255], (r, c)


def test_resizing_the_container_lays_out_again(harness):
    h = harness
    set_width(h, 1060)
    h.mount(channel_state(2))
    settle(h)
    wide = panel_boxes(h)
    set_width(h, 420)
    settle(h)
    narrow = panel_boxes(h)
    assert narrow[0]["plot"]["w"] < wide[0]["plot"]["w"]
    assert max(b["right"] for b in narrow) <= h.rect("#root")["x"] + 420 + 0.5
    assert len({round(b["y"]) for b in narrow}) == 4  # one panel per line
    set_width(h, 1060)
    settle(h)
    assert panel_boxes(h) == wide


HEAD_LINE = 153  # rgba(0, 0, 0, 0.4) over white


def test_head_boundaries_are_drawn_through_the_window_and_blocks(harness_dpr):
    h = harness_dpr
    set_width(h, 1060)
    zeros = np.zeros((16, 16))
    h.mount(
        {
            "panels": [
                # channels 56..71: the head boundary at 64 is 8 cells in
                half_panel("win", zeros, row_offset=56, col_offset=56, row_group=HEAD, col_group=HEAD),
                # blocks of 8 channels from 0: boundaries at 64 and 128 are cells 8 and 16
                half_panel(
                    "blocks", np.zeros((24, 24)), row_step=8, col_step=8, row_group=HEAD, col_group=HEAD
                ),
                half_panel("plain", zeros),
            ],
            "vmin": -1,
            "vmax": 1,
            "columns": 3,
        }
    )
    settle(h)

    def at_edge(pid: str, n: int, k: float) -> tuple[list[int], list[int], list[int]]:
        """Pixels on the vertical boundary k cells in (mid-height), and half a cell either side."""
        r = h.plot_rect(pid)
        x = r["x"] + k * r["w"] / n
        y = r["y"] + 0.5 * r["h"] / n + 2.5 * r["h"] / n
        dpr = h.js("() => window.devicePixelRatio")
        on = h.pixel(pid, x + 0.5 / dpr, y)
        return h.pixel(pid, x - 0.5 * r["w"] / n, y), on, h.pixel(pid, x + 0.5 * r["w"] / n, y)

    white = [255, 255, 255, 255]
    for pid, n, k in [("win", 16, 8), ("blocks", 24, 8), ("blocks", 24, 16)]:
        left, on, right = at_edge(pid, n, k)
        assert left == right == white, (pid, k)
        assert all(abs(v - HEAD_LINE) <= 1 for v in on[:3]), (pid, k, on)
    # rows too: the horizontal boundary of the window panel
    r = h.plot_rect("win")
    dpr = h.js("() => window.devicePixelRatio")
    y = r["y"] + 8 * r["h"] / 16 + 0.5 / dpr
    assert all(abs(v - HEAD_LINE) <= 1 for v in h.pixel("win", r["x"] + 1.5 * r["w"] / 16, y)[:3])
    # no line where no head starts, and none in a panel without heads
    assert h.pixel("win", r["x"] + 4 * r["w"] / 16 + 0.5 / dpr, r["y"] + 2.5 * r["h"] / 16) == white
    assert at_edge("plain", 16, 8)[1] == white


def test_tooltip_names_heads_and_dims(harness):
    h = harness
    values = corr(5)
    h.mount(
        {
            "panels": [
                half_panel(
                    "k", values, title="Keys · layer 3", row_group=HEAD, col_group=HEAD, axis_prefix="K"
                ),
                half_panel(
                    "blocks",
                    values[:48, :48],
                    title="blocks",
                    row_step=4,
                    col_step=4,
                    row_group=HEAD,
                    col_group=HEAD,
                    axis_prefix="K",
                ),
            ],
            "vmin": -1,
            "vmax": 1,
        }
    )
    h.page.mouse.move(*h.cell_centre("k", 100, 150, C, C))
    v = float(values.astype("<f2")[100, 150])
    lines = h.js("() => document.querySelector('.hw-tooltip').innerText").split("\n")
    assert (lines[0], lines[2]) == ("Keys · layer 3", "index 100 × 150")
    assert lines[1].startswith("K h1·d36 × h2·d22 = ")
    assert float(lines[1].split("= ")[1]) == pytest.approx(v, abs=5e-4)
    h.page.mouse.move(*h.cell_centre("blocks", 20, 3, 48, 48))
    lines = h.js("() => document.querySelector('.hw-tooltip').innerText").split("\n")
    assert lines[1].startswith("K h1·d16–19 × h0·d12–15 = ")
    assert lines[2] == "index 80–83 × 12–15"


def test_tooltip_follows_a_metric_change_under_a_still_pointer(harness):
    h = harness
    before = np.full((4, 4), 0.25)
    h.mount({"panels": [half_panel("m", before, title="mean")], "vmin": -1, "vmax": 1})
    h.page.mouse.move(*h.cell_centre("m", 2, 1, 4, 4))
    tooltip = "() => document.querySelector('.hw-tooltip').innerText"
    assert h.js(tooltip).split("\n")[-1] == "value: 0.2500"
    after = np.full((4, 4), -0.5)
    h.js(
        "(p) => model.kernelSet('panels', [hw.panel({ ...p, data: hw.u8(p.data, 1) })])",
        half_panel("m", after, title="max"),
    )
    assert h.js(tooltip).split("\n") == ["max", "row: 2", "col: 1", "value: -0.5000"]
    h.js("() => model.kernelSet('panels', [])")  # nothing under the pointer any more
    assert h.js("() => document.querySelector('.hw-tooltip').hidden") is True


def test_export_button_stays_put_while_read_outs_grow(harness):
    h = harness
    set_width(h, 968)
    h.mount(channel_state(1, width=4096, channel_width=8, layer_label="layer 3 of 0–29"))
    settle(h)
    button = h.rect("button.hw-export")
    kind = h.rect("button[data-value=key]")
    h.js("""() => {
      model.kernelSet('channel_start', 4000); model.kernelSet('channel_width', 96);
      model.kernelSet('layer', 27);
      model.kernelSet('layer_label', 'layer 27 of 0–29 (20480 tokens, key_post)');
    }""")
    settle(h)
    assert h.rect("button.hw-export") == button
    assert h.rect("button[data-value=key]") == kind  # the window's read-out kept its room
    root = h.rect("#root")
    assert button["x"] + button["w"] <= root["x"] + root["w"]


def drag_values(h, selector: str) -> list[int]:
    """Values a pointer reaches dragging the thumb across the slider one pixel at a time."""
    box = h.page.locator(selector).bounding_box()
    y = box["y"] + box["height"] / 2
    h.page.mouse.move(box["x"] + 1, y)
    h.page.mouse.down()
    seen = []
    for x in range(int(box["x"]), int(box["x"] + box["width"]) + 2):
        h.page.mouse.move(x, y)
        seen.append(int(h.js(f"() => document.querySelector('{selector}').value")))
    h.page.mouse.up()
    return seen


def test_width_slider_reaches_every_width(harness):
    h = harness
    h.mount(channel_state(1, channel_width=32))
    seen = set(drag_values(h, "input[data-trait=channel_width]"))
    assert set(range(1, C + 1)) <= seen, sorted(set(range(1, C + 1)) - seen)
    h.page.wait_for_timeout(200)  # past the slider's hold-off: the last drag value is committed
    h.page.fill("input[data-number=channel_width]", "64")
    h.page.press("input[data-number=channel_width]", "Enter")
    assert h.js("() => model.get('channel_width')") == 64


def test_window_snaps_to_heads_when_a_step_is_set(harness):
    h = harness
    controls = h.js("() => hw.DEFAULTS.controls")
    for c in controls:
        if c["type"] == "window":
            c["step"] = "channel_step"
    h.mount(channel_state(1, controls=controls, channel_step=HEAD, channel_width=HEAD))
    seen = set(drag_values(h, "input[data-trait=channel_width]"))
    assert seen == {64, 128, 192}
    h.page.wait_for_timeout(200)
    assert h.js("() => model.get('channel_width')") % HEAD == 0
    h.js("() => { model.kernelSet('channel_width', 64); model.kernelSet('channel_start', 0); }")
    seen = set(drag_values(h, "input[data-trait=channel_start]"))
    assert seen == {0, 64, 128}
    h.page.wait_for_timeout(200)
    assert h.js("() => model.get('channel_start')") in (0, 64, 128)
