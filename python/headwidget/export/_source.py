"""What the exporters take: a :class:`PanelGrid` or a view, and a view's panel sets across layers.

A view is anything with a ``grid`` property (the panels it shows now): a
:class:`~headwidget.views.View`, or a widget showing one. The offline HTML page cannot run Python, so
what its layer slider can show is computed here ("frames"): the view is moved to each requested layer,
its grid is taken, and it is moved back. The layer slider is the view's own control of its ``layer``
trait (:meth:`~headwidget.views.View.view_controls`). A view with a toggle (the channel view's keys
before or after RoPE, say) gets the frames of every option, which the page switches between; its
channel window, when it has one, is applied by the page. Other controls would need Python. Within
``hold_sync`` a live widget's front end only receives its final (original) state. A layer the view
cannot show (not captured, say) keeps the view's error message, which the page shows when the slider
reaches it.
"""

from __future__ import annotations

import base64
import dataclasses
import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np

from headwidget.core.charts import encode_chart
from headwidget.core.panels import PanelGrid, encode_panel
from headwidget.errors import HeadwidgetError
from headwidget.export._colormaps import colormap
from headwidget.views import Control, View

__all__ = [
    "MAX_WINDOW_CHANNELS",
    "ExportError",
    "Frames",
    "GridSource",
    "HasGrid",
    "collect_frames",
    "frame_json",
    "grid_of",
    "layer_slider",
    "toggle_control",
    "window_control",
]


class ExportError(HeadwidgetError, ValueError):
    """A grid or an export request that cannot be written (empty grid, bad matrix, unknown format…)."""


@runtime_checkable
class HasGrid(Protocol):
    """A view: ``view.grid`` is the :class:`PanelGrid` it shows now."""

    @property
    def grid(self) -> PanelGrid: ...


GridSource = PanelGrid | HasGrid


def _check(grid: PanelGrid) -> PanelGrid:
    if not grid.panels and not grid.charts:
        raise ExportError("the grid has no panels or charts to draw")
    if not (math.isfinite(grid.vmin) and math.isfinite(grid.vmax)):
        raise ExportError(f"the colour range must be finite, got vmin={grid.vmin}, vmax={grid.vmax}")
    try:
        colormap(grid.colormap)
    except ValueError as err:
        raise ExportError(str(err)) from None
    for panel in grid.panels:
        shape = np.shape(panel.matrix)
        if len(shape) != 2 or 0 in shape:
            raise ExportError(f"panel {panel.id!r}: expected a non-empty 2-D matrix, got shape {shape}")
        for name, labels, n in (
            ("row_labels", panel.row_labels, shape[0]),
            ("col_labels", panel.col_labels, shape[1]),
        ):
            if labels is not None and len(labels) != n:
                raise ExportError(f"panel {panel.id!r}: {name} has {len(labels)} entries for {n} cells")
    return grid


def grid_of(source: GridSource) -> PanelGrid:
    """The checked :class:`PanelGrid` of a grid or of a view.

    Example:
        >>> import numpy as np
        >>> from headwidget.core.panels import Panel
        >>> grid = PanelGrid([Panel("a", "A", np.eye(2))], -1.0, 1.0, "diverging", "r")
        >>> grid_of(grid) is grid
        True
    """
    if isinstance(source, PanelGrid):
        return _check(source)
    if isinstance(source, View):
        with source.full_resolution():  # a screen's coarser panels are not what a file keeps
            return _check(source.grid)
    if isinstance(source, HasGrid):
        grid = source.grid
        if isinstance(grid, PanelGrid):
            return _check(grid)
    raise TypeError(f"expected a PanelGrid or a view with a .grid, got {type(source).__name__}")


def layer_slider(source: object) -> Control | None:
    """The view's slider of its ``layer`` trait (what the page's frames follow), if it has one.

    Example:
        >>> from headwidget.views import view_class
        >>> layer_slider(view_class("alignment")).traits()
        ['layer', 'num_layers', 'layer_label']
    """
    view = source if isinstance(source, type) else type(source)
    if not issubclass(view, View):
        return None
    return next((c for c in view.view_controls() if c.trait == "layer" and c.type == "slider"), None)


def window_control(source: object) -> Control | None:
    """The view's channel-window control, if it has one (the page crops full frames to the window).

    Example:
        >>> from headwidget.views import view_class
        >>> window_control(view_class("channels")).traits()
        ['channel_start', 'channel_width', 'num_channels', 'channel_step']
    """
    view = source if isinstance(source, type) else type(source)
    if not issubclass(view, View):
        return None
    return next((c for c in view.view_controls() if c.type == "window"), None)


