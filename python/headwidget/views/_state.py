"""A view's state: a frozen dataclass whose fields carry the control that shows each, and the
traits made from it.

One field per thing a user chooses (the layer, the kind of keys...), with its type, its default and,
through :func:`state`, the control that shows it and whether a dashboard shares it. A view class names
its state as its parameter (``View[ChannelState]``); its state traits are made from the fields
(:func:`state_traits`), and :meth:`View.compute <headwidget.views.View.compute>` receives them as one
typed, hashable value (lists held as tuples), which mypy checks field by field.

Example:
    >>> from headwidget.views import slider
    >>> @dataclasses.dataclass(frozen=True)
    ... class Scaled(ViewState):
    ...     layer: int = state(0, slider("Layer", count="num_layers"), shared=True)
    ...     factors: tuple[float, ...] = (1.0,)
    >>> traits = state_traits(Scaled)
    >>> type(traits["layer"]).__name__, traits["layer"].metadata["control"].type, traits["factors"].default()
    ('WholeNumber', 'slider', [1.0])
    >>> Scaled().replace(factors=[2.0, 3.0]), shared_fields(Scaled)
    (Scaled(layer=0, factors=(2.0, 3.0)), ['layer'])
"""

from __future__ import annotations

import dataclasses
import typing
from typing import Any, TypeVar

import traitlets as t

from headwidget.views._controls import Control

__all__ = ["ViewState", "WholeNumber", "field_controls", "frozen", "shared_fields", "state", "state_traits"]

T = TypeVar("T")
S = TypeVar("S", bound="ViewState")


class WholeNumber(t.Int):  # type: ignore[type-arg]
    """An integer trait that refuses bools too (``True`` is not a layer or a channel, though Python's
    ``bool`` is an ``int``); floats and strings are refused as by ``traitlets.Int``.

    Example:
        >>> class Counted(t.HasTraits):
        ...     n = WholeNumber(0)
        >>> Counted(n=3).n
        3
        >>> Counted(n=True)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        traitlets.traitlets.TraitError: The 'n' trait of a Counted instance expected an int, not the bool...
    """

    def validate(self, obj: Any, value: Any) -> Any:
        if isinstance(value, bool):
            self.error(obj, value)
        return super().validate(obj, value)


def state(default: T, control: Control | None = None, *, shared: bool = False) -> T:
    """A state field's default, with the ``control`` that shows it and whether a dashboard shares it
    between its views (``shared``: the same field of every view that shares it moves together)."""
    return dataclasses.field(default=default, metadata={"control": control, "shared": shared})


def frozen(value: Any) -> Any:
    """A trait value as a state holds it: a list (of lists) as a tuple (of tuples)."""
    return tuple(frozen(v) for v in value) if isinstance(value, list | tuple) else value


def thawed(value: Any) -> Any:
    """A state's value as its trait holds it: tuples back to lists."""
    return [thawed(v) for v in value] if isinstance(value, tuple) else value


@dataclasses.dataclass(frozen=True)
class ViewState:
    """Base of every view's state: frozen, hashable (a cache key), so it cannot change under a
    computation. Subclasses are frozen dataclasses whose fields default through :func:`state` or plainly."""

    def replace(self: S, **changes: Any) -> S:
        """This state with some fields changed (lists become tuples, as in every state)."""
        return dataclasses.replace(self, **{k: frozen(v) for k, v in changes.items()})

    def values(self) -> dict[str, Any]:
        """The fields as trait values (tuples back to lists)."""
        return {f.name: thawed(getattr(self, f.name)) for f in dataclasses.fields(self)}


#: The trait of each field type a state may hold.
_TRAITS: dict[Any, type[t.TraitType[Any, Any]]] = {
    int: WholeNumber,
    str: t.Unicode,
    float: t.Float,
    bool: t.Bool,
}


def state_traits(cls: type[ViewState]) -> dict[str, t.TraitType[Any, Any]]:
    """One synced trait per field of ``cls``, tagged with its control (``int``: a :class:`WholeNumber`;
    ``str``, ``float``, ``bool``; ``tuple[X, ...]``: a list of X)."""
    hints = typing.get_type_hints(cls)
    traits: dict[str, t.TraitType[Any, Any]] = {}
    for f in dataclasses.fields(cls):
        hint, default = hints[f.name], f.default
        if typing.get_origin(hint) is tuple and isinstance(default, tuple):
            item = _TRAITS[typing.get_args(hint)[0]]()
            trait: t.TraitType[Any, Any] = t.List(item, default_value=list(default))
        elif hint in _TRAITS and default is not dataclasses.MISSING:
            trait = _TRAITS[hint](default)
        else:
            raise TypeError(
                f"{cls.__qualname__}.{f.name}: a state field is an int, str, float, bool or a tuple, "
                "with a default"
            )
        traits[f.name] = trait.tag(sync=True, state=True, **f.metadata)
    return traits


def field_controls(cls: type[ViewState]) -> list[Control]:
    """The controls of ``cls``'s fields, in field order, each bound to its field."""
    return [f.metadata["control"].bind(f.name) for f in dataclasses.fields(cls) if f.metadata.get("control")]


def shared_fields(cls: type[ViewState]) -> list[str]:
    """The fields of ``cls`` that a dashboard shares between its views."""
    return [f.name for f in dataclasses.fields(cls) if f.metadata.get("shared")]
