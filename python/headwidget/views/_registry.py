"""The view registry: every view by name, in the order the views ask for.

A view module registers its class with ``@register_view("name")``; :mod:`headwidget.views` imports
every view module of the package, so a new view is one file. The command line (``figure --view``),
the magic (``--view``), ``explore`` and the export read this registry.

Example:
    >>> view_names()[:3]
    ['channels', 'alignment', 'mechanisms']
    >>> view_class("alignment").title
    'Head alignment'
    >>> try:
    ...     view_class("attention")
    ... except UnknownViewError as err:
    ...     print(err)  # doctest: +ELLIPSIS
    unknown view 'attention'; the views are channels, alignment, mechanisms, consequences, healing, ...
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from headwidget.errors import UnknownViewError
from headwidget.views._base import View
from headwidget.views._sources import ViewSources

__all__ = ["UnknownViewError", "register_view", "view_class", "view_names"]

_VIEWS: dict[str, type[View[Any]]] = {}
_ORDER: dict[str, int] = {}
C = TypeVar("C", bound=type[View[Any]])


def register_view(name: str, *, order: int = 100) -> Callable[[C], C]:
    """Class decorator: register a :class:`View` subclass as ``name`` (sets ``view_name``).

    ``order`` places the view in :func:`view_names` (tabs, ``--view`` choices): lower first, equal
    orders by name. A second class under a name already taken is an error; the same class again (a
    module imported twice) replaces the first.
    """

    def add(cls: C) -> C:
        known = _VIEWS.get(name)
        if known is not None and (known.__module__, known.__qualname__) != (cls.__module__, cls.__qualname__):
            raise ValueError(
                f"a view called {name!r} is already registered: {known.__module__}.{known.__qualname__}"
            )
        if not isinstance(cls.sources, ViewSources):
            raise TypeError(f"{cls.__qualname__}.sources must say what the view is built from: a ViewSources")
        cls.view_name = name
        if not cls.title:
            cls.title = name.capitalize()
        _VIEWS[name] = cls
        _ORDER[name] = order
        return cls

    return add


def view_names() -> list[str]:
    """The registered view names, ordered by their ``order``, then by name."""
    return sorted(_VIEWS, key=lambda name: (_ORDER[name], name))


def view_class(name: str) -> type[View[Any]]:
    """The view registered as ``name``; :class:`~headwidget.errors.UnknownViewError` lists the names."""
    if name not in _VIEWS:
        raise UnknownViewError(f"unknown view {name!r}; the views are {', '.join(view_names())}")
    return _VIEWS[name]
