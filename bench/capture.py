"""Capture benchmarks, measured side by side in one run (ratios; absolute times are machine noise).

(a) overhead of capture on SmolLM2-135M, 8×256 tokens: capture of all layers vs the plain forward
    (full forward with logits, and the same forward stopped after the last attention, which is what
    capture computes), and the same capture with its folds skipped (what the hooks alone cost); plus
    the share of time spent inside the folds.
(b) streaming moments vs the naive route (materialise every K/V vector, then ``np.corrcoef``) at
    ≥ 50k tokens: time and peak-memory ratios. Each route runs in a fresh subprocess over the same
    pre-generated batches; time and the peak resident-memory increase (sampled every 2 ms) cover the
    statistics only, not making the data.
(c) accuracy of correlations vs float64 on float32 activations with large means and outliers:
    streaming (per-batch centred float32 Gram merged in float64) vs uncentred float32 sums.

Run: ``.venv/bin/python bench/capture.py`` (``--quick`` for a short smoke run).
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
from headwidget.moments import Moments
from headwidget.moments.correlation import corr_from_comoment


class _Stop(Exception):
    pass


def _timed(fn: Callable[[], object]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


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
            headwidget.capture(model, ids, batch_size=batch, progress=False, **options)  # type: ignore[arg-type]

        return go

    def without_folds() -> None:  # every hook fires, nothing is folded: the hooks' own cost
        def skip(self: capture_session._Recorder, layer: int) -> None:
            self.parts[layer].clear()

        current = capture_session._Recorder.fold_layer
        capture_session._Recorder.fold_layer = skip  # type: ignore[method-assign]
        try:
            run_capture()()
        finally:
            capture_session._Recorder.fold_layer = current  # type: ignore[method-assign]

    routes = {
        "plain forward (full, logits)": plain_full,
        "plain forward to last attention": plain_truncated,
        "capture K,V all layers": run_capture(),
        "capture K,V, folds skipped": without_folds,
        "capture K,V,K_post,input all": run_capture(rope="both", inputs=True),
    }
    for fn in routes.values():  # warm-up
        fn()
    times: dict[str, list[float]] = {name: [] for name in routes}
    hook_share: list[float] = []
    capture_session._Recorder.fold_layer = timed_fold  # type: ignore[method-assign]
    try:
        for _ in range(repeats):
            for name, fn in routes.items():
                in_hooks[0] = 0.0
                times[name].append(_timed(fn))
                if name == "capture K,V all layers":
                    hook_share.append(in_hooks[0])
    finally:
        capture_session._Recorder.fold_layer = original  # type: ignore[method-assign]
    base = statistics.median(times["plain forward to last attention"])
    full = statistics.median(times["plain forward (full, logits)"])
    print(
        f"\n(a) SmolLM2-135M, {batch}×{length} tokens, CPU ({torch.get_num_threads()} threads), "
        f"median of {repeats} interleaved runs"
    )
    # each round's own ratio to that round's forward, so a slow spell of the machine cancels out
    header = f"{'median s':>9s} {'÷ to-last-attn':>15s} {'(per round, IQR)':>22s} {'÷ full fwd':>11s}"
    print(f"{'route':36s} {header}")
    for name, ts in times.items():
        m = statistics.median(ts)
        rounds = [t / b for t, b in zip(ts, times["plain forward to last attention"], strict=True)]
        q = statistics.quantiles(rounds, n=4) if len(rounds) > 1 else [rounds[0]] * 3
        spread = f"{q[1]:.3f} ({q[0]:.3f}–{q[2]:.3f})"
        print(f"{name:36s} {m:9.3f} {m / base:15.3f} {spread:>22s} {m / full:11.3f}")
    print(
        f"time inside the folds (K,V): {statistics.median(hook_share):.3f} s = "
        f"{statistics.median(hook_share) / base:.1%} of the forward to the last attention"
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repeat (smoke run)")
    args = parser.parse_args()
    if args.quick:
        bench_overhead(repeats=1, batch=2, length=64)
        bench_streaming(tokens=50_000, channels=128, batch=2048, repeats=1)
        bench_accuracy(tokens=20_000, channels=64, batch=2048)
    else:
        bench_overhead(repeats=5, batch=8, length=256)
        bench_streaming(tokens=60_000, channels=1024, batch=2048, repeats=3)
        bench_accuracy(tokens=200_000, channels=128, batch=2048)


if __name__ == "__main__":
    main()
