"""Dataclass fields that say what a stored value may be, so that a file reader checks it from the class.

A field made by :func:`stored` carries, beside its default, the bounds of an integer and the words a
message uses when the value has the wrong type; a reader
(:class:`headwidget.stats._file._FileCheck`) checks every field of a dataclass against its annotated
type (``int``, ``str``, ``bool``, a ``Literal``, ``X | None``, ``list[X]``, ``dict[str, X]``, a nested
dataclass) and these bounds. A new field of a stored dataclass is then one edit: its line in the class.

Example:
    >>> from dataclasses import dataclass, fields
    >>> @dataclass
    ... class Capture:
    ...     tokens: int = stored(default=0, minimum=0)
    >>> bounds(fields(Capture)[0])
    (0, None)
    >>> Capture().tokens
    0
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, Field, field
from typing import Any

__all__ = ["bounds", "expects", "stored"]


def stored(
    *,
    default: Any = MISSING,
    default_factory: Callable[[], Any] | Any = MISSING,
    minimum: int | None = None,
    maximum: int | None = None,
    expects: str | None = None,
) -> Any:
    """A dataclass field (required unless given a default) with what a reader checks beyond its type:
    an integer's ``minimum`` and ``maximum``, and ``expects``, the message's words for a value of the
    wrong type (``"must be a list of layer indices"``)."""
    metadata = {"minimum": minimum, "maximum": maximum, "expects": expects}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def bounds(f: Field[Any]) -> tuple[int | None, int | None]:
    """The ``(minimum, maximum)`` a :func:`stored` field allows (None: unbounded)."""
    return f.metadata.get("minimum"), f.metadata.get("maximum")


def expects(f: Field[Any]) -> str | None:
    """What a message says a :func:`stored` field must be, when its value has the wrong type."""
    return f.metadata.get("expects")
