"""``HeadWidget``: the anywidget that shows a :class:`~headwidget.core.panels.PanelGrid`.

It moves panels to the browser as binary buffers (see :func:`~headwidget.core.panels.encode_panel`)
with their colour scale, and brings clicks and PNG exports back. Each panel's cells are named by a
frame key; the page keeps the cells of the frames it was sent and says which (a ``frames`` message),
so a panel the page holds (a slider moved back to a layer) is sent as its key alone. A page that
lacks a key it was sent (a page opened later, or one that let the frame go) says so (``missing``),
and the kernel sends the panels whole again. Once a page has drawn the panels shown now it says so
(``drawn``), and :meth:`HeadWidget.on_drawn` callbacks run (a view starts computing ahead then, not
while the page is drawing). It knows no view: the shell
of :mod:`headwidget.notebook` that shows a view is a ``HeadWidget`` that fills ``controls`` (the
description the front end builds its control bar from) and ``view`` (the view's name).

Example:
    >>> import numpy as np
    >>> from headwidget.core.panels import Panel, PanelGrid
    >>> w = HeadWidget(PanelGrid([Panel("a", "identity", np.eye(3))], 0.0, 1.0, "magma", "value"))
    >>> w.panels[0]["rows"], w.panels[0]["dtype"], w.colormap, w.controls
    (3, 'float16', 'magma', [])
"""

from __future__ import annotations

import base64
from collections.abc import Callable
from typing import Any, ClassVar

import anywidget
import traitlets as t

from headwidget.core import bundle
from headwidget.core.charts import encode_chart
from headwidget.core.panels import PanelGrid, encode_panel
from headwidget.core.protocol import PAGE_MESSAGES

__all__ = ["MAX_PAGE_FRAMES", "MAX_PANEL_PIXELS", "HeadWidget"]

#: The largest plot side a page may report (canvas sides are limited to about this by browsers).
MAX_PANEL_PIXELS = 32767
#: The most frame keys a page may say it holds (more are ignored: those panels are sent whole).
MAX_PAGE_FRAMES = 1024


#: The built front end (``npm run build``): anywidget's class-level module file, read once for every
#: widget; with ``ANYWIDGET_HMR=1`` (and ``watchfiles``, in the ``dev`` extra) in a source checkout, a
#: rebuild reloads every widget on screen.
BUNDLE = bundle.STATIC / "widget.js"


