"""The one background thread that computes views' next states ahead (``views/_prefetch.py``)."""

from __future__ import annotations

import dataclasses
import threading

import numpy as np

from headwidget.core.panels import Panel, PanelGrid
from headwidget.views import LayerState, LayerView
from headwidget.views._prefetch import Prefetcher


def test_a_state_being_computed_is_waited_for_not_computed_twice():
    started, release = threading.Event(), threading.Event()
    calls: list[str] = []

    def slow() -> str:
        calls.append("slow")
        started.set()
        release.wait(5)
        return "done"

    prefetcher = Prefetcher()
    prefetcher.queue({"a": slow, "b": lambda: calls.append("b") or "b"})
    assert started.wait(5)
    prefetcher.drop_others("a")  # "b" had not started: cancelled; "a" runs on
    threading.Timer(0.05, release.set).start()
    assert prefetcher.take("a") == "done" and prefetcher.take("b") is None
    prefetcher.wait()
    assert calls == ["slow"]
    prefetcher.close()


def test_a_failure_or_a_closed_prefetcher_only_means_no_head_start():
    prefetcher = Prefetcher()
    prefetcher.queue({"bad": lambda: 1 / 0})
    prefetcher.wait()
    assert prefetcher.take("bad") is None
    prefetcher.close()
    prefetcher.queue({"late": lambda: 1})
    assert prefetcher.take("late") is None


@dataclasses.dataclass(frozen=True)
class CountedState(LayerState):
    offset: float = 0.0


class Counted(LayerView[CountedState]):
    """A view whose compute counts its calls per layer, with the layer slider's neighbours."""

    def __init__(self):
        self.calls: list[int] = []
        self.prefetch = True
        super().__init__()
        self.set_up(CountedState(), num_layers=4)

    def neighbours(self, state):
        return self.layer_neighbours(state)

    def compute(self, state, resolution=None):
        self.calls.append(state.layer)
        matrix = np.full((2, 2), state.layer + state.offset)
        return PanelGrid([Panel("m", f"layer {state.layer}", matrix)], -9.0, 9.0, "diverging", "")


def test_a_view_takes_the_panels_computed_ahead_and_never_computes_a_state_twice():
    view = Counted()
    view._prefetcher.wait()
    assert sorted(view.calls) == [0, 1]  # layer 0 shown, layer 1 ahead (no layer −1)
    view.layer = 1  # computed ahead: taken, not computed again
    assert view.grid.panels[0].title == "layer 1" and view.layer_label == "layer 1 of 0–3"
    view._prefetcher.wait()
    assert sorted(view.calls) == [0, 1, 2]  # then 2 ahead (0 is kept: the base keeps its grids)
    view.offset = 0.5  # another state: its own computation, and its own neighbours
    view._prefetcher.wait()
    assert view.grid.panels[0].matrix[0, 0] == 1.5
    assert view.calls.count(1) == 2
    computed = len(view.calls)
    view.layer = 0  # computed ahead, and kept: not computed again
    assert view.grid.panels[0].matrix[0, 0] == 0.5 and len(view.calls) == computed
    view.close()


def test_a_held_prefetcher_starts_nothing_until_released_and_a_wanted_state_starts_at_once(monkeypatch):
    from headwidget.views import _prefetch

    monkeypatch.setattr(_prefetch, "PAGE_WAIT_S", 60.0)  # (held means held, however slow the machine)
    ran: list[str] = []
    prefetcher = Prefetcher()
    prefetcher.hold()
    prefetcher.queue({"a": lambda: ran.append("a") or "a", "b": lambda: ran.append("b") or "b"})
    # "a" is on the thread, waiting to start; "b" is queued behind it
    assert not threading.Event().wait(0.2) and ran == []
    assert prefetcher.take("a") == "a"  # wanted now: it starts at once, and with it what waits
    prefetcher.wait()
    assert ran == ["a", "b"]
    prefetcher.hold()
    prefetcher.queue({"c": lambda: ran.append("c") or "c"})
    assert not threading.Event().wait(0.2) and ran == ["a", "b"]
    prefetcher.release()  # the page has drawn
    prefetcher.wait()
    assert ran == ["a", "b", "c"] and prefetcher.take("c") == "c"
    prefetcher.hold()
    prefetcher.queue({"d": lambda: ran.append("d") or "d"})
    prefetcher.close()  # a job waiting to start ends without running
    assert ran == ["a", "b", "c"] and prefetcher.take("d") is None


def test_a_held_prefetcher_starts_all_the_same_when_no_page_answers(monkeypatch):
    from headwidget.views import _prefetch

    monkeypatch.setattr(_prefetch, "PAGE_WAIT_S", 0.05)
    done = threading.Event()
    prefetcher = Prefetcher()
    prefetcher.hold()
    prefetcher.queue({"a": done.set})
    assert done.wait(10)  # nobody released it
    prefetcher.close()


def _computed_ahead(view: Counted, calls: int, seconds: float = 10.0) -> bool:
    """Whether the view has made ``calls`` computations within ``seconds`` (without releasing it)."""
    deadline = threading.Event()
    for _ in range(int(seconds / 0.02)):
        if len(view.calls) >= calls:
            return True
        deadline.wait(0.02)
    return False


def test_a_view_drawn_by_a_page_computes_ahead_once_the_page_has_drawn(monkeypatch):
    """Computing ahead would compete with the page for the cores while it draws: a view whose widget a
    page draws (it reported its plot size) computes the neighbours once the page says it drew the
    panels shown now; without a page it computes them at once."""
    import headwidget.notebook  # noqa: F401  (the widget shell)
    from headwidget.views import _prefetch

    monkeypatch.setattr(_prefetch, "PAGE_WAIT_S", 60.0)
    view = Counted()
    widget = view.widget
    assert _computed_ahead(view, 2)  # no page yet: layer 1 ahead at once
    widget.panel_pixels = 300  # a page draws the widget: layer 1 again, at the page's size
    assert _computed_ahead(view, 3) and view._prefetcher.ready((view.current_state().replace(layer=1), 300))
    view.layer = 2
    assert not _computed_ahead(view, 5, seconds=0.3) and sorted(view.calls) == [0, 1, 1, 2]
    widget._handle_message(widget, {"type": "drawn", "keys": ["not shown"]}, [])  # another frame
    assert not _computed_ahead(view, 5, seconds=0.3)
    widget._handle_message(widget, {"type": "drawn", "keys": [p["key"] for p in widget.panels]}, [])
    assert _computed_ahead(view, 5)  # layer 3 ahead (layer 1, at this size, is computed already)
    view._prefetcher.wait()
    assert sorted(view.calls) == [0, 1, 1, 2, 3]
    view.close()
