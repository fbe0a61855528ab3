"""The CQ k-means against plain reference loops: the same seeds, codebooks and objective to the bit.

``fit_codebooks`` stops computing a group once it sits at a fixed point of Lloyd's iteration, and
its k-means++ seeding computes the distances in place; both are speed-ups that must not change a
result. The references here are the algorithm as documented, written out plainly: every group
recomputed at every iteration, every seeding step with fresh tensors.
"""

from __future__ import annotations

import math

import pytest
import torch

from headwidget.analysis import quantizers as _quantize
from headwidget.analysis.quantizers import _sq_dist, fit_codebooks, fit_codebooks_many, nearest_centroids
from headwidget.errors import ArgumentError, MissingStatisticsError

F64 = torch.float64


def reference_seed(x: torch.Tensor, k: int, gen: torch.Generator) -> torch.Tensor:
    """k-means++ on all rows of ``x`` (G, m, c) (m ≤ SEED_SAMPLES), drawing as ``_seed`` documents."""
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


def reference_lloyd(
    samples: torch.Tensor, c: int, b: int, iters: int, seed: int
) -> tuple[torch.Tensor, list]:
    """The module's seeding, then Lloyd on every group at every iteration (the documented stopping rule)."""
    n, channels = samples.shape
    k, groups = 2**b, channels // c
    x = samples.reshape(n, groups, c).transpose(0, 1).contiguous()
    centroids = _quantize._seed(x, k, torch.Generator().manual_seed(seed))
    history, previous = [], None
    for step in range(iters + 1):
        assign = nearest_centroids(x, centroids)
        dist = _sq_dist(x, centroids, assign)
        history.append(float(dist.sum(1, dtype=F64).sum()) / (n * groups))  # each group, then the groups
        if step == iters or (previous is not None and torch.equal(assign, previous)):
            break
        previous = assign
        sums = torch.zeros_like(centroids).scatter_add_(1, assign[..., None].expand(groups, n, c), x)
        counts = torch.zeros(groups, k, dtype=x.dtype).scatter_add_(1, assign, torch.ones_like(dist))
        means = sums / counts.clamp_min(1)[..., None]
        empty = counts == 0
        if bool(empty.any()):
            far = dist.topk(min(k, n), dim=1).indices
            rank = (empty.cumsum(1) - 1).clamp(0, far.shape[1] - 1)
            rows = far.gather(1, rank)
            means = torch.where(empty[..., None], x.gather(1, rows[..., None].expand(groups, k, c)), means)
        centroids = means
    return centroids, history