def toggle_control(source: object) -> Control | None:
    """The view's first toggle control, if it has one (the page holds the frames of every option).

    Example:
        >>> from headwidget.views import view_class
        >>> toggle_control(view_class("channels")).traits()
        ['kind', 'kinds_available']
    """
    view = source if isinstance(source, type) else type(source)
    if not issubclass(view, View):
        return None
    return next((c for c in view.view_controls() if c.type == "toggles"), None)


#: Most channels a page holds whole per panel for its window sliders (float16: 2 MiB a panel).
MAX_WINDOW_CHANNELS = 1024


@dataclass
class Frames:
    """The page's content: the view's fixed state, a frame per exported layer, errors of the others."""

    state: dict[str, Any]
    frames: dict[int, dict[str, Any]] = field(default_factory=dict)
    errors: dict[int, str] = field(default_factory=dict)
    nbytes: int = 0
    #: With a toggle: every option's frames and errors (the current option's are ``frames``/``errors``).
    options: dict[str, Frames] = field(default_factory=dict)


def frame_json(grid: PanelGrid, layer_label: str = "") -> dict[str, Any]:
    """A grid as the page's JSON: the widget's traits, panels' data as base64 of the wire format.

    Example:
        >>> import numpy as np
        >>> from headwidget.core.panels import Panel
        >>> frame = frame_json(PanelGrid([Panel("a", "A", np.eye(2))], -1.0, 1.0, "diverging", "r"))
        >>> frame["panels"][0]["dtype"], frame["panels"][0]["data"]
        ('float16', 'ADwAAAAAADw=')
    """
    panels = []
    for panel in grid.panels:
        encoded = encode_panel(panel, vmin=grid.vmin, vmax=grid.vmax)
        encoded["data"] = base64.b64encode(encoded["data"]).decode("ascii")
        panels.append(encoded)
    return {
        "vmin": grid.vmin, "vmax": grid.vmax, "colormap": grid.colormap,
        "colorbar_label": grid.colorbar_label, "columns": grid.columns,
        "layer_label": layer_label, "panels": panels, "charts": [encode_chart(c) for c in grid.charts],
    }  # fmt: skip


def _add(frames: Frames, layer: int, grid: PanelGrid, label: str, max_bytes: int) -> None:
    frame = frame_json(grid_of(grid), label)
    frames.frames[layer] = frame
    frames.nbytes += sum(len(p["data"]) for p in frame["panels"])
    if frames.nbytes > max_bytes:
        raise ExportError(
            f"the page would hold more than {max_bytes / 2**20:.0f} MiB of panel data after "
            f"{len(frames.frames)} layers: pass fewer layers (layers=[...]), a narrower channel window "
            "or a smaller max_cells, or raise max_bytes"
        )


def collect_frames(source: GridSource, layers: Sequence[int] | None, max_bytes: int) -> Frames:
    """Frames of a grid (one frame, no slider) or of a view over ``layers`` (default: all).

    Example:
        >>> import numpy as np
        >>> from headwidget.core.panels import Panel
        >>> grid = PanelGrid([Panel("a", "A", np.eye(2))], -1.0, 1.0, "diverging", "r")
        >>> frames = collect_frames(grid, None, 2**20)
        >>> list(frames.frames), frames.state["controls"]
        ([0], [])
    """
    if isinstance(source, PanelGrid):
        if layers is not None:
            raise ExportError("layers= needs a view with a layer slider; a PanelGrid has one panel set")
        frames = Frames(state={"view": "", "controls": [], "layer": 0, "layer_label": "", "num_layers": 0})
        _add(frames, 0, source, "", max_bytes)
        return frames
    view: Any = source
    with view.full_resolution() if isinstance(view, View) else nullcontext():
        frames = _window_frames(view, layers, max_bytes)
    # The page's bar in the order of the view's own
    order = [(c.type, c.trait) for c in view.view_controls()]
    frames.state["controls"].sort(key=lambda c: order.index((c["type"], c["trait"])))
    return frames


