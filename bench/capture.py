"""Capture benchmarks, measured side by side in one run (ratios; absolute times are machine noise).

(a) overhead of capture on SmolLM2-135M, 8×256 tokens: capture of all layers vs the plain forward
    (full forward with logits, and the same forward stopped after the last attention, which is what
    capture computes), and the same capture with its staging and folds skipped (what the hooks alone
    cost); plus the share of time spent inside the hooks that stage and fold. Wall and CPU time, each
    round's ratio to its own baseline.
(b) streaming moments vs the naive route (materialise every K/V vector, then ``np.corrcoef``) at
    ≥ 50k tokens: time and peak-memory ratios. Each route runs in a fresh subprocess over the same
    pre-generated batches; time and the peak resident-memory increase (sampled every 2 ms) cover the
    statistics only, not making the data.
(c) accuracy of correlations vs float64 on float32 activations with large means and outliers:
    streaming (per-batch centred float32 Gram merged in float64) vs uncentred float32 sums, and the
    GPU's tensor-core split (bfloat16 hi + lo parts; its products emulated exactly here) on the same
    data in bfloat16.
(d) cross-layer statistics of all 30 of SmolLM2's layers (``cross_layer=True``: the joint moments of
    every layer's keys, and of every layer's values, 30 × 192 = 5,760 channels each) against the same
    capture without them, 8×256 tokens, side by side: each round's capture with them ÷ its capture
    without them (target ≤ 1.3), and the time inside the cross-layer folds.

The GPU's part (capture ÷ forward for the SmolLM2, Llama-3-8B and LLaMA-2-7B shapes, and (c) on the
device) is ``bench/capture_gpu.py``, which ``bench/gpu_check.py`` runs.

Run: ``.venv/bin/python bench/capture.py`` (``--quick`` for a short smoke run, ``--only a`` for one part,
``--rounds N`` rounds of (a) and (d)).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import resource
import statistics
import time
from collections.abc import Callable, Iterator
from contextlib import suppress

import numpy as np
import torch

import headwidget
from headwidget.capture import session as capture_session
from headwidget.moments import FoldWork, GramMode, Moments, StackedMoments
from headwidget.moments.correlation import corr_from_comoment


class _Stop(Exception):
    pass


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    """Wall seconds and CPU seconds (all of this process's threads) of ``fn()``."""
    start, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - start, time.process_time() - cpu


def _ratio_spread(times: list[float], base: list[float]) -> str:
    """Each round's own ratio to that round's baseline: median (IQR)."""
    rounds = [t / b for t, b in zip(times, base, strict=True)]
    q = statistics.quantiles(rounds, n=4) if len(rounds) > 1 else [rounds[0]] * 3
    return f"{q[1]:.3f} ({q[0]:.3f}–{q[2]:.3f})"


def bench_overhead(repeats: int, batch: int, length: int) -> None:
    from headwidget.embedded import load_smollm2

    model, _ = load_smollm2()
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, length))
    last_attention = model.model.layers[-1].self_attn

    def plain_full() -> None:
        with torch.no_grad():
            model(input_ids=ids, use_cache=False)

    def plain_truncated() -> None:
        def stop(*_: object) -> None:
            raise _Stop

        handle = last_attention.register_forward_hook(stop)
        try:
            with torch.no_grad(), suppress(_Stop):
                model(input_ids=ids, use_cache=False)
        finally:
            handle.remove()

    in_hooks = [0.0]
    original = capture_session._Recorder.fold_layer

    def timed_fold(self: capture_session._Recorder, layer: int) -> None:
        start = time.perf_counter()
        original(self, layer)
        in_hooks[0] += time.perf_counter() - start

    def run_capture(**options: object) -> Callable[[], None]:
        def go() -> None:
            headwidget.capture(model, ids, batch_size=batch, max_length=length, progress=False, **options)

        return go

    def without_folds() -> None:  # every hook fires, nothing is staged or folded: the hooks' own cost
        def skip(self: capture_session._Recorder, layer: int) -> None:
            self.parts[layer].clear()

        current = capture_session._Recorder.fold_layer
        capture_session._Recorder.fold_layer = skip
        try:
            run_capture()()
        finally:
            capture_session._Recorder.fold_layer = current

    routes = {
        "plain forward (full, logits)": plain_full,
        "plain forward to last attention": plain_truncated,
        "capture K,V all layers": run_capture(),
        "capture K,V, folds skipped": without_folds,
        "capture K,V,K_post,input all": run_capture(rope="both", inputs=True),
    }
    for fn in routes.values():  # warm-up
        fn()
    wall: dict[str, list[float]] = {name: [] for name in routes}
    cpu: dict[str, list[float]] = {name: [] for name in routes}
    hook_share: list[float] = []
    capture_session._Recorder.fold_layer = timed_fold
    try:
        for _ in range(repeats):
            for name, fn in routes.items():
                in_hooks[0] = 0.0
                seconds, cpu_seconds = _timed(fn)
                wall[name].append(seconds)
                cpu[name].append(cpu_seconds)
                if name == "capture K,V all layers":
                    hook_share.append(in_hooks[0])
    finally:
        capture_session._Recorder.fold_layer = original
    reference = "plain forward to last attention"
    base = statistics.median(wall[reference])
    full = statistics.median(wall["plain forward (full, logits)"])
    print(
        f"\n(a) SmolLM2-135M, {batch}×{length} tokens, CPU ({torch.get_num_threads()} threads), "
        f"{repeats} interleaved rounds; ratios are each round's own (median, IQR), so that a slow spell "
        "of a shared machine cancels out; CPU time (of this process) is less sensitive to other "
        "processes than wall time"
    )
    header = f"{'median s':>9s} {'wall ÷ to-last-attn':>24s} {'CPU ÷ to-last-attn':>24s} {'÷ full fwd':>11s}"
    print(f"{'route':36s} {header}")
    for name in routes:
        m = statistics.median(wall[name])
        spread_wall = _ratio_spread(wall[name], wall[reference])
        spread_cpu = _ratio_spread(cpu[name], cpu[reference])
        print(f"{name:36s} {m:9.3f} {spread_wall:>24s} {spread_cpu:>24s} {m / full:11.3f}")
    folds = statistics.median(hook_share)
    print(
        f"time inside the hooks that stage and fold (K,V): {folds:.3f} s = {folds / base:.1%} of the "
        "forward to the last attention"
    )


