"""One GPU check of issue 42's targets, each printed with PASS or FAIL (about five minutes on one H100/H200).

1. **Capture at the limit** (``bench/capture_gpu.py``'s ``capture_section``): max |corr − float64| of the
   tensor-core Grams on the stress data (≤ 1e-5), and capture ÷ the forward to the last attention for
   SmolLM2's, Llama-3-8B's and LLaMA-2-7B's shapes (≤ 1.3, 1.05, 1.4); the ladder's own capture ratios
   below are printed against the same targets.
2. **The scale ladder** (``bench/scale.py``, each rung in a fresh process, bfloat16): SmolLM2-135M and
   Llama-3.2-1B whole, Llama-3-8B and LLaMA-2-7B with ``--layers`` (default 32: whole) at 4×512 tokens:
   capture ÷ forward, ``heal`` ÷ a plain AdamW loop (target ≥ 0.7) and, for capture, evaluate, heal and
   allocate, ``max_memory_allocated`` ÷ the estimate (target 0.8–1.2).
3. **Heal that fits**: the Llama-3-8B shape, all 32 layers, bfloat16, one heal step of 8×2048 tokens with
   ``checkpoint=True``: the device's peak (model and variant included) against 70 GB, and the heal's own
   peak ÷ its estimate; a SmolLM2 heal's tokens/s ÷ a plain AdamW loop's, and its untrained point in
   float32 against ``evaluate`` on the same tokens (they must agree to 1e-5).
4. **Past one GPU**: ``heal(distributed="fsdp")`` in a one-rank NCCL group, the model on the CPU and its
   shards on the GPU, against the same heal on the GPU without sharding (float32: the weights agree to
   1e-5); and from the estimates, the memory per GPU of a 70B model's heal on 8 GPUs.
5. **The third axis** (``bench/third_axis_gpu.py``): SmolLM2's capture with the joint moments of all
   30 layers ÷ the same capture without them (≤ 1.3), and ``prefill:128`` ÷ the documents protocol on
   the same scored tokens (≤ 1.2), on the device.
6. Analyses on the device (no target): batched head alignment (RoPE and orthogonal, 128 heads × d_h 128)
   against a per-pair loop on a subset, and operator similarity of a 7B-shaped layer (Frobenius trick
   against dense d×d forms), with the helpers of ``bench/analysis.py``.

Run on a machine with a CUDA GPU: ``python bench/gpu_check.py`` (``--skip ladder,fits,...`` leaves parts
out). ``--dry-run`` runs the same code on the CPU with every model shrunk (``bench/scale.py --tiny``) and
small batches: a check that the script works, whose numbers mean nothing.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import torch

import headwidget

sys.path.insert(0, str(Path(__file__).resolve().parent))
import scale
from capture_gpu import capture_section  # capture at the limit: accuracy and capture ÷ forward per shape
from heal import _Clock, _plain
from third_axis_gpu import third_axis_section  # cross-layer statistics and prefill:P on the device

CAPTURE_TARGETS = {"smollm2-135m": 1.3, "llama-3-8b": 1.05, "llama-2-7b": 1.4}
RESULTS: list[tuple[str, str, bool]] = []


def verdict(target: str, measured: str, passed: bool) -> None:
    """Record and print one target."""
    RESULTS.append((target, measured, passed))
    print(f"  {'PASS' if passed else 'FAIL'}  {target}: {measured}")


def ladder(args: argparse.Namespace) -> None:
    """Part 2: the scale ladder's rungs on this device, with their targets."""
    print("\n2. the scale ladder (bench/scale.py)")
    argv = ["--device", args.device, "--layers", str(args.layers), "--batch", str(args.batch)]
    argv += ["--length", str(args.length), "--steps", "3", "--repeats", "5"]
    if args.dry_run:
        argv += ["--tiny", "--quick"]
    rows = []
    for name in scale.RUNGS:
        start = time.perf_counter()
        rows.append(scale.run_rung(name, argv))
        print(f"  {name}: {time.perf_counter() - start:.0f} s", flush=True)
    print(scale.table(rows))
    for row in rows:
        for what in ("capture", "evaluate", "heal", "allocate"):
            cell = row[what]
            ratio = cell["peak"] / cell["estimate"]
            verdict(f"{row['rung']} {what} peak ÷ estimate in 0.8–1.2", f"{ratio:.2f}", 0.8 <= ratio <= 1.2)
        verdict(
            f"{row['rung']} heal ÷ plain AdamW ≥ 0.7", f"{row['heal_ratio']:.2f}", row["heal_ratio"] >= 0.7
        )
        if row["rung"] in CAPTURE_TARGETS:  # the ladder's own shapes, beside the section's
            limit = CAPTURE_TARGETS[row["rung"]]
            verdict(
                f"{row['rung']} capture ÷ forward ≤ {limit} (ladder, {row['tokens']} tokens)",
                f"{row['capture_ratio']:.2f}",
                row["capture_ratio"] <= limit,
            )