class HeadWidget(anywidget.AnyWidget):
    """Panels of matrices with a shared colour scale, the controls that choose them, and messages."""

    _esm: ClassVar[Any]  # the bundle: a file anywidget reads (and watches), or its text
    if BUNDLE.is_file():
        _esm = BUNDLE

    panels = t.List(t.Dict()).tag(sync=True)
    vmin = t.Float(-1.0).tag(sync=True)
    vmax = t.Float(1.0).tag(sync=True)
    colormap = t.Unicode("diverging").tag(sync=True)
    colorbar_label = t.Unicode("").tag(sync=True)
    columns = t.Int(0).tag(sync=True)
    #: Charts above the panels (:func:`~headwidget.core.charts.encode_chart`).
    charts = t.List(t.Dict()).tag(sync=True)

    #: The view's name (``data-view`` of the front end's root element).
    view = t.Unicode("").tag(sync=True)
    #: The control bar: one ``{"trait", "type", "label", ...}`` per control (``Control.to_json``).
    controls = t.List(t.Dict()).tag(sync=True)
    error = t.Unicode("").tag(sync=True)
    status = t.Unicode("").tag(sync=True)
    #: What the figure shows, above the controls (a view's ``caption``: model and layer); "" for none.
    heading = t.Unicode("").tag(sync=True)
    #: Set by the front end: the longest plot side it draws, in device pixels (0: not drawn yet). A
    #: view sends no more cells per panel side than this (:attr:`~headwidget.views.View.resolution`).
    panel_pixels = t.Int(0).tag(sync=True)

    @t.validate("panel_pixels")
    def _check_panel_pixels(self, proposal: dict[str, Any]) -> int:
        # What a page reports is a size, never a reason to fail: nonsense means "not known".
        value = proposal["value"]
        return value if 0 < value <= MAX_PANEL_PIXELS else 0

    def __init__(self, grid: PanelGrid | None = None, **kwargs: Any) -> None:
        """``grid``: panels to show at once (else call :meth:`show`)."""
        if not hasattr(HeadWidget, "_esm"):  # not built when headwidget was imported: built since?
            HeadWidget._esm = bundle.bundle_path().read_text()  # (the error says how to build it)
        self._sent: PanelGrid | None = None
        #: The panels of the grid shown, with their cells (what a page that lacks them is sent).
        self._encoded: list[dict[str, Any]] = []
        #: The frame keys the page said it holds (their panels are sent without cells).
        self._page_frames: frozenset[str] = frozenset()
        self._click_callbacks: list[Callable[[dict[str, Any]], None]] = []
        self._png_callbacks: list[Callable[[bytes], None]] = []
        self._drawn_callbacks: list[Callable[[], None]] = []
        super().__init__(**kwargs)
        self.on_msg(self._handle_message)
        if grid is not None:
            self.show(grid)

    def show(self, grid: PanelGrid) -> None:
        """Send ``grid`` to the browser (all its traits in one message) and clear ``error``."""
        self._encoded = [encode_panel(p, vmin=grid.vmin, vmax=grid.vmax) for p in grid.panels]
        with self.hold_sync():
            self.vmin, self.vmax = grid.vmin, grid.vmax
            self.colormap, self.colorbar_label = grid.colormap, grid.colorbar_label
            self.columns = grid.columns
            self.panels = self._on_the_wire()
            self.charts = [encode_chart(c) for c in grid.charts]
            self.error = ""
        self._sent = grid

    def _on_the_wire(self) -> list[dict[str, Any]]:
        """The panels shown, those whose frame the page holds without their cells."""
        held = self._page_frames
        return [{**p, "data": b""} if p["key"] in held else p for p in self._encoded]

    @property
    def grid(self) -> PanelGrid:
        """The panels shown (float64 matrices, labels, colour scale)."""
        if self._sent is None:
            raise RuntimeError("nothing shown yet: call show(grid)")
        return self._sent

    # ------------------------------------------------------------------ messages from the browser
    def on_click(self, callback: Callable[[dict[str, Any]], None]) -> None:
        """Call ``callback({"panel", "row", "col"})`` when a cell is clicked in the browser, and
        ``callback({"chart", "series", "point"})`` when a chart's point is."""
        self._click_callbacks.append(callback)

    def on_drawn(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` when a page has drawn the panels shown now (a page's report of panels
        shown before, or of other panels, is not passed on)."""
        self._drawn_callbacks.append(callback)

    def request_png(self, callback: Callable[[bytes], None]) -> None:
        """Ask the browser for a 2× PNG of the grid; ``callback(png_bytes)`` runs when it arrives."""
        self._png_callbacks.append(callback)
        self.send({"type": "export_png"})  # (KERNEL_MESSAGES)

    def _handle_message(self, widget: Any, content: dict[str, Any], buffers: list[bytes]) -> None:
        kind = content.get("type")
        if kind in ("click", "chart_click"):
            event = {k: content.get(k) for k in PAGE_MESSAGES[kind]}
            for on_click in list(self._click_callbacks):
                on_click(event)
        elif kind == "frames":
            keys = content.get("keys")
            if isinstance(keys, list) and len(keys) <= MAX_PAGE_FRAMES:
                self._page_frames = frozenset(k for k in keys if isinstance(k, str))
        elif kind == "drawn":
            keys = content.get("keys")
            if isinstance(keys, list) and keys == [p["key"] for p in self._encoded]:
                for on_drawn in list(self._drawn_callbacks):
                    on_drawn()
        elif kind == "missing":
            # The page lacks cells it was sent as keys: forget what it held, send the panels whole.
            self._page_frames = frozenset()
            whole = self._on_the_wire()
            if whole == self.panels:  # (sent whole already: send them again all the same)
                self.send_state("panels")
            else:
                self.panels = whole
        elif kind == "png" and content.get("data_url"):
            png = base64.b64decode(str(content["data_url"]).split(",", 1)[1])
            waiting, self._png_callbacks = self._png_callbacks, []
            for on_png in waiting:
                on_png(png)

    def _name_in_words(self) -> str:
        """What :meth:`__repr__` calls the widget (a view's shell: the view's class)."""
        return type(self).__name__

    def __repr__(self) -> str:
        """What the widget shows, in words: the text a notebook keeps where the widget cannot be drawn
        (a saved notebook opened without its widget state, a terminal).

        >>> import numpy as np
        >>> from headwidget.core.panels import Panel, PanelGrid
        >>> print(repr(HeadWidget(PanelGrid([Panel("a", "layer 3", np.eye(2))], 0.0, 1.0, "magma", "v"))))
        HeadWidget
        panels: layer 3
        (an interactive headwidget: run the cell in Jupyter to draw it)
        """
        name = self._name_in_words()
        lines = [f"{name}: {self.heading}" if self.heading else name]
        for what, titles in (
            ("charts", [c["title"] for c in self.charts]),
            ("panels", [p["title"] for p in self.panels]),
        ):
            if titles:
                lines.append(f"{what}: {'; '.join(titles)}")
        if self.error:
            lines.append(f"error: {self.error}")
        lines.append("(an interactive headwidget: run the cell in Jupyter to draw it)")
        return "\n".join(lines)
