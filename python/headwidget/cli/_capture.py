"""``headwidget capture``: K/V statistics of a model over a text file, saved as safetensors.

Example:
    >>> COMMAND.name
    'capture'
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from headwidget.cli._command import Command
from headwidget.cli._files import check_output_file, read_texts
from headwidget.cli._models import EMBEDDED, Loader
from headwidget.cli._options import DTYPES, count, gib, int_list

__all__ = ["COMMAND"]


def add_parser(sub: Any) -> None:
    """Declare ``capture`` and its options on the subparsers ``sub``."""
    cap = sub.add_parser(
        "capture",
        help="capture K/V statistics of a local model over a text file",
        description="Load a transformers model from a local directory (or an embedded model by name), "
        "stream its key/value statistics over the texts in --texts and save them as safetensors.",
    )
    cap.add_argument("--model", required=True, help=f"model directory, or one of: {', '.join(EMBEDDED)}")
    cap.add_argument(
        "--texts",
        required=True,
        type=Path,
        help="UTF-8 text file: one text per paragraph (separated by blank lines)",
    )
    cap.add_argument("--out", required=True, type=Path, help="statistics file to write (.safetensors)")
    cap.add_argument("--layers", default=None, help="comma-separated layer indices (default: all)")
    cap.add_argument("--rope", default="pre", choices=("pre", "post", "both"), help="which keys to capture")
    cap.add_argument("--inputs", action="store_true", help="also capture the attention input's moments")
    cap.add_argument(
        "--cross-layer",
        default=None,
        help="comma-separated layers whose heads get joint statistics, or 'all'",
    )
    cap.add_argument("--skip-first-token", action="store_true", help="drop each text's first token")
    cap.add_argument("--max-tokens", type=count, default=None, help="stop after this many tokens")
    cap.add_argument("--max-length", type=count, default=512, help="tokens per text (default: 512)")
    cap.add_argument("--batch-size", type=count, default=8, help="texts per forward pass (default: 8)")
    cap.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    cap.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="model weights dtype (default: float32)",
    )
    cap.add_argument("--max-memory", type=gib, default=None, help="GiB the statistics may use per device")
    cap.add_argument("--no-progress", action="store_true", help="hide the progress bar")


def run(args: argparse.Namespace, load: Loader) -> int:
    """Read the texts, check ``--out``, load the model with ``load``, capture, save and print a summary."""
    from headwidget.capture import capture
    from headwidget.report import summary_table

    texts = read_texts(args.texts)
    cross: list[int] | bool | None = True if args.cross_layer == "all" else None
    if args.cross_layer not in (None, "all"):
        cross = int_list(args.cross_layer, "--cross-layer")
    layers = int_list(args.layers, "--layers")
    check_output_file(args.out)  # before loading and capturing: a capture is never lost for want of a file
    model, tokenizer = load(args.model, device=args.device, dtype=args.dtype)
    stats = capture(
        model,
        texts,
        tokenizer=tokenizer,
        layers=layers,
        rope=args.rope,
        inputs=args.inputs,
        cross_layer=cross,
        skip_first_token=args.skip_first_token,
        max_tokens=args.max_tokens,
        max_length=args.max_length,
        batch_size=args.batch_size,
        max_memory=None if args.max_memory is None else int(args.max_memory * 2**30),
        progress=not args.no_progress,
    )
    stats.save(args.out)
    print(summary_table(stats))
    print(f"saved {stats!r} to {args.out}")
    return 0


COMMAND = Command("capture", add_parser, run)
