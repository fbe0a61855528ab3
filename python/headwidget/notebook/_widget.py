"""``ViewWidget``: a view that is also a :class:`~headwidget.widget.HeadWidget`, and ``widget_class``.

A displayable view class lists the view class after :class:`ViewWidget`
(``class ChannelView(ViewWidget, views.ChannelView)``): the view's ``__init__`` and state come first,
the widget's transport after. Every computed grid goes to the browser in one message; ``status``
says "computing…" meanwhile; ``controls`` and ``view`` come from the view class's declarations.
The page reports its plot size (``panel_pixels``): the view's ``resolution`` follows it, so a
4096-channel panel drawn 560 device pixels wide is sent as about 512 × 512 block means, and a larger
plot (a wider window, a zoom) asks for the panels again. Saving (``.save``) uses the full resolution.
:func:`displayable` makes such a class for a view that has no hand-written one; :func:`widget_class`
finds the class of a registered view by name.

Example:
    >>> import torch, headwidget
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)).eval()
    >>> stats = headwidget.capture(model, torch.randint(0, 64, (2, 16)), progress=False)
    >>> view = widget_class("channels").create(stats, layers=[1], interactive=False)
    >>> type(view).__name__, view.view, [c["trait"] for c in view.controls]
    ('ChannelView', 'channels', ['layer', 'channel_start', 'kind'])
    >>> view.layer = 0
    >>> view.panels[0]["title"]
    'Keys · layer 0'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import traitlets as t

from headwidget.core.panels import PanelGrid
from headwidget.export import save
from headwidget.views import View, reduced, view_class
from headwidget.widget import HeadWidget

__all__ = ["ViewWidget", "displayable", "widget_class"]

#: The displayable class of each view class (hand-written ones register themselves when defined).
_WIDGETS: dict[type[View], type[ViewWidget]] = {}


class ViewWidget(View, HeadWidget):
    """Base of the displayable views: a :class:`View` whose panels a :class:`HeadWidget` shows."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        view = next(
            (b for b in cls.__mro__[1:] if issubclass(b, View) and not issubclass(b, ViewWidget)), None
        )
        if view is not None and view is not View:
            _WIDGETS.setdefault(view, cls)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.on_click(self._clicked)

    def _clicked(self, event: dict[str, Any]) -> None:
        """A click in the browser: a cell goes to the view's :meth:`~headwidget.views.View.select_cell`,
        a chart's point to its :meth:`~headwidget.views.View.select_point`."""
        panel, row, col = event.get("panel"), event.get("row"), event.get("col")
        if isinstance(panel, str) and isinstance(row, int) and isinstance(col, int):
            self.select_cell(panel, row, col)
        chart, series, point = event.get("chart"), event.get("series"), event.get("point")
        if isinstance(chart, str) and isinstance(series, int) and isinstance(point, int):
            self.select_point(chart, series, point)

    @t.default("view")
    def _view_default(self) -> str:
        return self.view_name

    @t.default("controls")
    def _controls_default(self) -> list[dict[str, str]]:
        return [control.to_json() for control in self.view_controls()]

    @t.observe("panel_pixels")
    def _on_panel_pixels(self, change: dict[str, Any]) -> None:
        """The page's plot size changed: compute for it from now on, and at once when it now has room
        for more cells than the panels it shows."""
        old, cells = self.resolution, change["new"] or None
        self.resolution = cells
        grew = old is not None and (cells is None or cells > old)
        if grew and self._grid is not None and reduced(self._grid, cells or float("inf")):
            self.refresh()

    def refresh(self, *, strict: bool = False) -> None:
        """Recompute the panels and send them; on a bad state, show why above the last panels
        (``strict``: raise it, as a view being built does)."""
        self.status = "computing…"
        try:
            super().refresh(strict=strict)
        finally:
            self.status = ""

    def _set_grid(self, grid: PanelGrid) -> None:
        with self.hold_sync():
            super()._set_grid(grid)
            self.show(grid)
            self.heading = self.caption

    def save(self, path: str | os.PathLike[str], **options: Any) -> Path:
        """Save what the widget shows: ``.png``/``.svg``/``.pdf`` (matplotlib) or a standalone ``.html``.

        Options: ``dpi``, ``size`` (inches), ``title``; ``layers`` for ``.html``. See
        :func:`headwidget.export.save`.
        """
        return save(self, path, **options)


def displayable(view: type[View]) -> type[ViewWidget]:
    """The class that is both ``view`` and a widget: the hand-written one, else one made (once)."""
    if view not in _WIDGETS:
        type(view.__name__, (ViewWidget, view), {"__doc__": view.__doc__, "__module__": __name__})
    return _WIDGETS[view]


def widget_class(name: str) -> type[ViewWidget]:
    """The displayable class of the view registered as ``name`` (see :func:`displayable`).

    Raises :class:`~headwidget.errors.UnknownViewError` (listing the views) for an unknown name.
    """
    return displayable(view_class(name))