def bench_cross_layer(repeats: int, batch: int, length: int) -> None:
    """(d): capture of every layer with cross-layer statistics of all of them ÷ the same without."""
    from headwidget.capture.folds import StagedFolds
    from headwidget.embedded import load_smollm2

    model, _ = load_smollm2()
    torch.manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (batch, length))
    layers = int(model.config.num_hidden_layers)

    def run_capture(**options: object) -> Callable[[], None]:
        def go() -> None:
            headwidget.capture(model, ids, batch_size=batch, max_length=length, progress=False, **options)

        return go

    routes = {
        "capture K,V all layers": run_capture(),
        f"the same + cross_layer=True ({layers} layers)": run_capture(cross_layer=True),
    }
    in_cross = [0.0]
    original = StagedFolds.fold_cross

    def timed_cross(self: StagedFolds, *args: object, **kwargs: object) -> object:
        start = time.perf_counter()
        out = original(self, *args, **kwargs)
        in_cross[0] += time.perf_counter() - start
        return out

    for fn in routes.values():  # warm-up
        fn()
    wall: dict[str, list[float]] = {name: [] for name in routes}
    cpu: dict[str, list[float]] = {name: [] for name in routes}
    cross_share: list[float] = []
    StagedFolds.fold_cross = timed_cross
    try:
        for _ in range(repeats):
            for name, fn in routes.items():
                in_cross[0] = 0.0
                seconds, cpu_seconds = _timed(fn)
                wall[name].append(seconds)
                cpu[name].append(cpu_seconds)
            cross_share.append(in_cross[0])
    finally:
        StagedFolds.fold_cross = original
    reference = next(iter(routes))
    print(
        f"\n(d) cross-layer statistics, SmolLM2-135M, {batch}×{length} tokens, CPU "
        f"({torch.get_num_threads()} threads), {repeats} interleaved rounds; each round's own ratio "
        "(median, IQR); target ≤ 1.3"
    )
    print(f"{'route':44s} {'median s':>9s} {'wall ÷ without':>22s} {'CPU ÷ without':>22s}")
    for name in routes:
        m = statistics.median(wall[name])
        print(
            f"{name:44s} {m:9.3f} {_ratio_spread(wall[name], wall[reference]):>22s} "
            f"{_ratio_spread(cpu[name], cpu[reference]):>22s}"
        )
    folds = statistics.median(cross_share)
    base = statistics.median(wall[reference])
    print(f"time inside the cross-layer folds: {folds:.3f} s = {folds / base:.1%} of the capture without")
    _cross_layer_floor(model, batch * length, base)


