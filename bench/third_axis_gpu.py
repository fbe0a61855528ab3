"""The third axis's kernel-side speed targets on a device: ``third_axis_section(device)`` prints each
with PASS or FAIL.

1. Cross-layer statistics: SmolLM2-135M (its real weights, bfloat16 on a GPU) captured on 8×256 tokens
   with the joint moments of all 30 layers' keys and values (``cross_layer=True``: 5,760 channels a
   kind, folded on the tensor cores as ``split`` Grams) ÷ the same capture without them, as
   ``bench/capture.py`` (d) times it on the CPU. Target ≤ 1.3.
2. ``prefill:P``: SmolLM2 scored on the evaluation text by the prefill runner (a prefill of P = 128
   tokens that builds the cache, then one forward of the rest that reads it) ÷ the one-forward runner
   on the same batches and the same scored predictions, as ``bench/evaluate.py --prefill 128`` times it.
   Target ≤ 1.2.

Interleaved rounds after a warm-up; each round's own ratio, median (capture), and the best of each side
(prefill, as ``bench/evaluate.py``). ``bench/gpu_check.py`` calls :func:`third_axis_section`. Run alone:
``python bench/third_axis_gpu.py`` on a machine with a CUDA GPU; ``--dry-run`` is a smoke run of the same
code on the CPU in float32 with few tokens (its ratios say nothing about a GPU's).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import headwidget
from headwidget.embedded import load_smollm2
from headwidget.evaluation._inputs import evaluation_batches
from headwidget.evaluation._outputs import OutputRunner
from headwidget.evaluation._prefill import PrefillRunner, prefill_batches
from headwidget.texts import english_sample

sys.path.insert(0, str(Path(__file__).resolve().parent))
from capture_gpu import _seconds  # a call's seconds, the device synchronised around it

CROSS_TARGET = 1.3
PREFILL_TARGET = 1.2


def cross_layer_ratio(
    model: Any, device: torch.device, batch: int, length: int, rounds: int
) -> tuple[float, float, float]:
    """Capture with the joint moments of every layer ÷ without: each round's ratio (median, smallest,
    largest)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, int(model.config.vocab_size), (batch, length), generator=generator)

    def run(cross: bool) -> None:
        headwidget.capture(
            model,
            ids,
            batch_size=batch,
            max_length=length,
            progress=False,
            cross_layer=True if cross else None,
        )

    run(False)  # warm-up: kernels, the allocator's pools
    run(True)
    ratios = []
    for _ in range(rounds):
        without = _seconds(lambda: run(False), device)
        ratios.append(_seconds(lambda: run(True), device) / without)
    return statistics.median(ratios), min(ratios), max(ratios)


def prefill_ratio(
    model: torch.nn.Module, tokenizer: object, p: int, tokens: int, batch_size: int, repeats: int
) -> tuple[float, int]:
    """``prefill:P`` ÷ ``documents`` on the same batches (the best of ``repeats`` passes each), and the
    tokens scored."""
    device = next(model.parameters()).device
    documents = evaluation_batches(
        english_sample(split="evaluation"),
        tokenizer,
        batch_size=batch_size,
        max_length=2 * p,
        max_tokens=tokens,
        min_tokens=p + 2,
    )
    batches = prefill_batches(documents, p, batch_size=batch_size)
    whole, prefilled = OutputRunner.for_model(model), PrefillRunner.for_model(model, p)
    scored = 0
    with torch.no_grad():
        for batch in batches:  # warm-up, and the predictions each side scores
            targets = whole(model, batch).targets
            assert targets is not None  # (a language model's)
            scored += int(targets.numel())
            prefilled(model, batch)
        best = {"documents": float("inf"), "prefill": float("inf")}
        for _ in range(repeats):
            for side, runner in (("documents", whole), ("prefill", prefilled)):

                def passes(runner: Callable[..., object] = runner) -> None:
                    for batch in batches:
                        runner(model, batch)

                best[side] = min(best[side], _seconds(passes, device))
    return best["prefill"] / best["documents"], scored


def third_axis_section(
    device: torch.device | str = "cuda", *, rounds: int = 3, small: bool = False
) -> list[tuple[str, str, bool]]:
    """Print the two targets with PASS or FAIL; return them as (target, measured, passed).

    ``small``: few tokens (a smoke run: its ratios mean nothing).

    Example (the smoke run on the CPU, as ``python bench/third_axis_gpu.py --dry-run``):
        >>> results = third_axis_section("cpu", rounds=1, small=True)  # doctest: +ELLIPSIS
        <BLANKLINE>
        ...
        >>> len(results)
        2
    """
    where = torch.device(device)
    dtype = torch.bfloat16 if where.type == "cuda" else torch.float32
    model, tokenizer = load_smollm2(dtype=dtype, device=str(where))
    results: list[tuple[str, str, bool]] = []
    batch, length = (2, 64) if small else (8, 256)
    ratio, low, high = cross_layer_ratio(model, where, batch, length, rounds)
    layers = int(model.config.num_hidden_layers)
    target = (
        f"cross-layer statistics ({layers} layers, {batch}×{length} tokens, {dtype}) ÷ capture without "
        f"≤ {CROSS_TARGET}"
    )
    results.append((target, f"{ratio:.3f} (rounds {low:.3f}–{high:.3f})", ratio <= CROSS_TARGET))
    p, tokens, size = (16, 256, 2) if small else (128, 8192, 8)
    ratio, scored = prefill_ratio(model, tokenizer, p, tokens, size, repeats=1 if small else 3)
    target = f"prefill:{p} ÷ documents ≤ {PREFILL_TARGET} ({scored} predictions scored, {dtype})"
    results.append((target, f"{ratio:.3f}", ratio <= PREFILL_TARGET))
    print(f"\nthe third axis on {where}")
    for target, measured, passed in results:
        print(f"  {'PASS' if passed else 'FAIL'}  {target}: {measured}")
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, few tokens")
    args = parser.parse_args()
    if args.dry_run:
        third_axis_section("cpu", rounds=1, small=True)
        return
    third_axis_section(args.device, rounds=args.rounds)


if __name__ == "__main__":
    main()
