"""How a saved page works each type of control: the one place that says so on the kernel's side.

Each control a page holds frames for is an :class:`Axis`: the values it can give its trait, how far a
value is from the saved one (nearest states first), how a value is written in a state's key.
:data:`RULES` has a :class:`ControlRules` per control type (``tests/export/test_protocol.py`` checks
none is missing); its twin on the page is ``js/lib/offline.ts``'s ``OFFLINE_RULES``:

- ``slider``: every position (its ``positions`` when it lists them; ``layers=``: those layers); no
  distance while it moves freely, but
  when another slider plays (a timeline's steps), one per position away from the saved one;
- ``toggles``, ``select``: every option; 1 when it is another;
- ``checklist``: every subset of at most :data:`MAX_CHECKLIST_OPTIONS` options (else the saved
  choice only); the options added or removed; keyed in the order of the options;
- ``window``: no axis: the page crops whole matrices to the window (``_source._whole_window``);
- ``entry``: no axis: typing a spec needs Python, and the page says so.

Example:
    >>> from headwidget.views import checklist
    >>> control = checklist("Mechanisms", options="specs").bind("mechanisms")
    >>> axis = Axis(control, [["mha", "mqa"], ["mha"], ["mqa"], []], ["mha"], options=["mha", "mqa"])
    >>> axis.distance(["mqa"]), axis.keyed(["mqa", "mha"]), axis.to_json()["options"]
    (2, ['mha', 'mqa'], ['mha', 'mqa'])
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from headwidget.views import Control, View

__all__ = ["MAX_CHECKLIST_OPTIONS", "RULES", "Axis", "ControlRules", "page_axes"]

#: Most options a checklist may have for the page to hold its subsets (2⁸ = 256 of them); a longer
#: one keeps the saved choice only.
MAX_CHECKLIST_OPTIONS = 8


@dataclass
class Axis:
    """One control the page holds frames for: the values it can give its trait, the saved one, and
    (a checklist) the order of its options."""

    control: Control
    values: list[Any]
    saved: Any
    options: list[str] = field(default_factory=list)
    #: A slider that moves for free (every slider, unless another one plays).
    free: bool = True

    @property
    def trait(self) -> str:
        return self.control.trait

    @property
    def rules(self) -> ControlRules:
        return RULES[self.control.type]

    def distance(self, value: Any) -> int:
        """How far ``value`` is from the saved one."""
        return self.rules.distance(self, value)

    def keyed(self, value: Any) -> Any:
        """``value`` as a state's key writes it."""
        return self.rules.keyed(self, value)

    def to_json(self) -> dict[str, Any]:
        """The axis as the page reads it: trait, control type, label, and the values held (a
        checklist: its options, the order its keys use)."""
        data: dict[str, Any] = {"trait": self.trait, "type": self.control.type, "label": self.control.label}
        data.update(
            {"options": self.options} if self.control.type == "checklist" else {"values": self.values}
        )
        return data


class ControlRules:
    """How a page works one type of control; the defaults are those of a control of options."""

    def axis(
        self, view: View[Any], control: Control, saved: Any, layers: Sequence[int] | None
    ) -> Axis | None:
        """The axis the page holds for ``control`` of ``view`` (None: none)."""
        options = [str(o) for o in getattr(view, control.options)]
        return Axis(control, options, saved) if options else None

    def note(self, view: View[Any], control: Control) -> str:
        """What the page says it cannot offer of ``control`` (``""``: nothing)."""
        return ""

    def distance(self, axis: Axis, value: Any) -> int:
        return int(value != axis.saved)

    def keyed(self, axis: Axis, value: Any) -> Any:
        return value


class _Slider(ControlRules):
    def axis(
        self, view: View[Any], control: Control, saved: Any, layers: Sequence[int] | None
    ) -> Axis | None:
        count = int(getattr(view, control.count))
        listed = list(getattr(view, control.positions)) if control.positions else []
        positions = (listed or range(count)) if layers is None or control.trait != "layer" else layers
        return Axis(control, sorted({int(x) for x in positions}), saved) if count > 0 else None

    def distance(self, axis: Axis, value: Any) -> int:
        return 0 if axis.free else abs(int(value) - int(axis.saved))


class _Checklist(ControlRules):
    def axis(
        self, view: View[Any], control: Control, saved: Any, layers: Sequence[int] | None
    ) -> Axis | None:
        options = [str(o) for o in getattr(view, control.options)]
        if len(options) > MAX_CHECKLIST_OPTIONS:
            return Axis(control, [saved], saved, options=list(saved))
        masks = itertools.product((True, False), repeat=len(options))
        return Axis(
            control, [[o for o, on in zip(options, m, strict=True) if on] for m in masks], saved, options
        )

    def note(self, view: View[Any], control: Control) -> str:
        count = len(getattr(view, control.options))
        return (
            f"“{control.label}” has {count} options: this page holds the saved choice only (the subsets of "
            f"at most {MAX_CHECKLIST_OPTIONS})"
            if count > MAX_CHECKLIST_OPTIONS
            else ""
        )

    def distance(self, axis: Axis, value: Any) -> int:
        return len(set(value) ^ set(axis.saved))

    def keyed(self, axis: Axis, value: Any) -> Any:
        order = {o: i for i, o in enumerate(axis.options)}
        return sorted((str(v) for v in value), key=lambda v: order.get(v, len(order)))


class _Window(ControlRules):
    def axis(
        self, view: View[Any], control: Control, saved: Any, layers: Sequence[int] | None
    ) -> Axis | None:
        return None  # (the page crops whole matrices to the window)


class _Entry(_Window):
    def note(self, view: View[Any], control: Control) -> str:
        return f"“{control.label}” needs Python: open the view in a notebook to add one"


#: The rules of each control type (``core.protocol.CONTROL_TYPES``).
RULES: dict[str, ControlRules] = {
    "slider": _Slider(),
    "window": _Window(),
    "toggles": ControlRules(),
    "select": ControlRules(),
    "checklist": _Checklist(),
    "entry": _Entry(),
}


def page_axes(view: View[Any], layers: Sequence[int] | None) -> tuple[list[Axis], list[str]]:
    """The controls a page of ``view`` holds frames for, at the view's state, and what it cannot offer.

    Example:
        >>> import torch, headwidget
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4)).eval()
        >>> view = headwidget.MechanismView(model, mechanisms=["mha", "mqa"], prefetch=False)
        >>> axes, notes = page_axes(view, layers=[1])
        >>> [(a.trait, len(a.values)) for a in axes], notes[0][:28]
        ([('layer', 1), ('circuit', 2), ('mechanisms', 4)], '“Add mechanism” needs Python')
    """
    saved = view.current_state().values()
    axes: list[Axis] = []
    notes: list[str] = []
    for control in view.view_controls():
        rules = RULES[control.type]
        axis = rules.axis(view, control, saved.get(control.trait), layers)
        axes += [axis] if axis is not None else []
        notes += [note] if (note := rules.note(view, control)) else []
    if any(a.control.play for a in axes):  # the played slider is the one whose every position is held
        for axis in axes:
            axis.free = axis.control.type != "slider" or axis.control.play
    return axes, notes
