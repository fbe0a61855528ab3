"""Stored dataclasses and their one reader: a file's JSON is checked against the classes it loads into.

A field made by :func:`stored`, or annotated ``Annotated[T, Stored(...)]``, carries what a reader checks
beyond its type: the bounds of its numbers, whether its floats are finite, whether its list may repeat
an item, and the words a message uses when the value has the wrong shape (:class:`Stored`).
:class:`StoredReader` checks a JSON value against a dataclass: every field against its annotated type
(``int``, ``float``, ``str``, ``bool``, a ``Literal``, ``X | None``, ``list[X]``, ``dict[str, X]``, a
nested dataclass, ``Any``) and these rules, naming the field as the file spells it
(``meta.layout.head_dim``, ``measures["mqa"]["kl"]``, ``snapshots[2].step``). Statistics metadata,
evaluation reports, healing runs and timeline indexes are all read by it; what types cannot say (a layer
below the model's layer count, a measure within its range) each format checks after, with the same
:meth:`StoredReader.fail`. A new field of a stored dataclass is then one edit: its line in the class.

:func:`parse_json` reads the JSON text itself: a key twice, an integer of a hundred digits or more,
nesting too deep, bytes that are not UTF-8 are refused, never a traceback.

Example:
    >>> from dataclasses import dataclass
    >>> @dataclass
    ... class Capture:
    ...     layers: list[int] = stored(minimum=0, unique="layer")
    ...     tokens: int = stored(default=0, minimum=0)
    >>> reader = StoredReader(ValueError, "capture.json", "capture again")
    >>> reader.read({"layers": [0, 2]}, Capture)
    Capture(layers=[0, 2], tokens=0)
    >>> reader.read({"layers": [0, 2, 2]}, Capture)
    Traceback (most recent call last):
    ...
    ValueError: capture.json is corrupt or incomplete: layers lists layer 2 twice; capture again
    >>> reader.read(parse_json(b'{"layers": [0], "tokens": -1}', reader.fail_whole), Capture)
    Traceback (most recent call last):
    ...
    ValueError: capture.json is corrupt or incomplete: tokens is -1, outside the allowed >= 0; capture again
"""

from __future__ import annotations

import dataclasses
import functools
import json
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import MISSING, Field, dataclass, field
from types import NoneType, UnionType
from typing import Annotated, Any, Literal, NoReturn, TypeVar, Union, get_args, get_origin, get_type_hints

__all__ = [
    "Stored",
    "StoredReader",
    "describe",
    "key",
    "parse_json",
    "saved_fields",
    "some",
    "stored",
    "unsaved",
]

T = TypeVar("T")
_MAX_DIGITS = 100  # an integer in a stored file has fewer digits than this


def stored(
    *,
    default: Any = MISSING,
    default_factory: Callable[[], Any] | Any = MISSING,
    minimum: float | None = None,
    maximum: float | None = None,
    finite: bool = False,
    unique: bool | str = False,
    expects: str | None = None,
) -> Any:
    """A dataclass field (required unless given a default) with the :class:`Stored` rules a reader checks
    beyond its type. (A required field after fields with defaults: annotate it ``Annotated[T,
    Stored(...)]`` instead, which type checkers read as a field without a default.)"""
    metadata = {"rules": Stored(minimum, maximum, finite, unique, expects)}
    if default_factory is not MISSING:
        return field(default_factory=default_factory, metadata=metadata)
    return field(default=default, metadata=metadata)


def unsaved(default: Any = None) -> Any:
    """A dataclass field that no file holds (a model, a cache): left out of :func:`saved_fields`, refused
    as an unknown field by the reader, and out of comparisons and the repr."""
    return field(default=default, compare=False, repr=False, metadata={"unsaved": True})


def saved_fields(cls: Any) -> list[Field[Any]]:
    """The fields of dataclass ``cls`` that its files hold (all but the :func:`unsaved` ones)."""
    return [f for f in dataclasses.fields(cls) if not f.metadata.get("unsaved")]


