"""``HealingRun``: what :func:`~headwidget.healing.heal` did and measured, saved and loaded as JSON.

``curve`` has one row per evaluation point: ``tokens`` (healing tokens seen), ``step``, and the
measures against the original model on the evaluation text (a language model: ``nll``, ``kl``,
``top1``, ``delta_nll`` = the variant's NLL minus the original's; an encoder: ``hidden_rel_error``,
``embedding_cosine``). ``per_layer`` (with ``per_layer=True``) has one row per evaluation point and one
entry per converted layer (``layers``): the teacher-forced relative attention-output error
(:mod:`headwidget.healing._layers`). ``losses`` is the training loss of every step.

Example:
    >>> import pathlib, tempfile
    >>> run = HealingRun(model_name="tiny", spec="mqa", kind="causal-lm", method="kd", loss="kd",
    ...     trainable="kv", lr=1e-3, batch_size=2, max_length=8, tokens=32, seed=0, dtype="torch.float32",
    ...     steps=2, tokens_seen=32, reference_nll=2.0, kv_bytes_per_token=64.0, layers=[0],
    ...     curve=[{"tokens": 0, "step": 0, "nll": 2.5, "kl": 0.4, "top1": 0.7, "delta_nll": 0.5},
    ...            {"tokens": 32, "step": 2, "nll": 2.2, "kl": 0.2, "top1": 0.8, "delta_nll": 0.2}],
    ...     per_layer=[[0.3], [0.1]], losses=[0.5, 0.3], healing_fingerprint="ab",
    ...     evaluation_fingerprint="cd", evaluation_tokens=40)
    >>> round(run.closed(), 3), round(run.closed("delta_nll"), 3)  # of the KL, of the ΔNLL
    (0.5, 0.6)
    >>> HealingRun.load(run.save(pathlib.Path(tempfile.mkdtemp()) / "heal.json")) == run
    True
    >>> print(summary_table({"mqa": run}).splitlines()[2])
    | mqa | 64 | +0.5000 | +0.2000 | 50.0% |
    >>> load_runs(save_runs({"mqa": run}, pathlib.Path(tempfile.mkdtemp()) / "runs.json")) == {"mqa": run}
    True
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from headwidget.errors import ReportFileError
from headwidget.evaluation._report_file import (
    MEASURE_RANGES,
    ReportCheck,
    read_json,
    read_report,
    report_text,
)
from headwidget.files import NotRegularFileError, atomic_write

__all__ = ["CURVE_MEASURES", "HealingRun", "load_runs", "save_runs", "summary_table"]

#: The measures of a curve row, by kind of model (besides ``tokens`` and ``step``).
CURVE_MEASURES = {
    "causal-lm": ("nll", "kl", "top1", "delta_nll"),
    "encoder": ("hidden_rel_error", "embedding_cosine"),
}
RUN_SUFFIXES = (".json", ".md")


@dataclass
class HealingRun:
    """One healing run (see the module docstring); ``model`` is the healed copy (not saved)."""

    model_name: str
    spec: str
    kind: str
    method: str
    loss: str
    trainable: str
    lr: float
    batch_size: int
    max_length: int
    tokens: int
    seed: int
    dtype: str
    steps: int
    tokens_seen: int
    reference_nll: float
    kv_bytes_per_token: float
    layers: list[int]
    curve: list[dict[str, float]]
    per_layer: list[list[float]] | None
    losses: list[float]
    healing_fingerprint: str
    evaluation_fingerprint: str
    evaluation_tokens: int
    stopped_early: bool = False
    model: nn.Module | None = field(default=None, compare=False, repr=False)

    # ------------------------------------------------------------------ reading it
    def measure(self) -> str:
        """The curve's headline measure: ``kl`` for a language model, ``hidden_rel_error`` else."""
        return "kl" if self.kind == "causal-lm" else "hidden_rel_error"

    def closed(self, measure: str | None = None) -> float:
        """The share of the untrained damage the last point closed: ``1 − last / first`` of ``measure``
        (default :meth:`measure`; ``delta_nll`` for ΔNLL). NaN when the first is 0."""
        name = measure or self.measure()
        first, last = self.curve[0][name], self.curve[-1][name]
        return 1.0 - last / first if first else math.nan

    def at(self, tokens: int) -> dict[str, float]:
        """The curve row of the last evaluation point at or before ``tokens`` healing tokens."""
        rows = [row for row in self.curve if row["tokens"] <= tokens]
        return rows[-1] if rows else self.curve[0]

    def table(self) -> str:
        """A markdown table, one row per evaluation point."""
        names = CURVE_MEASURES[self.kind]
        head = ["tokens", "step", *names, "closed"]
        lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        first = self.curve[0][self.measure()]
        for row in self.curve:
            shut = 1.0 - row[self.measure()] / first if first else math.nan
            cells = [f"{int(row['tokens']):,}", str(int(row["step"]))]
            cells += [f"{row[n]:+.4f}" if n == "delta_nll" else f"{row[n]:.4f}" for n in names]
            lines.append("| " + " | ".join([*cells, f"{shut:.1%}"]) + " |")
        return "\n".join(lines)

    # ------------------------------------------------------------------ files
    def save(self, path: str | Path) -> Path:
        """Write the run as JSON (``.json``, :meth:`load` reads it) or a markdown table (``.md``),
        atomically (:mod:`headwidget.files`); the healed model is not saved (``run.model.save_pretrained``).

        Raises:
            ReportFileError: another suffix, a field that cannot be true, or a failed write (the file
                there before, if any, is unchanged).
        """
        target = Path(path)
        suffix = target.suffix.lower()
        if suffix not in RUN_SUFFIXES:
            raise ReportFileError(
                f"cannot save the healing run to {target.name!r}: the suffix must be one of "
                f"{', '.join(RUN_SUFFIXES)} (JSON that HealingRun.load reads, or a markdown table)"
            )
        content = {f.name: getattr(self, f.name) for f in _saved_fields()}
        text = report_text(
            type(self), {"format": RunCheck.format, "version": RunCheck.version, **content}, target, RunCheck
        )
        if suffix == ".md":
            text = (
                f"{self.model_name}, variant {self.spec}: healed with {self.method} ({self.loss}) on "
                f"{self.tokens_seen:,} tokens in {self.steps} steps, trainable {self.trainable}, "
                f"lr {self.lr:g}; "
                f"evaluated on {self.evaluation_tokens:,} held-out tokens\n\n{self.table()}\n"
            )
        try:
            with atomic_write(target, "w", encoding="utf-8") as fh:
                fh.write(text)
        except NotRegularFileError as err:
            raise ReportFileError(f"cannot save the healing run: {err}") from err
        except OSError as err:
            raise ReportFileError(
                f"cannot save the healing run to {target}: {err.strerror or err}; the file there before, if "
                "any, is unchanged"
            ) from err
        return target

    @classmethod
    def load(cls, path: str | Path) -> HealingRun:
        """Read a run :meth:`save` wrote as JSON, every field checked (``run.model`` is None).

        Raises:
            ReportFileError: a missing, unreadable or damaged file; the message names the field.
        """
        return cls(**read_report(cls, Path(path), RunCheck))


