"""``ViewShell``: the one widget that shows any view, by composition.

A view (:mod:`headwidget.views`) is the class a user builds, displays and saves; its widget
(``view.widget``, made on first display) is a :class:`~headwidget.widget.HeadWidget` that holds the
view and mirrors the view's synced traits (its state, and what its controls read: the layer count,
the options of a toggle…) both ways. A control moved in the browser sets the view's trait, and the
view recomputes; a state set from Python moves the control. The view tells the shell when it
computes (``status`` says "computing…") and sends every grid it shows in one message
(:class:`~headwidget.views.ViewScreen`). The page reports its plot size (``panel_pixels``): the
view's ``resolution`` follows it, so a 4096-channel panel drawn 560 device pixels wide is sent as
about 512 × 512 block means, and a larger plot (a wider window, a zoom) asks for the panels again.
Saving uses the full resolution.

The shell class of a view class is made once (:func:`shell_class`): its traits are the view's
synced trait names, holding whatever the view holds (the view validates them); the page sets the
view's inputs (its state and entries), never ``error``, which only the view says. Importing this module
registers :data:`PRESENTER`, the shell and :func:`headwidget.export.save`, as how views are displayed
and saved (:func:`~headwidget.views.present_with`).

Example:
    >>> import torch, headwidget
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)).eval()
    >>> stats = headwidget.capture(model, torch.randint(0, 64, (2, 16)), progress=False)
    >>> view = headwidget.ChannelView(stats, layer=1, prefetch=False)
    >>> widget = view.widget
    >>> type(widget).__name__, widget.view, [c["trait"] for c in widget.controls]
    ('ChannelViewWidget', 'channels', ['layer', 'channel_start', 'kind'])
    >>> view.layer = 0  # from Python: the widget follows
    >>> widget.layer, widget.panels[0]["title"]
    (0, 'Keys · layer 0')
    >>> widget.layer = 1  # what a move of the slider in the browser does
    >>> view.layer, view.grid.panels[0].title
    (1, 'Keys · layer 1')
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Any

import traitlets as t

from headwidget.core.panels import PanelGrid
from headwidget.export import save
from headwidget.views import View, present_with, reduced
from headwidget.widget import HeadWidget

__all__ = ["PRESENTER", "ViewShell", "shell_class"]

#: The shell class of each view class (made once: ipywidgets syncs the traits a class declares).
_SHELLS: dict[type[View[Any]], type[ViewShell]] = {}


class ViewShell(HeadWidget):
    """The widget of one view: its synced traits mirrored, its grids sent, clicks passed back."""

    def __init__(self, view: View[Any]) -> None:
        """Show ``view`` (an instance of the view class this shell class was made for)."""
        names = mirrored_traits(type(view))
        self._view = view
        self._mirrored = names
        super().__init__(
            view=view.view_name,
            controls=[control.to_json() for control in view.view_controls()],
            **{name: getattr(view, name) for name in names},
        )
        view.observe(self._from_view, names=names)
        self.observe(self._from_page, names=[n for n in names if n != "error"])  # (the view's to say)
        self.on_click(self._clicked)
        self.on_drawn(view.page_drew)
        view.attach(self)
        self.shown(view.grid)

    @property
    def shows(self) -> View[Any]:
        """The view this widget shows."""
        return self._view

    # ------------------------------------------------------------------ the view's side
    def computing(self, busy: bool) -> None:
        """The view started or stopped computing: ``status`` says so on the page."""
        self.status = "computing…" if busy else ""

    def together(self) -> contextlib.AbstractContextManager[Any]:
        """The view's labels, its grid and the end of "computing" in one message to the page."""
        held: contextlib.AbstractContextManager[Any] = self.hold_sync()
        return held

    def drawn_by_page(self) -> bool:
        """Whether a page draws this widget: one has reported its plot size."""
        return self.panel_pixels > 0

    def shown(self, grid: PanelGrid) -> None:
        """Send the view's new grid, its caption and the end of "computing" in one message."""
        with self.hold_sync():
            self.show(grid)
            self.error = self._view.error
            self.heading = self._view.caption
            self.status = ""

    def _from_view(self, change: dict[str, Any]) -> None:
        # The view's value now, not the change's: an observer of the view may have changed it again
        # (an entry's text is cleared once read), and this change would bring the stale one back.
        name = change["name"]
        setattr(self, name, getattr(self._view, name))

    # ------------------------------------------------------------------ the page's side
    def _from_page(self, change: dict[str, Any]) -> None:
        """A mirrored trait set on the widget (by the page): set it on the view. A value the view
        refuses is said in ``error``, and the widget goes back to the view's value."""
        name, view = change["name"], self._view
        new = getattr(self, name)  # (now, as above)
        if getattr(view, name) == new:
            return
        try:
            setattr(view, name, new)
        except t.TraitError as err:
            view.error = str(err)
            setattr(self, name, getattr(view, name))

    def _clicked(self, event: dict[str, Any]) -> None:
        """A click in the browser: a cell goes to the view's :meth:`~headwidget.views.View.select_cell`,
        a chart's point to its :meth:`~headwidget.views.View.select_point`."""
        panel, row, col = event.get("panel"), event.get("row"), event.get("col")
        if isinstance(panel, str) and isinstance(row, int) and isinstance(col, int):
            self._view.select_cell(panel, row, col)
        chart, series, point = event.get("chart"), event.get("series"), event.get("point")
        if isinstance(chart, str) and isinstance(series, int) and isinstance(point, int):
            self._view.select_point(chart, series, point)

    @t.observe("panel_pixels")
    def _on_panel_pixels(self, change: dict[str, Any]) -> None:
        """The page's plot size changed: the view computes for it from now on, and at once when it
        now has room for more cells than the panels it shows."""
        view = self._view
        old, cells = view.resolution, change["new"] or None
        view.resolution = cells
        grew = old is not None and (cells is None or cells > old)
        shown = view._grid
        if grew and shown is not None and reduced(shown, cells or float("inf")):
            view.refresh()
        elif cells != old:
            view.compute_ahead()  # (what was computed ahead has the old size)

    # ------------------------------------------------------------------ the user's side
    def save(self, path: str | os.PathLike[str], **options: Any) -> Path:
        """Save what the view shows (:meth:`~headwidget.views.View.save`)."""
        return self._view.save(path, **options)

    def close(self) -> None:
        """Close the widget's connection to the browser; the view stays usable (and can be shown again)."""
        view = getattr(self, "_view", None)
        if view is not None:
            view.detach(self)
            view.unobserve(self._from_view, names=self._mirrored)
            if view._widget is self:
                view._widget = None
        super().close()

    def _name_in_words(self) -> str:
        return type(self._view).__name__


