"""Benchmark the K/V quantizers: the CQ codebook fit, and a forward with fake-quantized K/V on SmolLM2.

Run: ``.venv/bin/python bench/quantization.py`` (the fit takes minutes on a 2-core CPU; ``--fit-iters``
shortens it; the first SmolLM2 load takes about 20 s more).

(a) **Fit.** :func:`headwidget.analysis.quantizers.fit_codebooks` of CQ-8c8b codebooks (256 centroids
for each of the 512 groups of 8 channels) for one 4096-channel layer from 16384 samples, on the CPU (or
``--device``). The samples are random data with correlated channels (a rank-64 signal plus noise), not a
real model's K/V: the cost depends on the shapes and the iterations, not on the values.

(b) **Forward.** SmolLM2-135M on ``--tokens`` evaluation tokens: the forward with the K/V of every layer
fake-quantized (``fit_quantizer(...).active(model)``) ÷ the plain forward, for kv:int4 and kv:cq4c8b, in
one run. The CQ codebooks are fitted on calibration samples (``capture(..., rope="post",
samples=R)``). The sides are interleaved and each is timed as its fastest of ``--repeats`` passes over
the batches, so a busy machine slows all of them alike. Target: ≤ 1.3 for both on a CPU.
"""

from __future__ import annotations

import argparse
import time
from contextlib import nullcontext

import torch

from headwidget.analysis.quantizers import fit_codebooks
from headwidget.capture import capture
from headwidget.embedded import load_smollm2
from headwidget.evaluation._inputs import evaluation_batches, forward_kwargs
from headwidget.evaluation._quantize import fit_quantizer
from headwidget.texts import english_sample

TARGET = 1.3


def correlated_samples(n: int, channels: int, rank: int, device: str, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(rank, channels, generator=gen) / rank**0.5
    z = torch.randn(n, rank, generator=gen)
    return (z @ mix + 0.3 * torch.randn(n, channels, generator=gen)).to(device)


def fit_bench(args: argparse.Namespace) -> None:
    x = correlated_samples(args.fit_samples, args.fit_channels, 64, args.device)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    t = time.perf_counter()
    books = fit_codebooks(x, 8, 8, iters=args.fit_iters, seed=0)
    if args.device.startswith("cuda"):
        torch.cuda.synchronize()
    took = time.perf_counter() - t
    lloyd = len(books.objective) - 1
    groups = args.fit_channels // 8
    print(
        f"(a) CQ-8c8b fit: {args.fit_channels} channels ({groups} groups × 256 centroids × 8), "
        f"{args.fit_samples} samples (random, correlated channels), {args.device}: {took:.1f} s "
        f"for seeding + {lloyd} Lloyd iterations ({took / max(1, lloyd):.2f} s per iteration); "
        f"MSE per group {books.objective[0]:.4f} → {books.objective[-1]:.4f}"
    )


@torch.no_grad()
def forward_bench(args: argparse.Namespace) -> None:
    t = time.perf_counter()
    model, tok = load_smollm2(dtype=torch.float32)
    print(f"SmolLM2 loaded ({time.perf_counter() - t:.1f} s)")
    t = time.perf_counter()
    stats = capture(
        model,
        english_sample(split="calibration"),
        tokenizer=tok,
        rope="post",
        samples=args.samples,
        max_tokens=args.calibration_tokens,
        max_length=args.max_length,
        progress=False,
    )
    took = time.perf_counter() - t
    print(f"calibration: {stats.tokens} tokens, {args.samples} samples kept ({took:.1f} s)")
    quantizers = {}
    for spec in ("kv:int4", "kv:cq4c8b"):
        t = time.perf_counter()
        quantizers[spec] = fit_quantizer(model, spec, stats)
        print(
            f"{spec}: fitted in {time.perf_counter() - t:.1f} s "
            f"({quantizers[spec].kv_bytes_per_token(torch.bfloat16)} B/token, "
            f"{quantizers[spec].constant_bytes} constant bytes)"
        )
    batches = evaluation_batches(
        english_sample(split="evaluation"),
        tok,
        batch_size=args.batch_size,
        max_length=args.max_length,
        max_tokens=args.tokens,
    )
    real = sum(int(b.attention_mask.sum()) for b in batches)
    device = next(model.parameters()).device
    inputs = [forward_kwargs(model, b, device) for b in batches]

    def one_pass(spec: str | None) -> float:
        context = nullcontext() if spec is None else quantizers[spec].active(model)
        with context:
            t = time.perf_counter()
            for kwargs in inputs:
                model(**kwargs)
            return time.perf_counter() - t

    sides: list[str | None] = [None, "kv:int4", "kv:cq4c8b"]
    for side in sides:  # warm-up
        one_pass(side)
    best = {side: float("inf") for side in sides}
    for _ in range(args.repeats):
        for side in sides:
            best[side] = min(best[side], one_pass(side))
    plain = best[None]
    print(f"\n(b) forward on {real} tokens in {len(batches)} batches (fastest of {args.repeats} passes):")
    print(f"{'side':<12}{'seconds':>9}{'÷ plain':>10}")
    for side in sides:
        print(f"{side or 'plain':<12}{best[side]:>9.3f}{best[side] / plain:>10.3f}")
    ratios = "   ".join(f"{s} ÷ plain = {best[s] / plain:.3f}" for s in sides if s is not None)
    met = all(best[s] / plain <= TARGET for s in sides if s is not None)
    print(f"{ratios}   (target ≤ {TARGET}: {'met' if met else 'MISSED'})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--fit-iters", type=int, default=25, help="Lloyd iterations of the fit (at most)")
    parser.add_argument("--fit-samples", type=int, default=16384)
    parser.add_argument("--fit-channels", type=int, default=4096)
    parser.add_argument("--device", default="cpu", help="device of the fit")
    parser.add_argument("--tokens", type=int, default=1024, help="evaluation tokens of the forward")
    parser.add_argument("--max-length", type=int, default=256)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--samples", type=int, default=2048, help="calibration samples for the CQ codebooks")
    parser.add_argument("--calibration-tokens", type=int, default=4096)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    parser.add_argument("--skip-fit", action="store_true")
    parser.add_argument("--skip-forward", action="store_true")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    if not args.skip_fit:
        fit_bench(args)
    if not args.skip_forward:
        forward_bench(args)


if __name__ == "__main__":
    main()