def _saved_fields() -> list[dataclasses.Field[Any]]:
    return [f for f in dataclasses.fields(HealingRun) if f.name != "model"]


class RunCheck(ReportCheck):
    """:class:`ReportCheck` for healing runs: the types from :class:`HealingRun`'s annotations, and what
    they cannot say (kinds, methods, ranges, one per-layer entry per layer and a row per point)."""

    format = "headwidget-healing-run"
    version = 1
    noun = "healing run"
    how_to_save = "save one with run.save(path)"
    repair = "the file was damaged or edited after HealingRun.save() wrote it; heal again or restore a copy"

    def __init__(self, report_class: type, source: str, where: str, repair: str) -> None:
        super().__init__(report_class, source, where, repair)
        self.fields = {f.name: f for f in _saved_fields()}

    def meaning(self, f: dict[str, Any]) -> None:
        kind = f["kind"]
        if kind not in CURVE_MEASURES:
            self.fail("kind", f"is {kind!r}; it must be one of {', '.join(map(repr, CURVE_MEASURES))}")
        if f["method"] not in ("kd", "lm"):
            self.fail("method", f"is {f['method']!r}; it must be 'kd' or 'lm'")
        for name in ("batch_size", "max_length", "tokens", "steps"):
            if f[name] < 1:
                self.fail(name, f"is {f[name]}; it must be ≥ 1")
        if not math.isfinite(f["lr"]) or f["lr"] <= 0:
            self.fail("lr", f"is {f['lr']!r}; it must be a finite number > 0")
        if len(f["losses"]) != f["steps"]:
            self.fail("losses", f"has {len(f['losses'])} entries for {f['steps']} steps")
        curve = f["curve"]
        if not curve:
            self.fail("curve", "is empty; a run has at least its untrained point")
        wanted = ("tokens", "step", *CURVE_MEASURES[kind])
        last = -1.0
        for i, row in enumerate(curve):
            self.entries(row, f"curve[{i}]", wanted, "entries", "a row of this kind has")
            for name in wanted:
                if name not in row:
                    self.fail(f"curve[{i}]", f"lacks {name!r}")
                value = row[name]
                if name in ("tokens", "step"):
                    if not float(value).is_integer() or value < 0:
                        self.fail(f"curve[{i}][{name!r}]", f"is {value!r}; it must be a whole number ≥ 0")
                else:
                    problem = MEASURE_RANGES[name].problem(float(value))
                    if problem is not None:
                        self.fail(f"curve[{i}][{name!r}]", problem)
            if row["tokens"] <= last:
                self.fail(f"curve[{i}]", "does not come after the row before it (tokens must increase)")
            last = row["tokens"]
        per_layer = f.get("per_layer")
        if per_layer is not None:
            if len(per_layer) != len(curve):
                self.fail("per_layer", f"has {len(per_layer)} rows for {len(curve)} curve points")
            for i, row in enumerate(per_layer):
                if len(row) != len(f["layers"]):
                    self.fail(f"per_layer[{i}]", f"has {len(row)} entries for {len(f['layers'])} layers")
                for j, value in enumerate(row):
                    if not (math.isnan(value) or (math.isfinite(value) and value >= 0)):
                        self.fail(f"per_layer[{i}][{j}]", f"is {value!r}; it must be a finite number ≥ 0")


