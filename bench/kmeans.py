"""Benchmark the CQ k-means (``fit_codebooks``) against the plain loop it replaces, at the demo's shapes.

Run: ``.venv/bin/python bench/kmeans.py [--stats DIR/smollm2-135m.safetensors] [--layers 0,13,29]``.

The demo fits CQ-4c8b (48 groups of 4 channels) and CQ-8c8b (24 groups of 8) codebooks of 256 centroids
on 2048 sampled rows of SmolLM2's post-RoPE keys and values, per layer. Here each fit runs twice,
interleaved: ``fit_codebooks`` (settled groups not recomputed, the seeding's distances as a row times a
matrix) and the plain loop (every group at every Lloyd iteration, the seeding's distances as a batch of
matrix-vector products). Both must give the same centroids and objective to the bit; the ratio of
their total times is printed, with the share of (group, iteration) steps the fixed-point skipping
saves. With ``--stats`` (what ``headwidget demo`` saves) the rows are the real ones; without, random
rows with correlated channels (the skipping saves less on them: their groups settle at more similar
iterations). ``--threads 1`` makes the ratio steadier on a busy machine. Last, every set's codebooks
one call each against one ``fit_codebooks_many`` call over all sets (as ``fit_quantizer`` fits every
layer's K and V), interleaved; and the nearest-centroid search itself, as it finds each row's minimum
(the integer-packed ``amin`` checked against the float minimum) against the two-step float ``argmin``
it replaced, on every set's groups at the demo's shapes: the same centroids, and the ratio of times.
"""

from __future__ import annotations

import argparse
import math
import time

import torch

from headwidget.analysis import quantizers as _quantize
from headwidget.analysis.quantizers import (
    _argmin,
    _sq_dist,
    _verified_argmin,
    fit_codebooks,
    fit_codebooks_many,
    nearest_centroids,
)