def _fits_in_process(args: argparse.Namespace) -> None:
    """Part 3's 8B step, in this (fresh) process: print the numbers for the parent."""
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = scale.build("llama-3-8b", 32, device, dtype, small=args.dry_run)
    variant = headwidget.apply(model, "mqa")
    batch, length = (8, 2048) if not args.dry_run else (2, 64)
    vocab = int(model.config.vocab_size)
    generator = torch.Generator().manual_seed(1)
    stream = torch.randint(1, vocab, (1, 4 * batch * length), generator=generator)
    held = torch.randint(1, vocab, (1, length), generator=generator)
    options: dict[str, Any] = {
        "tokens": batch * length,
        "batch_size": batch,
        "max_length": length,
        "eval_texts": held,
        "eval_tokens": length,
        "per_layer": False,
        "checkpoint": True,
    }
    need = headwidget.estimate_healing(variant, model, **options)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        held_before = torch.cuda.memory_allocated(device)
    headwidget.heal(variant, model, stream, progress=False, **options)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        peak = torch.cuda.max_memory_allocated(device)
        print(f"FITS {peak} {peak - held_before} {need}")
    else:
        print(f"FITS 0 0 {need}")


def _in_fresh_process(args: argparse.Namespace, flag: str, tag: str) -> list[str] | None:
    """Run this script with ``flag`` (one part) in a fresh process on ``args.device``; the fields of its
    stdout line that starts with ``tag``, or None (its stderr printed) when it failed."""
    done = subprocess.run(
        [sys.executable, __file__, flag, "--device", args.device, *(["--dry-run"] * args.dry_run)],
        capture_output=True,
        text=True,
        env=dict(os.environ),
    )
    line = next((x for x in done.stdout.splitlines() if x.startswith(tag + " ")), None)
    if done.returncode or line is None:
        print(done.stderr[-3000:])
        return None
    return line.split()[1:]


def fits(args: argparse.Namespace) -> None:
    """Part 3: the 8B heal step, and SmolLM2's heal rate and untrained point."""
    print("\n3. heal that fits")
    fields = _in_fresh_process(args, "--fits-in-process", "FITS")
    if fields is None:
        verdict("Llama-3-8B heal step at 8×2048 with checkpoint=True", "failed", False)
    else:
        device_peak, heal_peak, need = (int(x) for x in fields)
        if device_peak:
            verdict(
                "Llama-3-8B, 32 layers, 8×2048, bf16, checkpoint: device peak ≤ 70 GB",
                f"{device_peak / 1e9:.1f} GB",
                device_peak <= 70e9,
            )
            ratio = heal_peak / need
            verdict("  its heal peak ÷ estimate in 0.8–1.2", f"{ratio:.2f}", 0.8 <= ratio <= 1.2)
        else:
            print(f"  (dry run) estimate {need / 2**20:.1f} MiB")
    healing(args)