def _window_frames(view: Any, layers: Sequence[int] | None, max_bytes: int) -> Frames:
    """The frames of a view, whole matrices for the page's channel window sliders when it has them."""
    window = window_control(view)
    if window is None:
        return _option_frames(view, layers, max_bytes)
    # The page crops each layer's whole matrices to the window the user picks: export whole ones.
    start, width, total = (int(getattr(view, name)) for name in window.traits()[:3])
    if total > MAX_WINDOW_CHANNELS:
        frames = _option_frames(view, layers, max_bytes)
        frames.state["window_note"] = (
            f"{total} channels: this page holds the exported window only (at most "
            f"{MAX_WINDOW_CHANNELS} channels are kept whole for the window sliders)"
        )
        return frames
    hold = view.hold_sync() if hasattr(view, "hold_sync") else nullcontext()
    with hold:
        try:
            with view.hold_trait_notifications():
                setattr(view, window.trait, 0)
                setattr(view, window.width, total)
            frames = _option_frames(view, layers, max_bytes)
        finally:
            with view.hold_trait_notifications():
                setattr(view, window.trait, start)
                setattr(view, window.width, width)
    every = [f for option in (frames.options.values() or [frames]) for f in option.frames.values()]
    if any(p["row_step"] != 1 for frame in every for p in frame["panels"]):
        return frames  # downsampled: no window to crop
    frames.state["controls"].append(window.to_json())
    frames.state.update({name: int(getattr(view, name)) for name in window.traits()})
    for frame in every:
        frame["window"] = True
    return frames


def _option_frames(view: Any, layers: Sequence[int] | None, max_bytes: int) -> Frames:
    """:func:`_view_frames` for each option of the view's toggle (the current option first)."""
    toggle = toggle_control(view)
    options = [str(o) for o in getattr(view, toggle.options, [])] if toggle is not None else []
    frames = _view_frames(view, layers, max_bytes)
    if toggle is None or len(options) < 2:
        return frames
    current = str(getattr(view, toggle.trait))
    frames.options[current] = frames
    hold = view.hold_sync() if hasattr(view, "hold_sync") else nullcontext()
    with hold:
        try:
            for option in options:
                if option == current:
                    continue
                setattr(view, toggle.trait, option)
                other = _view_frames(view, layers, max_bytes, spent=frames.nbytes)
                frames.options[option] = other
                frames.nbytes = other.nbytes
        finally:
            setattr(view, toggle.trait, current)
    frames.state["controls"].append(toggle.to_json())
    frames.state.update({toggle.trait: current, toggle.options: options, "option_trait": toggle.trait})
    return frames


def _view_frames(view: Any, layers: Sequence[int] | None, max_bytes: int, spent: int = 0) -> Frames:
    """Frames of a view over ``layers`` (default: all) at its current state but for the layer
    (``spent``: bytes of panel data the page holds already)."""
    current = grid_of(view)  # computes the panels if the view has none yet
    slider = layer_slider(view)
    start = int(getattr(view, "layer", 0))
    label = str(getattr(view, slider.text, "")) if slider is not None and slider.text else ""
    count = int(getattr(view, slider.count)) if slider is not None else 0
    state: dict[str, Any] = {"view": getattr(view, "view_name", ""), "controls": [], "layer": start}
    state.update(layer_label=label, num_layers=count)
    frames = Frames(state=state, nbytes=spent)
    if slider is None or count < 1:
        if layers is not None:
            raise ExportError(f"{type(view).__name__} here has no layer slider; layers= does not apply")
        _add(frames, start, current, label, max_bytes)
        return frames
    # The page's own names for the slider's traits (its offline model sets them per frame).
    page_slider = dataclasses.replace(slider, count="num_layers", text="layer_label")
    state["controls"] = [page_slider.to_json()]
    wanted = sorted({int(x) for x in (range(count) if layers is None else layers)})
    hold = view.hold_sync() if hasattr(view, "hold_sync") else nullcontext()
    with hold:
        try:
            for layer in wanted:
                if layer == start:
                    _add(frames, layer, current, label, max_bytes)
                    continue
                view.layer = layer
                if getattr(view, "error", ""):
                    frames.errors[layer] = str(view.error)
                else:
                    shown = str(getattr(view, slider.text, "")) if slider.text else ""
                    _add(frames, layer, view.grid, shown, max_bytes)
        finally:
            view.layer = start
    if start not in frames.frames:  # the page opens on the first exported layer
        if not frames.frames:
            raise ExportError(f"none of the layers {wanted} could be shown: {frames.errors}")
        state["layer"] = min(frames.frames)
        state["layer_label"] = frames.frames[state["layer"]]["layer_label"]
    return frames
