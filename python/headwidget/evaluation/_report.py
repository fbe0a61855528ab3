"""``EvaluationReport``: what each variant does to a model's predictions, its cost, and where it was measured.

A language-model report holds per variant ``nll``, ``perplexity``, ``kl`` and ``top1``; an encoder
report ``hidden_rel_error`` and ``embedding_cosine`` (:mod:`headwidget.evaluation.measures`). Asking an
encoder report for perplexity (or a language-model report for encoder measures) raises
:class:`~headwidget.errors.EncoderMeasureError`. ``per_layer`` (with ``per_layer=True``) holds, per
variant, one number per evaluated layer with only that layer converted: ``ΔNLL`` for language models,
the hidden-state relative error for encoders (``per_layer_measure`` says which).

``kv_bytes_per_token`` is what every token costs in the cache (a float where a quantizer's count is not
whole); ``constant_bytes`` what a variant stores once, whatever the number of tokens (the fp16 codebooks
of ``kv:cq``, over all quantized layers; absent means 0, as in reports written before it existed).
The table shows a "constant bytes" column when some variant has any. A variant converts or quantizes
the ``layers`` listed, of the model's ``num_layers``; ``converted_kv_bytes`` is what the original
caches per token in those layers, so that a cost can be given per converted channel as well as over
the whole cache (both 0 in reports written before they existed: not recorded).

Example:
    >>> report = EvaluationReport(
    ...     model="tiny", kind="causal-lm", variants=["model", "mqa"],
    ...     measures={"model": {"nll": 2.0, "perplexity": 7.389, "kl": 0.0, "top1": 1.0},
    ...               "mqa": {"nll": 2.5, "perplexity": 12.18, "kl": 0.4, "top1": 0.8}},
    ...     kv_bytes_per_token={"model": 512, "mqa": 128}, tokens=100, sequences=4,
    ...     fingerprint="0123456789abcdef", dtype="torch.float32")
    >>> report.nll["mqa"], report.kv_bytes_per_token["mqa"]
    (2.5, 128)
    >>> print(report.table().splitlines()[2])
    | model | 512 | 2.0000 | 7.389 | +0.0000 | 0.0000 | 1.0000 |
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from dataclasses import fields as fields_of
from pathlib import Path
from typing import Annotated, Any

from headwidget.core.stored import Stored, stored
from headwidget.errors import EncoderMeasureError, ReportFileError
from headwidget.evaluation.report_file import (
    ENCODER_MEASURES,
    FORMAT,
    LM_MEASURES,
    REPORT_SUFFIXES,
    VERSION,
    read_report,
    report_text,
    save_text,
)

__all__ = ["EvaluationReport", "bytes_text"]


@dataclass
class EvaluationReport:
    """The result of :func:`~headwidget.evaluation.evaluate` (see the module docstring).

    ``kind`` is ``"causal-lm"`` or ``"encoder"``; ``measures[variant][name]``; ``tokens`` the predicted
    tokens (language models) or real tokens (encoders) every measure averages over; ``fingerprint`` a
    hash of the evaluation token ids, so two reports can be compared knowingly.
    """

    model: str
    kind: str
    variants: Annotated[list[str], Stored(unique=True)]
    measures: dict[str, dict[str, float]]
    kv_bytes_per_token: Annotated[dict[str, float], Stored(minimum=0.0)]
    tokens: Annotated[int, Stored(minimum=1)]
    sequences: Annotated[int, Stored(minimum=1)]
    fingerprint: str
    dtype: str
    layers: list[int] = stored(default_factory=list, minimum=0, unique="layer")
    per_layer: dict[str, list[float]] | None = None
    per_layer_measure: str | None = None
    calibration: dict[str, Any] = field(default_factory=dict)
    constant_bytes: dict[str, int] = stored(default_factory=dict, minimum=0)
    #: The model's layer count (0: not recorded).
    num_layers: int = stored(default=0, minimum=0)
    converted_kv_bytes: float = stored(default=0.0, minimum=0.0)
    #: Variants chosen by :func:`~headwidget.allocate` on (at least 1 % of) these tokens (their numbers
    #: are not held-out: the table marks them).
    chosen_on_these_tokens: list[str] = field(default_factory=list)
    #: How the texts became sequences: ``"documents"`` or ``"chunks:W"`` (see ``evaluate``).
    protocol: str = "documents"

    @property
    def converts_every_layer(self) -> bool:
        """Whether the variants convert every layer of the model (True where the report does not say:
        ``num_layers`` 0)."""
        return not self.num_layers or sorted(self.layers) == list(range(self.num_layers))

    def scope(self) -> str:
        """Which layers the variants convert, in words: ``"all 30 layers"``, ``"layers 0–5 of 30"``.

        Example:
            >>> report = EvaluationReport(model="m", kind="causal-lm", variants=["model"], measures={},
            ...     kv_bytes_per_token={"model": 1}, tokens=1, sequences=1, fingerprint="0",
            ...     dtype="torch.float32", layers=[0, 1, 2, 5], num_layers=30)
            >>> report.scope()
            'layers 0–2, 5 of 30'
        """
        if self.converts_every_layer:
            count = self.num_layers or len(self.layers)
            return f"all {count} layers" if count else "all layers"
        runs: list[list[int]] = []
        for layer in sorted(self.layers):
            if runs and layer == runs[-1][-1] + 1:
                runs[-1].append(layer)
            else:
                runs.append([layer])
        text = ", ".join(f"{r[0]}–{r[-1]}" if len(r) > 2 else ", ".join(map(str, r)) for r in runs)
        return f"layer{'s' if len(self.layers) > 1 else ''} {text} of {self.num_layers}"

    # ------------------------------------------------------------------ measures
    def _measure(self, name: str) -> dict[str, float]:
        wanted = LM_MEASURES if name in LM_MEASURES else ENCODER_MEASURES
        have = LM_MEASURES if self.kind == "causal-lm" else ENCODER_MEASURES
        if wanted != have:
            what = (
                "an encoder without a language-model head" if self.kind == "encoder" else "a language model"
            )
            raise EncoderMeasureError(
                f"{name} is not measured for {what} ({self.model}); this report has {', '.join(have)}"
            )
        return {v: self.measures[v][name] for v in self.variants}

    @property
    def nll(self) -> dict[str, float]:
        """Mean next-token cross-entropy (nats) per variant."""
        return self._measure("nll")

    @property
    def perplexity(self) -> dict[str, float]:
        """``exp(nll)`` per variant."""
        return self._measure("perplexity")

    @property
    def kl(self) -> dict[str, float]:
        """Mean ``KL(p_original ‖ p_variant)`` (nats) per variant."""
        return self._measure("kl")

    @property
    def top1(self) -> dict[str, float]:
        """Share of predicted tokens whose argmax agrees with the original's, per variant."""
        return self._measure("top1")

    @property
    def hidden_rel_error(self) -> dict[str, float]:
        """Encoders: ``‖H_variant − H_original‖_F / ‖H_original‖_F`` of the last hidden states."""
        return self._measure("hidden_rel_error")

    @property
    def embedding_cosine(self) -> dict[str, float]:
        """Encoders: mean cosine of the mean-pooled sentence embeddings."""
        return self._measure("embedding_cosine")

    # ------------------------------------------------------------------ output
    def rows(self) -> list[dict[str, Any]]:
        """One dict per variant: spec, KV bytes/token, constant bytes and the measures (and ΔNLL against
        ``model``)."""
        base = self.measures.get("model", {}).get("nll") if self.kind == "causal-lm" else None
        out = []
        for v in self.variants:
            row: dict[str, Any] = {
                "spec": v,
                "kv_bytes_per_token": self.kv_bytes_per_token[v],
                "constant_bytes": self.constant_bytes.get(v, 0),
            }
            row.update(self.measures[v])
            if base is not None:
                row["delta_nll"] = self.measures[v]["nll"] - base
            out.append(row)
        return out

    def table(self) -> str:
        """A markdown table, one row per variant (with the per-layer numbers below, if measured)."""
        if self.kind == "causal-lm":
            head = ["spec", "KV bytes/token", "NLL", "perplexity", "ΔNLL", "KL", "top-1"]
            base = self.measures.get("model", {}).get("nll", math.nan)
            body = [
                [
                    v,
                    bytes_text(self.kv_bytes_per_token[v]),
                    f"{m['nll']:.4f}",
                    f"{m['perplexity']:.3f}",
                    f"{m['nll'] - base:+.4f}",
                    f"{m['kl']:.4f}",
                    f"{m['top1']:.4f}",
                ]
                for v, m in ((v, self.measures[v]) for v in self.variants)
            ]
        else:
            head = ["spec", "KV bytes/token", "hidden rel. error", "embedding cosine"]
            body = [
                [
                    v,
                    bytes_text(self.kv_bytes_per_token[v]),
                    f"{self.measures[v]['hidden_rel_error']:.5f}",
                    f"{self.measures[v]['embedding_cosine']:.6f}",
                ]
                for v in self.variants
            ]
        if any(self.constant_bytes.get(v, 0) for v in self.variants):
            head.insert(2, "constant bytes")
            for v, r in zip(self.variants, body, strict=True):
                r.insert(2, str(self.constant_bytes.get(v, 0)))
        for v, r in zip(self.variants, body, strict=True):
            if v in self.chosen_on_these_tokens:
                r[0] += " †"
        lines = [_row(head), _row(["---"] * len(head)), *(_row(r) for r in body)]
        if self.chosen_on_these_tokens:
            lines += [
                "",
                "† chosen by allocate on (some of) these tokens: not a held-out measure; evaluate "
                "it on other text",
            ]
        if self.per_layer:
            name = "ΔNLL" if self.per_layer_measure == "delta_nll" else "hidden rel. error"
            lines += ["", f"{name} with only one layer (or cross-layer group) converted:", ""]
            lines.append(_row(["layer", *self.per_layer]))
            lines.append(_row(["---"] * (len(self.per_layer) + 1)))
            for i, layer in enumerate(self.layers):
                lines.append(_row([str(layer), *(f"{self.per_layer[v][i]:+.4f}" for v in self.per_layer)]))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (what :meth:`save` writes)."""
        return {"format": FORMAT, "version": VERSION, **asdict(self)}

    def save(self, path: str | Path) -> Path:
        """Write the report as JSON (``.json``) or as a markdown table with its facts (``.md``).

        The suffix is one of those two, in any case; any other is refused before anything is written.
        The report is checked as :meth:`load` checks a file (so a saved JSON report always loads), and
        the write is atomic (see :mod:`headwidget.files`): the file at ``path`` is either the old one or
        the complete new one, even when the disk fills up midway. Every failure raises
        :class:`~headwidget.errors.ReportFileError` naming ``path``; nothing is left behind.

        Example:
            >>> import pathlib, tempfile
            >>> report = EvaluationReport(model="tiny", kind="causal-lm", variants=["model"],
            ...     measures={"model": {"nll": 2.0, "perplexity": 7.389, "kl": 0.0, "top1": 1.0}},
            ...     kv_bytes_per_token={"model": 512}, tokens=100, sequences=4, fingerprint="0123",
            ...     dtype="torch.float32")
            >>> folder = pathlib.Path(tempfile.mkdtemp())
            >>> EvaluationReport.load(report.save(folder / "report.json")) == report
            True
            >>> report.save(folder / "report.png")
            Traceback (most recent call last):
            ...
            headwidget.errors.ReportFileError: cannot save the report to 'report.png': the suffix must be ...
        """
        target = Path(path)
        suffix = target.suffix.lower()
        if suffix not in REPORT_SUFFIXES:
            raise ReportFileError(
                f"cannot save the report to {target.name!r}: the suffix must be one of "
                f"{', '.join(REPORT_SUFFIXES)} (JSON that EvaluationReport.load reads, or a markdown table)"
            )
        content = {f.name: getattr(self, f.name) for f in fields_of(self)}  # to_json() without its copy
        text = report_text(type(self), {"format": FORMAT, "version": VERSION, **content}, target)
        if suffix == ".md":
            facts = (
                f"model: {self.model}; {self.tokens} evaluation tokens in {self.sequences} "
                f"sequence{'s' * (self.sequences != 1)} "
                f"(fingerprint {self.fingerprint}); dtype {self.dtype}"
            )
            text = f"{facts}\n\n{self.table()}\n"
        return save_text(target, text, "report")

    @classmethod
    def load(cls, path: str | Path) -> EvaluationReport:
        """Read a report written by :meth:`save` as JSON, checking every field.

        Each field must have its declared type (integers that are integers, strings that are strings),
        the format tag and version must be this headwidget's, and nothing else may be there. Every variant
        needs its measures (exactly those of the report's ``kind``) and its KV bytes per token (a finite
        count >= 0), and per-layer numbers with one per entry of ``layers``; ``constant_bytes`` may
        name only listed variants. NLL, KL and top-1 (in [0, 1]) are finite, perplexity >= 1 (+inf where
        it overflowed), the encoder measures NaN where undefined. Fields with a default may be absent
        (reports written before ``constant_bytes`` existed lack it).

        Raises:
            ReportFileError: the file is missing, unreadable, not a regular file, too large, not UTF-8
                JSON, not an evaluation report, or a field cannot be true; the message names the file
                and the field (``measures["mqa"]["kl"]``, ``per_layer["mqa"]``...).
        """
        return cls(**read_report(cls, Path(path)))


def bytes_text(value: float) -> str:
    """A byte count for a table: whole counts as integers (float sums that land within a rounding error
    of one too), fractional ones to two decimals, trailing zeros dropped.

    >>> bytes_text(512), bytes_text(288.00000000000006), bytes_text(160.33333333333334), bytes_text(76.5)
    ('512', '288', '160.33', '76.5')
    >>> bytes_text(1e-3), bytes_text(math.nan)
    ('0.001', 'nan')
    """
    if not math.isfinite(value):
        return str(value)
    nearest = round(value)
    if abs(value - nearest) <= 1e-9 * max(1.0, abs(value)):
        return str(int(nearest))
    if abs(value) < 0.01:
        return f"{value:.3g}"
    return f"{value:.2f}".rstrip("0").rstrip(".")


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"