def healing(args: argparse.Namespace) -> None:
    """SmolLM2's shape: heal(kd, kv) tokens/s ÷ a plain AdamW loop under the same autocast, and the
    untrained point in float32 against ``evaluate`` on the same device and tokens."""
    device = torch.device(args.device)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    model = scale.build("smollm2-135m", None, device, dtype, small=args.dry_run)
    exact = scale.build("smollm2-135m", None, device, torch.float32, small=args.dry_run)
    vocab = int(model.config.vocab_size)
    batch, length, steps = (8, 512, 4) if not args.dry_run else (2, 64, 2)
    generator = torch.Generator().manual_seed(2)
    stream = torch.randint(1, vocab, (1, 8 * batch * length), generator=generator)
    held = torch.randint(1, vocab, (batch, length), generator=generator)
    clock = _Clock(device, cpu_time=True)
    common: dict[str, Any] = {
        "batch_size": batch,
        "max_length": length,
        "eval_texts": held,
        "progress": False,
    }
    for _ in range(2):  # the first run warms the device's kernels up
        headwidget.heal(
            headwidget.apply(model, "mqa"),
            model,
            stream,
            tokens=steps * batch * length,
            eval_every=10**9,
            eval_tokens=batch * length // 2,
            per_layer=False,
            callbacks=[clock],
            **common,
        )
    healed = clock.steps()
    plain = _plain(model, None, batch, length, steps, torch.bfloat16 if device.type == "cuda" else None)
    ratio = statistics.median(plain[1:]) / statistics.median(healed[1:])
    verdict(
        f"SmolLM2 shape heal(kd, kv) ÷ plain AdamW at {batch}×{length} ≥ 0.7", f"{ratio:.2f}", ratio >= 0.7
    )
    run = headwidget.heal(
        headwidget.apply(exact, "mqa"),
        exact,
        stream,
        tokens=batch * length,
        eval_every=10**9,
        eval_tokens=batch * length,
        per_layer=False,
        dtype=torch.float32,
        **common,
    )
    report = headwidget.evaluate(
        exact,
        held,
        ["model", "mqa"],
        dtype=torch.float32,
        batch_size=batch,
        max_length=length,
        progress=False,
    )
    gap = max(abs(run.curve[0][m] - report.measures["mqa"][m]) for m in ("nll", "kl", "top1"))
    verdict("untrained point (float32) = evaluate, to 1e-5", f"{gap:.1e}", gap <= 1e-5)


def _sharded_in_process(args: argparse.Namespace) -> None:
    """Part 4 in this (fresh) process: a one-rank process group, FSDP against the plain heal."""
    import torch.distributed as dist

    cuda = args.device.startswith("cuda")
    backend = "nccl" if cuda else "gloo"
    if cuda:
        torch.cuda.set_device(0)
    import socket

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        model = scale.build("smollm2-135m", 4, torch.device("cpu"), torch.float32, small=args.dry_run)
        vocab = int(model.config.vocab_size)
        generator = torch.Generator().manual_seed(3)
        stream = torch.randint(1, vocab, (1, 4096), generator=generator)
        held = torch.randint(1, vocab, (4, 64), generator=generator)
        options: dict[str, Any] = {
            "tokens": 512,
            "batch_size": 4,
            "max_length": 64,
            "eval_texts": held,
            "eval_tokens": 256,
            "eval_every": 256,
            "dtype": torch.float32,
            "progress": False,
            "lr": 1e-3,
        }
        sharded = headwidget.heal(
            headwidget.apply(model, "mqa"), model, stream, distributed="fsdp", **options
        )
        on_device = model.to(args.device)
        whole = headwidget.heal(headwidget.apply(on_device, "mqa"), on_device, stream, **options)
        theirs = whole.model.state_dict()
        gap = max(
            float((t.cpu() - theirs[n].cpu()).abs().max()) for n, t in sharded.model.state_dict().items()
        )
        print(f"SHARDED {gap}")
    finally:
        dist.destroy_process_group()


def past_one_gpu(args: argparse.Namespace) -> None:
    """Part 4: the FSDP path on this device, and the 70B estimate per GPU."""
    print("\n4. past one GPU")
    fields = _in_fresh_process(args, "--sharded-in-process", "SHARDED")
    if fields is None:
        verdict('heal(distributed="fsdp") on one rank = heal', "failed", False)
    else:
        gap = float(fields[0])
        verdict(
            'heal(distributed="fsdp"), model on the CPU, shards on the device = heal, to 1e-5',
            f"{gap:.1e}",
            gap <= 1e-5,
        )
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=128256,
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        head_dim=128,
        tie_word_embeddings=False,
    )
    with torch.device("meta"):
        big = LlamaForCausalLM(config).to(torch.bfloat16)
    for batch in (8, 64):
        need = headwidget.estimate_healing(
            "mqa",
            big,
            batch_size=batch,
            max_length=2048,
            dtype=torch.bfloat16,
            checkpoint=True,
            distributed="fsdp",
            world_size=8,
        )
        print(
            f"  Llama-3-70B shape, 8 GPUs, FSDP, {batch}×2048, checkpoint: {need / 1e9:.1f} GB a GPU",
            "(estimate)",
        )


