"""Evaluation report files: the JSON text that is saved and loaded, every field checked both ways.

:func:`report_text` (what :meth:`EvaluationReport.save <headwidget.evaluation.EvaluationReport.save>`
writes, after checking it) and :func:`read_report` (what :meth:`EvaluationReport.load
<headwidget.evaluation.EvaluationReport.load>` calls) share one set of checks, :class:`ReportCheck`:
the report dataclass's field annotations and :func:`~headwidget.core.stored.stored` rules, read by
:class:`~headwidget.core.stored.StoredReader`, so a new field is checked as soon as it is declared; the
rules that fields cannot state (the measures of each kind and their ranges, every variant a spec and in
every table, per-layer lists as long as ``layers``) are written out here once. A file is read as
:mod:`headwidget.files` reads one: a symlink or anything but a regular file is refused unread.

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

import json
from pathlib import Path
from typing import Any, NoReturn

import torch

from headwidget.analysis.variants import parse_variant
from headwidget.core.kinds import KINDS
from headwidget.core.stored import Stored, StoredReader, describe, key, parse_json, some
from headwidget.errors import ArgumentError, MechanismSpecError, PathRefusedError, ReportFileError
from headwidget.evaluation._inputs import parse_protocol
from headwidget.files import atomic_write, read_regular

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
    "save_text",
]

LM_MEASURES = ("nll", "perplexity", "kl", "top1")
ENCODER_MEASURES = ("hidden_rel_error", "embedding_cosine")
FORMAT = "headwidget-evaluation-report"
VERSION = 1
#: What a report path may end with (in any case): JSON, or a markdown table.
REPORT_SUFFIXES = (".json", ".md")
#: Larger files are refused unread: thousands of variants over hundreds of layers take a few MiB.
MAX_REPORT_BYTES = 64 << 20
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


#: Each measure's range. NLL, KL and top-1 are defined on every report (at least one predicted token);
#: perplexity = exp(NLL) may overflow to +inf; the encoder measures are NaN where undefined (the
#: original's hidden states all zero).
MEASURE_RANGES: dict[str, Stored] = {
    "nll": Stored(minimum=0.0),
    "perplexity": Stored(minimum=1.0, inf=True),
    "kl": Stored(minimum=-_KL_SLACK),
    "top1": Stored(minimum=0.0, maximum=1.0),
    "hidden_rel_error": Stored(minimum=0.0, nan=True),
    "embedding_cosine": Stored(minimum=-1 - _COSINE_SLACK, maximum=1 + _COSINE_SLACK, nan=True),
    "delta_nll": Stored(finite=True),  # a layer's change of NLL: either sign
}
#: The entries of ``calibration`` (a ``dict[str, Any]`` field), all optional.
CALIBRATION: dict[str, Any] = {"tokens": int, "kinds": list[str]}


def _is_protocol(value: object) -> bool:
    """Whether ``value`` is a protocol in the canonical form a report records (``chunks:2048``...)."""
    try:
        return isinstance(value, str) and parse_protocol(value).text == value
    except ArgumentError:
        return False


def spec_problem(spec: str) -> str | None:
    """What is wrong with ``spec`` as a variant a file records (None: a spec in the canonical form
    ``evaluate`` and ``heal`` write, ``model`` included)."""
    try:
        canonical = parse_variant(spec).text
    except MechanismSpecError:
        return f"is {key(spec)}, which is not a variant spec (such as 'model', 'mqa', 'gqa:4+align')"
    return (
        None if canonical == spec else f"is {key(spec)}, not a spec as evaluate writes it ({key(canonical)})"
    )


def dtype_problem(name: str) -> str | None:
    """What is wrong with ``name`` as the floating dtype a file records (``"torch.float32"``...)."""
    dtype = getattr(torch, name.removeprefix("torch."), None) if name.startswith("torch.") else None
    if isinstance(dtype, torch.dtype) and dtype.is_floating_point:
        return None
    return f"is {describe(name)}; it must name a torch floating dtype such as 'torch.float32'"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


class ReportCheck(StoredReader):
    """Checks the JSON object of one report and turns it into the dataclass's keyword arguments.

    Every problem raises :class:`ReportFileError` as ``{where}: {field} {problem}; {repair}``, the field
    named as in the file: ``tokens``, ``variants[2]``, ``measures["mqa"]["kl"]``, ``per_layer["mqa"]``.

    Example:
        >>> from headwidget.evaluation import EvaluationReport
        >>> check = ReportCheck(EvaluationReport, "report.json", repair="evaluate again")
        >>> check.typed(["model", 3], list[str], "variants")
        Traceback (most recent call last):
        ...
        headwidget.errors.ReportFileError: report.json is corrupt or incomplete: variants[1] must be a ...
    """

    #: The format tag and version this check reads, and what such a file is called in a message.
    format = FORMAT
    version = VERSION
    noun = "evaluation report"
    how_to_save = "save one with report.save(path)"
    repair = _REPAIR

    def __init__(
        self, report_class: type, source: str, *, where: str | None = None, repair: str | None = None
    ) -> None:
        super().__init__(ReportFileError, source, repair or self.repair, where=where)
        self.report_class = report_class

    def report(self, data: object) -> dict[str, Any]:
        """The dataclass's keyword arguments from the file's top-level JSON value."""
        fields = self.document(
            data,
            self.report_class,
            tag=self.format,
            version=self.version,
            noun=self.noun,
            how_to_save=self.how_to_save,
        )
        self.meaning(fields)
        return fields

    def meaning(self, f: dict[str, Any]) -> None:
        """What the fields cannot say: kinds, variants, ranges, lengths. Absent optional fields are their
        defaults: no layers, no per-layer numbers, no calibration, no constant bytes."""
        kind = f["kind"]
        if kind not in _KINDS:
            self.fail("kind", f"is {describe(kind)}; it must be one of {', '.join(map(repr, _KINDS))}")
        variants = f["variants"]
        if not variants:
            self.fail("variants", "is empty; a report has at least one variant")
        for i, v in enumerate(variants):
            if (problem := spec_problem(v)) is not None:
                self.fail(f"variants[{i}]", problem)
        names = _KINDS[kind]
        self.per_variant(f["measures"], "measures", variants)
        for v in variants:
            field = f"measures[{key(v)}]"
            measures = self.keys(
                f["measures"][v], field, names, f"{'an' if kind[0] in 'aeiou' else 'a'} {kind} report has"
            )
            for name in names:
                if name not in measures:
                    self.fail(f"{field}[{key(name)}]", "is missing")
                self.in_range(measures[name], name, f"{field}[{key(name)}]")
        self.per_variant(f["kv_bytes_per_token"], "kv_bytes_per_token", variants)
        self.per_variant(f.get("constant_bytes", {}), "constant_bytes", variants, every=False)
        if (problem := dtype_problem(f["dtype"])) is not None:
            self.fail("dtype", problem)
        layers, num_layers = f.get("layers", []), f.get("num_layers", 0)
        for i, layer in enumerate(layers):
            if num_layers and layer >= num_layers:
                self.fail(f"layers[{i}]", f"is {layer}, but the model has num_layers = {num_layers}")
        protocol = f.get("protocol", "documents")
        if not _is_protocol(protocol):
            self.fail("protocol", f"is {key(protocol)}; it must be 'documents', 'chunks:W' or 'stride:W/S'")
        for i, v in enumerate(f.get("chosen_on_these_tokens", [])):
            if v not in variants:
                self.fail(f"chosen_on_these_tokens[{i}]", f"is {key(v)}, which is not one of the variants")
        converted, base = f.get("converted_kv_bytes", 0.0), f["kv_bytes_per_token"].get("model")
        if base is not None and converted > base * (1 + 1e-12):
            self.fail(
                "converted_kv_bytes",
                f"is {converted}, more than kv_bytes_per_token[{key('model')}] = {base}, what the whole "
                "model caches per token",
            )
        self.per_layer(f.get("per_layer"), f.get("per_layer_measure"), kind, variants, layers)
        self.calibration(f.get("calibration", {}))

    def per_variant(self, table: dict[str, Any], field: str, variants: list[str], every: bool = True) -> None:
        """``table`` has an entry for each of ``variants`` (with ``every``) and for nothing else."""
        listed = set(variants)
        for name in table:
            if name not in listed:
                self.fail(
                    f"{field}[{key(name)}]",
                    f"is the entry of a variant that variants does not list ({some(variants)})",
                )
        for v in variants if every else ():
            if v not in table:
                self.fail(f"{field}[{key(v)}]", "is missing (every variant in variants has one)")

    def in_range(self, value: float, measure: str, field: str) -> None:
        self.typed(value, float, field, MEASURE_RANGES[measure])

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
                    "per_layer_measure", f"is {describe(measure)}, but per_layer is null (not measured)"
                )
            return
        if measure != wanted:
            self.fail(
                "per_layer_measure",
                f"is {describe(measure)}, but the per-layer numbers of a {kind} report are {wanted!r}",
            )
        if not layers:
            self.fail(
                "layers", "is empty, but per_layer holds numbers per layer; it must list the layers swept"
            )
        self.per_variant(table, "per_layer", variants)
        for v, values in table.items():
            field = f"per_layer[{key(v)}]"
            if len(values) != len(layers):
                self.fail(
                    field,
                    f"holds {_count(len(values), 'number')}, but layers lists {_count(len(layers), 'layer')} "
                    "(one number per layer)",
                )
            for i, value in enumerate(values):
                self.in_range(value, wanted, f"{field}[{i}]")

    def calibration(self, value: dict[str, Any]) -> None:
        self.keys(value, "calibration", list(CALIBRATION))
        if "tokens" in value:
            self.integer(value["tokens"], 'calibration["tokens"]', 0)
        kinds = self.typed(value.get("kinds", []), list[str], 'calibration["kinds"]')
        seen: set[str] = set()
        for i, k in enumerate(kinds):
            if k not in KINDS:
                self.fail(
                    f'calibration["kinds"][{i}]', f"is {describe(k)}; it must be one of {', '.join(KINDS)}"
                )
            if k in seen:
                self.fail('calibration["kinds"]', f"lists {key(k)} twice")
            seen.add(k)


def report_text(
    report_class: type, fields: dict[str, Any], path: Path, check: type[ReportCheck] = ReportCheck
) -> str:
    """The JSON text of a report (``fields`` as :meth:`EvaluationReport.to_json` gives them), checked
    as :func:`read_report` checks a file, so that what is saved always loads.

    Raises :class:`ReportFileError` (``cannot save the evaluation report to {path}: ...; nothing was
    written``; ``check.noun`` names the kind of file).
    """
    where = f"cannot save the {check.noun} to {path}"

    def fail(problem: str) -> NoReturn:
        raise ReportFileError(f"{where}: {problem}; nothing was written")

    try:
        text = json.dumps(fields, indent=1, allow_nan=True)
    except (TypeError, ValueError) as err:  # a value that is no JSON: a set, a tensor, an object...
        fail(f"a field is not JSON ({err})")
    except RecursionError:
        fail("a field refers to itself")
    repair = "nothing was written; fix the fields or compute them again"
    checker = check(report_class, str(path), where=where, repair=repair)
    checker.report(parse_json(text, lambda problem: fail(f"its JSON {problem}")))
    return text


def read_json(path: Path, check: type[ReportCheck] = ReportCheck) -> object:
    """The JSON value in the report file at ``path`` (as :func:`read_report` reads it, fields unchecked).

    Raises :class:`ReportFileError` naming ``path`` for a missing, unreadable, symlinked, non-regular
    (directory, FIFO...), oversized, non-UTF-8 or non-JSON file.
    """
    try:
        raw = read_regular(path, limit=MAX_REPORT_BYTES)
    except FileNotFoundError as err:
        raise ReportFileError(f"no {check.noun} at {path} ({err.strerror})") from err
    except PathRefusedError as err:
        raise ReportFileError(f"cannot read a {check.noun}: {err}; {check.how_to_save}") from err
    except OSError as err:
        raise ReportFileError(f"cannot read a {check.noun} from {path}: {err.strerror or err}") from err

    def fail(problem: str) -> NoReturn:
        raise ReportFileError(f"{path} is not a readable {check.noun}: it {problem}")

    return parse_json(raw, fail)


def read_report(report_class: type, path: Path, check: type[ReportCheck] = ReportCheck) -> dict[str, Any]:
    """The keyword arguments of the report in the file at ``path``, every field checked.

    Raises :class:`ReportFileError` naming ``path`` (and the field) for a missing, unreadable, symlinked,
    non-regular (directory, FIFO...), oversized, non-UTF-8 or non-JSON file and for every field that
    cannot be true.
    """
    return check(report_class, str(path)).report(read_json(path, check))


def save_text(target: Path, text: str, what: str) -> Path:
    """``text`` written to ``target`` atomically (:mod:`headwidget.files`), failures named.

    Raises:
        ReportFileError: the message names ``what`` and the path; the file there before, if any, is
            unchanged.
    """
    try:
        with atomic_write(target, "w", encoding="utf-8") as fh:
            fh.write(text)
    except PathRefusedError as err:
        raise ReportFileError(f"cannot save the {what}: {err}") from err
    except OSError as err:
        raise ReportFileError(
            f"cannot save the {what} to {target}: {err.strerror or err}; the file there before, if any, is "
            "unchanged"
        ) from err
    return target
