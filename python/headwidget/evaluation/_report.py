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
The table shows a "constant bytes" column when some variant has any.

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

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from headwidget.errors import EncoderMeasureError, ReportFileError

__all__ = ["EvaluationReport"]

LM_MEASURES = ("nll", "perplexity", "kl", "top1")
ENCODER_MEASURES = ("hidden_rel_error", "embedding_cosine")
FORMAT = "headwidget-evaluation-report"
VERSION = 1


@dataclass
class EvaluationReport:
    """The result of :func:`~headwidget.evaluation.evaluate` (see the module docstring).

    ``kind`` is ``"causal-lm"`` or ``"encoder"``; ``measures[variant][name]``; ``tokens`` the predicted
    tokens (language models) or real tokens (encoders) every measure averages over; ``fingerprint`` a
    hash of the evaluation token ids, so two reports can be compared knowingly.
    """

    model: str
    kind: str
    variants: list[str]
    measures: dict[str, dict[str, float]]
    kv_bytes_per_token: dict[str, float]
    tokens: int
    sequences: int
    fingerprint: str
    dtype: str
    layers: list[int] = field(default_factory=list)
    per_layer: dict[str, list[float]] | None = None
    per_layer_measure: str | None = None
    calibration: dict[str, Any] = field(default_factory=dict)
    constant_bytes: dict[str, int] = field(default_factory=dict)

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
            row: dict[str, Any] = {"spec": v, "kv_bytes_per_token": self.kv_bytes_per_token[v],
                                   "constant_bytes": self.constant_bytes.get(v, 0)}  # fmt: skip
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
                [v, str(self.kv_bytes_per_token[v]), f"{m['nll']:.4f}", f"{m['perplexity']:.3f}",
                 f"{m['nll'] - base:+.4f}", f"{m['kl']:.4f}", f"{m['top1']:.4f}"]
                for v, m in ((v, self.measures[v]) for v in self.variants)
            ]  # fmt: skip
        else:
            head = ["spec", "KV bytes/token", "hidden rel. error", "embedding cosine"]
            body = [
                [v, str(self.kv_bytes_per_token[v]), f"{self.measures[v]['hidden_rel_error']:.5f}",
                 f"{self.measures[v]['embedding_cosine']:.6f}"]
                for v in self.variants
            ]  # fmt: skip
        if any(self.constant_bytes.get(v, 0) for v in self.variants):
            head.insert(2, "constant bytes")
            for v, r in zip(self.variants, body, strict=True):
                r.insert(2, str(self.constant_bytes.get(v, 0)))
        lines = [_row(head), _row(["---"] * len(head)), *(_row(r) for r in body)]
        if self.per_layer:
            name = "ΔNLL" if self.per_layer_measure == "delta_nll" else "hidden rel. error"
            lines += ["", f"{name} with only one layer converted:", ""]
            lines.append(_row(["layer", *self.per_layer]))
            lines.append(_row(["---"] * (len(self.per_layer) + 1)))
            for i, layer in enumerate(self.layers):
                lines.append(_row([str(layer), *(f"{self.per_layer[v][i]:+.4f}" for v in self.per_layer)]))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        """A JSON-ready dict (what :meth:`save` writes)."""
        return {"format": FORMAT, "version": VERSION, **asdict(self)}

    def save(self, path: str | Path) -> Path:
        """Write the report as JSON (``.json``) or as a markdown table with its facts (``.md``)."""
        target = Path(path)
        if target.suffix.lower() == ".md":
            facts = (
                f"model: {self.model}; {self.tokens} evaluation tokens in {self.sequences} sequences "
                f"(fingerprint {self.fingerprint}); dtype {self.dtype}"
            )
            target.write_text(f"{facts}\n\n{self.table()}\n", encoding="utf-8")
        else:
            target.write_text(json.dumps(self.to_json(), indent=1, allow_nan=True), encoding="utf-8")
        return target

    @classmethod
    def load(cls, path: str | Path) -> EvaluationReport:
        """Read a report written by :meth:`save` as JSON.

        Raises:
            ReportFileError: the file is missing or is not a headwidget evaluation report.
        """
        target = Path(path)
        try:
            data = json.loads(target.read_text(encoding="utf-8"))
        except (OSError, ValueError) as err:
            raise ReportFileError(f"cannot read an evaluation report from {target}: {err}") from err
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise ReportFileError(
                f"{target} is not a headwidget evaluation report (save one with report.save)"
            )
        data.pop("format")
        data.pop("version", None)
        try:
            return cls(**data)
        except TypeError as err:
            raise ReportFileError(f"{target}: unexpected report fields ({err})") from err


def _row(cells: list[str]) -> str:
    return "| " + " | ".join(cells) + " |"
