"""What the exporters take: a :class:`PanelGrid` or a view, and a view's panels over the states its
controls reach.

A view is anything with a ``grid`` property (the panels it shows now): a
:class:`~headwidget.views.View`, or a widget showing one. The offline HTML page cannot run Python, so
the panels its controls can ask for are computed here, one "frame" per state: the view's
:meth:`~headwidget.views.View.compute` of each state, keyed by the values of the state traits its
controls set (:func:`state_key`); the view itself is never moved. The states are every combination
of the controls' values (each slider position, each option of a toggle or a select, each subset of a
checklist's options), taken in order of how far they are from the saved state (how many options
differ; the slider's positions are all distance 0): the page holds them until ``max_states`` or
``max_bytes`` is reached, so what is left out first is the combinations with most controls changed,
and the page says so. A view with a slider that plays (a timeline's steps) holds every position of
that one first: its other sliders' positions count as changes, one per position away from the saved
one, so what a page too small for them all leaves out first is the layers furthest from the saved one.
A channel window is not a state of its own: the page holds the whole matrices
(up to :data:`MAX_WINDOW_CHANNELS` channels) and crops them to the window, as the kernel would. A text
entry (a spec to add) needs Python. A state the view cannot show (a layer not captured, say) keeps the
view's error message, which the page shows when a control reaches it.
"""

from __future__ import annotations

import base64
import hashlib
import itertools
import json
import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
from tqdm.auto import tqdm

from headwidget.core.charts import encode_chart
from headwidget.core.panels import PanelGrid, encode_panel
from headwidget.errors import HeadwidgetError
from headwidget.export._colormaps import colormap
from headwidget.views import STATE_ERRORS, Control, View

