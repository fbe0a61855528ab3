"""The one background thread that computes views' next states ahead (``views/_prefetch.py``)."""

from __future__ import annotations

import threading

import numpy as np
import traitlets as t

from headwidget.core.panels import Panel, PanelGrid
from headwidget.views import LayerView, state
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


class Counted(LayerView):
    """A view whose compute counts its calls per layer, with the layer slider's neighbours."""

    offset = state(t.Float(0.0))

    def __init__(self, **kwargs):
        self.calls: list[int] = []
        self.prefetch = True
        super().__init__(**kwargs)
        with self.initial_state():
            self.num_layers = 4

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
    assert sorted(view.calls) == [0, 0, 1, 2]  # then 2 and 0 ahead (0 again: the view keeps no grids)
    view.offset = 0.5  # another state: its own computation, and its own neighbours
    view._prefetcher.wait()
    assert view.grid.panels[0].matrix[0, 0] == 1.5
    assert view.calls.count(1) == 2
    view.close()
