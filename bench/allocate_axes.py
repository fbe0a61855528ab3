"""Does the third axis help? ``allocate_frontier`` on SmolLM2 with per-layer candidates only, and with
cross-layer candidates beside them, at the same budgets; each allocation then evaluated on held-out text.

Run: ``.venv/bin/python bench/allocate_axes.py`` (about half an hour on a shared 2-core CPU).

Both arms choose on the calibration split under ``prefill:P`` (``merge`` and ``xkv`` act on a prefilled
cache, and the ``kv:`` quantizers then quantize the prefilled cache as a deployed one does) with the
same statistics, sweep, refine rounds and budgets (fractions of the model's K/V bytes per token in
float32); every allocation is measured on the evaluation split under the same protocol, so the table
gives held-out KL(model ‖ variant) per predicted token and the K/V bytes each allocation holds.
"""

from __future__ import annotations

import argparse
import time
import warnings

import torch

from headwidget.capture import capture
from headwidget.embedded import load_smollm2
from headwidget.evaluation import allocate_frontier, evaluate
from headwidget.texts import english_sample

PER_LAYER = "model,mqa+align,mla:64,mla:32,kv:int4,kv:int2"
CROSS_LAYER = "share:2,mqa+align+share:2,merge:2,xkv:8/2"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-layer", default=PER_LAYER, help="the per-layer candidates of both arms")
    parser.add_argument("--cross-layer", default=CROSS_LAYER, help="the cross-layer candidates added")
    parser.add_argument("--budgets", default="1/3,1/6,1/12", help="fractions of the model's K/V bytes")
    parser.add_argument("--prefill", type=int, default=32, help="P of the prefill:P protocol")
    parser.add_argument("--tokens", type=int, default=2048, help="calibration tokens to choose on")
    parser.add_argument("--held-out", type=int, default=8192, help="evaluation tokens")
    parser.add_argument("--statistics-tokens", type=int, default=4096, help="tokens of the statistics")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--refine", type=int, default=1)
    args = parser.parse_args()
    budgets = [float(a) / float(b) for a, b in (x.split("/") for x in args.budgets.split(","))]
    per_layer = [s.strip() for s in args.per_layer.split(",") if s.strip()]
    cross = [s.strip() for s in args.cross_layer.split(",") if s.strip()]
    protocol = f"prefill:{args.prefill}"
    dtype = torch.float32
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads; {protocol}, float32")
    model, tok = load_smollm2(dtype=dtype)
    t = time.perf_counter()
    stats = capture(
        model,
        english_sample(split="calibration"),
        tokenizer=tok,
        inputs=True,
        progress=False,
        max_tokens=args.statistics_tokens,
        max_length=args.max_length,
    )
    print(f"statistics: {stats.tokens} calibration tokens ({time.perf_counter() - t:.0f} s)")
    common = {
        "tokenizer": tok,
        "stats": stats,
        "dtype": dtype,
        "max_length": args.max_length,
        "protocol": protocol,
        "progress": False,
    }
    arms = {}
    for name, candidates in (("per-layer", per_layer), ("+ cross-layer", per_layer + cross)):
        t = time.perf_counter()
        arms[name] = allocate_frontier(
            model,
            english_sample(split="calibration"),
            budgets=budgets,
            candidates=candidates,
            refine=args.refine,
            max_tokens=args.tokens,
            **common,
        )
        print(f"{name}: {len(candidates)} candidates, chosen in {time.perf_counter() - t:.0f} s")
    specs = list(dict.fromkeys(a.spec for allocations in arms.values() for a in allocations))
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # held-out: no allocation may be flagged as chosen on these tokens
        report = evaluate(
            model,
            english_sample(split="evaluation"),
            ["model", *specs],
            max_tokens=args.held_out,
            **common,
        )
    print(f"held out: {report.tokens} predicted tokens ({time.perf_counter() - t:.0f} s)\n")
    print("| budget | candidates | bytes/token | calibration KL | held-out KL | held-out ΔNLL | spec |")
    print("|---|---|---|---|---|---|---|")
    base = report.nll["model"]
    for i, budget in enumerate(budgets):
        for name, allocations in arms.items():
            a = allocations[i]
            measured = min(r.measured for r in a.rounds if r.spec == a.spec)
            print(
                f"| {budget:.4f} ({a.budget:g} B) | {name} | {report.kv_bytes_per_token[a.spec]:.1f} | "
                f"{measured:.4f} | {report.kl[a.spec]:.4f} | {report.nll[a.spec] - base:+.4f} | `{a.spec}` |"
            )
    print()
    for name, allocations in arms.items():
        for a in allocations:
            print(f"{name}, budget {a.budget:g}:\n{a.table()}\n")


if __name__ == "__main__":
    main()