def analyses(args: argparse.Namespace) -> None:
    """Part 5: batched head alignment and operator similarity on the device against per-pair loops."""
    from analysis import loop_align, synthetic_stats
    from headwidget.analysis import align, operator_similarity
    from headwidget.analysis.weights import HeadWeights

    print("\n6. analyses on the device")
    device, small = torch.device(args.device), args.dry_run
    heads, d = (8, 16) if small else (128, 128)
    stats = synthetic_stats(heads, d, tokens=512).to(device)
    pairs = [(i, j) for i in range(heads) for j in range(i + 1, heads)]
    subset = pairs[: min(len(pairs), 200)]
    print(
        f"\nhead alignment on {device}: {heads} heads × d_h {d} ({len(pairs)} pairs); loop over {len(subset)}"
    )
    for method, kind in (("rope", "key"), ("orthogonal", "value")):
        align(stats, 0, kind, method=method, heldout=True)  # warm-up
        batched = statistics.median(
            _median_time(lambda m=method, k=kind: align(stats, 0, k, method=m, heldout=True), device, 3)
        ) / len(pairs)
        loop = statistics.median(_median_time(lambda m=method: loop_align(stats, subset, m, True), device, 1))
        loop /= len(subset)
        print(
            f"  {method:10s} batched {batched * 1e6:9.1f} µs/pair   loop {loop * 1e6:9.1f} µs/pair   "
            f"speed-up {loop / batched:7.1f}×"
        )
    h, m, dm = (4, 16, 64) if small else (32, 128, 4096)
    gen = torch.Generator(device=device).manual_seed(1)
    w = HeadWeights(
        *(
            torch.randn(*s, generator=gen, device=device, dtype=torch.float64)
            for s in ((h, m, dm), (h, m, dm), (h, m, dm), (h, dm, m))
        )
    )
    trick = statistics.median(_median_time(lambda: operator_similarity(w, 0, "qk"), device, 3))

    def dense() -> None:
        forms = [(w.q[i].T @ w.k[i]).reshape(-1) for i in range(h)]
        torch.stack([torch.stack([a @ b for b in forms]) for a in forms])

    dense_t = statistics.median(_median_time(dense, device, 1))
    print(
        f"operator similarity on {device} (H {h}, d_h {m}, d {dm}): trick {trick * 1e3:.1f} ms, "
        f"dense forms kept {dense_t * 1e3:.1f} ms, speed-up {dense_t / trick:.1f}×"
    )


def _median_time(fn: Any, device: torch.device, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        fn()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        out.append(time.perf_counter() - start)
    return out


def capture_part(args: argparse.Namespace) -> None:
    print("\n1. capture at the limit")
    small = {"rounds": 1, "small": True} if args.dry_run else {}
    for target, passed in capture_section(args.device, **small):
        verdict(target, "(printed above)", passed)


def third_axis(args: argparse.Namespace) -> None:
    print("\n5. the third axis")
    rounds, small = (1, True) if args.dry_run else (3, False)
    for target, measured, passed in third_axis_section(args.device, rounds=rounds, small=small):
        verdict(target, measured, passed)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dry-run", action="store_true", help="on the CPU, every model shrunk")
    parser.add_argument(
        "--skip", default="", help="parts to leave out: capture, ladder, fits, sharded, third, analyses"
    )
    parser.add_argument("--layers", type=int, default=32, help="layers of the ladder's 8B and 7B rungs")
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--length", type=int, default=512)
    parser.add_argument("--fits-in-process", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--sharded-in-process", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.dry_run:
        args.device, args.batch, args.length = "cpu", 2, 64
    if args.fits_in_process:
        _fits_in_process(args)
        return
    if args.sharded_in_process:
        _sharded_in_process(args)
        return
    start = time.perf_counter()
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU (dry run)"
    print(f"gpu_check on {name}, torch {torch.__version__}")
    skip = set(args.skip.split(","))
    parts = {
        "capture": capture_part,
        "ladder": ladder,
        "fits": fits,
        "sharded": past_one_gpu,
        "third": third_axis,
        "analyses": analyses,
    }
    for key, part in parts.items():
        if key not in skip:
            part(args)
    passed = sum(ok for _, _, ok in RESULTS)
    print(f"\n{passed} of {len(RESULTS)} targets passed ({time.perf_counter() - start:.0f} s)")
    for target, measured, ok in RESULTS:
        print(f"  {'PASS' if ok else 'FAIL'}  {target}: {measured}")


if __name__ == "__main__":
    main()