def mirrored_traits(view: type[View[Any]]) -> list[str]:
    """The traits of ``view`` that a widget mirrors: every synced one (state and what controls read).

    Example:
        >>> from headwidget.views import view_class
        >>> mirrored_traits(view_class("alignment"))[:4]
        ['alignment', 'alignments_available', 'error', 'kind']
    """
    return sorted(view.class_trait_names(sync=True))


def shell_class(view: type[View[Any]]) -> type[ViewShell]:
    """The widget class that shows instances of ``view`` (made once per view class)."""
    made = _SHELLS.get(view)
    if made is None:
        own = set(HeadWidget.class_trait_names())
        traits = {n: t.Any().tag(sync=True) for n in mirrored_traits(view) if n not in own}
        made = type(f"{view.__name__}Widget", (ViewShell,), {"__module__": __name__, **traits})
        _SHELLS[view] = made
    return made


class _NotebookPresenter:
    """Views are displayed by their shell and saved by :func:`headwidget.export.save`."""

    def widget(self, view: View[Any]) -> ViewShell:
        return shell_class(type(view))(view)

    def save(self, view: View[Any], path: str | os.PathLike[str], **options: Any) -> Path:
        return save(view, path, **options)


#: How views are displayed and saved once this layer is imported.
PRESENTER = _NotebookPresenter()
present_with(PRESENTER)
