"""``HeadWidget``: the anywidget that shows a :class:`~headwidget.core.panels.PanelGrid`.

Subclasses (the views) implement :meth:`HeadWidget.compute`, turning the current state traits into
panels. Any change of a state trait — from Python or from a control in the browser — recomputes and
sends the new panels as binary buffers. A state the view cannot show (a layer that was not captured,
say) is reported in the ``error`` trait, shown above the grid, and the last good panels stay.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import anywidget
import traitlets as t

from headwidget.core.bundle import bundle_path
from headwidget.core.panels import PanelGrid, encode_panel
from headwidget.errors import HeadwidgetError

__all__ = ["STATE_TRAITS", "HeadWidget"]

#: Traits whose change means "recompute the panels".
STATE_TRAITS = ("layer", "channel_start", "channel_width", "kind", "metric", "alignment", "mechanisms")


class HeadWidget(anywidget.AnyWidget):
    """Panels of matrices with a shared colour scale, plus the controls that choose them."""

    _esm = t.Unicode("").tag(sync=True)

    panels = t.List(t.Dict()).tag(sync=True)
    vmin = t.Float(-1.0).tag(sync=True)
    vmax = t.Float(1.0).tag(sync=True)
    colormap = t.Unicode("diverging").tag(sync=True)
    colorbar_label = t.Unicode("").tag(sync=True)
    columns = t.Int(0).tag(sync=True)

    view = t.Unicode("").tag(sync=True)
    layer = t.Int(0).tag(sync=True)
    num_layers = t.Int(0).tag(sync=True)
    layer_label = t.Unicode("").tag(sync=True)
    channel_start = t.Int(0).tag(sync=True)
    channel_width = t.Int(0).tag(sync=True)
    num_channels = t.Int(0).tag(sync=True)
    kind = t.Unicode("key").tag(sync=True)
    kinds_available = t.List(t.Unicode()).tag(sync=True)
    metric = t.Unicode("").tag(sync=True)
    metrics_available = t.List(t.Unicode()).tag(sync=True)
    alignment = t.Unicode("").tag(sync=True)
    alignments_available = t.List(t.Unicode()).tag(sync=True)
    mechanisms = t.List(t.Unicode()).tag(sync=True)
    mechanisms_available = t.List(t.Unicode()).tag(sync=True)
    error = t.Unicode("").tag(sync=True)
    status = t.Unicode("").tag(sync=True)

    view_name: ClassVar[str] = ""

    def __init__(self, **kwargs: Any) -> None:
        kwargs.setdefault("_esm", bundle_path().read_text())
        super().__init__(**kwargs)
        self.view = self.view_name
        self._grid: PanelGrid | None = None
        self._click_callbacks: list[Callable[[dict[str, Any]], None]] = []
        self._png_callbacks: list[Callable[[bytes], None]] = []
        self.on_msg(self._handle_message)
        self.observe(self._on_state_change, names=list(STATE_TRAITS))

    # ------------------------------------------------------------------ computing panels
    def compute(self) -> PanelGrid:
        """The panels for the current state (views override this)."""
        raise NotImplementedError

    def refresh(self) -> None:
        """Recompute the panels; on a bad state, report it in ``error`` and keep the last panels."""
        self.status = "computing…"
        try:
            grid = self.compute()
        except (HeadwidgetError, ValueError, IndexError, KeyError) as err:
            self.error = str(err)
            return
        finally:
            self.status = ""
        self._grid = grid
        with self.hold_sync():
            self.vmin, self.vmax = grid.vmin, grid.vmax
            self.colormap, self.colorbar_label = grid.colormap, grid.colorbar_label
            self.columns = grid.columns
            self.panels = [encode_panel(p, vmin=grid.vmin, vmax=grid.vmax) for p in grid.panels]
            self.error = ""

    @property
    def grid(self) -> PanelGrid:
        """The panels currently shown (float64 matrices, labels, colour scale)."""
        if self._grid is None:
            self.refresh()
        if self._grid is None:
            raise RuntimeError(f"nothing to show: {self.error}")
        return self._grid

    def _on_state_change(self, change: dict[str, Any]) -> None:
        self.refresh()

    # ------------------------------------------------------------------ export
    def save(self, path: str | Path, **options: Any) -> Path:
        """Save what the widget shows: ``.png``/``.svg``/``.pdf`` (matplotlib) or a standalone ``.html``.

        Options: ``dpi``, ``size`` (inches), ``title``; ``layers`` for ``.html``. See
        :func:`headwidget.export.save`.
        """
        from headwidget.export import save  # the export package imports this module

        return save(self, path, **options)

    # ------------------------------------------------------------------ messages from the browser
    def on_click(self, callback: Callable[[dict[str, Any]], None]) -> None:
        """Call ``callback({"panel", "row", "col"})`` when a cell is clicked in the browser."""
        self._click_callbacks.append(callback)

    def request_png(self, callback: Callable[[bytes], None]) -> None:
        """Ask the browser for a 2× PNG of the grid; ``callback(png_bytes)`` runs when it arrives."""
        self._png_callbacks.append(callback)
        self.send({"type": "export_png"})

    def _handle_message(self, widget: Any, content: dict[str, Any], buffers: list[bytes]) -> None:
        kind = content.get("type")
        if kind == "click":
            event = {k: content.get(k) for k in ("panel", "row", "col")}
            for on_click in list(self._click_callbacks):
                on_click(event)
        elif kind == "png" and content.get("data_url"):
            png = base64.b64decode(str(content["data_url"]).split(",", 1)[1])
            waiting, self._png_callbacks = self._png_callbacks, []
            for on_png in waiting:
                on_png(png)

    def __repr__(self) -> str:
        titles = json.dumps([p["title"] for p in self.panels])
        return f"{type(self).__name__}(panels={titles})"
