"""What the control bar shows for a view: one :class:`Control` per state trait that has a control.

A view tags a state trait with the control that shows it (see :func:`~headwidget.views.state`); the
front end (``js/ui/controls.ts``) builds the bar from these descriptions, in declaration order, and
knows nothing about any particular view. A control names the traits it reads besides its own:

- ``slider``: an integer in ``0 .. count - 1`` (``count`` names the trait holding the number of
  positions; hidden below 1), with the text of the ``text`` trait beside it; with ``positions``, only
  the values listed in that trait (the layers captured, say: a slider over ``[8, ..., 15]`` of a
  model's 30 layers stops at those alone, and says them as they are); with ``play``, a
  play/pause button beside it steps through the positions in turn (training steps, say), and a saved
  page holds every position of that slider before any other (:mod:`headwidget.export._source`);
- ``window``: a window ``[trait, trait + width)`` inside ``0 .. total`` (two sliders: start and width,
  each with a field for exact values; hidden when ``total`` is 0); with ``step`` naming a trait that
  holds more than 1 (a head's channels, say), start and width snap to its multiples;
- ``toggles``, ``select``: one value of the list in the ``options`` trait (hidden when it is empty);
- ``checklist``: a sub-list of the ``options`` trait;
  these three show an option as its entry in ``labels`` (a fixed option → text map), else as itself;
- ``entry``: a text field; the text a user submits is set on the trait (a spec to add, say), which the
  view reads and clears.

Example:
    >>> slider("Layer", count="num_layers", text="layer_label").bind("layer").to_json()
    {'trait': 'layer', 'type': 'slider', 'label': 'Layer', 'count': 'num_layers', 'text': 'layer_label'}
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal

from headwidget.checks import flag
from headwidget.core.protocol import CONTROL_FIELDS, CONTROL_TYPES

__all__ = ["Control", "ControlType", "checklist", "entry", "select", "slider", "toggles", "window"]

#: The kinds of control: ``core/protocol.py``'s ``CONTROL_TYPES``, as a type (a test keeps them equal).
ControlType = Literal["slider", "window", "toggles", "select", "checklist", "entry"]
#: The fields of a control that name other traits it reads.
REFERENCES = tuple(f for f, kind in CONTROL_FIELDS.items() if kind == "string?")


@dataclass(frozen=True)
class Control:
    """A control of the bar: its type, label and the traits it reads (``""``: none).

    ``trait`` is the state trait it sets; :meth:`bind` fills it in when the view lists its controls.
    ``labels``: ``(option, text)`` pairs, the words an option is shown as (options not listed show as
    themselves). ``play``: a slider with a play/pause button (only a slider has one).
    """

    type: ControlType
    label: str
    count: str = ""
    text: str = ""
    width: str = ""
    total: str = ""
    options: str = ""
    step: str = ""
    positions: str = ""
    trait: str = ""
    labels: tuple[tuple[str, str], ...] = ()
    play: bool = False

    def __post_init__(self) -> None:
        if self.type not in CONTROL_TYPES:
            raise ValueError(f"unknown control type {self.type!r}; the types are {', '.join(CONTROL_TYPES)}")
        missing = [f for f in CONTROL_TYPES[self.type] if not getattr(self, f)]
        if missing:
            raise ValueError(f"a {self.type} control names the traits it reads: {', '.join(missing)}")
        if self.play is not True and self.play is not False:
            raise ValueError(f"play must be True or False, got {self.play!r}")
        if self.play and self.type != "slider":
            raise ValueError(f"only a slider has a play button, not a {self.type}")
        if self.positions and self.type != "slider":
            raise ValueError(f"only a slider stops at listed positions, not a {self.type}")

    def bind(self, trait: str) -> Control:
        """This control, setting ``trait``."""
        return dataclasses.replace(self, trait=trait)

    def traits(self) -> list[str]:
        """Every trait the control reads or sets: its own first, then the ones it refers to.

        Example:
            >>> window("Channels", width="channel_width", total="num_channels").bind("channel_start").traits()
            ['channel_start', 'channel_width', 'num_channels']
        """
        return [name for name in (self.trait, *(getattr(self, f) for f in REFERENCES)) if name]

    def to_json(self) -> dict[str, Any]:
        """The description the front end reads: ``trait``, ``type``, ``label``, the references set,
        the option ``labels`` (an object) when there are any and ``play`` when it is on.

        Example:
            >>> control = toggles("Kind", options="kinds", labels={"key_post": "post-RoPE"}).bind("kind")
            >>> control.to_json()["labels"], control.to_json()["options"]
            ({'key_post': 'post-RoPE'}, 'kinds')
        """
        values = {f: getattr(self, f) for f in CONTROL_FIELDS}
        values["labels"] = dict(self.labels)
        return {f: v for f, v in values.items() if v or f in ("trait", "type", "label")}


def slider(label: str, *, count: str, text: str = "", play: bool = False, positions: str = "") -> Control:
    """An integer slider over ``0 .. count - 1`` with the ``text`` trait as its read-out; ``play``: with
    a play/pause button that moves it one position at a time up to the last (pressed at the last, it
    starts again from the first); ``positions``: the trait listing the values it stops at, in order,
    when not all of ``0 .. count - 1`` (an empty list: all of them).

    Example:
        >>> slider("Step", count="num_steps", text="step_label", play=True).bind("step").to_json()["play"]
        True
        >>> slider("Layer", count="num_layers", positions="layer_positions").bind("layer").traits()
        ['layer', 'num_layers', 'layer_positions']
    """
    return Control("slider", label, count=count, text=text, play=flag("play", play), positions=positions)


def window(label: str, *, width: str, total: str, step: str = "") -> Control:
    """A start slider and a width slider for a window of ``label`` (e.g. channels) out of ``total``.

    ``step``: the trait holding the grid the window snaps to (start and width multiples of it when it
    is above 1; 0 or 1: no snapping), e.g. the channels of one head.

    Example:
        >>> control = window("Channels", width="channel_width", total="num_channels", step="channel_step")
        >>> control.bind("channel_start").traits()
        ['channel_start', 'channel_width', 'num_channels', 'channel_step']
    """
    return Control("window", label, width=width, total=total, step=step)


def _pairs(labels: Mapping[str, str] | None) -> tuple[tuple[str, str], ...]:
    return tuple((str(k), str(v)) for k, v in (labels or {}).items())


def toggles(label: str, *, options: str, labels: Mapping[str, str] | None = None) -> Control:
    """A group of toggle buttons, one per entry of the ``options`` trait, shown as its ``labels`` text."""
    return Control("toggles", label, options=options, labels=_pairs(labels))


def select(label: str, *, options: str, labels: Mapping[str, str] | None = None) -> Control:
    """A drop-down of the entries of the ``options`` trait, shown as their ``labels`` text."""
    return Control("select", label, options=options, labels=_pairs(labels))


def checklist(label: str, *, options: str, labels: Mapping[str, str] | None = None) -> Control:
    """A checkbox per entry of the ``options`` trait (shown as its ``labels`` text); the state trait is
    the list checked."""
    return Control("checklist", label, options=options, labels=_pairs(labels))


def entry(label: str) -> Control:
    """A text field; what a user submits is set on the trait.

    Example:
        >>> entry("Add mechanism").bind("add_mechanism").to_json()
        {'trait': 'add_mechanism', 'type': 'entry', 'label': 'Add mechanism'}
    """
    return Control("entry", label)
