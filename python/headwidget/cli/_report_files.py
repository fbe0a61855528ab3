"""The files ``headwidget evaluate`` writes: an :class:`~headwidget.evaluation.EvaluationReport` as JSON
(what ``EvaluationReport.load`` reads) or as Markdown (a header with its facts, then its table).

Example:
    >>> import pathlib, tempfile
    >>> from headwidget.evaluation import EvaluationReport
    >>> report = EvaluationReport(
    ...     model="tiny", kind="causal-lm", variants=["model", "mqa"],
    ...     measures={"model": {"nll": 2.0, "perplexity": 7.389, "kl": 0.0, "top1": 1.0},
    ...               "mqa": {"nll": 2.5, "perplexity": 12.18, "kl": 0.4, "top1": 0.8}},
    ...     kv_bytes_per_token={"model": 512, "mqa": 128}, tokens=100, sequences=4,
    ...     fingerprint="0123456789abcdef", dtype="torch.float32", layers=[0, 1])
    >>> facts = report_facts(report, evaluation="evaluation.txt", calibration="none")
    >>> facts[0]
    '- model: tiny (causal-lm)'
    >>> print(facts[2])
    - evaluation: 100 predicted tokens in 4 sequences of evaluation.txt (fingerprint 0123456789abcdef)
    >>> print(report_markdown(report, evaluation="text", calibration="none").splitlines()[0])
    # Attention variants of tiny
    >>> folder = pathlib.Path(tempfile.mkdtemp())
    >>> path = write_report(report, folder / "report.json", evaluation="text", calibration="none")
    >>> EvaluationReport.load(path).nll
    {'model': 2.0, 'mqa': 2.5}
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from headwidget.files import atomic_write

if TYPE_CHECKING:
    from headwidget.evaluation import EvaluationReport

__all__ = ["REPORT_SUFFIXES", "report_facts", "report_markdown", "write_report"]

#: What ``--out`` of ``evaluate`` may end with: the suffixes ``EvaluationReport.save`` writes (stated
#: here too so that the command line refuses another before it imports torch).
REPORT_SUFFIXES = (".json", ".md")


def report_facts(report: EvaluationReport, *, evaluation: str, calibration: str) -> list[str]:
    """The facts a reader needs to compare two reports knowingly, one Markdown list item each:
    model, dtype, the evaluation tokens (their fingerprint, the protocol), the calibration, the converted
    layers.
    """
    measured = "predicted tokens" if report.kind == "causal-lm" else "tokens"
    layers = ", ".join(str(i) for i in report.layers) if report.layers else "all"
    return [
        f"- model: {report.model} ({report.kind})",
        f"- dtype: {report.dtype.removeprefix('torch.')} (the model and every variant run in it; "
        "KV bytes/token are counted in it)",
        f"- evaluation: {report.tokens} {measured} in {report.sequences} sequences of {evaluation} "
        f"(fingerprint {report.fingerprint})",
        f"- protocol: {report.protocol}",
        f"- calibration: {calibration}",
        f"- converted layers: {layers}",
    ]


def report_markdown(report: EvaluationReport, *, evaluation: str, calibration: str) -> str:
    """A Markdown page: a title, :func:`report_facts` and ``report.table()`` (with the per-layer table
    when the report has one).
    """
    facts = report_facts(report, evaluation=evaluation, calibration=calibration)
    title = f"# Attention variants of {report.model}"
    return "\n".join([title, "", *facts, "", report.table(), ""])


def write_report(report: EvaluationReport, path: Path, *, evaluation: str, calibration: str) -> Path:
    """Write ``report`` to ``path`` by its suffix (:data:`REPORT_SUFFIXES`), atomically (see
    :mod:`headwidget.files`): JSON with ``report.save``, Markdown with :func:`report_markdown`.
    """
    if path.suffix.lower() == ".md":
        with atomic_write(path, "w") as fh:
            fh.write(report_markdown(report, evaluation=evaluation, calibration=calibration))
    else:
        report.save(path)
    return path