def plain_seed(x: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """k-means++ as ``_seed`` draws it (all rows: the demo's 2048 are under SEED_SAMPLES)."""
    g, m, c = x.shape
    rows = torch.arange(g)
    norms = (x * x).sum(-1)
    centroids = torch.empty(g, k, c, dtype=x.dtype)
    best = torch.full_like(norms, math.inf)
    chosen = torch.randint(0, m, (g,), generator=gen)
    for j in range(k):
        if j:
            weights = best.clamp_min(0).cumsum(1)
            total = weights[:, -1:]
            dead = total <= 0
            weights = torch.where(dead, torch.arange(1, m + 1, dtype=x.dtype), weights)
            total = torch.where(dead, torch.full_like(total, m), total)
            u = torch.rand(g, 1, generator=gen, dtype=x.dtype) * total
            chosen = torch.searchsorted(weights, u, right=True).squeeze(1).clamp_(max=m - 1)
        new = x[rows, chosen]
        centroids[:, j] = new
        dist = norms - 2 * torch.bmm(x, new[:, :, None]).squeeze(2) + (new * new).sum(-1, keepdim=True)
        dist[rows, chosen] = 0.0
        best = torch.minimum(best, dist.clamp_min_(0))
    return centroids


def plain_fit(
    samples: torch.Tensor, c: int, b: int, iters: int = 25
) -> tuple[torch.Tensor, list[float], int]:
    """The plain k-means: centroids, objective, and the (group, iteration) steps it computed."""
    n, channels = samples.shape
    k, groups = 2**b, channels // c
    x = samples.float().reshape(n, groups, c).transpose(0, 1).contiguous()
    centroids = plain_seed(x, k, torch.Generator().manual_seed(0))
    history, previous, steps = [], None, 0
    for step in range(iters + 1):
        assign = nearest_centroids(x, centroids)
        steps += groups
        dist = _sq_dist(x, centroids, assign)
        history.append(float(dist.sum(1, dtype=torch.float64).sum()) / (n * groups))  # per group, then all
        if step == iters or (previous is not None and torch.equal(assign, previous)):
            break
        previous = assign
        sums = torch.zeros_like(centroids).scatter_add_(1, assign[..., None].expand(groups, n, c), x)
        counts = torch.zeros(groups, k).scatter_add_(1, assign, torch.ones_like(dist))
        means = sums / counts.clamp_min(1)[..., None]
        empty = counts == 0
        if bool(empty.any()):
            far = dist.topk(min(k, n), dim=1).indices
            rank = (empty.cumsum(1) - 1).clamp(0, far.shape[1] - 1)
            rows = far.gather(1, rank)
            means = torch.where(empty[..., None], x.gather(1, rows[..., None].expand(groups, k, c)), means)
        centroids = means
    return centroids, history, steps


def rows_to_fit(args: argparse.Namespace) -> list[tuple[str, torch.Tensor]]:
    if args.stats:
        from headwidget.stats import KVStats

        stats = KVStats.load(args.stats)
        layers = [int(x) for x in args.layers.split(",")]
        return [
            (f"layer {layer} {kind}", stats.samples(layer, kind))
            for layer in layers
            for kind in ("key_post", "value")
        ]
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(args.synthetic):
        mix = torch.randn(16, 192, generator=gen) / 4
        rows = torch.randn(2048, 16, generator=gen) @ mix + 0.3 * torch.randn(2048, 192, generator=gen)
        out.append((f"synthetic {i}", rows))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stats", help="statistics with samples, e.g. the demo's smollm2-135m.safetensors")
    parser.add_argument("--layers", default="0,13,29", help="layers of --stats (default: 0,13,29)")
    parser.add_argument("--synthetic", type=int, default=2, help="random row sets without --stats")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's)")
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    total = {"plain": 0.0, "fit_codebooks": 0.0}
    computed = skipped = 0
    counted: list[int] = []  # the groups of every nearest_centroids call of one fit_codebooks

    def counting(x: torch.Tensor, centroids: torch.Tensor, **kw: bool) -> torch.Tensor:
        counted.append(x.shape[0])
        return nearest_centroids(x, centroids, **kw)

    for i, (name, rows) in enumerate(rows_to_fit(args)):
        for c in (4, 8):
            counted.clear()
            results = {}
            for side in ("plain", "fit_codebooks") if (i + c) % 2 else ("fit_codebooks", "plain"):
                started = time.perf_counter()
                if side == "plain":
                    results[side] = plain_fit(rows, c, 8)
                else:
                    _quantize.nearest_centroids = counting
                    try:
                        books = fit_codebooks(rows, c, 8)
                    finally:
                        _quantize.nearest_centroids = nearest_centroids
                    results[side] = (books.centroids, list(books.objective), sum(counted))
                total[side] += time.perf_counter() - started
            (want, history, steps), (got, objective, done) = results["plain"], results["fit_codebooks"]
            same = torch.equal(want, got) and history == objective
            computed, skipped = computed + done, skipped + steps - done
            print(
                f"{name:22s} c={c}: {len(history) - 1:2d} iterations, {1 - done / steps:4.0%} of the group "
                f"steps skipped, {'identical' if same else 'DIFFERENT'}",
                flush=True,
            )
            if not same:
                raise SystemExit("fit_codebooks differs from the plain loop")
    ratio = total["fit_codebooks"] / total["plain"]
    print(
        f"\nplain {total['plain']:.1f} s, fit_codebooks {total['fit_codebooks']:.1f} s: ratio {ratio:.2f} "
        f"({skipped / (computed + skipped):.0%} of the group steps skipped)"
    )
    together(rows_to_fit(args))
    searches(rows_to_fit(args))


def together(sets: list[tuple[str, torch.Tensor]]) -> None:
    """Every set's codebooks one call each against one ``fit_codebooks_many`` call (what fit_quantizer
    does with all layers' K and V), interleaved; the same codebooks to the bit."""
    rows = [r for _, r in sets]
    times = {"one by one": 0.0, "together": 0.0}
    for c in (4, 8):
        for side in ("one by one", "together") if c == 4 else ("together", "one by one"):
            started = time.perf_counter()
            if side == "together":
                many = fit_codebooks_many(rows, c, 8)
            else:
                single = [fit_codebooks(r, c, 8) for r in rows]
            times[side] += time.perf_counter() - started
        same = all(
            torch.equal(a.centroids, b.centroids) and a.objective == b.objective
            for a, b in zip(many, single, strict=True)
        )
        if not same:
            raise SystemExit("fit_codebooks_many differs from fit_codebooks one by one")
    alone, joint = times["one by one"], times["together"]
    print(
        f"{len(rows)} sets, c=4 and c=8: one by one {alone:.1f} s, together {joint:.1f} s: "
        f"ratio {joint / alone:.2f} (identical)"
    )


def argmin_search(x: torch.Tensor, centroids: torch.Tensor, check: list[int] | None = None) -> torch.Tensor:
    """The search before the checked packing: the same blocks, each row's minimum by ``_argmin``.
    With ``check``, each block's picks are compared with the checked packing's on the same block (the
    same distance picked; which of equal ones may differ) and the rows that differ are counted in it."""
    g, n, _ = x.shape
    k = centroids.shape[1]
    norms = (centroids * centroids).sum(-1, keepdim=True)
    ct = torch.cat([-2 * centroids, norms, torch.ones_like(norms)], -1).transpose(1, 2)
    xa = torch.cat([x, torch.ones_like(x[..., :1]), (x * x).sum(-1, keepdim=True)], -1)
    out = torch.empty(g, n, dtype=torch.long)
    rows = min(n, max(64, _quantize.CHUNK_ELEMENTS // k))
    span = max(1, _quantize.CHUNK_ELEMENTS // (rows * k))
    for first in range(0, g, span):
        for start in range(0, n, rows):
            block = torch.bmm(xa[first : first + span, start : start + rows], ct[first : first + span])
            found = out[first : first + span, start : start + rows] = _argmin(block)
            if check is not None:
                packed = _verified_argmin(block, torch.int32)
                if not torch.equal(block.gather(-1, packed[..., None]), block.gather(-1, found[..., None])):
                    raise SystemExit("the checked packed search picks another distance than the argmin")
                check.append(int((packed != found).sum()))
    return out


def searches(sets: list[tuple[str, torch.Tensor]], repeats: int = 3) -> None:
    """``nearest_centroids`` against :func:`argmin_search` on each set's groups (256 centroids drawn
    from its rows), interleaved; then both on the same blocks: the same distances picked."""
    times = {"checked packing": 0.0, "argmin": 0.0}
    gen = torch.Generator().manual_seed(0)
    ties: list[int] = []
    for _, rows in sets:
        for c in (4, 8):
            x = rows.float().reshape(rows.shape[0], -1, c).transpose(0, 1).contiguous()
            books = x[:, torch.randperm(x.shape[1], generator=gen)[:256]].clone()
            for r in range(repeats):
                for side in ("checked packing", "argmin") if r % 2 else ("argmin", "checked packing"):
                    started = time.perf_counter()
                    _ = nearest_centroids(x, books) if side == "checked packing" else argmin_search(x, books)
                    times[side] += time.perf_counter() - started
            argmin_search(x, books, check=ties)
    new, old = times["checked packing"], times["argmin"]
    print(
        f"nearest-centroid search, {len(sets)} sets, c=4 and c=8: argmin {old:.2f} s, checked packing "
        f"{new:.2f} s: ratio {new / old:.2f} (the same distances; {sum(ties)} picks of another of equal "
        "ones)"
    )


if __name__ == "__main__":
    main()
