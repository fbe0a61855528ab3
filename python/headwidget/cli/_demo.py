"""``headwidget demo``: the embedded real models, captured and drawn (:mod:`headwidget.demo`).

Example:
    >>> COMMAND.name
    'demo'
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from headwidget.cli._command import Command
from headwidget.cli._errors import UsageError
from headwidget.cli._files import check_output_dir
from headwidget.cli._models import EMBEDDED, Loader, check_device
from headwidget.cli._options import count

__all__ = ["COMMAND"]


def add_parser(sub: Any) -> None:
    """Declare ``demo`` and its options on the subparsers ``sub``."""
    from headwidget.demo import (
        CODEBOOK_ROWS,
        EVALUATION_TOKENS,
        FULL_EVALUATION_TOKENS,
        FULL_SWEEP_TOKENS,
        QUANTIZER_TOKENS,
        SAMPLES,
        SWEEP_TOKENS,
    )

    demo = sub.add_parser(
        "demo",
        help="capture the embedded real models over English text, print summaries, save stats",
        description="Load SmolLM2-135M (GQA) and all-MiniLM-L6-v2 (BERT) from their PyPI packages, "
        "capture K/V statistics over English prose shipped with Python, print a per-layer summary "
        "and save the statistics (safetensors) under --out; then draw the figures, evaluate SmolLM2's "
        "attention variants and K/V quantizers on held-out text and write report.md. By default it is "
        f"a quick run (variants on {EVALUATION_TOKENS} held-out tokens, the per-layer sweep on "
        f"{SWEEP_TOKENS}). The K/V quantizers are a reduced run by default (CQ codebooks from "
        f"{CODEBOOK_ROWS} of the {SAMPLES} sampled rows, measured on at most {QUANTIZER_TOKENS} tokens): "
        "--full runs them in full.",
    )
    demo.add_argument("--out", type=Path, default=Path("headwidget-demo"), help="output directory")
    demo.add_argument("--max-tokens", type=count, default=4096, help="tokens per model (default: 4096)")
    demo.add_argument(
        "--no-figures",
        action="store_true",
        help="no reference figures and no explorer (nor their head-alignment and mechanism tables); the "
        "evaluation still draws its charts",
    )
    demo.add_argument(
        "--no-evaluation",
        action="store_true",
        help="no evaluation of SmolLM2 (its variants, the per-layer sweep, the channel coupling, the K/V "
        "quantizers): the statistics, the reference figures and the report only; with --no-figures, "
        "only the statistics and their per-layer summary (printed and in report.md)",
    )
    demo.add_argument("--max-length", type=count, default=256, help="tokens per text (default: 256)")
    demo.add_argument("--batch-size", type=count, default=8, help="texts per forward pass (default: 8)")
    demo.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    demo.add_argument("--models", default=None, help=f"comma-separated subset of: {', '.join(EMBEDDED)}")
    demo.add_argument("--no-progress", action="store_true", help="hide progress bars")
    demo.add_argument(
        "--evaluation-tokens",
        type=count,
        default=None,
        help=f"held-out tokens SmolLM2's variants are evaluated on (default: {EVALUATION_TOKENS}, "
        f"with --full {FULL_EVALUATION_TOKENS})",
    )
    demo.add_argument(
        "--sweep-tokens",
        type=count,
        default=None,
        help=f"held-out tokens of the per-layer ΔNLL sweep (default: {SWEEP_TOKENS}, with --full "
        f"{FULL_SWEEP_TOKENS})",
    )
    demo.add_argument(
        "--full",
        action="store_true",
        help=f"the full run: variants on {FULL_EVALUATION_TOKENS} held-out tokens and the sweep on "
        f"{FULL_SWEEP_TOKENS} (unless given above), CQ codebooks fitted on all {SAMPLES} sampled rows and "
        f"the quantizers measured on --evaluation-tokens (default: {CODEBOOK_ROWS} rows, at most "
        f"{QUANTIZER_TOKENS} tokens; the codebook fits are the demo's costliest step)",
    )


def run(args: argparse.Namespace, load: Loader) -> int:
    """Check the options, then run :func:`headwidget.demo.run_demo` (``load`` is not needed)."""
    from headwidget.demo import MODELS, run_demo

    if args.models is not None and not args.models.strip():
        raise UsageError(
            f"--models is empty; give a comma-separated subset of {list(MODELS)}, or leave it out"
        )
    models = args.models.split(",") if args.models else None
    unknown = [m for m in models or [] if m not in MODELS]
    if unknown:
        raise UsageError(f"unknown model(s) {unknown}; choose from {list(MODELS)}")
    check_device(args.device)
    check_output_dir(args.out)
    run_demo(
        args.out,
        max_tokens=args.max_tokens,
        max_length=args.max_length,
        batch_size=args.batch_size,
        device=args.device,
        models=models,
        progress=not args.no_progress,
        figures=not args.no_figures,
        evaluation=not args.no_evaluation,
        evaluation_tokens=args.evaluation_tokens,
        sweep_tokens=args.sweep_tokens,
        full=args.full,
    )
    return 0


COMMAND = Command("demo", add_parser, run)