@dataclass(frozen=True)
class Stored:
    """What a reader checks of a stored field beyond its type.

    ``minimum`` and ``maximum`` bound every number in the field (an ``int``, a ``float``, the items of
    a list, the values of a mapping); a float with a bound, or with ``finite``, must be finite, but for
    NaN where ``nan`` allows it and +inf where ``inf`` does.
    ``unique``: no item of the list twice (a string names the items in the message: ``"layer"``).
    ``expects``: the message's words for a value of the wrong shape (``"must be a list of layer
    indices"``).
    """

    minimum: float | None = None
    maximum: float | None = None
    finite: bool = False
    unique: bool | str = False
    expects: str | None = None
    nan: bool = False
    inf: bool = False

    def allowed(self) -> str:
        low, high = self.minimum, self.maximum
        if high is None:
            return f">= {low:g}" if isinstance(low, float) else f">= {low}"
        return f"<= {high}" if low is None else f"{low}..{high}"


_NO_RULES = Stored()


def _rules_of(f: Field[Any], hint: Any) -> tuple[Any, Stored]:
    """A field's type without its annotations, and its rules (from ``Annotated`` or :func:`stored`)."""
    rules = f.metadata.get("rules")
    if get_origin(hint) is Annotated:
        hint, *extras = get_args(hint)
        rules = next((e for e in extras if isinstance(e, Stored)), rules)
    return hint, rules if isinstance(rules, Stored) else _NO_RULES


class _Oversized:
    """An integer in the JSON text too long to be a count (it is never converted, which costs time)."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _parse_int(text: str) -> int | _Oversized:
    digits = len(text.lstrip("-"))
    return int(text) if digits < _MAX_DIGITS else _Oversized(digits)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, value in pairs:
        if name in out:
            raise ValueError(f"the key {name!r} appears twice")
        out[name] = value
    return out


def parse_json(raw: bytes | str, fail: Callable[[str], NoReturn]) -> object:
    """The JSON value of ``raw``; ``fail`` gets what is wrong (``"is not valid JSON (...)"``) for text
    that is not UTF-8 or not JSON, a key twice, or nesting too deep. An integer of 100 digits or more is
    kept unconverted, so that a reader refuses it by field name (``NaN`` is a float: a field's rules say
    whether it may be one)."""
    if isinstance(raw, bytes):
        try:
            raw = raw.decode("utf-8")
        except UnicodeDecodeError as err:
            fail(f"is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start})")
    try:
        return json.loads(raw, object_pairs_hook=_unique_keys, parse_int=_parse_int)
    except RecursionError:
        fail("is JSON nested too deeply to be read")
    except ValueError as err:
        fail(f"is not valid JSON ({err})")


def describe(value: object) -> str:
    """A JSON value as a message shows it: ``null``, ``the number 3``, ``the string "x"``, ``a list of 2``."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, _Oversized):
        return f"a number of {value.digits} digits"
    if isinstance(value, (int, float)):
        text = repr(value)
        return f"the number {text if len(text) <= 40 else text[:37] + '...'}"
    if isinstance(value, str):
        text = json.dumps(value)
        return f"the string {text if len(text) <= 40 else text[:37] + '...'}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return "an object"


def key(name: str) -> str:
    """``name`` as a message shows a key: quoted and escaped as in JSON, shortened when long."""
    plain = name.isascii() and name.isprintable() and '"' not in name and "\\" not in name
    text = f'"{name}"' if plain else json.dumps(name)
    return text if len(text) <= 60 else text[:56] + '..."'


def some(names: Sequence[str], limit: int = 8) -> str:
    """The first ``limit`` of ``names``, comma-separated (a damaged file may list a million)."""
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _shallow_match(value: object, kind: Any) -> bool:
    """Whether a JSON value has the outer shape of type ``kind`` (a list for ``list[...]``, a string for a
    ``Literal``, a mapping of strings to strings for ``dict[str, str]``...), items unchecked but for a
    mapping's."""
    origin = get_origin(kind)
    if origin is list:
        return isinstance(value, list)
    if origin is dict:
        return isinstance(value, dict) and all(_shallow_match(v, get_args(kind)[1]) for v in value.values())
    if origin is Literal or kind is str:
        return isinstance(value, str)
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return type(value) is int
    return isinstance(value, dict)


