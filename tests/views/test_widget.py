"""``HeadWidget`` on its own: a PanelGrid on the wire, clicks and PNG replies from the browser."""

from __future__ import annotations

import base64

import numpy as np
import pytest

from headwidget.core.panels import Panel, PanelGrid
from headwidget.export import grid_of
from headwidget.widget import HeadWidget


def grid() -> PanelGrid:
    m = np.array([[0.5, -0.25], [np.nan, 1.0]])
    return PanelGrid([Panel("a", "A", m, row_labels=["r0", "r1"])], -1.0, 1.0, "diverging", "r", columns=1)


def test_show_sends_the_grid_in_the_wire_format():
    w = HeadWidget()
    with pytest.raises(RuntimeError, match="nothing shown yet"):
        _ = w.grid
    w.error = "stale"
    shown = grid()
    w.show(shown)
    sent = w.panels[0]
    values = np.frombuffer(sent["data"], dtype="<f2").reshape(2, 2)
    assert values[0].tolist() == [0.5, -0.25] and np.isnan(values[1, 0]) and values[1, 1] == 1.0
    assert (sent["row_labels"], sent["dtype"]) == (["r0", "r1"], "float16")
    assert (w.vmin, w.vmax, w.colormap, w.colorbar_label, w.columns, w.error) == (
        -1.0,
        1.0,
        "diverging",
        "r",
        1,
        "",
    )
    assert w.grid is shown and grid_of(w) is shown  # the export takes a widget as it takes a view
    assert repr(w).splitlines()[:2] == ["HeadWidget", "panels: A"] and w.controls == [] and w.view == ""


def test_the_text_stand_in_says_what_the_widget_shows_and_how_to_draw_it():
    """A saved notebook without widget state shows this text instead of the widget."""
    w = HeadWidget(grid())
    w.heading, w.error = "SmolLM2-135M · layer 3", "layer 40 does not exist"
    w.charts = [{"title": "KV bytes against damage"}, {"title": "per-layer ΔNLL"}]
    assert repr(w).splitlines() == [
        "HeadWidget: SmolLM2-135M · layer 3",
        "charts: KV bytes against damage; per-layer ΔNLL",
        "panels: A",
        "error: layer 40 does not exist",
        "(an interactive headwidget: run the cell in Jupyter to draw it)",
    ]


def test_clicks_and_png_replies_reach_their_callbacks():
    w = HeadWidget(grid())
    clicks, pngs, sent = [], [], []
    w.on_click(clicks.append)
    w.send = sent.append  # type: ignore[method-assign]
    w.request_png(pngs.append)
    assert sent == [{"type": "export_png"}]
    w._handle_message(w, {"type": "click", "panel": "a", "row": 1, "col": 0, "extra": 1}, [])
    assert clicks == [{"panel": "a", "row": 1, "col": 0}]
    png = b"\x89PNG fake"
    w._handle_message(
        w, {"type": "png", "data_url": "data:image/png;base64," + base64.b64encode(png).decode()}, []
    )
    assert pngs == [png]
    w._handle_message(w, {"type": "png", "data_url": "data:image/png;base64,AAAA"}, [])
    assert pngs == [png]  # a callback runs once


def test_a_frame_the_page_holds_is_sent_as_its_key_alone():
    """The page says which frames it holds (``frames``); a panel whose cells it holds comes with empty
    ``data``, the others whole; a page that lacks a key (``missing``) gets the panels whole again."""
    w = HeadWidget()
    first = grid()
    other = PanelGrid([Panel("b", "B", np.eye(2) * 0.5)], -1.0, 1.0, "diverging", "r")
    w.show(first)
    whole = w.panels[0]
    assert whole["key"].startswith("float16:2x2:") and len(whole["data"]) == 8
    w._handle_message(w, {"type": "frames", "keys": [whole["key"]]}, [])
    w.show(other)
    assert len(w.panels[0]["data"]) == 8  # not held: whole
    w.show(grid())  # a grid equal to the first (a slider moved back): the same key, no cells
    assert (w.panels[0]["key"], w.panels[0]["data"]) == (whole["key"], b"")
    assert {k: v for k, v in w.panels[0].items() if k != "data"} == {
        k: v for k, v in whole.items() if k != "data"
    }
    w._handle_message(w, {"type": "missing", "keys": [whole["key"]]}, [])
    assert w.panels[0] == whole  # sent whole again, and the page is not believed to hold anything
    w.show(other)
    w.show(first)
    assert w.panels[0]["data"] == whole["data"]
    # What a page says is checked: not a list, too many keys, or keys that are not strings.
    w._handle_message(w, {"type": "frames", "keys": [whole["key"]]}, [])
    ignored = ("abc", None, [whole["key"]] * 2000)  # the page is still believed to hold the frame
    for bad, still_held in [*((b, True) for b in ignored), ([3], False)]:  # [3]: holds no key
        w._handle_message(w, {"type": "frames", "keys": bad}, [])
        w.show(other)
        w.show(first)
        assert (w.panels[0]["data"] == b"") is still_held, bad


def test_a_page_that_drew_the_panels_shown_now_is_passed_on_and_no_other_report():
    """``drawn`` runs the ``on_drawn`` callbacks when its keys are those of the panels shown now; a
    report of panels shown before, of other keys, or malformed, runs none."""
    w = HeadWidget()
    calls: list[str] = []
    w.on_drawn(lambda: calls.append("drawn"))
    first = grid()
    other = PanelGrid([Panel("b", "B", np.eye(2) * 0.5)], -1.0, 1.0, "diverging", "r")
    w.show(first)
    first_keys = [p["key"] for p in w.panels]
    w.show(other)
    for stale in (first_keys, [], None, "abc", [3], [*first_keys, *first_keys]):
        w._handle_message(w, {"type": "drawn", "keys": stale}, [])
    assert calls == []
    w._handle_message(w, {"type": "drawn", "keys": [p["key"] for p in w.panels]}, [])
    assert calls == ["drawn"]
