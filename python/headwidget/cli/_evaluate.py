"""``headwidget evaluate``: what converted attention variants do to a model's predictions.

1. ``--variants`` are read (``model`` is always the first row) and ``--out`` (``.json`` or ``.md``)
   is checked before anything is loaded;
2. ``--model`` is loaded (an embedded name or a model directory, as ``capture`` takes it) and every
   variant is fitted on one layer from a capture of a few tokens, so a spec the model cannot take
   fails before the calibration capture;
3. the calibration statistics are captured on ``--calibration-tokens`` of
   ``english_sample(split="calibration")`` with only what the variants need (keys and values for
   ``+align``, the attention input for data-aware LRKV/MLA and partial RoPE; nothing for plain
   merges), or read from ``--stats``;
4. :func:`headwidget.evaluation.evaluate` runs on ``--evaluation-tokens`` of
   ``english_sample(split="evaluation")`` (disjoint from the calibration text) or of ``--texts``;
5. the table is printed and the report written.

Progress bars go to stderr, only when it is a terminal (and ``--no-progress`` is not given).

Example:
    >>> COMMAND.name
    'evaluate'
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from headwidget.analysis.variants import VARIANT_FORMS
from headwidget.cli._command import Command
from headwidget.cli._errors import UsageError
from headwidget.cli._files import check_output_file, read_texts
from headwidget.cli._models import EMBEDDED, Loader
from headwidget.cli._options import DTYPES, count, int_list
from headwidget.cli._report_files import REPORT_SUFFIXES, write_report
from headwidget.cli._variants import (
    CALIBRATION_SAMPLES,
    check_variants,
    check_variants_statistics,
    needs_inputs,
    needs_samples,
    needs_statistics,
    samples_needed,
    variant_specs,
)
from headwidget.errors import ArgumentError
from headwidget.texts import SAMPLE_SOURCE, english_sample

__all__ = ["COMMAND"]

#: Default ``--calibration-tokens`` and ``--evaluation-tokens``.
CALIBRATION_TOKENS = 4096
EVALUATION_TOKENS = 8192


def add_parser(sub: Any) -> None:
    """Declare ``evaluate`` and its options on the subparsers ``sub``."""
    ev = sub.add_parser(
        "evaluate",
        help="measure what converted attention variants do to a model's predictions on held-out text",
        description="Load a model (an embedded one by name, or a local directory), capture calibration "
        "statistics on one part of the English sample, and measure each variant (NLL, perplexity, KL "
        "and top-1 agreement against the model, KV bytes per token) on the other part. Writes the "
        "report as .json (headwidget.EvaluationReport.load reads it) or .md, and prints its table.",
    )
    ev.add_argument("--model", required=True, help=f"model directory, or one of: {', '.join(EMBEDDED)}")
    ev.add_argument(
        "--variants",
        default=None,
        help=f"comma-separated variant specs: {VARIANT_FORMS} (the model itself is always the first "
        "row; kv:… quantize the K/V the attention uses, the others convert the attention)",
    )
    ev.add_argument(
        "--variant",
        action="append",
        default=[],
        metavar="SPEC",
        help="one more variant spec, repeatable; for mixed specs, whose layer lists hold commas "
        "(--variant 'mla:64@0-9;mla:128@10-29')",
    )
    ev.add_argument("--out", required=True, type=Path, help="report to write: .json or .md")
    ev.add_argument(
        "--per-layer",
        action="store_true",
        help="also measure each variant with only one layer (a cross-layer variant: one group) converted, "
        "for every layer (ΔNLL; a group's is given to each of its layers)",
    )
    ev.add_argument("--layers", default=None, help="comma-separated layers to convert (default: all)")
    ev.add_argument(
        "--calibration-tokens",
        type=count,
        default=CALIBRATION_TOKENS,
        help=f"tokens of calibration text the statistics are captured on (default: {CALIBRATION_TOKENS})",
    )
    ev.add_argument(
        "--evaluation-tokens",
        type=count,
        default=EVALUATION_TOKENS,
        help=f"tokens of evaluation text the variants are measured on (default: {EVALUATION_TOKENS})",
    )
    ev.add_argument(
        "--stats",
        type=Path,
        default=None,
        help="statistics of this model written by `headwidget capture` (used instead of capturing)",
    )
    ev.add_argument(
        "--allow-other-weights",
        action="store_true",
        help="use --stats even when they were captured from other weights of the same architecture "
        "(a base model's statistics for its fine-tune), which is otherwise refused",
    )
    ev.add_argument(
        "--texts",
        type=Path,
        default=None,
        help="UTF-8 evaluation text file, one text per paragraph (default: the evaluation part of the "
        "English sample)",
    )
    ev.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="dtype the model and the variants run in; KV bytes are counted in it (default: float32)",
    )
    ev.add_argument(
        "--protocol",
        default="documents",
        help="how the texts become scored sequences: documents (each text its own, up to --max-length), "
        "chunks:W (one stream cut into windows of W tokens), stride:W/S (windows of W every S tokens, "
        "each scoring its new tokens) or prefill:P (each text's first P tokens prefill a KV cache that "
        "merge/xkv/kv: variants transform, the rest is scored from it) (default: documents)",
    )
    ev.add_argument("--batch-size", type=count, default=8, help="texts per forward pass (default: 8)")
    ev.add_argument("--max-length", type=count, default=512, help="tokens per text (default: 512)")
    ev.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    ev.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def run(args: argparse.Namespace, load: Loader) -> int:
    """Check the options and ``--out``, load the model, calibrate, evaluate, print and write the report."""
    import torch

    from headwidget.capture import capture
    from headwidget.evaluation import evaluate, parse_protocol
    from headwidget.stats import KVStats

    specs = variant_specs(args.variants, args.variant)
    if args.out.suffix.lower() not in REPORT_SUFFIXES:
        raise UsageError(f"--out {args.out}: the extension must be .json or .md (the report's format)")
    layers = int_list(args.layers, "--layers")
    try:
        protocol = parse_protocol(args.protocol).text
    except ArgumentError as e:
        raise UsageError(f"--protocol {args.protocol}: {e}") from None
    need = samples_needed(specs)
    if args.stats is None and need > args.calibration_tokens:
        raise UsageError(
            f"--calibration-tokens {args.calibration_tokens}: the kv:cq codebooks fit {need} centroids per "
            f"layer on one sample per calibration token, so they need at least {need}; give "
            f"--calibration-tokens {need} or more"
        )
    texts = read_texts(args.texts) if args.texts is not None else english_sample(split="evaluation")
    evaluation = str(args.texts) if args.texts is not None else f"the evaluation split of {SAMPLE_SOURCE}"
    stats = None
    if args.stats is not None:
        if not args.stats.is_file():
            raise UsageError(f"--stats {args.stats}: no such statistics file")
        stats = KVStats.load(args.stats)
        check_variants_statistics(specs, list(stats.kinds), str(args.stats))
    check_output_file(args.out)  # before loading and capturing: the work is never lost for want of a file
    progress = not args.no_progress and sys.stderr.isatty()
    model, tokenizer = load(args.model, device=args.device)
    calibration_texts = english_sample(split="calibration")
    if stats is None and needs_statistics(specs):
        from headwidget.adapters import adapter_for
        from headwidget.evaluation import resolve_layers

        first = resolve_layers(adapter_for(model), layers)[0]
        check_variants(model, tokenizer, specs, first, calibration_texts)
        sampled = needs_samples(specs)  # kv:cq codebooks: samples of the post-RoPE keys and values
        stats = capture(
            model,
            calibration_texts,
            tokenizer=tokenizer,
            layers=layers,
            inputs=needs_inputs(specs),
            max_tokens=args.calibration_tokens,
            max_length=args.max_length,
            batch_size=args.batch_size,
            samples=CALIBRATION_SAMPLES if sampled else 0,
            rope="both" if sampled else "pre",
            progress=progress,
        )
        calibration = f"{stats.tokens} tokens of the calibration split of {SAMPLE_SOURCE}"
    elif stats is not None:
        calibration = f"{stats.tokens} tokens, read from --stats {args.stats}"
    else:
        calibration = "none (no variant is fitted from statistics)"
    if stats is not None:
        calibration += f" (kinds {', '.join(stats.kinds)})"
    report = evaluate(
        model,
        texts,
        specs,
        tokenizer=tokenizer,
        stats=stats,
        allow_other_weights=args.allow_other_weights,
        layers=layers,
        per_layer=args.per_layer,
        dtype=getattr(torch, args.dtype),
        batch_size=args.batch_size,
        max_length=args.max_length,
        max_tokens=args.evaluation_tokens,
        protocol=protocol,
        progress=progress,
    )
    write_report(report, args.out, evaluation=evaluation, calibration=calibration)
    print(
        f"{report.model}: {report.tokens} evaluation tokens in {report.sequences} sequences "
        f"(fingerprint {report.fingerprint}), {args.dtype}; calibration: {calibration}\n"
    )
    print(report.table())
    print(f"\nsaved {args.out}")
    return 0


COMMAND = Command("evaluate", add_parser, run)
