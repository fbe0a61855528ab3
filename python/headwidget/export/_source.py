"""What the exporters take: a :class:`PanelGrid` or a view, and a view's panels over the states its
controls reach.

A view is anything with a ``grid`` property (the panels it shows now): a
:class:`~headwidget.views.View`, or a widget showing one. The offline page cannot run Python, so a
frame per state is computed here: the view's :meth:`~headwidget.views.View.compute` of each state,
keyed by the values its controls set (:func:`~._frames.state_key`); the view is never moved. The
states are every combination of the values its controls can take (:mod:`._axes`), nearest the saved
state first, held (:class:`~._frames.Frames`) until ``max_states`` or ``max_bytes``, and the page
says what it leaves out. A slider that plays (a timeline's steps) has every position held first; the
other sliders' positions count as changes. The page crops whole matrices (up to
:data:`MAX_WINDOW_CHANNELS` channels) to a channel window; a state the view cannot show keeps the
view's error message, which the page shows when a control reaches it.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Iterator, Sequence
from typing import Any, Protocol, runtime_checkable

import numpy as np
from tqdm.auto import tqdm

from headwidget.core.panels import PanelGrid
from headwidget.errors import ExportError
from headwidget.export._axes import Axis, page_axes
from headwidget.export._colormaps import colormap
from headwidget.export._frames import Frames, frame_json, state_key
from headwidget.views import STATE_ERRORS, Control, View

__all__ = [
    "DEFAULT_MAX_STATES",
    "MAX_WINDOW_CHANNELS",
    "ExportError",
    "GridSource",
    "HasGrid",
    "collect_frames",
    "grid_of",
    "window_control",
]


@runtime_checkable
class HasGrid(Protocol):
    """A view: ``view.grid`` is the :class:`PanelGrid` it shows now."""

    @property
    def grid(self) -> PanelGrid: ...


GridSource = PanelGrid | HasGrid


def _check(grid: PanelGrid, *, empty: bool = False) -> PanelGrid:
    """``grid``, checked to be drawable (``empty``: a grid with nothing to draw is, as a page's state
    with every checklist option unticked)."""
    if not grid.panels and not grid.charts and not empty:
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
        try:  # a screen's coarser panels are not what a file keeps
            return _check(source.full_grid())
        except STATE_ERRORS as err:
            raise ExportError(
                f"the view cannot show its current state, so it cannot be saved: {err}"
            ) from err
    if isinstance(source, HasGrid):
        grid = source.grid
        if isinstance(grid, PanelGrid):
            return _check(grid)
    raise TypeError(f"expected a PanelGrid or a view with a .grid, got {type(source).__name__}")


def window_control(source: object) -> Control | None:
    """The view's window control, if it has one (the page crops whole frames to the window).

    Example:
        >>> from headwidget.views import view_class
        >>> window_control(view_class("channels")).traits()
        ['channel_start', 'channel_width', 'num_channels', 'channel_step']
    """
    view = source if isinstance(source, type) else type(source)
    if not issubclass(view, View):
        return None
    return next((c for c in view.view_controls() if c.type == "window"), None)


#: Most channels a page holds whole per panel for its window sliders (float16: 2 MiB a panel).
MAX_WINDOW_CHANNELS = 1024
#: Most states a page holds by default (every slider position counts: 30 layers × 2 kinds is 60).
DEFAULT_MAX_STATES = 256


def collect_frames(
    source: GridSource,
    layers: Sequence[int] | None,
    max_bytes: int,
    max_states: int = DEFAULT_MAX_STATES,
    *,
    progress: bool = False,
) -> Frames:
    """Frames of a grid (one frame, no control) or of a view over the states its controls reach
    (``layers``: the layer slider's positions held, default all).

    Raises :class:`ExportError` when the saved state at every slider position does not fit in
    ``max_bytes``; the other states are held as far as ``max_bytes`` and ``max_states`` allow.
    ``progress``: a bar of the states computed, shown when they take more than two seconds.

    Example:
        >>> import numpy as np
        >>> from headwidget.core.panels import Panel
        >>> grid = PanelGrid([Panel("a", "A", np.eye(2))], -1.0, 1.0, "diverging", "r")
        >>> frames = collect_frames(grid, None, 2**20)
        >>> list(frames.frames), frames.state["controls"]
        (['[]'], [])
    """
    if isinstance(source, View):
        return _view_frames(source, layers, max_bytes, max_states, progress)
    if layers is not None and isinstance(source, PanelGrid):
        raise ExportError("layers= needs a view with a layer slider; a PanelGrid has one panel set")
    if layers is not None:
        raise ExportError(f"{type(source).__name__} has no layer slider; layers= does not apply")
    frames = Frames(state={"view": str(getattr(source, "view", "")), "controls": []})
    frames.add(state_key([]), frame_json(grid_of(source)))
    _check_size(frames, max_bytes)
    return frames


def _view_frames(
    view: View[Any], layers: Sequence[int] | None, max_bytes: int, max_states: int, progress: bool
) -> Frames:
    saved = view.current_state()
    grid_of(view)  # the saved state must be one the view can show (else: why it cannot be saved)
    controls = view.view_controls()
    axes, notes = page_axes(view, layers)
    if layers is not None and not any(a.trait == "layer" and a.control.type == "slider" for a in axes):
        raise ExportError(f"{type(view).__name__} here has no layer slider; layers= does not apply")
    window = _whole_window(view, saved)
    base = saved if window is None else saved.replace(**window)
    state: dict[str, Any] = {"view": view.view_name, "controls": []}
    frames = Frames(state=state, axes=axes)
    ordered = _states(axes)
    frames.reachable = len(ordered)
    held = 0
    planned = max(min(len(ordered), max_states), sum(1 for d, _ in ordered if d == 0))
    bar = tqdm(
        total=planned,
        unit="state",
        desc=f"page of {view.view_name or 'view'}",
        delay=2.0,
        disable=not progress,
    )
    for distance, values in ordered:
        if distance > 0 and held >= max_states:
            break
        bar.update()
        key = state_key([axis.keyed(v) for axis, v in zip(axes, values, strict=True)])
        each = base.replace(**{axis.trait: v for axis, v in zip(axes, values, strict=True)})
        held += 1
        try:
            grid = _check(view.compute(each, None), empty=True)
            traits = {**view.labels(each), "heading": view.describe(each)}
        except STATE_ERRORS as err:
            frames.errors[key] = str(err)
            continue
        frame = frame_json(grid, traits)
        if window is not None:
            frame["window"] = True
        if not frames.add(key, frame, max_bytes if distance > 0 else float("inf")):
            held -= 1
            break  # the saved state at every layer is in; the states further away would not fit
        if distance == 0:
            _check_size(frames, max_bytes)
    bar.close()
    if not frames.frames:
        raise ExportError(f"none of the states could be shown: {sorted(set(frames.errors.values()))}")
    if held < frames.reachable:
        played = next((a.control.label for a in axes if a.control.play), None)
        first = f"every position of “{played}” is held first; " if played else ""
        notes.append(
            f"this page holds {held} of the {frames.reachable} states its controls reach (at most "
            f"{max_states} states and {max_bytes / 2**20:.0f} MiB): {first}left out first are those with "
            "most options changed from the saved one; save with a larger max_states= to hold more"
        )
    window_spec = window_control(view)
    if window_spec is not None and window is None:
        notes.append(
            f"{_window_total(view, window_spec)} channels: this page holds the saved window only (at "
            f"most {MAX_WINDOW_CHANNELS} channels, each a cell, are kept whole for the window sliders)"
        )
    exported = {axis.trait for axis in axes}
    if window_spec is not None and window is not None:
        exported.add(window_spec.trait)
    state["controls"] = [c.to_json() for c in controls if c.trait in exported]
    for control in controls:
        if control.trait in exported:
            state.update({name: getattr(view, name) for name in control.traits()})
    saved_key = state_key([axis.keyed(getattr(saved, axis.trait)) for axis in axes])
    opening = saved_key if saved_key in frames.frames else next(iter(frames.frames))
    if opening != saved_key:  # the saved layer was not exported: open on the first held state
        for axis, value in zip(axes, json.loads(opening), strict=True):
            state[axis.trait] = value
    state.update(frames.frames[opening]["traits"])
    frames.state["opening"] = opening
    frames.note = "; ".join(notes)
    return frames


def _states(axes: list[Axis]) -> list[tuple[int, tuple[Any, ...]]]:
    """Every combination of the axes' values with its distance from the saved state, nearest first
    (the saved choice itself, not an equal subset in another order, for a checklist)."""

    def values(axis: Axis) -> Iterator[Any]:
        for v in axis.values:
            if axis.control.type == "checklist" and set(v) == set(axis.saved):
                yield list(axis.saved)
            else:
                yield v

    combos = itertools.product(*(list(values(a)) for a in axes))
    scored = [(sum(a.distance(v) for a, v in zip(axes, c, strict=True)), c) for c in combos]
    scored.sort(key=lambda item: item[0])
    return scored


def _window_total(view: View[Any], control: Control) -> int:
    return int(getattr(view, control.total))


def _whole_window(view: View[Any], saved: Any) -> dict[str, int] | None:
    """The window traits set to the whole range, when the page can crop that to any window: at most
    :data:`MAX_WINDOW_CHANNELS` channels, shown one cell each (None: the page keeps the saved window)."""
    control = window_control(view)
    if control is None:
        return None
    total = _window_total(view, control)
    if not 0 < total <= MAX_WINDOW_CHANNELS:
        return None
    whole = {control.trait: 0, control.width: total}
    try:
        grid = view.compute(saved.replace(**whole), None)
    except STATE_ERRORS:
        return None
    if any(p.row_step != 1 or p.col_step != 1 for p in grid.panels):
        return None  # block means: a crop would not show the window's own cells
    return whole


def _check_size(frames: Frames, max_bytes: int) -> None:
    if frames.nbytes > max_bytes:
        raise ExportError(
            f"the page would hold more than {max_bytes / 2**20:.0f} MiB of panel data after "
            f"{len(frames.frames)} states: pass fewer layers (layers=[...]), a narrower channel window "
            "or a smaller max_cells, or raise max_bytes"
        )
