"""One short GPU check: capture overhead on a CUDA GPU, printed as side-by-side ratios.

1. A synthetic LLaMA-7B-shaped attention stack (32 layers, hidden 4096, 32 heads, d_h 128 → C = 4096
   channels of K and of V per layer; small MLPs to keep the weights at ~5 GB) in bfloat16, random
   init: capture of all layers vs the same forward stopped after the last attention.
2. SmolLM2-135M on the GPU (8×256 tokens): the same ratios as ``bench/capture.py`` (a).
3. Accuracy: correlations from the GPU capture vs a float64 recomputation on the GPU.
4. Analyses on the device: batched head alignment (RoPE and orthogonal, 128 heads × d_h 128) vs a
   per-pair loop on a subset, and operator similarity of a 7B-shaped layer (Frobenius trick vs dense
   d×d forms), with the helpers of ``bench/analysis.py``.
5. A short heal of SmolLM2's ``mqa`` variant on the device: ``heal(kd, kv)`` with bfloat16 autocast,
   training tokens/s ÷ a plain AdamW next-token loop over the same k_proj/v_proj under the same autocast
   (target ≥ 0.7), peak device memory of each, that held-out KL fell; and in float32 (no autocast) the
   untrained point against ``evaluate`` on the same device and tokens.

Run on a machine with a CUDA GPU: ``python bench/gpu_check.py`` (a few minutes); ``--device cpu --small``
is a smoke run of the same code here.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from contextlib import suppress

import torch
from torch import nn

import headwidget


class _Stop(Exception):
    pass


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _median_time(fn: Callable[[], object], device: torch.device, repeats: int) -> list[float]:
    out = []
    for _ in range(repeats):
        _sync(device)
        start = time.perf_counter()
        fn()
        _sync(device)
        out.append(time.perf_counter() - start)
    return out


def _forward_to_last_attention(model: nn.Module, attention: nn.Module, ids: torch.Tensor) -> None:
    def stop(*_: object) -> None:
        raise _Stop

    handle = attention.register_forward_hook(stop)
    try:
        with torch.no_grad(), suppress(_Stop):
            model(input_ids=ids, use_cache=False)
    finally:
        handle.remove()


def compare(name: str, model: nn.Module, ids: torch.Tensor, device: torch.device, repeats: int) -> None:
    last = model.model.layers[-1].self_attn  # type: ignore[union-attr,index]
    routes: dict[str, Callable[[], object]] = {
        "forward to last attention": lambda: _forward_to_last_attention(model, last, ids),
        "capture K,V (moments + head Gram)": lambda: headwidget.capture(
            model, ids, batch_size=ids.shape[0], max_length=ids.shape[1], progress=False
        ),
        "capture K,V,K_post": lambda: headwidget.capture(
            model, ids, batch_size=ids.shape[0], max_length=ids.shape[1], rope="both", progress=False
        ),
    }
    for fn in routes.values():
        fn()  # warm-up (kernels, allocator)
    times: dict[str, list[float]] = {k: [] for k in routes}
    for _ in range(repeats):
        for key, fn in routes.items():
            times[key] += _median_time(fn, device, 1)
    base = statistics.median(times["forward to last attention"])
    print(f"\n{name}: {tuple(ids.shape)} tokens on {device}, median of {repeats} interleaved runs")
    for key, ts in times.items():
        print(
            f"  {key:36s} {statistics.median(ts) * 1e3:9.1f} ms   ratio {statistics.median(ts) / base:6.3f}"
        )


def profile_capture(model: nn.Module, ids: torch.Tensor, device: torch.device) -> None:
    """Where one capture's time goes on the device: the top operators by their own host time, and
    the number of kernels launched (a small model's capture on a GPU is bound by launches)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profile(activities=activities) as prof:
        headwidget.capture(model, ids, batch_size=ids.shape[0], max_length=ids.shape[1], progress=False)
        _sync(device)
    events = prof.key_averages()
    print(
        f"\n  one capture, profiled: {sum(e.count for e in events if e.key.startswith('aten::'))} aten calls"
    )
    print(events.table(sort_by="self_cpu_time_total", row_limit=12, max_name_column_width=40))


def accuracy(model: nn.Module, ids: torch.Tensor) -> None:
    layer = len(model.model.layers) - 1  # type: ignore[union-attr,arg-type]
    stats = headwidget.capture(model, ids, layers=[layer], progress=False)
    seen: list[torch.Tensor] = []
    proj = model.model.layers[layer].self_attn.k_proj  # type: ignore[union-attr,index]
    handle = proj.register_forward_hook(lambda m, a, out: seen.append(out.detach()))
    attention = model.model.layers[layer].self_attn  # type: ignore[union-attr,index]
    try:
        _forward_to_last_attention(model, attention, ids)
    finally:
        handle.remove()
    k = seen[0].reshape(-1, seen[0].shape[-1]).double()
    ref = torch.corrcoef(k.T).cpu().numpy()
    err = abs(stats.channel_corr(layer, "key") - ref).max()
    where = f"layer {layer} keys, {k.shape[0]} tokens, C={k.shape[1]}"
    print(f"\n  max |corr − float64 corrcoef| ({where}): {err:.2e}")


def analyses(device: torch.device, small: bool) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from analysis import loop_align, synthetic_stats
    from headwidget.analysis import align, operator_similarity
    from headwidget.analysis.weights import HeadWeights

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


def _peak(device: torch.device, fn: Callable[[], object]) -> int:
    if device.type != "cuda":
        fn()
        return 0
    torch.cuda.reset_peak_memory_stats(device)
    fn()
    return int(torch.cuda.max_memory_allocated(device))


def healing(model: nn.Module, tokenizer: object, device: torch.device, small: bool) -> None:
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from headwidget.texts import english_sample
    from heal import _Clock, _plain

    batch, length, steps = (2, 64, 2) if small else (8, 512, 4)
    tokens = batch * length * steps
    cast = torch.bfloat16 if device.type == "cuda" else None
    clock = _Clock(device)
    runs = []

    def healed() -> None:
        variant = headwidget.apply(model, "mqa")
        runs.append(
            headwidget.heal(
                variant,
                model,
                tokenizer=tokenizer,
                tokens=tokens,
                batch_size=batch,
                max_length=length,
                eval_every=tokens,
                eval_tokens=4 * length,
                dtype=cast or torch.float32,
                progress=False,
                callbacks=[clock],
            )
        )

    healed()  # warm-up: the first steps on a device pay for its kernels' set-up (cuBLAS, autocast)
    runs.clear()
    heal_peak = _peak(device, healed)
    heal_steps = clock.steps()
    run = runs[0]
    plain_steps: list[float] = []
    _plain(model, tokenizer, batch, length, steps, cast)  # warm-up
    plain_peak = _peak(
        device, lambda: plain_steps.extend(_plain(model, tokenizer, batch, length, steps, cast))
    )
    # tokens/s of a step past the first, median (the first step of each also warms its optimizer state)
    heal_rate = batch * length / statistics.median(heal_steps[1:] or heal_steps)
    plain_rate = batch * length / statistics.median(plain_steps[1:] or plain_steps)
    how = "bfloat16 autocast" if cast is not None else "float32"
    print(f"\nheal on {device}: mqa, {steps} steps of {batch}×{length} tokens, {how}, after a warm-up run")
    print(
        "  step seconds: heal "
        + " ".join(f"{t:.3f}" for t in heal_steps)
        + "; plain "
        + " ".join(f"{t:.3f}" for t in plain_steps)
    )
    print(
        f"  heal(kd, kv) {heal_rate:9.1f} tokens/s   plain AdamW loop {plain_rate:9.1f} tokens/s   "
        f"ratio {heal_rate / plain_rate:.3f} (target ≥ 0.7)"
    )
    if device.type == "cuda":
        gib = 2**30
        print(f"  peak device memory: heal {heal_peak / gib:.2f} GiB, plain loop {plain_peak / gib:.2f} GiB")
    first, last = run.curve[0]["kl"], run.curve[-1]["kl"]
    print(
        f"  held-out KL: untrained {first:.4f} → {last:.4f} after {run.tokens_seen} tokens "
        f"({'fell' if last < first else 'did NOT fall'})"
    )

    exact = headwidget.heal(
        headwidget.apply(model, "mqa"),
        model,
        tokenizer=tokenizer,
        tokens=batch * length,
        batch_size=batch,
        max_length=length,
        eval_every=10**9,
        eval_tokens=4 * length,
        per_layer=False,
        dtype=torch.float32,
        progress=False,
    )
    held_out = english_sample(split="evaluation")
    report = headwidget.evaluate(
        model,
        held_out,
        ["model", "mqa"],
        tokenizer=tokenizer,
        dtype=torch.float32,
        batch_size=batch,
        max_length=length,
        max_tokens=exact.evaluation_tokens,
        progress=False,
    )
    gaps = {m: abs(exact.curve[0][m] - report.measures["mqa"][m]) for m in ("nll", "kl", "top1")}
    same = exact.evaluation_fingerprint == report.fingerprint
    print(
        "  untrained point (float32) − evaluate: "
        + ", ".join(f"{m} {g:.1e}" for m, g in gaps.items())
        + f"; same evaluation tokens: {same}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--small", action="store_true", help="tiny shapes (a smoke run on CPU)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--smollm2-shape",
        metavar="DIR",
        help="a folder with SmolLM2's config.json and tokenizer: use a random-init model of that shape "
        "instead of the trained one (for a machine the 94 MiB GGUF file cannot reach)",
    )
    args = parser.parse_args()
    device = torch.device(args.device)
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, layers, inter, tokens = (256, 4, 256, (2, 64)) if args.small else (4096, 32, 1024, (8, 512))
    config = LlamaConfig(
        vocab_size=1024,
        hidden_size=hidden,
        intermediate_size=inter,
        num_hidden_layers=layers,
        num_attention_heads=hidden // 128,
        num_key_value_heads=hidden // 128,
        head_dim=128,
    )
    torch.manual_seed(0)
    with device:
        synthetic = LlamaForCausalLM(config).to(torch.bfloat16 if device.type == "cuda" else torch.float32)
    synthetic.eval()
    ids = torch.randint(0, 1024, tokens, device=device)
    need = headwidget.estimate(synthetic, batch_size=tokens[0], max_length=tokens[1])
    print(f"synthetic stack: {layers} layers, C={hidden} per kind, statistics need {need / 2**30:.1f} GiB")
    compare("synthetic LLaMA-7B-shaped stack", synthetic, ids, device, args.repeats)
    accuracy(synthetic, ids)
    del synthetic
    if device.type == "cuda":
        torch.cuda.empty_cache()

    if args.smollm2_shape:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

        torch.manual_seed(0)
        tokenizer = AutoTokenizer.from_pretrained(args.smollm2_shape)
        with device:
            smol = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(args.smollm2_shape))
        smol.eval()
        print("\nSmolLM2-135M: its config and tokenizer, random-init weights (--smollm2-shape)")
    else:
        from headwidget.embedded import load_smollm2

        smol, tokenizer = load_smollm2(device=str(device))
    ids = torch.randint(0, smol.config.vocab_size, (2, 64) if args.small else (8, 256), device=device)
    compare("SmolLM2-135M", smol, ids, device, args.repeats)
    profile_capture(smol, ids, device)
    accuracy(smol, ids)
    healing(smol, tokenizer, device, args.small)
    del smol
    analyses(device, args.small)


if __name__ == "__main__":
    main()
