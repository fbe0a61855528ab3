"""How a batch of token rows is folded into float64 moments, for ``N`` streams of one shape at once.

:class:`StackedMoments` holds the accumulators of ``N`` streams of ``C`` channels (the keys and values
of several layers) stacked: ``mean`` (N, C), ``m2`` (N, C, C) and ``norm_gram`` (N, 2, C, C).
:meth:`StackedMoments.fold` folds one batch of ``n`` rows of every stream, given as one (N, n, C)
tensor, in a few calls over all streams at once, in buffers it reuses from batch to batch
(:class:`FoldWork`). :meth:`Moments.update <headwidget.moments.Moments.update>` is the fold of one
stream; :class:`~headwidget.moments.MomentStack` gives each stream of a stack as a ``Moments``.

The arithmetic: each batch is centred on its float64 mean rounded to the rows' dtype, its Gram formed
and added straight into the float64 accumulators, and the batch merged with Chan et al.'s pairwise
update. A Gram is formed by block rows (:func:`gram_blocks`): the upper triangle's blocks of rows
``[s, e)`` and columns ``[s, C)``, the lower triangle added as their transpose (from 128 channels on,
0.52 to 0.63 of the products of the full square: the more blocks, the fewer products, while each
block row stays a large product).

Two ways to form the Gram blocks (:class:`GramMode`):

- ``"exact"``: products in the rows' own dtype (float32, or float64 for a float64 model), as on the CPU.
  A float32 Gram of at least :data:`ONEDNN_CHANNELS` channels on the CPU (the joint Gram of many cross
  layers) is formed by oneDNN's matmul where PyTorch has it (:func:`onednn_linear`), which uses the
  widest vector units of CPUs whose BLAS does not (2× MKL's speed on an AVX-512 AMD EPYC). Its rows are
  copied transposed, in chunks of :data:`ONEDNN_CHUNK` tokens, and each chunk's products are added to
  the block's in float32 as oneDNN forms them (:func:`add_gram_onednn`): a product over all of a batch's
  tokens in one call sums them in a longer float32 chain than MKL does, and its rounding was 2–3× MKL's;
  in chunks of 128 tokens the correlations' mean error is 0.85× MKL's (stress data of 512 and 1,024
  channels). Each block row is formed by tiles of :data:`ONEDNN_TILE` columns that stay in cache while
  the chunks are summed into them: a fold of 2,048 rows of 5,760 channels took 0.63× MKL's time.
- ``"split"``: products on a GPU's tensor cores. The centred rows ``r = x − s`` (``s``: the batch mean
  rounded to float32, ``r`` formed in float32) are split into two bfloat16 parts, ``hi = bf16(r)`` and
  ``lo = bf16(r − hi)``, which hold ``r`` to about 2⁻¹⁷ of its size, and the co-moment is
  ``hiᵀhi + loᵀhi + hiᵀlo`` (``loᵀlo``, about 2⁻¹⁸ of it, left out). A bfloat16 × bfloat16 product is
  exact in float32, and each product is accumulated in float32 (:func:`bf16_products`; on CUDA
  ``torch.baddbmm(..., out_dtype=torch.float32)`` with reduced-precision reductions turned off). The
  per-head-normalised rows, of unit length per head, are centred on their float32 mean and enter their
  Gram as one bfloat16 part (the rounding is then relative to how much they vary, not to their size).
  :func:`bf16_products` computes the same products anywhere: off CUDA it multiplies the bfloat16
  parts as float32, which is exact, so the split's accuracy is tested on the CPU.

Example:
    >>> import torch
    >>> rows = torch.randn(2, 100, 8, dtype=torch.float64) + 50  # two streams, 100 rows of 8 channels
    >>> stack = StackedMoments.empty(2, 8, head_dim=4)
    >>> work = FoldWork.make(entries=2, rows=100, channels=8, head_dim=4, dtype=torch.float32)
    >>> flags = stack.fold(rows.float(), split_a=40, work=work)
    >>> covariance = stack.m2[1] / (stack.count - 1)
    >>> bool(torch.allclose(covariance, torch.cov(rows[1].T), atol=1e-5)), flags.tolist()
    (True, [[True, True], [True, True]])
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import torch

__all__ = [
    "F64",
    "ONEDNN_CHANNELS",
    "ONEDNN_CHUNK",
    "ONEDNN_TILE",
    "Allocate",
    "FoldWork",
    "GramMode",
    "StackedMoments",
    "add_gram_onednn",
    "bf16_products",
    "gram_blocks",
    "onednn_linear",
    "safe_diagonal",
    "split_bf16",
]

F64 = torch.float64

#: How the Gram blocks are formed: in the rows' own dtype, or from bfloat16 parts on tensor cores.
GramMode = Literal["exact", "split"]

#: ``product(out, a, b, accumulate)``: ``out = a @ b`` (``out += a @ b`` with ``accumulate``), batched.
Product = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], None]

#: ``allocate(shape, dtype, device)``: an uninitialised tensor (default: ``torch.empty``); a caller may
#: hand out views of one block it allocated for many buffers.
Allocate = Callable[[tuple[int, ...], torch.dtype, torch.device], torch.Tensor]


def safe_diagonal(dtype: torch.dtype) -> float:
    """A Gram of this dtype whose diagonal stays below this bound has no overflow anywhere: every
    partial sum of ``Σ x_i x_j`` is bounded by ``max(Σ x_i², Σ x_j²)`` (Cauchy–Schwarz), and the bound is
    half the dtype's largest value, which leaves room for rounding."""
    return torch.finfo(dtype).max / 2