#: The format of a file of several runs (``headwidget heal --variants a,b``), one per variant.
RUNS_FORMAT = "headwidget-healing-runs"


def summary_table(runs: dict[str, HealingRun]) -> str:
    """One markdown row per run: KV bytes, ΔNLL (an encoder: the hidden-state error) untrained and at each
    evaluation point of the first run, and the share of the untrained KL the last point closed (the
    module docstring has an example)."""
    first = next(iter(runs.values()))
    name = "delta_nll" if first.kind == "causal-lm" else "hidden_rel_error"
    points = [int(row["tokens"]) for row in first.curve]
    label = "ΔNLL" if first.kind == "causal-lm" else "hidden error"
    head = [
        "variant",
        "KV bytes/token",
        *(f"{label} at {t:,} tokens" for t in points),
        f"{first.measure()} closed",
    ]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for spec, run in runs.items():
        cells = [f"{run.at(t)[name]:+.4f}" for t in points]
        lines.append(
            "| " + " | ".join([spec, f"{run.kv_bytes_per_token:g}", *cells, f"{run.closed():.1%}"]) + " |"
        )
    return "\n".join(lines)


def save_runs(runs: dict[str, HealingRun], path: str | Path) -> Path:
    """Write several runs (variant → run) to one file: JSON that :func:`load_runs` reads (each run as
    :meth:`HealingRun.save` writes it), or markdown (the :func:`summary_table`, then each run's table).

    Raises:
        ReportFileError: another suffix, a run that cannot be saved, a failed write (nothing changed).
    """
    target = Path(path)
    suffix = target.suffix.lower()
    if suffix not in RUN_SUFFIXES or not runs:
        raise ReportFileError(
            f"cannot save the healing runs to {target.name!r}: give at least one run, and a path ending in "
            f"{' or '.join(RUN_SUFFIXES)}"
        )
    if suffix == ".md":
        parts = [summary_table(runs)]
        parts += [f"## {spec}\n\n{run.table()}" for spec, run in runs.items()]
        text = "\n\n".join(parts) + "\n"
    else:
        each = {}
        for spec, run in runs.items():
            content = {f.name: getattr(run, f.name) for f in _saved_fields()}
            fields = {"format": RunCheck.format, "version": RunCheck.version, **content}
            each[spec] = json.loads(report_text(HealingRun, fields, target, RunCheck))
        text = json.dumps({"format": RUNS_FORMAT, "version": 1, "runs": each}, indent=1, allow_nan=True)
    try:
        with atomic_write(target, "w", encoding="utf-8") as fh:
            fh.write(text)
    except OSError as err:
        raise ReportFileError(
            f"cannot save the healing runs to {target}: {getattr(err, 'strerror', None) or err}; the file "
            "there before, if any, is unchanged"
        ) from err
    return target


def load_runs(path: str | Path) -> dict[str, HealingRun]:
    """Read :func:`save_runs`' JSON (variant → run, every run's fields checked); a file of one run
    (:meth:`HealingRun.save`) gives ``{spec: run}``.

    Raises:
        ReportFileError: a missing, unreadable or damaged file (the message names the run and field).
    """
    source = Path(path)
    data = read_json(source, RunCheck)
    where = f"{source} is corrupt or incomplete"
    if isinstance(data, dict) and data.get("format") == RunCheck.format:
        run = HealingRun(**RunCheck(HealingRun, str(source), where, RunCheck.repair).report(data))
        return {run.spec: run}
    if not isinstance(data, dict) or data.get("format") != RUNS_FORMAT or data.get("version") != 1:
        raise ReportFileError(
            f"{source} is not a file of headwidget healing runs (its format must be {RUNS_FORMAT!r} "
            f"version 1, or {RunCheck.format!r}); write one with headwidget.healing.save_runs or "
            "`headwidget heal`"
        )
    runs = data.get("runs")
    if not isinstance(runs, dict) or not runs or set(data) != {"format", "version", "runs"}:
        raise ReportFileError(f"{where}: runs must be a non-empty object of variant → run, and nothing else")
    out = {}
    for spec, entry in runs.items():
        check = RunCheck(HealingRun, str(source), f"{where}: runs[{json.dumps(spec)}]", RunCheck.repair)
        out[spec] = HealingRun(**check.report(entry))
    return out
