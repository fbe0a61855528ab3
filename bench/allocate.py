"""Benchmark ``allocate``: its whole time against the time of the sweeps it needs, on SmolLM2, in one run.

Run: ``.venv/bin/python bench/allocate.py`` (a few minutes on a 2-core CPU; the first SmolLM2 load
takes about 20 s more).

An allocation (:mod:`headwidget.evaluation._allocate`) needs the candidates' fits, one per-layer sweep
(:func:`~headwidget.evaluation._sweep.layer_sweep`) and, per refine round, one sweep around the
current allocation (:func:`~headwidget.evaluation._sweep.swap_sweep`). Everything else (the original's
reference outputs, the knapsack, measuring the chosen spec and the uniform candidates within the
budget, bookkeeping) is overhead. The script times ``allocate`` whole and, in the same call, the time
spent inside those three (the functions are wrapped with timers), and prints
``allocate ÷ (fits + sweeps)``. Target ≤ 1.15. Beside it, the call's peak resident set (``bench/peaks.py``)
and :func:`headwidget.estimate_allocation` of the same arguments.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

import headwidget.evaluation._allocate as allocate_module
from headwidget.capture import capture
from headwidget.embedded import load_smollm2
from headwidget.evaluation import allocate, estimate_allocation
from headwidget.texts import english_sample

sys.path.insert(0, str(Path(__file__).resolve().parent))
from peaks import Peak

TARGET = 1.15


class Timed:
    """Wraps ``allocate_module.<name>`` with a timer for the duration of the benchmark."""

    def __init__(self, name: str) -> None:
        self.name, self.seconds, self.calls = name, 0.0, 0
        self.inner: Callable[..., Any] = getattr(allocate_module, name)
        setattr(allocate_module, name, self)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return self.inner(*args, **kwargs)
        finally:
            self.seconds += time.perf_counter() - start
            self.calls += 1

    def restore(self) -> None:
        setattr(allocate_module, self.name, self.inner)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--candidates", default="model,mqa+align,mla:64,kv:int4,kv:int2")
    parser.add_argument("--budget", type=float, default=1 / 3, help="a fraction of the model's K/V bytes")
    parser.add_argument("--tokens", type=int, default=512, help="tokens to choose on")
    parser.add_argument("--calibration-tokens", type=int, default=2048, help="tokens of the statistics")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--refine", type=int, default=1)
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float64"])
    args = parser.parse_args()
    dtype = getattr(torch, args.dtype)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, dtype {args.dtype}")
    t = time.perf_counter()
    model, tok = load_smollm2(dtype=dtype)
    print(f"SmolLM2 loaded ({time.perf_counter() - t:.1f} s)")
    t = time.perf_counter()
    stats = capture(
        model,
        english_sample(split="calibration"),
        tokenizer=tok,
        inputs=True,
        rope="both",
        progress=False,
        max_tokens=args.calibration_tokens,
        max_length=args.max_length,
    )
    print(f"statistics: {stats.tokens} calibration tokens ({time.perf_counter() - t:.1f} s, not counted)")
    candidates = [s.strip() for s in args.candidates.split(",") if s.strip()]
    texts = english_sample(split="evaluation")
    options = {
        "candidates": candidates,
        "dtype": dtype,
        "max_length": args.max_length,
        "max_tokens": args.tokens,
    }
    need = estimate_allocation(model, texts, tokenizer=tok, **options)
    timers = [Timed("plan_variant"), Timed("layer_sweep"), Timed("swap_sweep")]
    try:
        t = time.perf_counter()
        with Peak(torch.device("cpu")) as peak:
            alloc = allocate(
                model,
                texts,
                tokenizer=tok,
                stats=stats,
                budget=args.budget,
                refine=args.refine,
                progress=False,
                **options,
            )
        whole = time.perf_counter() - t
    finally:
        for timer in timers:
            timer.restore()
    needed = sum(timer.seconds for timer in timers)
    print(
        f"chose on {alloc.tokens} predicted tokens; {len(candidates)} candidates × "
        f"{len(alloc.choice)} layers; {len(alloc.rounds)} rounds\n"
    )
    print(f"{'part':<44}{'calls':>6}{'seconds':>9}")
    labels = {
        "plan_variant": "fits (plan_variant)",
        "layer_sweep": "per-layer sweep (layer_sweep)",
        "swap_sweep": "refine sweeps (swap_sweep)",
    }
    for timer in timers:
        print(f"{labels[timer.name]:<44}{timer.calls:>6}{timer.seconds:>9.1f}")
    print(f"{'fits + sweeps':<50}{needed:>9.1f}")
    print(f"{'allocate, whole':<50}{whole:>9.1f}")
    ratio = whole / needed
    verdict = "met" if ratio <= TARGET else "MISSED"
    print(f"allocate ÷ (fits + sweeps) = {ratio:.3f} (target ≤ {TARGET}: {verdict})")
    print(
        f"peak resident set of the call {peak.bytes / 2**20:.0f} MiB, "
        f"estimate_allocation {need / 2**20:.0f} MiB "
        f"(÷ {peak.bytes / need:.2f}; the resident set also holds what glibc keeps after frees)\n"
    )
    print(alloc.table())


if __name__ == "__main__":
    main()
