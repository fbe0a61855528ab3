"""What a view is built from, read off its one constructor.

A view has one constructor, its ``__init__``. Its first argument says what the view is built from,
by name: ``stats`` (captured statistics), ``model`` (a model's weights), ``report`` (an evaluation
report), ``timeline`` (a training run's snapshots) or ``healing`` (healing runs); the other sources it
takes by keyword are the ones it uses when they are there (the mechanisms view's ``stats``, the
trends' ``model``, the quantization view's ``report``). What a constructor does with the layers a
user names is read off it too: ``pinned`` takes the layers after the first, ``layers`` takes them all
when there are several, ``layer`` the first. And ``prefetch`` is what ``interactive`` sets.

So :meth:`View.create <headwidget.views.View.create>`, which the command line, the magic and
``explore`` build every view through, is written once, for every view, from these facts.

Example:
    >>> from headwidget.views import view_class
    >>> view_sources(view_class("mechanisms"))
    ViewSources(main='model', optional=('stats',), layers='layer', prefetch=True)
    >>> view_sources(view_class("channels")).layers
    'pinned'
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
from typing import Any, Literal

__all__ = ["SOURCE_NAMES", "ViewSources", "missing_source", "view_sources"]

#: What views are built from, by the name a constructor gives its argument.
SOURCE_NAMES = ("stats", "model", "report", "timeline", "healing")

#: What each source is, and how a user gets one (the end of the message when a view lacks it).
_WHAT: dict[str, str] = {
    "stats": "captured statistics (headwidget.capture(...) or KVStats.load(path))",
    "model": "a model (its weights)",
    "report": "an evaluation report: report=headwidget.evaluate(...)",
    "timeline": (
        "a timeline, not one capture: timeline=tracker.timeline, Timeline.load(path) or "
        "Timeline.from_checkpoints(...)"
    ),
    "healing": "healing runs: healing={'mqa': headwidget.heal(...)}",
}


@dataclasses.dataclass(frozen=True)
class ViewSources:
    """What a view's constructor takes, by its parameters' names.

    ``main``: the source it is built from (its first argument; ``""``: none); ``optional``: the
    other sources it takes by keyword; ``layers``: what it does with the layers a user names
    (``"pinned"``: the first selected, the rest pinned beside it; ``"layers"``: several shown
    together; ``"layer"``: the first selected; ``""``: it has no layer); ``prefetch``: whether it
    computes neighbours ahead.
    """

    main: str
    optional: tuple[str, ...]
    layers: Literal["pinned", "layers", "layer", ""]
    prefetch: bool

    def takes(self, source: str) -> bool:
        """Whether the view uses ``source`` (its main source or an optional one)."""
        return source == self.main or source in self.optional

    def arguments(self, layers: tuple[int, ...], interactive: bool) -> dict[str, Any]:
        """The constructor's keyword arguments for ``layers`` and ``interactive``.

        Example:
            >>> ViewSources("stats", (), "pinned", True).arguments((3, 1, 2), False)
            {'layer': 3, 'pinned': [1, 2], 'prefetch': False}
            >>> ViewSources("stats", (), "layers", False).arguments((3, 1), True)
            {'layers': [3, 1]}
        """
        found: dict[str, Any] = {}
        if layers and self.layers == "layers" and len(layers) > 1:
            found["layers"] = list(layers)
        elif layers and self.layers:
            found["layer"] = layers[0]
            if self.layers == "pinned":
                found["pinned"] = list(layers[1:])
        if self.prefetch:
            found["prefetch"] = interactive
        return found


@functools.cache
def view_sources(cls: type) -> ViewSources:
    """The :class:`ViewSources` of view class ``cls``, read off its ``__init__``.

    A constructor whose first positional argument is not one of :data:`SOURCE_NAMES` is a
    programming error, a TypeError (``register_view`` calls this, so it shows when the module is
    imported); one with no positional argument builds the view from nothing.
    """
    init = next(vars(k)["__init__"] for k in cls.__mro__ if "__init__" in vars(k))  # the one it runs
    parameters = list(inspect.signature(init).parameters.values())[1:]  # after self
    positional = [
        p.name
        for p in parameters
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    first = positional[0] if positional else ""  # "": built from nothing (a demonstration view)
    if first and first not in SOURCE_NAMES:
        raise TypeError(
            f"{cls.__qualname__}.__init__ must name what the view is built from as its first argument: "
            f"one of {', '.join(SOURCE_NAMES)}, not {first!r}"
        )
    names = {p.name for p in parameters[1:] if p.kind is inspect.Parameter.KEYWORD_ONLY}
    layers: Literal["pinned", "layers", "layer", ""] = (
        "pinned"
        if {"layer", "pinned"} <= names
        else "layers"
        if "layers" in names
        else "layer"
        if "layer" in names
        else ""
    )
    optional = tuple(name for name in SOURCE_NAMES if name in names)
    return ViewSources(first, optional, layers, "prefetch" in names)


def missing_source(view: str, source: str) -> str:
    """The message for the ``view`` view asked for without its ``source``.

    Example:
        >>> missing_source("healing", "healing")
        "the healing view needs healing runs: healing={'mqa': headwidget.heal(...)}"
    """
    return f"the {view} view needs {_WHAT[source]}"