__all__ = [
    "DEFAULT_MAX_STATES",
    "MAX_CHECKLIST_OPTIONS",
    "MAX_WINDOW_CHANNELS",
    "ExportError",
    "Frames",
    "GridSource",
    "HasGrid",
    "collect_frames",
    "frame_json",
    "grid_of",
    "state_key",
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
#: Most options a checklist may have for the page to hold its subsets (2⁸ = 256 of them); a longer
#: one keeps the saved choice only.
MAX_CHECKLIST_OPTIONS = 8


def state_key(values: Sequence[Any]) -> str:
    """The key of a state on the page: the JSON array of its traits' values, compact, as the page's
    ``JSON.stringify`` writes it (``js/lib/offline.ts``).

    Example:
        >>> state_key([3, "key_post", ["mha", "mqa"]])
        '[3,"key_post",["mha","mqa"]]'
    """
    return json.dumps(list(values), ensure_ascii=False, separators=(",", ":"), allow_nan=False)


@dataclass
class Axis:
    """One control the page holds frames for: the trait it sets and the values it can give it."""

    control: Control
    values: list[Any]
    saved: Any
    #: A slider that moves for free (every slider, unless another one plays).
    free: bool = True

    @property
    def trait(self) -> str:
        return self.control.trait

    def distance(self, value: Any) -> int:
        """How far ``value`` is from the saved one: options changed (a free slider moves for free;
        another one counts the positions it moved)."""
        if self.control.type == "slider":
            return 0 if self.free else abs(int(value) - int(self.saved))
        if self.control.type == "checklist":
            return len(set(value) ^ set(self.saved))
        return int(value != self.saved)

    @property
    def options(self) -> list[Any]:
        """A checklist's options in their order (its first value holds them all); [] otherwise."""
        return list(self.values[0]) if self.control.type == "checklist" and self.values else []

    def to_json(self) -> dict[str, Any]:
        """The axis as the page reads it (``js/lib/offline.ts``): trait, control type, values held
        (sliders, toggles, selects) and, for a checklist, its options (the order its keys use)."""
        data: dict[str, Any] = {"trait": self.trait, "type": self.control.type, "label": self.control.label}
        if self.control.type == "checklist":
            data["options"] = self.options
        else:
            data["values"] = self.values
        return data


@dataclass
class Frames:
    """The page's content: its initial traits, a frame per state key, and why other states are
    missing (``errors``: the view's own message; ``note``: what the page leaves out, in words)."""

    state: dict[str, Any]
    axes: list[Axis] = field(default_factory=list)
    frames: dict[str, dict[str, Any]] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    nbytes: int = 0
    reachable: int = 1
    note: str = ""
    _seen: set[bytes] = field(default_factory=set, repr=False)

    @property
    def keys(self) -> list[str]:
        """The state traits a frame's key lists the values of, in order."""
        return [axis.trait for axis in self.axes]

    def cost(self, frame: dict[str, Any]) -> tuple[int, set[bytes]]:
        """The bytes ``frame`` would add (its matrices the page does not hold yet, each distinct one
        stored once, and its text) and the digests of those new matrices."""
        new = {hashlib.sha256(p["data"].encode("ascii")).digest(): len(p["data"]) for p in frame["panels"]}
        new = {digest: n for digest, n in new.items() if digest not in self._seen}
        text = len(json.dumps({k: v for k, v in frame.items() if k != "panels"}))
        return text + sum(new.values()), set(new)

    def add(self, key: str, frame: dict[str, Any], cost: tuple[int, set[bytes]] | None = None) -> None:
        """Hold ``frame`` under ``key``; ``cost``: what :meth:`cost` said of it, if it was asked."""
        nbytes, digests = self.cost(frame) if cost is None else cost
        self.nbytes += nbytes
        self.frames[key] = frame
        self._seen |= digests


def frame_json(grid: PanelGrid, traits: dict[str, Any] | None = None) -> dict[str, Any]:
    """A grid as the page's JSON: the widget's traits, panels' data as base64 of the wire format, and
    ``traits``, the text traits that go with the state (the layer read-out...).

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
        del encoded["key"]  # (a page holds every frame's cells: there is no kernel to spare)
        encoded["data"] = base64.b64encode(encoded["data"]).decode("ascii")
        panels.append(encoded)
    return {
        "vmin": grid.vmin,
        "vmax": grid.vmax,
        "colormap": grid.colormap,
        "colorbar_label": grid.colorbar_label,
        "columns": grid.columns,
        "traits": dict(traits or {}),
        "panels": panels,
        "charts": [encode_chart(c) for c in grid.charts],
    }


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
    if isinstance(source, PanelGrid):
        if layers is not None:
            raise ExportError("layers= needs a view with a layer slider; a PanelGrid has one panel set")
        frames = Frames(state={"view": "", "controls": []})
        frames.add(state_key([]), frame_json(grid_of(source)))
        _check_size(frames, max_bytes)
        return frames
    if not isinstance(source, View):
        if layers is not None:
            raise ExportError(f"{type(source).__name__} has no layer slider; layers= does not apply")
        frames = Frames(state={"view": str(getattr(source, "view", "")), "controls": []})
        frames.add(state_key([]), frame_json(grid_of(source)))
        _check_size(frames, max_bytes)
        return frames
    return _view_frames(source, layers, max_bytes, max_states, progress)


def _view_frames(
    view: View, layers: Sequence[int] | None, max_bytes: int, max_states: int, progress: bool
) -> Frames:
    saved = view.current_state()
    grid_of(view)  # the saved state must be one the view can show (else: why it cannot be saved)
    controls = view.view_controls()
    axes, left_out = _axes(view, saved, layers)
    base = saved
    window = _whole_window(view, saved)
    if window is not None:
        base = saved.replace(**window)
    state: dict[str, Any] = {"view": view.view_name, "controls": []}
    frames = Frames(state=state, axes=axes)
    notes = list(left_out)
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
        key = state_key([_keyed(axis, v) for axis, v in zip(axes, values, strict=True)])
        each = base.replace(**{axis.trait: v for axis, v in zip(axes, values, strict=True)})
        held += 1
        try:
            grid = _check(view.compute(each, None), empty=True)
            traits = view.labels(each)
        except STATE_ERRORS as err:
            frames.errors[key] = str(err)
            continue
        frame = frame_json(grid, traits)
        if window is not None:
            frame["window"] = True
        cost = frames.cost(frame)
        if distance > 0 and frames.nbytes + cost[0] > max_bytes:
            held -= 1
            break  # the saved state at every layer is in; the states further away would not fit
        frames.add(key, frame, cost)
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
            "most options changed from the saved one; save with a larger max_states to hold more"
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
    saved_key = state_key([_keyed(axis, getattr(saved, axis.trait)) for axis in axes])
    opening = saved_key if saved_key in frames.frames else next(iter(frames.frames))
    if opening != saved_key:  # the saved layer was not exported: open on the first held state
        for axis, value in zip(axes, json.loads(opening), strict=True):
            state[axis.trait] = value
    state.update(frames.frames[opening]["traits"])
    frames.state["opening"] = opening
    frames.note = "; ".join(notes)
    return frames


def _axes(view: View, saved: Any, layers: Sequence[int] | None) -> tuple[list[Axis], list[str]]:
    """The controls the page holds frames for, with their values, and what it cannot offer."""
    axes: list[Axis] = []
    notes: list[str] = []
    fields = saved.values()
    for control in view.view_controls():
        if control.trait not in fields:
            if control.type == "entry":
                notes.append(f"“{control.label}” needs Python: open the view in a notebook to add one")
            continue
        value = fields[control.trait]
        if control.type == "slider":
            count = int(getattr(view, control.count))
            if count < 1:
                continue
            positions = range(count) if layers is None or control.trait != "layer" else layers
            axes.append(Axis(control, sorted({int(x) for x in positions}), value))
        elif control.type in ("toggles", "select"):
            options = [str(o) for o in getattr(view, control.options)]
            if options:
                axes.append(Axis(control, options, value))
        elif control.type == "checklist":
            options = [str(o) for o in getattr(view, control.options)]
            if len(options) > MAX_CHECKLIST_OPTIONS:
                axes.append(Axis(control, [value], value))
                notes.append(
                    f"“{control.label}” has {len(options)} options: this page holds the saved choice only "
                    f"(the subsets of at most {MAX_CHECKLIST_OPTIONS})"
                )
            else:
                subsets = [
                    [o for o, on in zip(options, mask, strict=True) if on]
                    for mask in itertools.product((True, False), repeat=len(options))
                ]
                axes.append(Axis(control, subsets, value))
    if layers is not None and not any(a.trait == "layer" and a.control.type == "slider" for a in axes):
        raise ExportError(f"{type(view).__name__} here has no layer slider; layers= does not apply")
    if any(a.control.play for a in axes):  # the played slider is the one whose every position is held
        for axis in axes:
            axis.free = axis.control.type != "slider" or axis.control.play
    return axes, notes


def _keyed(axis: Axis, value: Any) -> Any:
    """A value as the page keys it: a checklist's choice in the order of its options."""
    if axis.control.type == "checklist":
        order = {o: i for i, o in enumerate(axis.options)}
        return sorted((str(v) for v in value), key=lambda v: order.get(v, len(order)))
    return value  # a slider's position, a toggle's or a select's option


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


def _window_total(view: View, control: Control) -> int:
    return int(getattr(view, control.total))


def _whole_window(view: View, saved: Any) -> dict[str, int] | None:
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
