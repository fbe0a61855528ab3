"""``headwidget heal``: how much each converted variant recovers with a little training.

1. ``--variants`` are read (a ``kv:`` quantizer, which trains nothing, and ``model`` are refused) and
   ``--out`` (``.json`` or ``.md``) is checked before anything is loaded;
2. ``--model`` is loaded and every variant fitted on one layer from a capture of a few tokens, so a spec
   the model cannot take fails before the calibration capture;
3. the statistics the fits need are captured on ``--calibration-tokens`` of the calibration split;
4. each variant is built (:func:`headwidget.apply`) and healed (:func:`headwidget.heal`) on the calibration
   split (less any paragraph that repeats evaluation text), its curve measured on ``--eval-tokens`` of the
   evaluation split every ``--eval-every`` tokens;
5. each run's table and the summary are printed, and the runs written (:func:`headwidget.healing.save_runs`).

Ctrl-C stops the whole command: the variant being healed stops at its next step (as
:func:`headwidget.heal` does), no further variant is healed, the runs so far are written, and the exit
status is 130 (128 + SIGINT), with one line on stderr saying what was healed and what was not.

Example:
    >>> COMMAND.name
    'heal'
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from headwidget.analysis.variants import parse_variant, uniform_parts
from headwidget.cli._command import Command
from headwidget.cli._errors import UsageError
from headwidget.cli._files import check_output_file
from headwidget.cli._models import EMBEDDED, Loader
from headwidget.cli._options import count, real, seed
from headwidget.cli._variants import check_variants, needs_inputs, needs_statistics, variant_specs
from headwidget.errors import ArgumentError

__all__ = ["COMMAND"]

CALIBRATION_TOKENS = 4096
RUN_SUFFIXES = (".json", ".md")
#: The exit status when Ctrl-C stops the command (128 + SIGINT, as a shell reports it).
INTERRUPTED = 130


def add_parser(sub: Any) -> None:
    """Declare ``heal`` and its options on the subparsers ``sub``."""
    p = sub.add_parser(
        "heal",
        help="heal converted attention variants with a little training and measure how much they recover",
        description="Load a model, build each variant, train it (only its mechanism's own parameters by "
        "default) by distillation from the model on the calibration part of the English sample, and "
        "measure NLL, KL and top-1 against the model on the evaluation part as it trains. Writes the runs "
        "as .json (headwidget.HealingRun.load_all(path) reads it: a mapping of variant to run, which "
        "headwidget.HealingView draws) or .md, and prints their tables. Ctrl-C stops the command: the runs "
        "so far are written and the exit status is 130.",
    )
    p.add_argument("--model", required=True, help=f"model directory, or one of: {', '.join(EMBEDDED)}")
    p.add_argument(
        "--variants", required=True, help="comma-separated variant specs (mqa, mqa+align, mla:128...)"
    )
    p.add_argument("--out", required=True, type=Path, help="runs to write: .json or .md")
    p.add_argument("--tokens", type=count, default=65536, help="healing tokens per variant (default: 65536)")
    p.add_argument("--trainable", default="kv", help="kv, attention, all or lora:r (default: kv)")
    p.add_argument("--method", default="kd", choices=("kd", "lm"), help="kd (distil) or lm (default: kd)")
    p.add_argument("--lr", type=real, default=None, help="peak learning rate (default: per --trainable)")
    p.add_argument(
        "--eval-tokens", type=count, default=4096, help="evaluation tokens a point (default: 4096)"
    )
    p.add_argument(
        "--eval-every", type=count, default=8192, help="healing tokens between points (default: 8192)"
    )
    p.add_argument("--batch-size", type=count, default=8, help="windows a step (default: 8)")
    p.add_argument("--max-length", type=count, default=512, help="tokens a window (default: 512)")
    p.add_argument(
        "--micro-batch-size",
        type=count,
        default=None,
        help="windows run at a time in a step, their gradients summed (the same steps, less memory; "
        "default: the whole batch)",
    )
    p.add_argument(
        "--checkpoint", action="store_true", help="compute each layer's activations again in the backward"
    )
    p.add_argument(
        "--calibration-tokens",
        type=count,
        default=CALIBRATION_TOKENS,
        help="tokens the statistics of +align, LRKV, MLA and rope:r are captured on "
        f"(default: {CALIBRATION_TOKENS})",
    )
    p.add_argument(
        "--protocol",
        default="documents",
        help="how the curve's points are measured: documents (each evaluation text its own sequence) or "
        "prefill:P (its first P tokens prefill a KV cache, the rest is scored reading it) (default: "
        "documents)",
    )
    p.add_argument("--seed", type=seed, default=0, help="window order and LoRA initialization (default: 0)")
    p.add_argument("--no-per-layer", action="store_true", help="skip the per-layer attention errors")
    p.add_argument("--device", default=None, help="torch device (default: cuda if available, else cpu)")
    p.add_argument("--no-progress", action="store_true", help="hide the progress bars")


def _specs(args: argparse.Namespace) -> list[str]:
    """The conversions of ``--variants``: a spec with a ``kv:`` quantizer part trains nothing (refused),
    one whose every part is ``model`` converts nothing (left out, and none left is refused)."""
    parts = {s: uniform_parts(parse_variant(s)) for s in variant_specs(args.variants)}
    specs = [s for s, ps in parts.items() if any(p.mechanism != "model" for p in ps)]
    if not specs:
        raise UsageError("--variants: give at least one conversion to heal (e.g. mqa,mqa+align)")
    quantized = [s for s in specs if any(p.quantizer for p in parts[s])]
    if quantized:
        raise UsageError(
            f"--variants {','.join(quantized)}: a kv: quantizer fits no weight, so healing has nothing to "
            "train; heal conversions (mqa, gqa:G, lrkv:r, mla:d_c, rope:r, +align), then apply the "
            "quantizer to the healed model"
        )
    return specs


def _interrupted(runs: dict[str, Any], specs: list[str], out: Path) -> int:
    """Ctrl-C: write the runs so far (the last one stopped early), say so on stderr, exit status 130."""
    from headwidget.healing import save_runs

    left = [s for s in specs if s not in runs or runs[s].stopped_early]
    if runs:
        save_runs(runs, out)
        said = f"wrote the runs so far to {out} ({', '.join(runs)})"
    else:
        said = "no variant was healed, nothing written"
    print(
        f"headwidget heal: interrupted (Ctrl-C): {said}; not healed in full: {', '.join(left)}",
        file=sys.stderr,
    )
    return INTERRUPTED


def run(args: argparse.Namespace, load: Loader) -> int:
    """Check the options and ``--out``, load the model, calibrate, heal each variant, print and write."""
    from headwidget.healing import parse_trainable

    specs = _specs(args)
    if args.out.suffix.lower() not in RUN_SUFFIXES:
        raise UsageError(f"--out {args.out}: the extension must be .json or .md (the runs' format)")
    try:
        parse_trainable(args.trainable)
    except ArgumentError as err:
        raise UsageError(f"--trainable {args.trainable}: {err}") from None
    check_output_file(args.out)
    runs: dict[str, Any] = {}
    try:
        return _heal_all(args, load, specs, runs)
    except KeyboardInterrupt:
        return _interrupted(runs, specs, args.out)


def _heal_all(args: argparse.Namespace, load: Loader, specs: list[str], runs: dict[str, Any]) -> int:
    """Load, calibrate, heal each variant into ``runs`` (a stopped run ends the command), print, write."""
    from headwidget.capture import capture
    from headwidget.evaluation import apply
    from headwidget.healing import heal, save_runs, summary_table
    from headwidget.texts import english_sample

    progress = not args.no_progress and sys.stderr.isatty()
    model, tokenizer = load(args.model, device=args.device)
    calibration = english_sample(split="calibration")
    stats = None
    if needs_statistics(specs):
        check_variants(model, tokenizer, ["model", *specs], 0, calibration)
        stats = capture(
            model,
            calibration,
            tokenizer=tokenizer,
            inputs=needs_inputs(specs),
            max_tokens=args.calibration_tokens,
            max_length=args.max_length,
            batch_size=args.batch_size,
            progress=progress,
        )
    for spec in specs:
        variant = apply(model, spec, stats)
        runs[spec] = heal(
            variant,
            model,
            tokenizer=tokenizer,
            tokens=args.tokens,
            method=args.method,
            trainable=args.trainable,
            lr=args.lr,
            batch_size=args.batch_size,
            max_length=args.max_length,
            micro_batch_size=args.micro_batch_size,
            checkpoint=args.checkpoint,
            eval_every=args.eval_every,
            eval_tokens=args.eval_tokens,
            protocol=args.protocol,
            per_layer=not args.no_per_layer,
            seed=args.seed,
            progress=progress,
        )
        print(f"{spec}: healed on {runs[spec].tokens_seen:,} tokens ({runs[spec].steps} steps)\n")
        print(runs[spec].table() + "\n")
        if runs[spec].stopped_early:  # no callbacks here: only Ctrl-C stops a run early
            raise KeyboardInterrupt
    save_runs(runs, args.out)
    print(summary_table(runs))
    print(f"\nsaved {args.out}")
    return 0


COMMAND = Command("heal", add_parser, run)
