"""What a view is built from, as the view declares it (its class attribute ``sources``).

A view names what it is built from: ``main``, the one source it cannot do without (``stats``,
captured statistics; ``model``, a model's weights; ``report``, an evaluation report; ``timeline``, a
training run's snapshots; ``healing``, healing runs; ``""``: nothing), its constructor's first
argument; ``optional``, the other sources it takes by keyword when they are there (the mechanisms
view's ``stats`` and ``report``, the trends' ``model``, the quantization view's ``report``);
``layers``, what it does with the layers a user names (``pinned``: the first selected, the rest
pinned beside it; ``layers``: all of them shown together when there are several; ``layer``: the
first selected); and whether its constructor takes ``prefetch``, which ``interactive`` sets. The
sources a view is built from must be of one model (:mod:`~headwidget.views._models`).

So :meth:`View.create <headwidget.views.View.create>`, which the command line, the magic and
``explore`` build every view through, is written once, for every view, from these facts.

Example:
    >>> from headwidget.views import view_class
    >>> view_class("mechanisms").sources
    ViewSources(main='model', optional=('stats', 'report'), layers='layer', prefetch=True)
    >>> view_class("channels").sources.layers
    'pinned'
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

__all__ = ["SOURCE_NAMES", "ViewSources", "missing_source"]

#: What views are built from (a view's constructor takes its main source first, the others by keyword).
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
    """What a view is built from and takes (see the module docstring); a name that is not a source
    is refused when the class is declared.

    >>> ViewSources("weights")
    Traceback (most recent call last):
    ...
    ValueError: a view is built from one of stats, model, report, timeline, healing (or ""), not 'weights'
    """

    main: str = ""
    optional: tuple[str, ...] = ()
    layers: Literal["pinned", "layers", "layer", ""] = ""
    prefetch: bool = False

    def __post_init__(self) -> None:
        for name in ((self.main,) if self.main else ()) + self.optional:
            if name not in SOURCE_NAMES:
                raise ValueError(
                    f'a view is built from one of {", ".join(SOURCE_NAMES)} (or ""), not {name!r}'
                )

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


def missing_source(view: str, source: str) -> str:
    """The message for the ``view`` view asked for without its ``source``.

    Example:
        >>> missing_source("healing", "healing")
        "the healing view needs healing runs: healing={'mqa': headwidget.heal(...)}"
    """
    return f"the {view} view needs {_WHAT[source]}"
