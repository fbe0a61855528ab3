"""The maths of the K/V quantizers, pure: KIVI-style integer quantization and coupled quantization's
k-means codebooks and nearest centroids, on tensors (no model, no hook).

:mod:`headwidget.evaluation._quantize` applies them to the K/V a live model's attention uses.

**kv:int{b}[/g{n}]** (KIVI: asymmetric min/max, ``b`` bits, ``L = 2**b − 1`` levels; ``n`` = 32 by
default). Keys are quantized per channel over groups of ``n`` consecutive tokens of each batch row and
KV head; the groups follow each row's real tokens in order (so left and right padding give the same
groups), a last partial group is its own group (KIVI's own code keeps the newest tokens in full
precision instead; here, in a whole forward, every token is quantized: the deployed reading of
``protocol="prefill:P"`` keeps KIVI's residual, see :mod:`headwidget.evaluation._cache_transforms`),
and padding tokens never enter a group's min/max
(they are passed through unchanged; the attention masks them). Values are quantized per token over
groups of ``n`` contiguous channels of the token's flattened K/V-head vector (``C = kv_heads·head_dim``
channels, heads concatenated as a cache row stores them), so a group spans several KV heads when
``head_dim < n``; when ``n`` does not divide ``C`` (a tiny model with C = 16) the last group is partial
and holds the rest, a group never reaching past the token's vector. Per group, ``zero = min`` rounded
down to fp16 and ``scale = (max − zero)/L`` rounded up to fp16 (the stored numbers; rounding this way
keeps the whole range representable), then ``x̂ = clamp(round((x − zero)/scale), 0, L)·scale + zero``.
The ranges are the data's own per group — that is the method — so kv:int needs no calibration.
Bytes per token and layer: ``C_K·b/8 + 4·C_K/n + C_V·b/8 + 4·⌈C_V/n⌉`` (the key scales and zeros,
2 + 2 bytes per channel per ``n`` tokens, amortised over the tokens; the value groups counted whole),
which is the formula ``2·(C·b/8 + 4·C/n)`` when ``n`` divides ``C``.

**kv:cq{c}c{b}b** (coupled). Per layer and kind (post-RoPE keys — pre-RoPE keys of a model without
RoPE — and values), every group of ``c`` contiguous channels of a token's flattened vector is replaced by
the nearest (Euclidean) of ``2**b`` centroids, stored in fp16, learned by :func:`fit_codebooks` (plain
k-means: the paper's Fisher-guided centroids, which weight each sample by its gradient, are not these) on
calibration samples of that layer and kind: ``KVStats.samples(layer, "key_post")`` and
``KVStats.samples(layer, "value")`` of statistics captured with ``rope="post"`` (or ``"both"``) and
``samples=R`` — never the evaluation texts. Bytes per token and layer: ``2·(C/c)·b/8``; the codebooks,
``2**b·c`` fp16 values per group per kind, are a per-layer constant (:attr:`KVQuantizer.constant_bytes`).

Example:
    >>> import torch
    >>> values = torch.tensor([[[[0.0, 1.0, 2.0, 3.0]]]])  # (B, G, T, d): one token, four channels
    >>> quantize_int_values(values, bits=2, group=4).tolist()  # 4 levels over 0..3: exact
    [[[[0.0, 1.0, 2.0, 3.0]]]]
    >>> books = fit_codebooks(torch.randn(256, 4, generator=torch.Generator().manual_seed(0)), c=2, b=2)
    >>> tuple(books.centroids.shape)  # (groups, 2**b, c)
    (2, 4, 2)
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from headwidget.analysis.variants import CQ_BITS
from headwidget.checks import whole_number
from headwidget.errors import ArgumentError, MechanismSpecError, MissingStatisticsError

__all__ = [
    "CHUNK_ELEMENTS",
    "DEVICE_CHUNK_ELEMENTS",
    "MAX_ITERS",
    "SEED_SAMPLES",
    "STACK_ELEMENTS",
    "Codebooks",
    "check_enough_samples",
    "fit_codebooks",
    "fit_codebooks_many",
    "flat_rows",
    "nearest_centroids",
    "quantize_int_keys",
    "quantize_int_values",
    "unflat_rows",
    "work_dtype",
]

#: Elements of one block of distances computed at once by k-means and CQ on a CPU (1 MiB of float32:
#: blocks that stay in the cache are several times faster than large ones).
CHUNK_ELEMENTS = 2**18
#: The same on an accelerator, where fewer, larger blocks are faster.
DEVICE_CHUNK_ELEMENTS = 2**26
#: k-means++ seeding looks at most this many samples per group (``max(it, 16·2**b)``); Lloyd uses all.
SEED_SAMPLES = 8192
#: :func:`fit_codebooks_many` stacks fits into one k-means loop up to this many sample elements (128 MiB
#: of float32 samples; the loop's assignments and distances take 3× that).
STACK_ELEMENTS = 2**25
#: The most Lloyd iterations ``iters`` may ask for (the fit stops early when no assignment changes).
MAX_ITERS = 10_000

F16 = torch.float16


# ---------------------------------------------------------------------------------------------- fp16
def _fp16_down(v: torch.Tensor) -> torch.Tensor:
    """The largest fp16 value ≤ ``v`` (as ``v``'s dtype)."""
    h = v.to(F16)
    bits = h.view(torch.int16)
    stepped = torch.where(bits > 0, bits - 1, torch.where(bits == 0, torch.full_like(bits, -32767), bits + 1))
    h = torch.where(h.to(v.dtype) > v, stepped.view(F16), h)
    return h.to(v.dtype)


def _fp16_up(v: torch.Tensor) -> torch.Tensor:
    """The smallest fp16 value ≥ ``v`` (as ``v``'s dtype)."""
    return -_fp16_down(-v)


def work_dtype(x: torch.Tensor) -> torch.dtype:
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def _minmax(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, bits: int) -> torch.Tensor:
    levels = float(2**bits - 1)
    zero = _fp16_down(lo)
    scale = _fp16_up((hi - zero) / levels)
    safe = torch.where(scale > 0, scale, torch.ones_like(scale))
    q = torch.round((x - zero) / safe).clamp_(0.0, levels)
    return q * scale + zero


# ---------------------------------------------------------------------------------------------- kv:int
def quantize_int_keys(
    key: torch.Tensor, bits: int, group: int = 32, real: torch.Tensor | None = None
) -> torch.Tensor:
    """KIVI keys: quantize→dequantize ``key`` (B, G, T, d) per channel over groups of ``group`` tokens.

    The groups run over each row's real tokens (``real``: (B, T) booleans, default all) in order; a
    last partial group is its own group; padding tokens neither enter a group's min/max nor change
    (they are returned as given). Scale and zero point are fp16 (module docstring).

    Example:
        >>> k = torch.tensor([0.0, 1.0, 2.0, 3.0, 100.0]).reshape(1, 1, 5, 1)
        >>> quantize_int_keys(k, bits=2, group=4, real=torch.tensor([[1, 1, 1, 1, 0]])).flatten().tolist()
        [0.0, 1.0, 2.0, 3.0, 100.0]
        >>> quantize_int_keys(k, bits=1, group=4).flatten().tolist()  # the 5th token is its own group
        [0.0, 0.0, 3.0, 3.0, 100.0]
    """
    b, g, t, d = key.shape
    work = key.to(work_dtype(key))
    if real is None or bool(real.all()):
        order = None
        xs = work
        mask = torch.ones(b, t, dtype=torch.bool, device=key.device)
    else:
        real = real.to(device=key.device, dtype=torch.bool)
        order = torch.argsort((~real).to(torch.int8), dim=1, stable=True)  # real tokens first, in order
        xs = work.gather(2, order[:, None, :, None].expand(b, g, t, d))
        mask = real.gather(1, order)
    group = max(1, min(group, t))  # a group longer than the sequence is one group of all of it
    pad = (-t) % group
    if pad:
        xs = torch.nn.functional.pad(xs, (0, 0, 0, pad))
        mask = torch.nn.functional.pad(mask, (0, pad), value=False)
    n = (t + pad) // group
    xs = xs.reshape(b, g, n, group, d)
    m = mask.reshape(b, 1, n, group, 1)
    lo = xs.masked_fill(~m, math.inf).amin(3, keepdim=True)
    hi = xs.masked_fill(~m, -math.inf).amax(3, keepdim=True)
    empty = ~m.any(3, keepdim=True)
    lo, hi = lo.masked_fill(empty, 0.0), hi.masked_fill(empty, 0.0)
    out = _minmax(xs, lo, hi, bits).reshape(b, g, n * group, d)[:, :, :t]
    if order is not None:
        out = torch.empty_like(out).scatter_(2, order[:, None, :, None].expand(b, g, t, d), out)
        assert real is not None
        out = torch.where(real[:, None, :, None], out, work)
    return out.to(key.dtype)


def _int_rows(rows: torch.Tensor, bits: int, group: int) -> torch.Tensor:
    """Quantize every row of ``rows`` (N, C) over groups of ``group`` contiguous channels (last partial)."""
    c = rows.shape[-1]
    full = c - c % group
    parts = []
    if full:
        x = rows[:, :full].reshape(rows.shape[0], full // group, group)
        parts.append(_minmax(x, x.amin(-1, keepdim=True), x.amax(-1, keepdim=True), bits).reshape(-1, full))
    if full < c:
        x = rows[:, full:]
        parts.append(_minmax(x, x.amin(-1, keepdim=True), x.amax(-1, keepdim=True), bits))
    return parts[0] if len(parts) == 1 else torch.cat(parts, -1)


def flat_rows(x: torch.Tensor) -> torch.Tensor:
    """(B, G, T, d) → (B·T, G·d): every token's vector, KV heads concatenated."""
    b, g, t, d = x.shape
    return x.transpose(1, 2).reshape(b * t, g * d)


def unflat_rows(rows: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    b, g, t, d = like.shape
    return rows.reshape(b, t, g, d).transpose(1, 2).to(like.dtype)


def quantize_int_values(value: torch.Tensor, bits: int, group: int = 32) -> torch.Tensor:
    """KIVI values: quantize→dequantize ``value`` (B, G, T, d) per token over groups of ``group`` channels.

    A token's channels are its KV heads' ``G·d`` channels concatenated; groups are ``group`` contiguous
    channels of that vector, the last one partial when ``group`` does not divide ``G·d``. Per token,
    so padding cannot touch a real token's groups.

    Example:
        >>> v = torch.tensor([[0.0, 1.0, 2.0, 3.0], [5.0, 5.0, 5.0, 5.0]]).reshape(1, 2, 1, 4)
        >>> quantize_int_values(v, bits=1, group=3).flatten().tolist()
        [0.0, 0.0, 2.0, 3.0, 5.0, 5.0, 5.0, 5.0]
    """
    return unflat_rows(_int_rows(flat_rows(value.to(work_dtype(value))), bits, group), value)


# ---------------------------------------------------------------------------------------------- k-means
def nearest_centroids(x: torch.Tensor, centroids: torch.Tensor, *, packed: bool = False) -> torch.Tensor:
    """(G, N) index of the nearest of ``centroids`` (G, K, c) for every row of ``x`` (G, N, c).

    The squared distances are expanded, ``‖x − μ‖² = [x, 1, ‖x‖²]·[−2μ, ‖μ‖², 1]``: one batched matmul per
    block of groups and rows, each block's (groups, rows, K) distances at most :data:`CHUNK_ELEMENTS`
    (cache-sized) on a CPU, :data:`DEVICE_CHUNK_ELEMENTS` elsewhere. The index returned is that of the
    smallest of these computed distances (of equal ones, the first for K = 2**b ≤ 256, else any).

    For K = 2**b ≤ 256 and float32/float64, the minimum is found with one integer ``amin`` instead of
    an ``argmin`` (several times slower on a CPU): the distances are read as integers, which order like
    the floats for non-negative values, and their lowest b bits are replaced by the centroid's index
    (:func:`_packed_argmin`). Two centroids whose distances agree in all but those b mantissa bits (a
    relative difference below ``2**(b − 23)`` in float32) then look tied. With ``packed`` (the
    forward's quantizer) either may be returned; otherwise the pick is checked against the float
    minimum of its row, and the rows where it is not that minimum (a near tie, or a rounding-negative
    distance) take an exact ``argmin``, so the result is the exact one.

    Example:
        >>> books = torch.tensor([[[0.0], [1.0], [1.0], [5.0]]])
        >>> nearest_centroids(torch.tensor([[[0.9], [1.0], [4.0], [-3.0]]]), books).tolist()
        [[1, 1, 3, 0]]
    """
    g, n, _ = x.shape
    k = centroids.shape[1]
    ints = {torch.float32: torch.int32, torch.float64: torch.int64}.get(x.dtype)
    packing = ints is not None and 2 <= k <= 256 and k & (k - 1) == 0
    budget = CHUNK_ELEMENTS if x.device.type == "cpu" else DEVICE_CHUNK_ELEMENTS
    norms = (centroids * centroids).sum(-1, keepdim=True)
    ct = torch.cat([-2 * centroids, norms, torch.ones_like(norms)], -1).transpose(1, 2)
    xa = torch.cat([x, torch.ones_like(x[..., :1]), (x * x).sum(-1, keepdim=True)], -1)
    out = torch.empty(g, n, dtype=torch.long, device=x.device)
    rows = min(n, max(64, budget // k))
    span = max(1, budget // (rows * k))
    for first in range(0, g, span):
        books = ct[first : first + span]
        for start in range(0, n, rows):
            block = torch.bmm(xa[first : first + span, start : start + rows], books)
            if ints is None or not packing:
                found = _argmin(block)
            elif packed:
                found = _packed_argmin(block, ints, in_place=True)
            else:
                found = _verified_argmin(block, ints)
            out[first : first + span, start : start + rows] = found
    return out


def _packed_argmin(block: torch.Tensor, ints: torch.dtype, *, in_place: bool = False) -> torch.Tensor:
    """The index of each row's smallest entry of ``block`` (..., K = 2**b), up to entries that agree in
    all but their lowest b bits: the entries read as integers, those bits replaced by the index, one
    ``amin``. ``in_place`` overwrites ``block``.

    >>> _packed_argmin(torch.tensor([[3.0, 0.5, 2.0, 0.25]]), torch.int32).tolist()
    [3]
    """
    k = block.shape[-1]
    index = torch.arange(k, dtype=ints, device=block.device)
    keep = torch.tensor(-k, dtype=ints, device=block.device)  # ~(k − 1): clears the low b bits
    bits = block.view(ints)
    bits = bits.bitwise_and_(keep) if in_place else bits.bitwise_and(keep)
    return bits.bitwise_or_(index).amin(-1).bitwise_and_(k - 1)


def _verified_argmin(block: torch.Tensor, ints: torch.dtype) -> torch.Tensor:
    """``block.argmin(-1)`` (..., K = 2**b), the first of equal minima: :func:`_packed_argmin`, kept where
    it picks its row's float minimum, an exact ``argmin`` for the other rows.

    A pick equal to the minimum is the first minimum: an earlier equal entry agrees with it in every
    bit and would have been picked. Any other pick (an entry within the low bits of the minimum, or
    the integer order of negative floats, which is reversed) is replaced.

    >>> block = torch.tensor([[1.0 + 2**-22, 3.0, 1.0, 1.0], [-1.0, -2.0, 0.0, 5.0]])
    >>> _packed_argmin(block, torch.int32).tolist(), _verified_argmin(block, torch.int32).tolist()
    ([0, 0], [2, 1])
    """
    low = block.amin(-1, keepdim=True)
    found = _packed_argmin(block, ints).long()
    sure = (block.gather(-1, found[..., None]) == low).squeeze(-1)
    if not bool(sure.all()):
        miss = ~sure
        found[miss] = block[miss].argmin(-1)
    return found


def _argmin(d: torch.Tensor) -> torch.Tensor:
    """``d.argmin(-1)`` for a contiguous ``d`` (..., K), up to which of tied minima is returned.

    For K ≥ 64, in two steps that are several times faster on a CPU than one ``argmin`` over K: the
    minimum over the 8 strips ``k = j·K/8 + l`` of each column ``l`` (an elementwise minimum), the
    argmin over the K/8 columns, then over the 8 entries of the winning column.
    """
    k = d.shape[-1]
    if k < 64 or k % 8:
        return d.argmin(-1)
    cols = k // 8
    strips = d.view(*d.shape[:-1], 8, cols)
    col = strips.amin(-2).argmin(-1)
    picked = strips.gather(-1, col[..., None, None].expand(*col.shape, 8, 1)).squeeze(-1)
    return picked.argmin(-1) * cols + col


def _sq_dist(x: torch.Tensor, centroids: torch.Tensor, assign: torch.Tensor) -> torch.Tensor:
    """(G, N) exact squared distance of every row to its assigned centroid."""
    picked = centroids.gather(1, assign[..., None].expand(*assign.shape, x.shape[-1]))
    return ((x - picked) ** 2).sum(-1)


def _seed(x: torch.Tensor, k: int, gen: torch.Generator, copies: int = 1) -> torch.Tensor:
    """k-means++ centroids (G, k, c) from the rows of ``x`` (G, N, c) (≤ SEED_SAMPLES rows per group).

    With ``copies``, ``x`` stacks that many fits of G / copies groups each, and every fit gets the
    numbers one fit alone draws from ``gen`` (the same rows, the same first centroids, the same
    uniforms): their centroids are those of one call each.
    """
    g, n, c = x.shape
    one = g // copies
    m = min(n, max(SEED_SAMPLES, 16 * k))
    if m < n:
        pick = torch.randperm(n, generator=gen, device=x.device)[:m]
        x = x[:, pick]
    rows = torch.arange(g, device=x.device)
    norms = (x * x).sum(-1)  # (G, m)
    xt = x.transpose(1, 2).contiguous()  # (G, c, m): x·μ as a row times a matrix (faster than x times μ)
    centroids = torch.empty(g, k, c, dtype=x.dtype, device=x.device)
    best = torch.full_like(norms, math.inf)  # ≥ 0 from the first step on (each distance is clamped)
    chosen = torch.randint(0, m, (one,), generator=gen, device=x.device).repeat(copies)
    for j in range(k):
        if j:  # draw the next centroid with probability ∝ squared distance to the nearest one so far
            weights = best.cumsum(1)
            total = weights[:, -1:]
            dead = total <= 0  # every row already a centroid: draw uniformly
            if x.device.type != "cpu" or bool(dead.any()):  # (no host sync per step on a device)
                weights = torch.where(dead, torch.arange(1, m + 1, device=x.device, dtype=x.dtype), weights)
                total = torch.where(dead, torch.full_like(total, m), total)
            u = torch.rand(one, 1, generator=gen, device=x.device, dtype=x.dtype).repeat(copies, 1) * total
            chosen = torch.searchsorted(weights, u, right=True).squeeze(1).clamp_(max=m - 1)
        new = x[rows, chosen]  # (G, c)
        centroids[:, j] = new
        # ‖x‖² − 2·x·μ + ‖μ‖², in place (−2·p + n is n − 2·p to the bit: the doubling is exact)
        dist = torch.bmm(new[:, None, :], xt).squeeze(1).mul_(-2).add_(norms)
        dist.add_((new * new).sum(-1, keepdim=True))
        dist[rows, chosen] = 0.0  # exactly: the rounding of the expansion must not keep it drawable
        torch.minimum(best, dist.clamp_min_(0), out=best)
    return centroids


@dataclass(frozen=True)
class Codebooks:
    """The k-means codebooks of one (layer, kind): ``centroids`` (G, 2**b, c) for the G = C/c groups of c
    contiguous channels, and ``objective``: the mean squared error per group vector after the seeding and
    after each Lloyd iteration (non-increasing), summed in float64 group by group (each group's rows in
    blocks of :data:`SUM_BLOCK`), then over the groups.

    :meth:`quantize` uses the centroids rounded to fp16 (what is stored); :attr:`nbytes` counts them.

    Example:
        >>> samples = torch.tensor([[0.0, 1.0], [0.0, 1.0], [4.0, 4.0], [4.0, 4.0]])
        >>> books = fit_codebooks(samples, c=2, b=1, seed=0)
        >>> books.centroids.shape, books.nbytes
        (torch.Size([1, 2, 2]), 8)
        >>> books.quantize(torch.tensor([[0.1, 0.9]])).tolist()
        [[0.0, 1.0]]
    """

    centroids: torch.Tensor
    objective: tuple[float, ...] = field(default=(), repr=False)

    @property
    def channels(self) -> int:
        """The channels each codeword covers (c)."""
        return int(self.centroids.shape[2])

    @property
    def nbytes(self) -> int:
        """Bytes of the stored (fp16) codebooks."""
        return 2 * self.centroids.numel()

    def stored(self, device: torch.device, dtype: torch.dtype) -> torch.Tensor:
        """The centroids as stored (fp16), on ``device`` in ``dtype`` for the arithmetic."""
        return self.centroids.to(F16).to(device=device, dtype=dtype)

    def quantize(self, rows: torch.Tensor, centroids: torch.Tensor | None = None) -> torch.Tensor:
        """Replace every group of c channels of ``rows`` (N, C) by its nearest stored centroid.

        Nearest up to near ties: centroids whose squared distances differ by less than a relative
        ``2**(b − 23)`` (float32) may be swapped (see :func:`nearest_centroids`, ``packed``).
        """
        work = rows.to(work_dtype(rows))
        books = self.stored(rows.device, work.dtype) if centroids is None else centroids
        g, _, c = books.shape
        x = work.reshape(work.shape[0], g, c).transpose(0, 1)  # (G, N, c)
        picked = books.gather(1, nearest_centroids(x, books, packed=True)[..., None].expand(g, x.shape[1], c))
        return picked.transpose(0, 1).reshape(work.shape).to(rows.dtype)


def fit_codebooks(samples: torch.Tensor, c: int, b: int, *, iters: int = 25, seed: int = 0) -> Codebooks:
    """k-means codebooks of ``2**b`` centroids for every group of ``c`` contiguous channels of ``samples``.

    All ``C/c`` groups are fitted at once on ``samples``' device: data (G, n, c), centroids (G, 2**b, c),
    distances by batched matmul (in chunks of at most :data:`CHUNK_ELEMENTS`). Seeding is k-means++ on
    (at most :data:`SEED_SAMPLES`, or 16·2**b) samples; then up to ``iters`` Lloyd iterations, stopping
    early when no assignment changes; a cluster left empty is re-seeded at the sample farthest from
    its centroid. A group whose assignment did not change, and whose centroids are the means of it
    (none re-seeded), is at a fixed point: it is not computed again, which gives the same codebooks and
    objective as iterating it. Deterministic for a ``seed`` on one device. Computes in float32 (float64
    samples in float64).

    Args:
        samples: (n, C) calibration rows of one layer and kind (``KVStats.samples(layer, kind)``).
        c: channels per codeword; must divide C.
        b: bits per codeword (2**b centroids).

    Raises:
        MechanismSpecError: ``c`` does not divide C (the message lists the divisors), or no samples.
        MissingStatisticsError: fewer samples than the ``2**b`` centroids (a k-means with fewer points
            than centroids cannot be trusted: the message says how many samples it needs).
        ArgumentError: ``c``, ``b``, ``iters`` or ``seed`` not an integer in range.

    Example:
        >>> gen = torch.Generator().manual_seed(0)
        >>> samples = torch.randn(512, 8, generator=gen)
        >>> books = fit_codebooks(samples, c=4, b=3, iters=10)
        >>> tuple(books.centroids.shape), books.objective[-1] <= books.objective[0]
        ((2, 8, 4), True)
    """
    return fit_codebooks_many([samples], c, b, iters=iters, seed=seed)[0]


def fit_codebooks_many(
    samples: Sequence[torch.Tensor], c: int, b: int, *, iters: int = 25, seed: int = 0
) -> list[Codebooks]:
    """:func:`fit_codebooks` of each of ``samples``, fitted together: the same codebooks and objectives
    as one call each (the same seed draws the same numbers for every one), in one k-means loop over all
    their groups (what a layer's K and V of every layer cost in Python overhead once, not once each).
    Samples of the same shape, dtype and device are stacked, up to :data:`STACK_ELEMENTS` sample
    elements a loop (a large model's layers take several loops, so memory stays that of a few fits);
    others are fitted in loops of their own.

    Example:
        >>> gen = torch.Generator().manual_seed(0)
        >>> a, b = torch.randn(256, 8, generator=gen), torch.randn(256, 8, generator=gen)
        >>> together = fit_codebooks_many([a, b], c=4, b=3)
        >>> alone = [fit_codebooks(s, c=4, b=3) for s in (a, b)]
        >>> all(torch.equal(t.centroids, o.centroids) and t.objective == o.objective
        ...     for t, o in zip(together, alone))
        True
    """
    c = whole_number("c", c, minimum=1, hint="channels per codeword")
    b = whole_number("b", b, minimum=CQ_BITS[0], maximum=CQ_BITS[1], hint="bits per codeword: 2**b centroids")
    iters = whole_number("iters", iters, minimum=0, maximum=MAX_ITERS, hint="Lloyd iterations")
    seed = whole_number("seed", seed, minimum=0, maximum=2**63 - 1, hint="the seed of the k-means++ start")
    grouped = [_grouped_rows(s, c, b) for s in samples]
    out: list[Codebooks | None] = [None] * len(grouped)
    kinds: dict[tuple[object, ...], list[int]] = {}
    for i, x in enumerate(grouped):
        kinds.setdefault((tuple(x.shape), x.dtype, x.device), []).append(i)
    for members in kinds.values():
        per_stack = max(1, STACK_ELEMENTS // grouped[members[0]].numel())
        for first in range(0, len(members), per_stack):
            stack = members[first : first + per_stack]
            fitted = _kmeans(torch.stack([grouped[i] for i in stack]), 2**b, iters, seed)
            for i, books in zip(stack, fitted, strict=True):
                out[i] = books
    return [books for books in out if books is not None]


def _grouped_rows(samples: torch.Tensor, c: int, b: int) -> torch.Tensor:
    """``samples`` (n, C) checked, as (G, n, c) groups of ``c`` contiguous channels in the work dtype."""
    if not isinstance(samples, torch.Tensor) or not samples.is_floating_point():
        got = type(samples).__name__ + (f" of {samples.dtype}" if isinstance(samples, torch.Tensor) else "")
        raise ArgumentError(
            f"samples must be a floating (n, C) torch tensor (KVStats.samples(layer, kind)), got {got}"
        )
    if samples.ndim != 2 or samples.shape[0] == 0:
        raise MechanismSpecError(f"k-means needs (n, C) samples with n ≥ 1, got shape {tuple(samples.shape)}")
    n, channels = samples.shape
    check_enough_samples(n, b, f"kv:cq{c}c{b}b")
    if c < 1 or channels % c:
        divisors = [d for d in range(1, channels + 1) if channels % d == 0]
        raise MechanismSpecError(
            f"kv:cq{c}c{b}b groups c = {c} contiguous channels, which must divide the C = {channels} "
            f"channels; allowed c: {', '.join(map(str, divisors))}"
        )
    return samples.to(work_dtype(samples)).reshape(n, channels // c, c).transpose(0, 1).contiguous()


def _kmeans(stacked: torch.Tensor, k: int, iters: int, seed: int) -> list[Codebooks]:
    """k-means of every group of ``stacked`` (L, G, n, c): L fits of G groups, each as one fit alone."""
    fits, groups, n, c = stacked.shape
    x = stacked.reshape(fits * groups, n, c)
    gen = torch.Generator(device=x.device).manual_seed(int(seed))
    centroids = _seed(x, k, gen, copies=fits)
    histories: list[list[float]] = [[] for _ in range(fits)]
    running = list(range(fits))  # the fits still iterating (a fit alone would not have stopped yet)
    assign = torch.empty(fits * groups, n, dtype=torch.long, device=x.device)
    dist = torch.empty(fits * groups, n, dtype=x.dtype, device=x.device)
    # Only the groups whose centroids can still move are computed: ``live`` (their data ``xs`` and
    # centroids ``books``); ``settled`` marks centroids that are the means of their group's current
    # assignment, none re-seeded. A fit stops (its groups leave ``live``) when no assignment of it
    # changed, as it would alone.
    live = torch.arange(fits * groups, device=x.device)
    settled = torch.zeros(fits * groups, dtype=torch.bool, device=x.device)
    xs, books = x, centroids
    for step in range(iters + 1):
        found = nearest_centroids(xs, books)
        near = _sq_dist(xs, books, found)
        same = None if step == 0 else (found == assign[live]).all(1)
        assign[live], dist[live] = found, near
        totals = _fit_totals(dist, fits).tolist()  # one read, all fits
        for f in running:
            histories[f].append(totals[f] / (n * groups))
        if step == iters:
            break
        if same is not None:
            changed = set((live[~same] // groups).tolist())
            stopped = [f for f in running if f not in changed]
            if stopped:
                running = [f for f in running if f in changed]
                if not running:
                    break
                keep = torch.isin(live // groups, torch.tensor(stopped, device=x.device), invert=True)
                live, xs, found, near, same = live[keep], xs[keep], found[keep], near[keep], same[keep]
            # unchanged and settled: a fixed point, Lloyd keeps these centroids for ever
            moving = ~(same & settled[live])
            live, xs, found, near = live[moving], xs[moving], found[moving], near[moving]
        count = len(live)
        sums = torch.zeros(count, k, c, dtype=x.dtype, device=x.device)
        sums.scatter_add_(1, found[..., None].expand(count, n, c), xs)
        counts = torch.zeros(count, k, dtype=x.dtype, device=x.device)
        counts.scatter_add_(1, found, torch.ones_like(near))
        means = sums / counts.clamp_min(1)[..., None]
        empty = counts == 0
        if bool(empty.any()):  # re-seed each empty cluster at a distinct far sample of its group
            far = near.topk(min(k, n), dim=1).indices  # (live groups, min(k, n))
            rank = (empty.cumsum(1) - 1).clamp(0, far.shape[1] - 1)
            rows = far.gather(1, rank)
            reseeded = xs.gather(1, rows[..., None].expand(count, k, c))
            means = torch.where(empty[..., None], reseeded, means)
        settled[live] = ~empty.any(1)
        centroids[live] = books = means
    shaped = centroids.reshape(fits, groups, k, c)
    return [Codebooks(shaped[f].clone(), tuple(histories[f])) for f in range(fits)]


#: :func:`_fit_totals` sums distances in blocks of at most this many (torch splits one sum between
#: threads only from 32768 elements on: a shorter block is always summed in the same order).
SUM_BLOCK = 8192


def _fit_totals(dist: torch.Tensor, fits: int) -> torch.Tensor:
    """The float64 sum of each fit's distances (``dist``: fits·G rows): each row in blocks of
    :data:`SUM_BLOCK`, then the blocks, then the groups of a fit. A fit's total then has the same
    rounding stacked with others or alone (one long sum, as ``dist.reshape(fits, -1).sum(1)`` makes of
    a fit alone, is split between threads; several are not).

    >>> _fit_totals(torch.ones(4, 10_000), 2).tolist()
    [20000.0, 20000.0]
    """
    rows, n = dist.shape
    blocks = -(-n // SUM_BLOCK)
    if blocks > 1:  # zero padding adds nothing, exactly
        dist = torch.nn.functional.pad(dist, (0, blocks * SUM_BLOCK - n)).reshape(rows, blocks, SUM_BLOCK)
    per_row = dist.sum(-1, dtype=torch.float64)
    if blocks > 1:
        per_row = per_row.sum(-1)
    return per_row.reshape(fits, rows // fits).sum(1)


def check_enough_samples(n: int, b: int, spec: str, where: str = "") -> None:
    """Refuse a k-means of ``2**b`` centroids on fewer than ``2**b`` samples (it cannot be trusted: some
    centroids would be copies of single samples, or left empty)."""
    need = 2**b
    if n < need:
        raise MissingStatisticsError(
            f"{spec}{where}: fitting 2**{b} = {need} centroids needs at least {need} calibration samples, "
            f"got {n}; capture with samples={need} or more (and at least {need} tokens), or use fewer bits"
        )
