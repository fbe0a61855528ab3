"""Evaluation report files: the JSON text that is saved and loaded, every field checked both ways.

:func:`report_text` (what :meth:`EvaluationReport.save <headwidget.evaluation.EvaluationReport.save>`
writes, after checking it) and :func:`read_report` (what :meth:`EvaluationReport.load
<headwidget.evaluation.EvaluationReport.load>` calls) share one set of checks, :class:`ReportCheck`.
Its type checks come from the report dataclass's field annotations (``int``, ``str``, ``list[str]``,
``dict[str, float]``, ``X | None``...), so a new field is checked as soon as it is declared; the rules
that types cannot state (the measures of each kind and their ranges, every variant in every table,
per-layer lists as long as ``layers``) are written out here once.

Example:
    >>> import pathlib, tempfile
    >>> path = pathlib.Path(tempfile.mkdtemp()) / "report.json"
    >>> _ = path.write_text('{"format": "headwidget-evaluation-report", "version": 1, "model": 7}')
    >>> from headwidget.evaluation import EvaluationReport
    >>> EvaluationReport.load(path)
    Traceback (most recent call last):
    ...
    headwidget.errors.ReportFileError: ...report.json is corrupt or incomplete: model must be a string, ...
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import stat
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, NoReturn

import torch

from headwidget.core.kinds import KINDS
from headwidget.errors import ArgumentError, ReportFileError
from headwidget.evaluation._inputs import parse_protocol

__all__ = [
    "ENCODER_MEASURES",
    "FORMAT",
    "LM_MEASURES",
    "MAX_REPORT_BYTES",
    "MEASURE_RANGES",
    "REPORT_SUFFIXES",
    "VERSION",
    "ReportCheck",
    "read_json",
    "read_report",
    "report_text",
]

LM_MEASURES = ("nll", "perplexity", "kl", "top1")
ENCODER_MEASURES = ("hidden_rel_error", "embedding_cosine")
FORMAT = "headwidget-evaluation-report"
VERSION = 1
#: What a report path may end with (in any case): JSON, or a markdown table.
REPORT_SUFFIXES = (".json", ".md")
#: Larger files are refused unread: thousands of variants over hundreds of layers take a few MiB.
MAX_REPORT_BYTES = 64 << 20
_MAX_DIGITS = 100  # an integer in a report file has fewer digits than this
_KINDS = {"causal-lm": LM_MEASURES, "encoder": ENCODER_MEASURES}
_PER_LAYER = {"causal-lm": "delta_nll", "encoder": "hidden_rel_error"}
#: The float32 rounding a mean KL of (nearly) equal distributions may fall below zero by, generously.
_KL_SLACK = 1e-5
#: The rounding a cosine may leave [-1, 1] by, generously.
_COSINE_SLACK = 1e-6
_REPAIR = (
    "the file was damaged or edited after EvaluationReport.save() wrote it; evaluate again or "
    "restore the file from a copy"
)


@dataclasses.dataclass(frozen=True)
class _Range:
    """The real numbers a measure may take: ``low..high``, and whether NaN or +inf can be true."""

    low: float
    high: float = math.inf
    nan: bool = False
    inf: bool = False

    def problem(self, value: float) -> str | None:
        if math.isnan(value):
            return None if self.nan else "is NaN; this measure is always defined"
        if math.isinf(value) and not (self.inf and value > 0):
            return f"is {value}; it must be finite"
        if not self.low <= value <= self.high:
            allowed = f">= {self.low:g}" if self.high == math.inf else f"in [{self.low:g}, {self.high:g}]"
            return f"is {value!r}; it must be {allowed}"
        return None


#: Each measure's range. NLL, KL and top-1 are defined on every report (at least one predicted token);
#: perplexity = exp(NLL) may overflow to +inf; the encoder measures are NaN where undefined (the
#: original's hidden states all zero).
MEASURE_RANGES: dict[str, _Range] = {
    "nll": _Range(0.0),
    "perplexity": _Range(1.0, inf=True),
    "kl": _Range(-_KL_SLACK),
    "top1": _Range(0.0, 1.0),
    "hidden_rel_error": _Range(0.0, nan=True),
    "embedding_cosine": _Range(-1 - _COSINE_SLACK, 1 + _COSINE_SLACK, nan=True),
    "delta_nll": _Range(-math.inf),  # a layer's change of NLL: either sign, finite
}
#: The entries of ``calibration`` (a ``dict[str, Any]`` field), all optional.
CALIBRATION: dict[str, Any] = {"tokens": int, "kinds": list[str]}


class _Oversized:
    """An integer in the JSON text too long to be a count (it is never converted, which costs time)."""

    def __init__(self, digits: int) -> None:
        self.digits = digits


def _parse_int(text: str) -> int | _Oversized:
    digits = len(text.lstrip("-"))
    return int(text) if digits < _MAX_DIGITS else _Oversized(digits)


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in pairs:
        if key in out:
            raise ValueError(f"the key {key!r} appears twice")
        out[key] = value
    return out


def _describe(value: object) -> str:
    """A JSON value as a message shows it."""
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


def _is_protocol(value: object) -> bool:
    """Whether ``value`` is a protocol in the canonical form a report records (``chunks:2048``...)."""
    try:
        return isinstance(value, str) and parse_protocol(value).text == value
    except ArgumentError:
        return False


def _key(name: str) -> str:
    """``name`` as a message shows a table entry: quoted and escaped as in JSON, shortened when long."""
    plain = name.isascii() and name.isprintable() and '"' not in name and "\\" not in name
    text = f'"{name}"' if plain else json.dumps(name)
    return text if len(text) <= 60 else text[:56] + '..."'


def _string_problem(value: object) -> str | None:
    return None if type(value) is str else f"must be a string, not {_describe(value)}"


def _integer_problem(value: object) -> str | None:
    if type(value) is int:  # not a bool
        return None
    if isinstance(value, _Oversized):
        return f"is {_describe(value)}, beyond any count a report holds"
    return f"must be an integer, not {_describe(value)}"


def _number_problem(value: object) -> str | None:
    if type(value) is float or type(value) is int:
        return None
    if isinstance(value, _Oversized):
        return f"is {_describe(value)}, beyond any number a report holds"
    return f"must be a number, not {_describe(value)}"


def _bool_problem(value: object) -> str | None:
    return None if type(value) is bool else f"must be true or false, not {_describe(value)}"


#: The checks of the scalar annotations (the JSON parser gives exactly these types).
_SCALARS = {str: _string_problem, int: _integer_problem, float: _number_problem, bool: _bool_problem}


def _what(mode: int) -> str:
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISFIFO(mode):
        return "a FIFO (named pipe)"
    if stat.S_ISSOCK(mode):
        return "a socket"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    return "not a regular file"


def _some(names: Sequence[str], limit: int = 8) -> str:
    """The first ``limit`` of ``names``, comma-separated (a damaged file may list a million)."""
    return ", ".join(names[:limit]) + (f" and {len(names) - limit} more" if len(names) > limit else "")


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class ReportCheck:
    """Checks the JSON object of one report and turns it into the dataclass's keyword arguments.

    Every problem raises :class:`ReportFileError` as ``{where}: {field} {problem}; {repair}``, the field
    named as in the file: ``tokens``, ``variants[2]``, ``measures["mqa"]["kl"]``, ``per_layer["mqa"]``.

    Example:
        >>> from headwidget.evaluation import EvaluationReport
        >>> check = ReportCheck(EvaluationReport, "report.json", "report.json is corrupt", "evaluate again")
        >>> check.value(["model", 3], list[str], "variants")
        Traceback (most recent call last):
        ...
        headwidget.errors.ReportFileError: report.json is corrupt: variants[1] must be a string, not ...
    """

    #: The format tag and version this check reads, and what such a file is called in a message.
    format = FORMAT
    version = VERSION
    noun = "evaluation report"
    how_to_save = "save one with report.save(path)"
    repair = _REPAIR

    def __init__(self, report_class: type, source: str, where: str, repair: str) -> None:
        self.fields = {f.name: f for f in dataclasses.fields(report_class)}
        self.types = typing.get_type_hints(report_class)
        self.source, self.where, self.repair = source, where, repair

    def fail(self, field: str, problem: str) -> NoReturn:
        raise ReportFileError(f"{self.where}: {field} {problem}; {self.repair}")

    # ------------------------------------------------------------------ types, from the annotations
    def value(self, value: object, hint: Any, field: str) -> None:
        """``value`` is a JSON value of the type ``hint`` (recursively)."""
        scalar = _SCALARS.get(hint)
        if scalar is not None:
            problem = scalar(value)
            if problem is not None:
                self.fail(field, problem)
            return
        if hint is Any:
            return
        origin = typing.get_origin(hint)
        if origin in (typing.Union, types.UnionType):
            options = typing.get_args(hint)
            if value is None and type(None) in options:
                return
            (inner,) = [o for o in options if o is not type(None)]
            self.value(value, inner, field)
        elif origin is list:
            if not isinstance(value, list):
                self.fail(field, f"must be a list, not {_describe(value)}")
            (item,) = typing.get_args(hint)
            check = _SCALARS.get(item)
            for i, entry in enumerate(value):
                if check is None:
                    self.value(entry, item, f"{field}[{i}]")
                elif (problem := check(entry)) is not None:  # the common case, without a name per entry
                    self.fail(f"{field}[{i}]", problem)
        elif origin is dict:
            if not isinstance(value, dict):
                self.fail(field, f"must be an object, not {_describe(value)}")
            _, item = typing.get_args(hint)
            check = _SCALARS.get(item)
            for key, entry in value.items():
                if check is None:
                    self.value(entry, item, f"{field}[{_key(key)}]")
                elif (problem := check(entry)) is not None:
                    self.fail(f"{field}[{_key(key)}]", problem)
        else:  # a field of a new kind of type: teach this method to read it
            raise TypeError(f"the report field {field} has the type {hint!r}, which ReportCheck cannot read")

    def entries(self, value: dict[str, Any], field: str, known: Sequence[str], what: str, whose: str) -> None:
        """``value`` has no keys but ``known``; ``whose`` introduces them in the message."""
        unknown = [k for k in value if k not in known]
        if unknown:
            listed = _some([_key(k) for k in unknown])
            self.fail(field, f"has unknown {what} {listed} ({whose} {', '.join(known)})")

    # ------------------------------------------------------------------ the whole report
    def report(self, data: object) -> dict[str, Any]:
        """The dataclass's keyword arguments from the file's top-level JSON value."""
        if not isinstance(data, dict) or data.get("format") != self.format:
            got = (
                f"its format is {_describe(data.get('format'))}"
                if isinstance(data, dict)
                else f"it holds {_describe(data)}, not an object"
            )
            raise ReportFileError(
                f"{self.source} is not a headwidget {self.noun} ({got}; its format is "
                f"{self.format!r}); {self.how_to_save}"
            )
        if "version" not in data:
            self.fail("version", "is missing")
        self.value(data["version"], int, "version")
        if data["version"] != self.version:
            raise ReportFileError(
                f"{self.source}: version is {data['version']}, but this headwidget reads {self.noun} "
                f"version {self.version} only; read it with the headwidget that wrote it, or upgrade "
                "headwidget (pip install -U headwidget)"
            )
        self.entries(data, "the report", ["format", "version", *self.fields], "fields", "known:")
        for name, f in self.fields.items():
            if name in data:
                self.value(data[name], self.types[name], name)
            elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                self.fail(name, "is missing")
        fields = {name: data[name] for name in self.fields if name in data}
        self.meaning(fields)
        return fields

    def meaning(self, f: dict[str, Any]) -> None:
        """What the types cannot say: kinds, variants, ranges, lengths. Absent optional fields are their
        defaults: no layers, no per-layer numbers, no calibration, no constant bytes."""
        kind = f["kind"]
        if kind not in _KINDS:
            self.fail("kind", f"is {_describe(kind)}; it must be one of {', '.join(map(repr, _KINDS))}")
        variants = f["variants"]
        if not variants:
            self.fail("variants", "is empty; a report has at least one variant")
        seen: set[Any] = set()
        for i, v in enumerate(variants):
            if not v:
                self.fail(f"variants[{i}]", "is empty; it must be a variant spec such as 'mqa'")
            if v in seen:
                self.fail("variants", f"lists {_key(v)} twice")
            seen.add(v)
        names = _KINDS[kind]
        self.per_variant(f["measures"], "measures", variants)
        for v in variants:
            field = f"measures[{_key(v)}]"
            measures = f["measures"][v]
            article = "an" if kind[0] in "aeiou" else "a"
            self.entries(measures, field, names, "measures", f"{article} {kind} report has")
            for name in names:
                if name not in measures:
                    self.fail(f"{field}[{_key(name)}]", "is missing")
                self.in_range(measures[name], name, f"{field}[{_key(name)}]")
        self.per_variant(f["kv_bytes_per_token"], "kv_bytes_per_token", variants)
        for v, count in f["kv_bytes_per_token"].items():
            if not (math.isfinite(count) and count >= 0):
                self.fail(f"kv_bytes_per_token[{_key(v)}]", f"is {count!r}; it must be a finite count >= 0")
        constant = f.get("constant_bytes", {})
        self.per_variant(constant, "constant_bytes", variants, every=False)
        for v, count in constant.items():
            if count < 0:
                self.fail(f"constant_bytes[{_key(v)}]", f"is {count}; it must be >= 0")
        for field in ("tokens", "sequences"):
            if f[field] < 1:
                self.fail(field, f"is {f[field]}; a report measures at least one (it must be >= 1)")
        self.dtype(f["dtype"])
        layers = f.get("layers", [])
        num_layers = f.get("num_layers", 0)
        if num_layers < 0:
            self.fail("num_layers", f"is {num_layers}; it must be >= 0 (0: not recorded)")
        seen = set()
        for i, layer in enumerate(layers):
            if layer < 0:
                self.fail(f"layers[{i}]", f"is {layer}; layer indices are >= 0")
            if num_layers and layer >= num_layers:
                self.fail(f"layers[{i}]", f"is {layer}, but the model has num_layers = {num_layers}")
            if layer in seen:
                self.fail("layers", f"lists layer {layer} twice")
            seen.add(layer)
        protocol = f.get("protocol", "documents")
        if not _is_protocol(protocol):
            self.fail("protocol", f"is {_key(protocol)}; it must be 'documents', 'chunks:W' or 'stride:W/S'")
        for i, v in enumerate(f.get("chosen_on_these_tokens", [])):
            if v not in variants:
                self.fail(f"chosen_on_these_tokens[{i}]", f"is {_key(v)}, which is not one of the variants")
        converted = f.get("converted_kv_bytes", 0.0)
        base = f["kv_bytes_per_token"].get("model")
        if not (math.isfinite(converted) and converted >= 0):
            self.fail("converted_kv_bytes", f"is {converted!r}; it must be a finite count >= 0")
        if base is not None and converted > base * (1 + 1e-12):
            self.fail(
                "converted_kv_bytes",
                f"is {converted}, more than kv_bytes_per_token[{_key('model')}] = {base}, what the whole "
                "model caches per token",
            )
        self.per_layer(f.get("per_layer"), f.get("per_layer_measure"), kind, variants, layers)
        self.calibration(f.get("calibration", {}))

    def per_variant(self, table: dict[str, Any], field: str, variants: list[str], every: bool = True) -> None:
        """``table`` has an entry for each of ``variants`` (with ``every``) and for nothing else."""
        listed = set(variants)
        for key in table:
            if key not in listed:
                self.fail(
                    f"{field}[{_key(key)}]",
                    f"is the entry of a variant that variants does not list ({_some(variants)})",
                )
        for v in variants if every else ():
            if v not in table:
                self.fail(f"{field}[{_key(v)}]", "is missing (every variant in variants has one)")

    def in_range(self, value: float, measure: str, field: str) -> None:
        problem = MEASURE_RANGES[measure].problem(value)
        if problem is not None:
            self.fail(field, problem)

    def dtype(self, name: str) -> None:
        attr = name.removeprefix("torch.")
        dtype = getattr(torch, attr, None) if name.startswith("torch.") else None
        if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
            self.fail(
                "dtype", f"is {_describe(name)}; it must name a torch floating dtype such as 'torch.float32'"
            )

    def per_layer(
        self,
        table: dict[str, list[float]] | None,
        measure: str | None,
        kind: str,
        variants: list[str],
        layers: list[int],
    ) -> None:
        wanted = _PER_LAYER[kind]
        if table is None:
            if measure is not None:
                self.fail(
                    "per_layer_measure", f"is {_describe(measure)}, but per_layer is null (not measured)"
                )
            return
        if measure != wanted:
            self.fail(
                "per_layer_measure",
                f"is {_describe(measure)}, but the per-layer numbers of a {kind} report are {wanted!r}",
            )
        if not layers:
            self.fail(
                "layers", "is empty, but per_layer holds numbers per layer; it must list the layers swept"
            )
        self.per_variant(table, "per_layer", variants)
        for v, values in table.items():
            field = f"per_layer[{_key(v)}]"
            if len(values) != len(layers):
                self.fail(
                    field,
                    f"holds {_count(len(values), 'number')}, but layers lists {_count(len(layers), 'layer')} "
                    "(one number per layer)",
                )
            bounds = MEASURE_RANGES[wanted]
            for i, value in enumerate(values):
                if (problem := bounds.problem(value)) is not None:
                    self.fail(f"{field}[{i}]", problem)

    def calibration(self, value: dict[str, Any]) -> None:
        self.entries(value, "calibration", list(CALIBRATION), "entries", "known:")
        for key, hint in CALIBRATION.items():
            if key in value:
                self.value(value[key], hint, f"calibration[{_key(key)}]")
        tokens = value.get("tokens", 0)
        if tokens < 0:
            self.fail('calibration["tokens"]', f"is {tokens}; it must be >= 0")
        seen: set[str] = set()
        for i, k in enumerate(value.get("kinds", [])):
            if k not in KINDS:
                self.fail(
                    f'calibration["kinds"][{i}]', f"is {_describe(k)}; it must be one of {', '.join(KINDS)}"
                )
            if k in seen:
                self.fail('calibration["kinds"]', f"lists {_key(k)} twice")
            seen.add(k)


def _parse(text: str, fail: Callable[[str], NoReturn]) -> object:
    try:
        return json.loads(text, object_pairs_hook=_unique_keys, parse_int=_parse_int)
    except RecursionError:
        fail("its JSON is nested too deeply to be a headwidget report")
    except ValueError as err:
        fail(f"it is not valid JSON ({err})")


def report_text(
    report_class: type, fields: dict[str, Any], path: Path, check: type[ReportCheck] = ReportCheck
) -> str:
    """The JSON text of a report (``fields`` as :meth:`EvaluationReport.to_json` gives them), checked
    as :func:`read_report` checks a file, so that what is saved always loads.

    Raises :class:`ReportFileError` (``cannot save the report to {path}: ...; nothing was written``).
    """
    where = f"cannot save the report to {path}"

    def fail(problem: str) -> NoReturn:
        raise ReportFileError(f"{where}: {problem}; nothing was written")

    try:
        text = json.dumps(fields, indent=1, allow_nan=True)
    except (TypeError, ValueError) as err:  # a value that is no JSON: a set, a tensor, an object...
        fail(f"a field is not JSON ({err})")
    except RecursionError:
        fail("a field refers to itself")
    repair = "nothing was written; fix the report's fields or evaluate again"
    check(report_class, str(path), where, repair).report(_parse(text, fail))
    return text


def read_json(path: Path, check: type[ReportCheck] = ReportCheck) -> object:
    """The JSON value in the report file at ``path`` (as :func:`read_report` reads it, fields unchecked).

    Raises :class:`ReportFileError` naming ``path`` for a missing, unreadable, non-regular (directory,
    FIFO...), oversized, non-UTF-8 or non-JSON file.
    """

    def fail(problem: str) -> NoReturn:
        raise ReportFileError(f"{path} is not a readable {check.noun}: {problem}")

    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0)  # a FIFO never blocks
    try:
        fd = os.open(path, flags)
    except FileNotFoundError as err:
        raise ReportFileError(f"no {check.noun} at {path} ({err.strerror})") from err
    except ValueError as err:  # a NUL byte in the path
        raise ReportFileError(f"cannot read a {check.noun} from {path!r}: {err}") from err
    except OSError as err:
        raise ReportFileError(f"cannot read a {check.noun} from {path}: {err.strerror or err}") from err
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            fail(f"it is {_what(info.st_mode)}, not a file; {check.how_to_save}")
        if info.st_size > MAX_REPORT_BYTES:
            fail(f"it holds {info.st_size} bytes, more than the {MAX_REPORT_BYTES} any report needs")
        with os.fdopen(os.dup(fd), "rb") as fh:
            raw = fh.read(MAX_REPORT_BYTES + 1)
    except ReportFileError:
        raise
    except OSError as err:
        raise ReportFileError(f"cannot read a {check.noun} from {path}: {err.strerror or err}") from err
    finally:
        os.close(fd)
    if len(raw) > MAX_REPORT_BYTES:
        fail(f"it holds more than the {MAX_REPORT_BYTES} bytes any report needs")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as err:
        fail(f"it is not UTF-8 text (byte 0x{raw[err.start]:02x} at offset {err.start})")
    return _parse(text, fail)


def read_report(report_class: type, path: Path, check: type[ReportCheck] = ReportCheck) -> dict[str, Any]:
    """The keyword arguments of the report in the file at ``path``, every field checked.

    Raises :class:`ReportFileError` naming ``path`` (and the field) for a missing, unreadable, non-regular
    (directory, FIFO...), oversized, non-UTF-8 or non-JSON file and for every field that cannot be true.
    """
    data = read_json(path, check)
    return check(report_class, str(path), f"{path} is corrupt or incomplete", check.repair).report(data)