def _scalar_problem(value: object, hint: Any, rules: Stored) -> str | None:
    """What is wrong with ``value`` as a JSON scalar of type ``hint`` under ``rules`` (None: nothing)."""
    if hint is str:
        return None if type(value) is str else f"must be a string, not {describe(value)}"
    if hint is bool:
        return None if type(value) is bool else f"must be true or false, not {describe(value)}"
    if get_origin(hint) is Literal:
        choices = get_args(hint)
        return (
            None if value in choices else f"is {value!r}; it must be one of {', '.join(map(repr, choices))}"
        )
    if isinstance(value, _Oversized):
        return f"is {describe(value)}, beyond any number a file holds"
    whole = hint is int
    if type(value) is not int and (whole or type(value) is not float):
        return f"must be {'an integer' if whole else 'a number'}, not {describe(value)}"
    assert isinstance(value, (int, float))
    low, high = rules.minimum, rules.maximum
    bounded = low is not None or high is not None
    allowed = (rules.nan and math.isnan(value)) or (rules.inf and value == math.inf)
    if not whole and (bounded or rules.finite) and not math.isfinite(value):
        return (
            None
            if allowed
            else f"is {value!r}; it must be a finite number" + (f" {rules.allowed()}" if bounded else "")
        )
    if (low is not None and value < low) or (high is not None and value > high):
        return f"is {value!r}, outside the allowed {rules.allowed()}"
    return None


@functools.cache
def _hints(cls: type) -> dict[str, Any]:
    return get_type_hints(cls, include_extras=True)


