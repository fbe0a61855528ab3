"""The ``headwidget`` command line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from headwidget.errors import HeadwidgetError

__all__ = ["main"]


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="headwidget",
        description="How redundant are a transformer's attention heads and KV channels?",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    demo = sub.add_parser(
        "demo",
        help="capture the embedded real models over English text, print per-layer summaries, save stats",
        description="Load SmolLM2-135M (GQA) and all-MiniLM-L6-v2 (BERT) from their PyPI packages, "
        "capture K/V statistics over English prose shipped with Python, print a per-layer summary "
        "and save the statistics (safetensors) under --out.",
    )
    demo.add_argument("--out", type=Path, default=Path("headwidget-demo"),
                      help="output directory (default: ./headwidget-demo)")  # fmt: skip
    demo.add_argument("--max-tokens", type=int, default=8192,
                      help="tokens to capture per model (default: 8192)")  # fmt: skip
    demo.add_argument("--max-length", type=int, default=256, help="tokens per text (default: 256)")
    demo.add_argument("--batch-size", type=int, default=8, help="texts per forward pass (default: 8)")
    demo.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    demo.add_argument("--models", default=None,
                      help="comma-separated subset of: smollm2-135m, minilm-l6 (default: both)")  # fmt: skip
    demo.add_argument("--no-progress", action="store_true", help="hide progress bars")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        if args.command == "demo":
            from headwidget.demo import MODELS, run_demo

            models = args.models.split(",") if args.models else None
            unknown = [m for m in models or [] if m not in MODELS]
            if unknown:
                print(
                    f"headwidget demo: unknown model(s) {unknown}; choose from {list(MODELS)}",
                    file=sys.stderr,
                )
                return 2
            run_demo(
                args.out, max_tokens=args.max_tokens, max_length=args.max_length,
                batch_size=args.batch_size, device=args.device, models=models,
                progress=not args.no_progress,
            )  # fmt: skip
            return 0
    except HeadwidgetError as err:
        print(f"headwidget {args.command}: {err}", file=sys.stderr)
        return 1
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