def mixture(n: int, groups: int, c: int, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """Groups of very different difficulty (some converge in a few iterations, some take many)."""
    gen = torch.Generator().manual_seed(seed)
    parts = []
    for g in range(groups):
        centres = torch.randn(2 + 3 * g, c, generator=gen, dtype=F64) * 3
        pick = torch.randint(0, len(centres), (n,), generator=gen)
        parts.append(centres[pick] + (0.05 + 0.4 * g) * torch.randn(n, c, generator=gen, dtype=F64))
    return torch.cat(parts, 1).to(dtype)


def with_duplicates(
    n: int, groups: int, c: int, distinct: int, seed: int, dtype: torch.dtype
) -> torch.Tensor:
    """Only ``distinct`` different vectors per group: more centroids than that leave clusters empty."""
    gen = torch.Generator().manual_seed(seed)
    atoms = torch.randint(-4, 5, (groups, distinct, c), generator=gen).to(dtype)
    pick = torch.randint(0, distinct, (n, groups), generator=gen)
    return torch.stack([atoms[g, pick[:, g]] for g in range(groups)], 1).reshape(n, groups * c)


@pytest.mark.parametrize(
    ("c", "b", "dtype"),
    [(1, 5, torch.float32), (2, 4, F64), (4, 4, torch.float32), (8, 6, torch.float32)],
)
def test_seeding_draws_the_reference_centroids(c: int, b: int, dtype: torch.dtype) -> None:
    x = mixture(400, 2, c, seed=c + b, dtype=dtype).reshape(400, 2, c).transpose(0, 1).contiguous()
    got = _quantize._seed(x, 2**b, torch.Generator().manual_seed(3))
    assert torch.equal(got, reference_seed(x, 2**b, torch.Generator().manual_seed(3)))


def test_seeding_with_fewer_distinct_rows_than_centroids_draws_the_reference_centroids() -> None:
    x = with_duplicates(300, 3, 4, distinct=6, seed=1, dtype=torch.float32)
    x = x.reshape(300, 3, 4).transpose(0, 1).contiguous()
    got = _quantize._seed(x, 16, torch.Generator().manual_seed(0))  # every row a centroid after 6 draws
    assert torch.equal(got, reference_seed(x, 16, torch.Generator().manual_seed(0)))


@pytest.mark.parametrize(
    ("data", "c", "b", "dtype"),
    [
        ("mixture", 4, 8, torch.float32),  # K = 256: the two-step argmin
        ("mixture", 2, 5, F64),
        ("mixture", 8, 3, torch.float32),
        ("duplicates", 4, 4, torch.float32),  # empty clusters, re-seeded
        ("duplicates", 2, 3, F64),
    ],
)
def test_fixed_point_groups_end_with_the_reference_codebooks(monkeypatch, data, c, b, dtype) -> None:
    groups = 4
    if data == "mixture":
        samples = mixture(500, groups, c, seed=b, dtype=dtype)
    else:
        samples = with_duplicates(500, groups, c, distinct=2**b - 3, seed=b, dtype=dtype)
    want, history = reference_lloyd(samples, c, b, iters=30, seed=4)
    computed: list[int] = []

    def counting(x: torch.Tensor, centroids: torch.Tensor, **kw: bool) -> torch.Tensor:
        computed.append(x.shape[0])
        return nearest_centroids(x, centroids, **kw)

    monkeypatch.setattr(_quantize, "nearest_centroids", counting)
    books = fit_codebooks(samples, c, b, iters=30, seed=4)
    assert torch.equal(books.centroids, want)
    assert list(books.objective) == history
    assert len(computed) == len(history)
    if data == "mixture":  # the groups settle at different iterations: later ones compute fewer
        assert computed[0] == groups and min(computed) < groups


@pytest.mark.parametrize(("dtype", "stack"), [(torch.float32, None), (F64, None), (torch.float32, 2)])
def test_fits_made_together_are_the_reference_fits_made_one_by_one(monkeypatch, dtype, stack) -> None:
    # what fit_quantizer does with every layer's K and V: one k-means loop over all their groups. The
    # sets stop after different numbers of iterations (and one re-seeds empty clusters), and one has
    # another shape, so it is fitted in a loop of its own.
    sets = [
        mixture(500, 4, 2, seed=1, dtype=dtype),
        with_duplicates(500, 4, 2, distinct=13, seed=2, dtype=dtype),
        mixture(500, 4, 2, seed=3, dtype=dtype) * 10,
        mixture(300, 2, 2, seed=4, dtype=dtype),
        mixture(500, 4, 2, seed=5, dtype=dtype),
    ]
    want = [reference_lloyd(s, 2, 4, iters=30, seed=7) for s in sets]
    assert len({len(history) for _, history in want}) > 1  # the fits really stop at different steps
    loops: list[int] = []

    def counting(x: torch.Tensor, centroids: torch.Tensor, **kw: bool) -> torch.Tensor:
        loops.append(x.shape[0])
        return nearest_centroids(x, centroids, **kw)

    monkeypatch.setattr(_quantize, "nearest_centroids", counting)
    if stack:  # a memory budget of two (500, 8)-sets a loop: the four take two loops
        monkeypatch.setattr(_quantize, "STACK_ELEMENTS", stack * 500 * 8)
    got = fit_codebooks_many(sets, 2, 4, iters=30, seed=7)
    for books, (centroids, history) in zip(got, want, strict=True):
        assert torch.equal(books.centroids, centroids)
        assert list(books.objective) == history
    # the first step computes the (500, 8)-sets' groups at once: all four, or two under the budget
    assert loops[0] == (stack or 4) * 4
    assert len(loops) < sum(len(history) for _, history in want)


def test_fits_made_together_refuse_what_one_fit_refuses() -> None:
    good = mixture(300, 2, 2, seed=1, dtype=torch.float32)
    with pytest.raises(ArgumentError, match="floating"):
        fit_codebooks_many([good, [[1.0, 2.0]]], 2, 3)  # type: ignore[list-item]
    with pytest.raises(MissingStatisticsError, match="needs at least 8"):
        fit_codebooks_many([good, good[:5]], 2, 3)
    assert fit_codebooks_many([], 2, 3) == []


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_the_exact_search_returns_the_first_minimum_where_packing_sees_a_tie(dtype) -> None:
    """k-means's nearest search: the integer-packed pick, checked against the float minimum; picks
    that are not the minimum (entries agreeing in all but the low b bits, negative distances, whose
    integer order is reversed) are replaced by an exact argmin. Against torch's argmin (the first
    minimum) on blocks full of exact ties, near ties and negatives, and on a search whose two nearest
    centroids differ in the bits packing overwrites."""
    gen = torch.Generator().manual_seed(5)
    block = torch.randint(-4, 5, (3, 500, 256), generator=gen).to(dtype)
    block[:, :, 7] += 2.0**-20 * block[:, :, 7].abs()  # within the low 8 bits of its integer neighbours
    block[0, 0] = 3.0
    block[0, 0, 9], block[0, 0, 200] = 1.0 + 2.0**-21, 1.0  # a packed tie; the later entry is smaller
    ints = torch.int32 if dtype == torch.float32 else torch.int64
    assert torch.equal(_quantize._verified_argmin(block.clone(), ints), block.argmin(-1))
    assert int(block[0, 0].argmin()) == 200
    if dtype == torch.float32:  # packing alone takes the earlier of the two (2**-21 is in its low 8 bits)
        assert int(_quantize._packed_argmin(block[0, :1].clone(), ints)) == 9
    # the same through the search: row x = 0 reads the centroids' squared norms
    centroids = torch.full((1, 256, 1), 10.0, dtype=dtype)
    centroids[0, 3, 0], centroids[0, 4, 0] = 1.0 + 2.0**-22, 1.0  # squares 1 + 2**-21 and 1
    x = torch.zeros(1, 1, 1, dtype=dtype)
    assert nearest_centroids(x, centroids).tolist() == [[4]]
    if dtype == torch.float32:  # the forward's packed search may return either of the two
        assert nearest_centroids(x, centroids, packed=True).tolist() == [[3]]
    # random rows: the float64 brute force wherever its best two distances are apart
    x = torch.randn(4, 600, 4, generator=gen, dtype=dtype)
    centroids = torch.randn(4, 256, 4, generator=gen, dtype=dtype)
    dist = ((x.double()[:, :, None] - centroids.double()[:, None]) ** 2).sum(-1)
    two = dist.topk(2, -1, largest=False).values
    apart = (two[..., 1] - two[..., 0]) > 1e-5 * (1 + (x.double() ** 2).sum(-1))
    got = nearest_centroids(x, centroids)
    assert bool(apart.float().mean() > 0.99) and torch.equal(got[apart], dist.argmin(-1)[apart])
    # K not a power of two: the two-step argmin, the same picks
    dist = dist[..., :200]
    two = dist.topk(2, -1, largest=False).values
    apart = (two[..., 1] - two[..., 0]) > 1e-5 * (1 + (x.double() ** 2).sum(-1))
    got = nearest_centroids(x, centroids[:, :200])
    assert bool(apart.float().mean() > 0.99) and torch.equal(got[apart], dist.argmin(-1)[apart])


@pytest.mark.parametrize(("n", "channels"), [(2100, 32), (70_000, 2)])
def test_a_fit_made_with_others_has_its_objective_alone_to_the_bit_on_two_threads(n, channels) -> None:
    # A fit alone has one long sum of distances (over 32768), which torch splits between threads, and
    # stacked fits several, which it does not: summed as one row, the objectives differed in the last
    # bits (the centroids did not).
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        gen = torch.Generator().manual_seed(11)
        sets = [torch.randn(n, channels, generator=gen) * (i + 1) + i for i in range(3)]
        together = fit_codebooks_many(sets, 2, 2, iters=3)
        alone = [fit_codebooks(s, 2, 2, iters=3) for s in sets]
    finally:
        torch.set_num_threads(threads)
    for a, b in zip(together, alone, strict=True):
        assert torch.equal(a.centroids, b.centroids)
        assert a.objective == b.objective
