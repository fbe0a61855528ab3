"""``HealingRun``: what :func:`~headwidget.healing.heal` did and measured, saved and loaded as JSON.

``curve`` has one row per evaluation point: ``tokens`` (healing tokens seen), ``step``, and the
measures against the original model on the evaluation text (a language model: ``nll``, ``kl``,
``top1``, ``delta_nll`` = the variant's NLL minus the original's; an encoder: ``hidden_rel_error``,
``embedding_cosine``). ``per_layer`` (with ``per_layer=True``) has one row per evaluation point and one
entry per converted layer (``layers``): the teacher-forced relative attention-output error
(:mod:`headwidget.healing._layers`). ``losses`` is the training loss of every step.

A run file is checked field by field on load and before every save, as statistics files are: each
field against its type and bounds (:class:`~headwidget.core.stored.StoredReader`), then against the
others (:class:`RunCheck`): a method, loss, spec, trainable and dtype that heal gives, steps of
``batch_size × max_length`` tokens, as many as ``tokens`` plans (fewer only when stopped early), one
loss a step, a curve from the untrained point (step 0, 0 tokens) to at most the last step with
``delta_nll = nll − reference_nll``. :meth:`HealingRun.load_all` reads the file ``headwidget heal``
writes (a run per variant).

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
    >>> runs = save_runs({"mqa": run}, pathlib.Path(tempfile.mkdtemp()) / "runs.json")
    >>> HealingRun.load_all(runs) == {"mqa": run}
    True
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from torch import nn

from headwidget.core.stored import Stored, describe, key, saved_fields, some, unsaved
from headwidget.errors import ArgumentError, ReportFileError
from headwidget.evaluation.report_file import (
    ReportCheck,
    dtype_problem,
    read_json,
    report_text,
    save_text,
    spec_problem,
)
from headwidget.healing._loss import LOSS_NAMES
from headwidget.healing._trainable import parse_trainable

__all__ = ["CURVE_MEASURES", "HealingRun", "RunCheck", "load_runs", "save_runs", "summary_table"]

#: The measures of a curve row, by kind of model (besides ``tokens`` and ``step``).
CURVE_MEASURES = {
    "causal-lm": ("nll", "kl", "top1", "delta_nll"),
    "encoder": ("hidden_rel_error", "embedding_cosine"),
}
RUN_SUFFIXES = (".json", ".md")
#: The format of a file of several runs (``headwidget heal --variants a,b``), one per variant.
RUNS_FORMAT = "headwidget-healing-runs"
#: How far below 0 rounding may take a loss (the KL of nearly equal distributions, in float32).
_LOSS_SLACK = 1e-5
_FINGERPRINT = re.compile(r"[0-9a-f]{1,64}")


#: A ``prefill:P`` protocol as a run records it.
_PREFILL = re.compile(r"prefill:[1-9][0-9]*")


@dataclass
class HealingRun:
    """One healing run (see the module docstring); ``model`` is the healed copy (not saved)."""

    model_name: str
    spec: str
    kind: str
    method: str
    loss: str
    trainable: str
    lr: Annotated[float, Stored(minimum=0.0, maximum=10.0)]
    batch_size: Annotated[int, Stored(minimum=1, maximum=1 << 20)]
    max_length: Annotated[int, Stored(minimum=2, maximum=1 << 24)]
    tokens: Annotated[int, Stored(minimum=1)]
    seed: Annotated[int, Stored(minimum=0, maximum=2**63 - 1)]
    dtype: str
    steps: Annotated[int, Stored(minimum=0)]
    tokens_seen: Annotated[int, Stored(minimum=0)]
    #: The original's NLL on the evaluation text; None for an encoder, which predicts no tokens (a NaN
    #: given for one is taken as None, so that the run equals itself saved and loaded).
    reference_nll: Annotated[float | None, Stored(minimum=0.0)]
    kv_bytes_per_token: Annotated[float, Stored(minimum=0.0)]
    layers: Annotated[list[int], Stored(minimum=0, unique="layer")]
    curve: list[dict[str, float]]
    per_layer: list[list[float]] | None
    losses: Annotated[list[float], Stored(minimum=-_LOSS_SLACK)]
    healing_fingerprint: str
    evaluation_fingerprint: str
    evaluation_tokens: Annotated[int, Stored(minimum=1)]
    stopped_early: bool = False
    #: How the curve's held-out points were measured: ``"documents"`` or ``"prefill:P"``.
    protocol: str = "documents"
    model: nn.Module | None = unsaved()

    def __post_init__(self) -> None:
        if (
            self.kind == "encoder"
            and isinstance(self.reference_nll, float)
            and math.isnan(self.reference_nll)
        ):
            self.reference_nll = None

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
        text = report_text(HealingRun, _document(self), target, RunCheck)
        if suffix == ".md":
            text = (
                f"{self.model_name}, variant {self.spec}: healed with {self.method} ({self.loss}) on "
                f"{self.tokens_seen:,} tokens in {self.steps} steps, trainable {self.trainable}, "
                f"lr {self.lr:g}; "
                f"evaluated on {self.evaluation_tokens:,} held-out tokens ({self.protocol} protocol)\n\n"
                f"{self.table()}\n"
            )
        return save_text(target, text, "healing run")

    @classmethod
    def load(cls, path: str | Path) -> HealingRun:
        """Read a run :meth:`save` wrote as JSON, every field checked (``run.model`` is None); the file of
        several runs that ``headwidget heal`` writes is read by :meth:`load_all`.

        Raises:
            ReportFileError: a missing, unreadable, symlinked or damaged file; the message names the field.
        """
        source = Path(path)
        data = read_json(source, RunCheck)
        if isinstance(data, dict) and data.get("format") == RUNS_FORMAT:
            names = [key(n) for n in data["runs"]] if isinstance(data.get("runs"), dict) else []
            raise ReportFileError(
                f"{source} holds {len(names)} healing run(s) ({some(names)}), as `headwidget heal` writes "
                "them: read it with HealingRun.load_all(path), a mapping of variant to run"
            )
        return cls(**RunCheck(cls, str(source)).report(data))

    @classmethod
    def load_all(cls, path: str | Path) -> dict[str, HealingRun]:
        """The runs in the file ``headwidget heal`` writes (variant → run, every run's fields checked); a
        file of one run (:meth:`save`) gives ``{run.spec: run}``. ``HealingView(runs)`` draws them.

        Raises:
            ReportFileError: a missing, unreadable, symlinked or damaged file (the message names the run
                and the field).
        """
        source = Path(path)
        data = read_json(source, RunCheck)
        if isinstance(data, dict) and data.get("format") == RunCheck.format:
            run = cls(**RunCheck(cls, str(source)).report(data))
            return {run.spec: run}
        how = "write one with `headwidget heal`, or save a run with run.save(path)"
        fields = RunCheck(cls, str(source)).document(
            data, _RunsFile, tag=RUNS_FORMAT, version=1, noun="file of healing runs", how_to_save=how
        )
        where = f"{source} is corrupt or incomplete"
        if not fields["runs"]:
            raise ReportFileError(f"{where}: runs is empty; a file of healing runs holds at least one")
        return {
            spec: cls(**RunCheck(cls, str(source), where=f"{where}: runs[{key(spec)}]").report(entry))
            for spec, entry in fields["runs"].items()
        }


@dataclass
class _RunsFile:
    """The body of a file of several runs: variant → run (each then read by :class:`RunCheck`)."""

    runs: dict[str, Any]


class RunCheck(ReportCheck):
    """:class:`ReportCheck` for healing runs: the types and bounds of :class:`HealingRun`'s fields, and what
    fields cannot say (see the module docstring)."""

    format = "headwidget-healing-run"
    version = 1
    noun = "healing run"
    how_to_save = "save one with run.save(path)"
    repair = "the file was damaged or edited after HealingRun.save() wrote it; heal again or restore a copy"

    def report(self, data: object) -> dict[str, Any]:
        if isinstance(data, dict) and data.get("kind") == "encoder":  # written when it was NaN
            nll = data.get("reference_nll")
            data = {**data, "reference_nll": None} if isinstance(nll, float) and math.isnan(nll) else data
        return super().report(data)

    def meaning(self, f: dict[str, Any]) -> None:
        kind, method = f["kind"], f["method"]
        if f.get("protocol", "documents") != "documents" and not _PREFILL.fullmatch(str(f["protocol"])):
            self.fail("protocol", f"is {describe(f['protocol'])}; it must be 'documents' or 'prefill:P'")
        if kind not in CURVE_MEASURES:
            self.fail("kind", f"is {kind!r}; it must be one of {', '.join(map(repr, CURVE_MEASURES))}")
        loss = LOSS_NAMES.get((method, kind))
        if loss is None:
            methods = " or ".join(repr(m) for m, k in LOSS_NAMES if k == kind)
            self.fail("method", f"is {describe(method)}; a {kind} model is healed with {methods}")
        if f["loss"] != loss:
            self.fail(
                "loss",
                f"is {describe(f['loss'])}, but method {method!r} on a {kind} model minimises {loss!r}",
            )
        for name, problem in (("spec", spec_problem(f["spec"])), ("dtype", dtype_problem(f["dtype"]))):
            if problem is not None:
                self.fail(name, problem)
        self.trainable(f["trainable"])
        if not f["lr"] > 0:
            self.fail("lr", f"is {f['lr']!r}; a learning rate is > 0")
        self.steps(f)
        if (f["reference_nll"] is None) != (kind == "encoder"):
            why = "an encoder predicts no tokens: it must be null" if kind == "encoder" else "it is measured"
            self.fail("reference_nll", f"is {describe(f['reference_nll'])}, but {why}")
        layers = f["layers"]
        if not layers or layers != sorted(layers):
            self.fail(
                "layers", f"is {layers[:8]}; a run converts at least one layer, listed in increasing order"
            )
        self.curve(f)
        self.layer_errors(f["per_layer"], len(f["curve"]), len(layers))
        for name in ("healing_fingerprint", "evaluation_fingerprint"):
            if _FINGERPRINT.fullmatch(f[name]) is None:
                self.fail(name, f"is {describe(f[name])}, which is not a hexadecimal fingerprint")

    def trainable(self, text: str) -> None:
        try:
            mode, rank = parse_trainable(text)
        except ArgumentError:
            self.fail("trainable", f"is {describe(text)}; it must be 'kv', 'attention', 'all' or 'lora:r'")
        canonical = mode if rank is None else f"lora:{rank}"
        if canonical != text:
            self.fail("trainable", f"is {describe(text)}, not as heal writes it ({canonical!r})")

    def steps(self, f: dict[str, Any]) -> None:
        """Steps of ``batch_size × max_length`` tokens, as many as ``tokens`` plans (fewer only when stopped
        early), one loss each."""
        steps, per_step = f["steps"], f["batch_size"] * f["max_length"]
        planned = -(-f["tokens"] // per_step)
        if steps > planned or (steps < planned and not f["stopped_early"]):
            self.fail(
                "steps",
                f"is {steps}, but tokens = {f['tokens']} at batch_size × max_length = {per_step} a step plan "
                f"{planned} steps (fewer only in a run stopped early)",
            )
        if f["tokens_seen"] != steps * per_step:
            seen = steps * per_step
            self.fail(
                "tokens_seen", f"is {f['tokens_seen']}, but {steps} steps of {per_step} tokens see {seen}"
            )
        if len(f["losses"]) != steps:
            self.fail("losses", f"has {len(f['losses'])} entries for {steps} steps (one loss a step)")

    def curve(self, f: dict[str, Any]) -> None:
        curve, kind, per_step = f["curve"], f["kind"], f["batch_size"] * f["max_length"]
        if not curve:
            self.fail("curve", "is empty; a run has at least its untrained point")
        wanted = ("tokens", "step", *CURVE_MEASURES[kind])
        for i, row in enumerate(curve):
            here = f"curve[{i}]"
            self.keys(row, here, wanted, "a row of this kind has")
            for name in wanted:
                if name not in row:
                    self.fail(f"{here}[{key(name)}]", "is missing")
                if name in ("tokens", "step") and not (float(row[name]).is_integer() and row[name] >= 0):
                    self.fail(f"{here}[{key(name)}]", f"is {row[name]!r}; it must be a whole number >= 0")
                elif name not in ("tokens", "step"):
                    self.in_range(row[name], name, f"{here}[{key(name)}]")
            step, tokens = row["step"], row["tokens"]
            if i == 0 and (step, tokens) != (0, 0):
                self.fail(
                    here, f"is at step {step}, {tokens} tokens; a curve starts untrained, at step 0, 0 tokens"
                )
            if i and step <= curve[i - 1]["step"]:
                self.fail(
                    f'{here}["step"]', f"is {step}, not after the row before it ({curve[i - 1]['step']})"
                )
            if step > f["steps"]:
                self.fail(f'{here}["step"]', f"is {step}, past the run's last step ({f['steps']})")
            if tokens != step * per_step:
                self.fail(
                    f'{here}["tokens"]',
                    f"is {tokens}, but {step} steps of {per_step} tokens see {step * per_step}",
                )
            if kind == "causal-lm":
                nll, reference = row["nll"], f["reference_nll"]
                if abs(row["delta_nll"] - (nll - reference)) > 1e-9 * max(1.0, abs(nll), abs(reference)):
                    self.fail(
                        f'{here}["delta_nll"]',
                        f"is {row['delta_nll']!r}, but nll − reference_nll is {nll - reference!r}",
                    )

    def layer_errors(self, table: list[list[float]] | None, points: int, layers: int) -> None:
        if table is None:
            return
        if len(table) != points:
            self.fail("per_layer", f"has {len(table)} rows for {points} curve points")
        for i, row in enumerate(table):
            if len(row) != layers:
                self.fail(f"per_layer[{i}]", f"has {len(row)} entries for {layers} layers")
            for j, value in enumerate(row):
                self.in_range(value, "hidden_rel_error", f"per_layer[{i}][{j}]")  # a relative error too


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
    """Write several runs (variant → run) to one file: JSON that :meth:`HealingRun.load_all` reads (each
    run as :meth:`HealingRun.save` writes it), or markdown (the :func:`summary_table`, then each run's table).

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
        each = {
            spec: json.loads(report_text(HealingRun, _document(run), target, RunCheck))
            for spec, run in runs.items()
        }
        text = json.dumps({"format": RUNS_FORMAT, "version": 1, "runs": each}, indent=1, allow_nan=True)
    return save_text(target, text, "healing runs")


def _document(run: HealingRun) -> dict[str, Any]:
    """What the file of ``run`` holds: the format, its version and the saved fields."""
    fields = {f.name: getattr(run, f.name) for f in saved_fields(HealingRun)}
    return {"format": RunCheck.format, "version": RunCheck.version, **fields}


def load_runs(path: str | Path) -> dict[str, HealingRun]:
    """:meth:`HealingRun.load_all` (its name before it was public)."""
    return HealingRun.load_all(path)