def _empty(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(shape, dtype=dtype, device=device)


def gram_blocks(channels: int) -> list[tuple[int, int]]:
    """The row blocks ``[s, e)`` a Gram of ``channels`` channels is formed by (see the module docstring).

    One block below 128 channels; from 128 on, ``min(channels // 32, max(8, channels // 256))`` blocks
    of equal width: up to 8 of at least 32 channels, and one per 256 channels beyond 2048 (the joint
    Gram of many cross layers: 22 blocks of 262 channels for 5,760, 0.52 of the square's products
    instead of 0.56 with 8).

    >>> gram_blocks(64), gram_blocks(192)
    ([(0, 64)], [(0, 32), (32, 64), (64, 96), (96, 128), (128, 160), (160, 192)])
    >>> len(gram_blocks(2048)), len(gram_blocks(4096)), len(gram_blocks(5760))
    (8, 16, 22)
    """
    count = 1 if channels < 128 else min(channels // 32, max(8, channels // 256))
    width = -(-channels // count)
    return [(start, min(start + width, channels)) for start in range(0, channels, width)]


def split_bf16(r: torch.Tensor, hi: torch.Tensor, lo: torch.Tensor) -> None:
    """Split float32 ``r`` into bfloat16 ``hi = bf16(r)`` and ``lo = bf16(r − hi)``; ``r`` is overwritten
    with ``r − hi``.

    ``r − hi`` is exact in float32, so ``hi + lo`` equals ``r`` to within half a bfloat16 step of
    ``lo``: about 2⁻¹⁷ of ``|r|``.

    >>> r = torch.tensor([1.0 + 2**-10 + 2**-20, -3.0e-3])
    >>> hi, lo = torch.empty(2, dtype=torch.bfloat16), torch.empty(2, dtype=torch.bfloat16)
    >>> split_bf16(r.clone(), hi, lo)
    >>> hi.tolist(), bool(((hi.float() + lo.float() - r).abs() <= 2**-17 * r.abs()).all())
    ([1.0, -0.0030059814453125], True)
    """
    hi.copy_(r)
    r.sub_(hi)
    lo.copy_(r)


def bf16_products(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, accumulate: bool) -> None:
    """``out (+)= a @ b`` for bfloat16 ``a`` (N, m, k) and ``b`` (N, k, p) into float32 ``out``: every
    product exact, accumulated in float32.

    On CUDA the tensor cores do it (``torch.baddbmm(..., out_dtype=torch.float32)``, PyTorch ≥ 2.8; run
    it with ``torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction`` off, as
    :meth:`MomentStack.fold` does). Elsewhere the same products are formed from the parts upcast to
    float32, which is exact (8 + 8 significant bits fit in float32's 24), and summed in float32.

    >>> a = torch.tensor([[[1.0 + 2**-7, 3.0]]], dtype=torch.bfloat16)
    >>> b = torch.tensor([[[1.0 + 2**-7], [2**-9]]], dtype=torch.bfloat16)
    >>> out = torch.zeros(1, 1, 1)
    >>> bf16_products(out, a, b, accumulate=False); out.item() == (1 + 2**-7) ** 2 + 3 * 2**-9
    True
    """
    if a.device.type == "cuda":
        if accumulate:
            torch.baddbmm(out, a, b, out_dtype=torch.float32, out=out)
        else:
            torch.bmm(a, b, out_dtype=torch.float32, out=out)
        return
    if accumulate:
        torch.baddbmm(out, a.float(), b.float(), out=out)
    else:
        torch.bmm(a.float(), b.float(), out=out)


#: The fewest channels whose float32 Gram on the CPU is formed by oneDNN (module docstring): below
#: that, the batched BLAS products of many small Grams at once (at 1,024 channels oneDNN's chunked
#: products were still slower than MKL's; at 2,048 and 5,760 channels faster).
ONEDNN_CHANNELS = 2048
#: Tokens per chunk of the oneDNN route: each chunk's products are summed in one float32 chain.
ONEDNN_CHUNK = 128
#: Columns per tile of a block row on the oneDNN route: a tile (block width × 720 float32, 0.75 MB
#: for SmolLM2's 5,760 cross channels) stays in cache while its chunks are summed into it (1.8× the
#: speed of whole block rows).
ONEDNN_TILE = 720


@functools.cache
def _onednn_op() -> Any:
    try:
        return torch.ops.mkldnn._linear_pointwise if torch.backends.mkldnn.is_available() else None
    except (AttributeError, RuntimeError):  # a build without the op
        return None


def onednn_linear() -> Any:
    """oneDNN's float32 matmul, ``op(x, w, None, "none", [], "") = x @ wᵀ``, where this PyTorch has it
    and float32 matmuls are to be exact (``torch.get_float32_matmul_precision() == "highest"``: oneDNN would
    otherwise form them from bfloat16 or TF32 parts); else None.

    >>> op = onednn_linear()
    >>> x = torch.tensor([[1.0, 2.0], [3.0, 4.0]])
    >>> op is None or op(x, x, None, "none", [], "").tolist() == [[5.0, 11.0], [11.0, 25.0]]
    True
    """
    if torch.get_float32_matmul_precision() != "highest":
        return None
    matmul = getattr(torch.backends.mkldnn, "matmul", None)
    if getattr(matmul, "fp32_precision", "none") not in ("none", "ieee"):
        return None
    return _onednn_op()


def _uses_onednn(rows: torch.Tensor) -> bool:
    return (
        rows.device.type == "cpu"
        and rows.dtype == torch.float32
        and int(rows.shape[-1]) >= ONEDNN_CHANNELS
        and onednn_linear() is not None
    )


def add_gram_onednn(
    acc: torch.Tensor,
    rows: torch.Tensor,
    buffer: torch.Tensor,
    shift: torch.Tensor | None = None,
    track: bool = True,
) -> torch.Tensor | None:
    """:func:`_add_gram` of ``rows − shift`` by oneDNN (module docstring): ``Σ (x − s)(x − s)ᵀ`` over the
    ``n`` rows of each stream of float32 ``rows`` (N, n, C) added into ``acc`` (N, C, C, float64), by the
    block rows of :func:`gram_blocks`; ``shift`` (N, C) or None (no centring); ``buffer``: at least
    N × n × C float32 for the rows transposed in chunks of :data:`ONEDNN_CHUNK` tokens. Returns the
    largest diagonal entry of the sum per stream in float64 (None unless ``track``).

    >>> x = torch.arange(12.0).reshape(1, 3, 4)
    >>> acc = torch.zeros(1, 4, 4, dtype=torch.float64)
    >>> onednn_linear() is None or add_gram_onednn(acc, x, torch.empty(12)).tolist() == [179.0]
    True
    >>> onednn_linear() is None or bool(torch.equal(acc[0], (x[0].T @ x[0]).double()))
    True
    """
    op = onednn_linear()
    assert op is not None
    entries, n, c = (int(d) for d in rows.shape)
    chunks = [(start, min(start + ONEDNN_CHUNK, n)) for start in range(0, n, ONEDNN_CHUNK)]
    largest = torch.empty(entries, dtype=F64, device=acc.device)
    for i in range(entries):
        parts = []  # each chunk's rows transposed, (C, tokens), contiguous
        for start, stop in chunks:
            part = buffer[c * start : c * stop].view(c, stop - start)
            if shift is None:
                part.copy_(rows[i, start:stop].T)
            else:
                torch.sub(rows[i, start:stop].T, shift[i].unsqueeze(1), out=part)
            parts.append(part)
        diagonal = []
        for start, stop in gram_blocks(c):
            width = stop - start
            # the block row by tiles of columns, each summed over the chunks while it is in cache
            for first in range(start, c, max(ONEDNN_TILE, width)):
                last = min(c, first + max(ONEDNN_TILE, width))
                tile = op(parts[0][start:stop], parts[0][first:last], None, "none", [], "")
                for part in parts[1:]:
                    tile.add_(op(part[start:stop], part[first:last], None, "none", [], ""))
                acc[i, start:stop, first:last].add_(tile)
                below = max(first, stop)  # the tile's columns past the diagonal block, mirrored
                if below < last:
                    acc[i, below:last, start:stop].add_(tile[:, below - first :].T.contiguous())
                if track and first == start:
                    diagonal.append(torch.diagonal(tile[:, :width]).amax())
        if track:
            largest[i] = torch.stack(diagonal).amax()
    return largest if track else None


def _same_dtype_products(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, accumulate: bool) -> None:
    if accumulate:
        torch.baddbmm(out, a, b, out=out)
    else:
        torch.bmm(a, b, out=out)


def _add_gram(
    acc: torch.Tensor,
    pairs: Sequence[tuple[torch.Tensor, torch.Tensor]],
    buffer: torch.Tensor,
    product: Product,
    track: bool = True,
) -> torch.Tensor | None:
    """Add ``Σ aᵀb`` over ``pairs`` (each (N, n, C)) into ``acc`` (N, C, C, float64) by the block rows of
    :func:`gram_blocks`, each formed in ``buffer`` (1-D, at least N × first block's width × C); return
    the largest diagonal entry of the sum per stream, in float64 (None unless ``track``).

    >>> x = torch.arange(12.0).reshape(1, 3, 4)
    >>> acc = torch.zeros(1, 4, 4, dtype=torch.float64)
    >>> _add_gram(acc, [(x, x)], torch.empty(16), _same_dtype_products).tolist()
    [179.0]
    >>> bool(torch.equal(acc[0], (x[0].T @ x[0]).double()))
    True
    """
    entries, c = int(acc.shape[0]), int(acc.shape[-1])
    largest = []
    for start, stop in gram_blocks(c):
        width = stop - start
        block = buffer[: entries * width * (c - start)].view(entries, width, c - start)
        for i, (a, b) in enumerate(pairs):
            product(block, a[:, :, start:stop].mT, b[:, :, start:], i > 0)
        acc[:, start:stop, start:].add_(block)
        if stop < c:
            acc[:, stop:, start:stop].add_(block[:, :, width:].mT)
        if track:
            largest.append(torch.diagonal(block[:, :, :width], dim1=1, dim2=2).amax(1, keepdim=True))
    return torch.cat(largest, 1).amax(1).to(F64) if track else None


@dataclass
class FoldWork:
    """The buffers :meth:`MomentStack.fold` reuses from batch to batch, for up to ``rows`` rows.

    ``mode`` says how the Gram blocks are formed (:data:`GramMode`). ``exact`` keeps the centred rows
    (``centred``, the rows' dtype) and, for rows narrower than float64, one stream's rows in float64
    (``wide``, for the exact float64 means); ``split`` keeps the float32 centred rows and their two
    bfloat16 parts (``residual``, ``hi``, ``lo``). Both keep the per-head norms (``norms``) and one
    block row of Gram products (``products``, float32 or float64).
    """

    mode: GramMode
    dtype: torch.dtype
    entries: int
    rows: int
    products: torch.Tensor
    norms: torch.Tensor | None = None
    centred: torch.Tensor | None = None
    wide: torch.Tensor | None = None
    residual: torch.Tensor | None = None
    hi: torch.Tensor | None = None
    lo: torch.Tensor | None = None

    @classmethod
    def make(
        cls,
        entries: int,
        rows: int,
        channels: int,
        head_dim: int | None,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        mode: GramMode = "exact",
        allocate: Allocate = _empty,
    ) -> FoldWork:
        """Buffers for folding up to ``rows`` rows of ``dtype`` into stacks of up to ``entries`` streams
        of ``channels`` channels (heads of ``head_dim``) on ``device``."""
        n, c, where = entries, channels, torch.device(device)
        first, last = gram_blocks(c)[0]
        product_dtype = torch.float32 if mode == "split" else dtype
        work = cls(mode, dtype, n, rows, allocate((n * (last - first) * c,), product_dtype, where))
        if head_dim is not None:
            work.norms = allocate((n, rows, c // head_dim, 1), product_dtype, where)
        if mode == "split":
            work.residual = allocate((n, rows, c), torch.float32, where)
            work.hi = allocate((n, rows, c), torch.bfloat16, where)
            work.lo = allocate((n, rows, c), torch.bfloat16, where)
        else:
            work.centred = allocate((n, rows, c), dtype, where)
            if dtype != F64:
                work.wide = allocate((rows, c), F64, where)
        return work

    @staticmethod
    def nbytes(
        entries: int, rows: int, channels: int, head_dim: int | None, element: int, mode: GramMode = "exact"
    ) -> int:
        """Bytes :meth:`make` allocates for ``entries`` streams, ``rows`` rows of ``element``-byte values.

        >>> FoldWork.nbytes(2, rows=100, channels=8, head_dim=4, element=4)
        14912
        """
        first, last = gram_blocks(channels)[0]
        vectors = entries * rows * channels
        product = 4 if mode == "split" else element
        total = entries * (last - first) * channels * product
        if head_dim is not None:
            total += entries * rows * (channels // head_dim) * product
        if mode == "split":
            return total + 8 * vectors
        return total + element * vectors + (8 * rows * channels if element != 8 else 0)


@dataclass
class StackedMoments:
    """The float64 accumulators of ``entries`` streams of ``channels``-wide vectors (see the module
    docstring): ``mean`` (N, C), ``m2`` (N, C, C) and, with ``head_dim``, ``norm_gram`` (N, 2, C, C); one
    token ``count`` and ``split_count`` for all (every stream sees the same tokens)."""

    mean: torch.Tensor
    m2: torch.Tensor
    norm_gram: torch.Tensor | None
    head_dim: int | None
    count: int = 0
    split_count: tuple[int, int] = (0, 0)

    @classmethod
    def empty(
        cls,
        entries: int,
        channels: int,
        *,
        head_dim: int | None = None,
        device: torch.device | str = "cpu",
        allocate: Allocate = _empty,
    ) -> StackedMoments:
        """Zero accumulators for ``entries`` streams, in one allocation."""
        if head_dim is not None and channels % head_dim:
            raise ValueError(f"{channels} channels do not split into heads of {head_dim}")
        n, c = entries, channels
        sizes = [n * c, n * c * c] + ([2 * n * c * c] if head_dim is not None else [])
        storage = allocate((sum(sizes),), F64, torch.device(device)).zero_()
        parts = storage.split(sizes)
        gram = parts[2].view(n, 2, c, c) if head_dim is not None else None
        return cls(parts[0].view(n, c), parts[1].view(n, c, c), gram, head_dim)

    @staticmethod
    def nbytes(entries: int, channels: int, head_dim: int | None) -> int:
        """Bytes of the float64 accumulators of ``entries`` streams."""
        mats = 1 + (2 if head_dim is not None else 0)
        return 8 * entries * (channels + mats * channels * channels)

    @property
    def entries(self) -> int:
        return int(self.mean.shape[0])

    @property
    def channels(self) -> int:
        return int(self.mean.shape[1])

    @property
    def device(self) -> torch.device:
        return self.mean.device

    # ------------------------------------------------------------------ folding
    def fold(self, rows: torch.Tensor, split_a: int, work: FoldWork) -> torch.Tensor | None:
        """Fold in one batch: ``rows`` (N, n, C), row ``t`` of entry ``i`` a token vector of stream ``i``;
        rows ``[:split_a]`` belong to token split A, the rest to B. ``rows`` is overwritten.

        Returns (N, 2) bool flags, on the stack's device, per stream (reading them waits for the device):
        whether the batch's mean is finite, and whether what it adds to the co-moment and the
        normalised Grams is finite (the diagonal of its centred Gram below half the largest value of the
        products' dtype, so that no entry can overflow, and finite per-head norms). None for no rows.
        """
        n = int(rows.shape[1])
        if n == 0:
            return None
        if n > work.rows or self.entries > work.entries:
            raise ValueError(
                f"{self.entries} × {n} rows do not fit the fold's buffers of {work.entries} × {work.rows}"
            )
        restore = None
        if work.mode == "split" and rows.device.type == "cuda":
            restore = torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
            torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = False
        try:
            if work.mode == "split":
                mean, delta, largest = self._comoment_split(rows, work)
            else:
                mean, delta, largest = self._comoment_exact(rows, work)
            finite_norms = self._normalised_grams(rows, split_a, work)
        finally:
            if restore is not None:
                torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = restore
        self.merge_mean(n, mean, delta)
        if self.norm_gram is not None:
            self.split_count = (self.split_count[0] + split_a, self.split_count[1] + n - split_a)
        products = work.products.dtype
        second = largest < safe_diagonal(products)
        if finite_norms is not None:
            second &= finite_norms
        return torch.stack([torch.isfinite(mean).all(1), second], 1)

    def _comoment_exact(
        self, rows: torch.Tensor, work: FoldWork
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Add the centred Gram of ``rows`` in their own dtype; return the batch mean, its rounding
        ``mean − shift`` and the largest diagonal entry of the centred Gram, per stream."""
        n = int(rows.shape[1])
        if rows.dtype == F64:
            sums = rows.sum(1)
        else:
            assert work.wide is not None
            sums = torch.empty_like(self.mean)
            wide = work.wide[:n]
            for i in range(self.entries):  # float64 sums without a float64 copy of every stream at once
                wide.copy_(rows[i])
                torch.sum(wide, 0, out=sums[i])
        mean = sums / n
        shift = mean.to(rows.dtype)
        assert work.centred is not None
        if _uses_onednn(rows):
            largest = add_gram_onednn(self.m2, rows, work.centred.view(-1), shift)
        else:
            centred = work.centred[: self.entries, :n]
            torch.sub(rows, shift.unsqueeze(1), out=centred)
            largest = _add_gram(self.m2, [(centred, centred)], work.products, _same_dtype_products)
        assert largest is not None
        return mean, mean - shift.to(F64), largest

    def _comoment_split(
        self, rows: torch.Tensor, work: FoldWork
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """:meth:`_comoment_exact` from two bfloat16 parts of the float32 centred rows."""
        n = int(rows.shape[1])
        assert work.residual is not None and work.hi is not None and work.lo is not None
        shift = rows.sum(1, dtype=torch.float32).div_(n)
        residual = work.residual[: self.entries, :n]
        torch.sub(rows, shift.unsqueeze(1), out=residual)
        # the batch mean from the centred rows' float32 sums, which are small: about 2⁻²⁴ σ/√n off
        shift64 = shift.to(F64)
        mean = shift64 + residual.sum(1).to(F64) / n
        hi, lo = work.hi[: self.entries, :n], work.lo[: self.entries, :n]
        split_bf16(residual, hi, lo)
        largest = _add_gram(self.m2, [(hi, hi), (lo, hi), (hi, lo)], work.products, bf16_products)
        assert largest is not None
        return mean, mean - shift64, largest

    def _normalised_grams(self, rows: torch.Tensor, split_a: int, work: FoldWork) -> torch.Tensor | None:
        """Add the Grams of the per-head-normalised rows of both token splits; return whether each
        stream's per-head norms were finite (None without heads)."""
        if self.norm_gram is None or self.head_dim is None:
            return None
        n, c = int(rows.shape[1]), self.channels
        heads = c // self.head_dim
        assert work.norms is not None
        norms = work.norms[: self.entries, :n]
        grouped = rows.view(self.entries, n, heads, self.head_dim)
        torch.linalg.vector_norm(grouped, dim=-1, keepdim=True, dtype=norms.dtype, out=norms)
        finite = torch.isfinite(norms).flatten(1).all(1)
        norms.masked_fill_(norms == 0, 1.0)  # a zero head stays zero
        splits = [
            (i, start, stop) for i, (start, stop) in enumerate(((0, split_a), (split_a, n))) if stop > start
        ]
        if work.mode == "split":
            assert work.residual is not None and work.hi is not None
            unit = work.residual[: self.entries, :n]
            torch.div(grouped, norms, out=unit.view(self.entries, n, heads, self.head_dim))
            for split, start, stop in splits:
                part = work.hi[: self.entries, start:stop]
                self._add_centred_unit_gram(split, unit[:, start:stop], part, work)
        else:
            grouped.div_(norms)
            onednn = _uses_onednn(rows)
            for split, start, stop in splits:
                part = rows[:, start:stop]
                if onednn:
                    assert work.centred is not None
                    add_gram_onednn(self.norm_gram[:, split], part, work.centred.view(-1), track=False)
                    continue
                _add_gram(
                    self.norm_gram[:, split], [(part, part)], work.products, _same_dtype_products, False
                )
        return finite

    def _add_centred_unit_gram(
        self, split: int, unit: torch.Tensor, part: torch.Tensor, work: FoldWork
    ) -> None:
        """Add ``Σ x̂x̂ᵀ`` of the float32 unit rows ``unit`` (N, k, C; overwritten) to split ``split``'s
        normalised Gram, from one bfloat16 part of the rows centred on their float32 mean ``m``:
        ``Σ x̂x̂ᵀ = Σ uuᵀ + m·sᵀ + s·mᵀ + k·m·mᵀ`` with ``u = x̂ − m`` and ``s = Σ u``. Centred, the
        bfloat16 rounding is relative to how much the rows vary, not to their size."""
        assert self.norm_gram is not None
        k = int(unit.shape[1])
        mean = unit.sum(1).div_(k)
        unit.sub_(mean.unsqueeze(1))
        sums = unit.sum(1).to(F64)
        part.copy_(unit)
        _add_gram(self.norm_gram[:, split], [(part, part)], work.products, bf16_products, False)
        m = mean.to(F64)
        left = torch.stack([m, sums, m * k], 2)
        self.norm_gram[:, split].baddbmm_(left, torch.stack([sums, m, m], 1))

    def merge_mean(self, n: int, mean: torch.Tensor, delta: torch.Tensor | None = None) -> None:
        """Fold in the means (N, C) of ``n`` more rows per stream whose centred co-moment is already in
        ``m2``: the running means, the counts and Chan et al.'s between-means term. With ``delta``, the
        rows' Gram in ``m2`` was taken about ``mean − delta``, and ``n·delta·deltaᵀ`` comes off."""
        total = self.count + n
        between = mean - self.mean
        weight = self.count * n / total
        if delta is None:
            if weight:
                self.m2.baddbmm_(between.unsqueeze(2), between.unsqueeze(1), alpha=weight)
        else:  # m2 += weight·between·betweenᵀ − n·delta·deltaᵀ: one rank-2 update per stream
            left = torch.stack([between * weight, delta * -n], 2)
            self.m2.baddbmm_(left, torch.stack([between, delta], 1))
        self.mean.add_(between, alpha=n / total)
        self.count = total