def _cross_layer_floor(model: torch.nn.Module, tokens: int, base: float) -> None:
    """What the cross-layer statistics cannot cost less than with their float64 accumulators: the first
    touch of the accumulators (one capture allocates them once) and the Gram products of one fold per
    kind on accumulators already touched (the m2 pass and the normalised pass), timed on random rows of
    the same shape, beside the products alone at the rate of its own float32 products."""
    from headwidget.moments.folding import ONEDNN_CHUNK, gram_blocks, onednn_linear

    config = model.config
    head_dim = int(getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads)
    width = int(config.num_hidden_layers) * int(config.num_key_value_heads) * head_dim
    kinds = 2  # keys (before RoPE, the default) and values
    start = time.perf_counter()
    stacks = [StackedMoments.empty(1, width, head_dim=head_dim) for _ in range(kinds)]
    touch = time.perf_counter() - start
    stack = stacks.pop()
    del stacks
    work = FoldWork.make(1, tokens, width, head_dim, torch.float32)
    rows = torch.randn(1, tokens, width)
    stack.fold(rows.clone(), tokens // 2, work)  # warm-up
    start = time.perf_counter()
    stack.fold(rows.clone(), tokens // 2, work)
    fold = (time.perf_counter() - start) * kinds
    flops = kinds * 2 * sum(2.0 * (e - s) * (width - s) * tokens for s, e in gram_blocks(width))
    rate = float("nan")
    op = onednn_linear()
    if op is not None:  # one block row's tile, chunk by chunk, as the route forms it
        a, b = torch.randn(256, ONEDNN_CHUNK), torch.randn(720, ONEDNN_CHUNK)
        op(a, b, None, "none", [], "")
        calls = 200
        start = time.perf_counter()
        for _ in range(calls):
            op(a, b, None, "none", [], "")
        rate = calls * 2.0 * 256 * 720 * ONEDNN_CHUNK / (time.perf_counter() - start)
    print(
        f"floor of these statistics ({kinds} kinds × {width} channels, {tokens} tokens, float64 full-square "
        "accumulators):"
    )
    print(
        f"  first touch of the accumulators ({kinds * StackedMoments.nbytes(1, width, head_dim) / 2**30:.2f} "
        "GiB) "
        f"{touch:.3f} s; the folds on touched accumulators {fold:.3f} s"
    )
    print(f"  the products alone at the route's rate ({rate / 1e9:.0f} GFLOP/s): {flops / rate:.3f} s")
    print(
        f"  → capture with ÷ without ≥ {(base + touch + fold) / base:.3f} (touch + folds), "
        f"≥ {(base + fold) / base:.3f} (the folds alone, nothing touched), "
        f"≥ {(base + flops / rate) / base:.3f} (products alone)"
    )


def _activations(tokens: int, channels: int, seed: int = 0) -> np.ndarray:
    rng = np.random.default_rng(seed)
    mix = rng.normal(size=(channels, channels)).astype(np.float32) / np.sqrt(channels)
    x = rng.standard_normal((tokens, channels), dtype=np.float32) @ mix
    x += rng.uniform(-300, 300, size=channels).astype(np.float32)
    spikes = rng.random((tokens, channels)) < 1e-3
    x[spikes] += rng.normal(scale=50.0, size=int(spikes.sum()))
    return x.astype(np.float32)


def _batches(tokens: int, channels: int, batch: int) -> Iterator[torch.Tensor]:
    for start in range(0, tokens, batch):
        n = min(batch, tokens - start)
        yield torch.from_numpy(_activations(n, channels, seed=start))


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * resource.getpagesize()


def _measured(work: Callable[[], object]) -> tuple[float, int]:
    """Seconds and peak RSS increase (bytes) of ``work()``, sampling RSS every 2 ms on a thread."""
    import threading

    base, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.002)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    start = time.perf_counter()
    work()
    elapsed = time.perf_counter() - start
    done.set()
    sampler.join()
    return elapsed, max(peak[0], _rss()) - base


def _route_naive(tokens: int, channels: int, batch: int) -> tuple[float, int]:
    batches = [b.numpy() for b in _batches(tokens, channels, batch)]
    return _measured(lambda: np.corrcoef(np.concatenate(batches).T))


def _route_streaming(tokens: int, channels: int, batch: int, head_dim: int | None) -> tuple[float, int]:
    batches = list(_batches(tokens, channels, batch))

    def work() -> None:
        m = Moments.empty(channels, head_dim=head_dim)
        for b in batches:
            m.update(b, split_a=len(b) // 2)
        corr_from_comoment(m.m2)

    return _measured(work)


def _in_child(fn: Callable[..., tuple[float, int]], *args: object) -> tuple[float, int]:
    with mp.get_context("spawn").Pool(1) as pool:
        return pool.apply(fn, args)


def bench_streaming(tokens: int, channels: int, batch: int, repeats: int) -> None:
    routes: dict[str, tuple[Callable[..., tuple[float, int]], tuple[object, ...]]] = {
        "naive: all K/V + np.corrcoef": (_route_naive, (tokens, channels, batch)),
        "streaming moments": (_route_streaming, (tokens, channels, batch, None)),
        "streaming + per-head normalised Gram": (_route_streaming, (tokens, channels, batch, 64)),
    }
    results: dict[str, list[tuple[float, int]]] = {name: [] for name in routes}
    for _ in range(repeats):
        for name, (fn, args) in routes.items():
            results[name].append(_in_child(fn, *args))
    naive_t = statistics.median(t for t, _ in results["naive: all K/V + np.corrcoef"])
    naive_m = max(r for _, r in results["naive: all K/V + np.corrcoef"])
    print(
        f"\n(b) {tokens} tokens × {channels} channels, batches of {batch}; median time of {repeats}, "
        "peak resident-memory increase while computing (data made beforehand)"
    )
    print(f"{'route':38s} {'time s':>8s} {'time ÷ naive':>13s} {'peak MiB':>9s} {'naive ÷ this':>13s}")
    for name, runs in results.items():
        t = statistics.median(r[0] for r in runs)
        mem = max(r[1] for r in runs)
        print(f"{name:38s} {t:8.2f} {t / naive_t:13.2f} {mem / 2**20:9.0f} {naive_m / max(mem, 1):13.1f}")


def split_accuracy(
    x: torch.Tensor, batch: int, head_dim: int, mode: GramMode = "split"
) -> tuple[float, float]:
    """Fold the rows of ``x`` (n, C, on any device) batch by batch as a capture does (``mode``:
    ``"split"``, the tensor cores' bfloat16 parts, emulated exactly off CUDA; or ``"exact"``); return
    max |corr − float64 corrcoef| and max |mean token cosine − float64| of the heads' normalised Grams,
    both against ``x`` itself in float64."""
    n, c = x.shape
    stack = StackedMoments.empty(1, c, head_dim=head_dim, device=x.device)
    work = FoldWork.make(1, batch, c, head_dim, x.dtype, x.device, mode)
    for start in range(0, n, batch):
        rows = x[start : start + batch].unsqueeze(0).clone()
        stack.fold(rows, split_a=rows.shape[1] // 2, work=work)
    x64 = x.double().cpu().numpy()
    corr = corr_from_comoment(stack.m2[0].cpu()).numpy()
    heads = x64.reshape(n, -1, head_dim)
    unit = (heads / np.linalg.norm(heads, axis=-1, keepdims=True)).reshape(n, c)
    assert stack.norm_gram is not None
    cosines = stack.norm_gram[0].sum(0).cpu().numpy() / n
    return float(np.abs(corr - np.corrcoef(x64.T)).max()), float(np.abs(cosines - unit.T @ unit / n).max())


def bench_accuracy(tokens: int, channels: int, batch: int) -> None:
    x = _activations(tokens, channels, seed=7)
    ref = np.corrcoef(x.astype(np.float64).T)
    m = Moments.empty(channels)
    for start in range(0, tokens, batch):
        m.update(torch.from_numpy(x[start : start + batch]), split_a=0)
    streaming = corr_from_comoment(m.m2).numpy()
    xt = torch.from_numpy(x)
    mean = xt.mean(0)
    naive = corr_from_comoment(((xt.T @ xt) / tokens - torch.outer(mean, mean)).double()).numpy()
    print(
        f"\n(c) max |corr − float64 corrcoef| on {tokens}×{channels} float32 activations "
        "(|mean| up to 300, 0.1% 50σ outliers)"
    )
    print(
        f"{'streaming: centred float32 Gram per batch, Chan merge in float64':66s} "
        f"{np.abs(streaming - ref).max():.2e}"
    )
    print(f"{'naive: uncentred float32 sums, E[xx^T] − E[x]E[x]^T':66s} {np.abs(naive - ref).max():.2e}")
    bf16 = torch.from_numpy(x).to(torch.bfloat16)  # a bfloat16 model's K/V; reference: them in float64
    corr_err, cosine_err = split_accuracy(bf16, batch, head_dim=channels // 2)
    print(
        f"{'tensor cores (emulated here): bf16 hi+lo parts of the centred rows':66s} {corr_err:.2e}"
        f"   (of the same data in bfloat16; mean token cosine {cosine_err:.1e})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat (smoke run)")
    parser.add_argument("--rounds", type=int, default=9, help="interleaved rounds of (a) (default 9)")
    parser.add_argument("--only", choices=["a", "b", "c", "d"], help="run one part")
    args = parser.parse_args()
    parts = [args.only] if args.only else ["a", "b", "c", "d"]
    if args.quick:
        runs = {
            "a": lambda: bench_overhead(repeats=1, batch=2, length=64),
            "b": lambda: bench_streaming(tokens=50_000, channels=128, batch=2048, repeats=1),
            "c": lambda: bench_accuracy(tokens=20_000, channels=64, batch=2048),
            "d": lambda: bench_cross_layer(repeats=1, batch=2, length=64),
        }
    else:
        runs = {
            "a": lambda: bench_overhead(repeats=args.rounds, batch=8, length=256),
            "b": lambda: bench_streaming(tokens=60_000, channels=1024, batch=2048, repeats=3),
            "c": lambda: bench_accuracy(tokens=200_000, channels=128, batch=2048),
            "d": lambda: bench_cross_layer(repeats=args.rounds, batch=8, length=256),
        }
    for part in parts:
        runs[part]()


if __name__ == "__main__":
    main()