def _join(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name


class StoredReader:
    """Reads JSON values into stored dataclasses, refusing every value its type and field do not allow.

    Each problem raises ``error`` as ``{where}: {field} {problem}; {repair}`` (``where`` defaults to
    ``"{source} is corrupt or incomplete"``), the field named as in the file (see the module docstring).
    """

    def __init__(
        self, error: Callable[[str], Exception], source: str, repair: str, *, where: str | None = None
    ) -> None:
        self.error, self.source, self.repair = error, source, repair
        self.where = f"{source} is corrupt or incomplete" if where is None else where

    def fail(self, field: str, problem: str) -> NoReturn:
        raise self.error(f"{self.where}: {field} {problem}; {self.repair}")

    def fail_whole(self, problem: str) -> NoReturn:
        """Refuse the file as a whole (``problem``: ``"is not valid JSON (...)"``...)."""
        raise self.error(f"{self.source} {problem}; {self.repair}")

    # ------------------------------------------------------------------ objects
    def read(self, value: object, cls: type[T], path: str = "") -> T:
        """An instance of dataclass ``cls`` from the JSON object ``value``, every field checked."""
        return cls(**self.fields(value, cls, path))

    def fields(self, value: object, cls: type, path: str = "") -> dict[str, Any]:
        """The fields of dataclass ``cls`` in the JSON object ``value``, each checked against its annotated
        type and its :func:`stored` rules (a field left out takes the class's default; a field the class
        lacks is refused)."""
        known = saved_fields(cls)
        obj = self.keys(value, path, [f.name for f in known])
        hints = _hints(cls)
        out = {}
        for f in known:
            if f.name in obj:
                hint, rules = _rules_of(f, hints[f.name])
                out[f.name] = self.typed(obj[f.name], hint, _join(path, f.name), rules)
            elif f.default is MISSING and f.default_factory is MISSING:
                self.fail(_join(path, f.name), "is missing")
        return out

    def keys(self, value: object, path: str, known: Sequence[str], whose: str = "known:") -> dict[str, Any]:
        """``value`` as a JSON object with no key but ``known`` (``whose`` introduces them)."""
        where = path or "the file"
        if not isinstance(value, dict):
            self.fail(where, f"must be an object, not {describe(value)}")
        unknown = [k for k in value if k not in known]
        if unknown:
            self.fail(
                where, f"has unknown fields {some([key(k) for k in unknown])} ({whose} {', '.join(known)})"
            )
        return value

    # ------------------------------------------------------------------ values
    def typed(self, value: object, hint: Any, path: str, rules: Stored = _NO_RULES) -> Any:
        """``value`` as type ``hint`` under ``rules`` (the module docstring lists the types); a nested
        dataclass is built, every other value returned as it is."""
        if get_origin(hint) in (Union, UnionType):  # X | None
            if value is None:
                return None
            (hint,) = [a for a in get_args(hint) if a is not NoneType]
        if rules.expects is not None and not _shallow_match(value, hint):
            self.fail(path, f"{rules.expects}, not {describe(value)}")
        origin = get_origin(hint)
        if origin is list:
            if not isinstance(value, list):
                self.fail(path, f"must be a list, not {describe(value)}")
            items = self._items(enumerate(value), get_args(hint)[0], path, rules)
            if rules.unique:
                self._unique(items, path, rules.unique)
            return items
        if origin is dict:
            if not isinstance(value, dict):
                self.fail(path, f"must be an object, not {describe(value)}")
            return dict(zip(value, self._items(value.items(), get_args(hint)[1], path, rules), strict=True))
        if dataclasses.is_dataclass(hint) and isinstance(hint, type):
            return self.read(value, hint, path)
        if hint is Any:
            return value
        if hint not in (str, bool, int, float) and get_origin(hint) is not Literal:
            raise TypeError(f"{path}: a stored field cannot have the type {hint!r}")
        if (problem := _scalar_problem(value, hint, rules)) is not None:
            self.fail(path, problem)
        return value

    def _items(self, items: Iterable[tuple[Any, Any]], hint: Any, path: str, rules: Stored) -> list[Any]:
        """The checked values of a list's ``(index, item)`` or a mapping's ``(key, value)`` pairs; a scalar
        item type is checked without naming each item (a file may hold a million)."""
        scalar = hint in (str, bool, int, float) or get_origin(hint) is Literal
        inner = dataclasses.replace(rules, expects=None, unique=False)
        out = []
        for label, item in items:
            problem = _scalar_problem(item, hint, rules) if scalar else None
            if scalar and problem is None:
                out.append(item)
                continue
            name = f"{path}[{label}]" if isinstance(label, int) else f"{path}[{key(label)}]"
            if problem is not None:
                self.fail(name, problem)
            out.append(self.typed(item, hint, name, inner))
        return out

    def _unique(self, items: list[Any], path: str, noun: bool | str) -> None:
        seen: set[Any] = set()
        for item in items:
            if item in seen:
                self.fail(
                    path, f"lists {noun} {item} twice" if isinstance(noun, str) else f"lists {item!r} twice"
                )
            seen.add(item)

    def integer(self, value: object, path: str, low: int | None = None, high: int | None = None) -> int:
        """``value`` as an integer in ``low..high`` (bounds known only from other fields)."""
        self.typed(value, int, path, Stored(low, high))
        assert isinstance(value, int)
        return value

    def document(
        self, data: object, cls: type, *, tag: str, version: int, noun: str, how_to_save: str
    ) -> dict[str, Any]:
        """The fields of ``cls`` in a file ``{"format": tag, "version": version, ...fields}``."""
        if not isinstance(data, dict) or data.get("format") != tag:
            got = (
                f"its format is {describe(data.get('format'))}"
                if isinstance(data, dict)
                else f"it holds {describe(data)}, not an object"
            )
            raise self.error(f"{self.source} is not a headwidget {noun} ({got}, not {tag!r}); {how_to_save}")
        if "version" not in data:
            self.fail("version", "is missing")
        if self.integer(data["version"], "version") != version:
            raise self.error(
                f"{self.source}: version is {data['version']}, but this headwidget reads {noun} version "
                f"{version} only; read it with the headwidget that wrote it, or upgrade headwidget "
                "(pip install -U headwidget)"
            )
        rest = {k: v for k, v in data.items() if k not in ("format", "version")}
        return self.fields(rest, cls)
