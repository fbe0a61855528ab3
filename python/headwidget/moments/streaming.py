"""Streaming, mergeable first and second moments of token vectors.

A :class:`Moments` holds, for token vectors ``x ∈ R^C`` seen so far:

- ``count``: the number of tokens ``n``;
- ``mean``: the channel means (C,), float64;
- ``m2``: the centred co-moment ``Σ_t (x_t − mean)(x_t − mean)^T`` (C×C), float64;
- optionally ``norm_gram``: for vectors made of heads of ``head_dim`` channels, the Gram of the
  per-head-normalised vectors ``Σ_t x̂_t x̂_t^T`` (each head's slice scaled to unit length), kept for
  two disjoint token splits (2×C×C) so that alignments can be fitted on one split and scored on the other.

Each batch is reduced on the device it lives on: the batch is centred on its own mean, its Gram is
formed in float32 (by block rows of its upper triangle; see :mod:`headwidget.moments.folding`, which
folds many moments of one shape together), and the result is merged into the float64 totals with
Chan et al.'s pairwise update.
That keeps correlations accurate to about 1e-8 even for activations with large means, where the naive
``E[xx^T] − E[x]E[x]^T`` in float32 loses most of its digits.

Example:
    >>> import torch
    >>> x = torch.randn(1000, 8, dtype=torch.float64) * 3 + 100
    >>> m = Moments.empty(8, head_dim=4)
    >>> m.update(x[:600].float(), split_a=300); m.update(x[600:].float(), split_a=200)
    >>> bool(torch.allclose(m.covariance(), torch.cov(x.T), atol=1e-4))
    True
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from headwidget.moments.folding import F64, FoldWork, StackedMoments

__all__ = ["Moments", "normalise_heads"]


def normalise_heads(x: torch.Tensor, head_dim: int) -> torch.Tensor:
    """Scale each head's ``head_dim`` slice of every row of ``x`` (n, C) to unit length.

    A head whose slice is exactly zero stays zero (its cosine with anything is taken as 0).

    >>> normalise_heads(torch.tensor([[3.0, 4.0, 0.0, 0.0]]), 2)
    tensor([[0.6000, 0.8000, 0.0000, 0.0000]])
    """
    return _normalise_heads(x, head_dim)[0]


def _normalise_heads(x: torch.Tensor, head_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The normalised rows and the per-head norms (n, heads, 1) they were divided by."""
    n, c = x.shape
    heads = x.reshape(n, c // head_dim, head_dim)
    norms = torch.linalg.vector_norm(heads, dim=-1, keepdim=True)
    scaled = heads / torch.where(norms > 0, norms, torch.ones_like(norms))
    return scaled.reshape(n, c), norms


def _own_cpu_copy(t: torch.Tensor) -> torch.Tensor:
    """``t`` on the CPU, contiguous, in storage of its own (accumulators of a capture are views of one
    stacked tensor, which a file writer would see as shared).

    >>> stacked = torch.zeros(2, 3)
    >>> _own_cpu_copy(stacked[1]).untyped_storage().nbytes()
    12
    """
    t = t.detach().cpu().contiguous()
    shared = t.storage_offset() or t.untyped_storage().nbytes() != t.numel() * t.element_size()
    return t.clone() if shared else t


@dataclass
class Moments:
    """Float64 streaming moments of C-dimensional token vectors (see the module docstring)."""

    count: int
    mean: torch.Tensor
    m2: torch.Tensor
    head_dim: int | None = None
    norm_gram: torch.Tensor | None = None
    split_count: tuple[int, int] = (0, 0)

    # ------------------------------------------------------------------ construction
    @classmethod
    def empty(
        cls, channels: int, *, head_dim: int | None = None, device: torch.device | str = "cpu"
    ) -> Moments:
        """Zero moments for ``channels``-wide vectors; ``head_dim`` enables the normalised Gram."""
        if head_dim is not None and channels % head_dim:
            raise ValueError(f"{channels} channels do not split into heads of {head_dim}")
        gram = None
        if head_dim is not None:
            gram = torch.zeros(2, channels, channels, dtype=F64, device=device)
        return cls(
            count=0,
            mean=torch.zeros(channels, dtype=F64, device=device),
            m2=torch.zeros(channels, channels, dtype=F64, device=device),
            head_dim=head_dim,
            norm_gram=gram,
        )

    @property
    def channels(self) -> int:
        return int(self.mean.shape[0])

    @property
    def num_heads(self) -> int:
        """Heads of ``head_dim`` channels (1 when the vectors are not split into heads)."""
        return self.channels // self.head_dim if self.head_dim else 1

    @staticmethod
    def nbytes(channels: int, head_dim: int | None) -> int:
        """Bytes the float64 accumulators of this shape occupy."""
        return StackedMoments.nbytes(1, channels, head_dim)

    # ------------------------------------------------------------------ streaming update
    def update(self, x: torch.Tensor, split_a: int, *, checks: list[torch.Tensor] | None = None) -> None:
        """Fold in the rows of ``x`` (n, C); rows ``[:split_a]`` belong to token split A, the rest to B.

        ``x`` should be float32 (or wider) on the same device as the accumulators.

        With ``checks`` (a list), a (2,) bool tensor on that device is appended to it: whether this
        batch's mean is finite, and whether what it adds to the co-moment and to the normalised Grams
        is finite: the diagonal of its centred Gram stays below half the dtype's largest value (then
        no entry can overflow) and its per-head norms are finite. The second flag catches values so
        large that their float32 squares overflow (a co-moment of inf, or heads divided by an
        infinite norm down to 0). Reading a flag waits for the device, so callers collect the flags of many
        updates and read them together.

        >>> m, checks = Moments.empty(2, head_dim=2), []
        >>> m.update(torch.tensor([[1.0, 2.0], [3.0, 5.0]]), split_a=1, checks=checks)
        >>> m.update(torch.tensor([[1e20, 0.0], [-1e20, 0.0]]), split_a=1, checks=checks)
        >>> [c.tolist() for c in checks]
        [[True, True], [True, False]]
        """
        rows = x.to(F64 if x.dtype == F64 else torch.float32, copy=True).unsqueeze(0)
        stack = self._stacked()
        work = FoldWork.make(1, int(x.shape[0]), self.channels, self.head_dim, rows.dtype, x.device)
        flags = stack.fold(rows, split_a, work)
        self.count, self.split_count = stack.count, stack.split_count
        if checks is not None and flags is not None:
            checks.append(flags[0])

    def _stacked(self) -> StackedMoments:
        """These moments as a stack of one (views of their own tensors)."""
        gram = None if self.norm_gram is None else self.norm_gram.unsqueeze(0)
        mean, m2 = self.mean.unsqueeze(0), self.m2.unsqueeze(0)
        return StackedMoments(mean, m2, gram, self.head_dim, self.count, self.split_count)

    def _merge_comoment(self, n: int, mean: torch.Tensor, m2: torch.Tensor) -> None:
        """Merge moments of ``n`` rows given as their mean and centred co-moment."""
        self.m2.add_(m2)
        stack = self._stacked()
        stack.merge_mean(n, mean.unsqueeze(0))
        self.count = stack.count

    # ------------------------------------------------------------------ combination
    def merge(self, other: Moments) -> Moments:
        """A new :class:`Moments` equal to the moments of both token sets together."""
        if other.channels != self.channels or other.head_dim != self.head_dim:
            raise ValueError(
                f"cannot merge moments of {self.channels} channels (head_dim {self.head_dim}) with "
                f"{other.channels} channels (head_dim {other.head_dim})"
            )
        out = self.clone()
        if other.count:
            out._merge_comoment(other.count, other.mean.to(out.mean.device), other.m2.to(out.m2.device))
        if out.norm_gram is not None and other.norm_gram is not None:
            out.norm_gram.add_(other.norm_gram.to(out.norm_gram.device))
            out.split_count = (
                self.split_count[0] + other.split_count[0],
                self.split_count[1] + other.split_count[1],
            )
        return out

    def clone(self) -> Moments:
        return Moments(
            count=self.count,
            mean=self.mean.clone(),
            m2=self.m2.clone(),
            head_dim=self.head_dim,
            norm_gram=None if self.norm_gram is None else self.norm_gram.clone(),
            split_count=self.split_count,
        )

    def select(self, index: torch.Tensor) -> Moments:
        """The moments of a subset of channels (``index``: LongTensor of channel positions)."""
        index = index.to(self.mean.device)
        rows, cols = index[:, None], index[None, :]  # one gather: no (k, C) rows copied on the way
        gram = None
        if self.norm_gram is not None:
            gram = self.norm_gram[:, rows, cols]
        return Moments(
            count=self.count,
            mean=self.mean.index_select(0, index),
            m2=self.m2[rows, cols],
            head_dim=self.head_dim,
            norm_gram=gram,
            split_count=self.split_count,
        )

    def window(self, start: int, stop: int) -> Moments:
        """The moments of channels ``[start, stop)`` as views of these (nothing copied: never change
        them); equal to ``select(torch.arange(start, stop))``.

        >>> m = Moments.empty(6, head_dim=2)
        >>> m.update(torch.randn(50, 6, dtype=torch.float64), split_a=20)
        >>> w = m.window(2, 6)
        >>> bool(torch.equal(w.m2, m.select(torch.arange(2, 6)).m2)), w.m2.data_ptr() == m.m2[2, 2].data_ptr()
        (True, True)
        """
        if not 0 <= start < stop <= self.channels:
            raise ValueError(
                f"channels [{start}, {stop}) are not within the {self.channels} of these moments"
            )
        return Moments(
            count=self.count,
            mean=self.mean[start:stop],
            m2=self.m2[start:stop, start:stop],
            head_dim=self.head_dim,
            norm_gram=None if self.norm_gram is None else self.norm_gram[:, start:stop, start:stop],
            split_count=self.split_count,
        )

    def to(self, device: torch.device | str) -> Moments:
        """A copy of these moments on ``device``."""
        return Moments(
            count=self.count,
            mean=self.mean.to(device),
            m2=self.m2.to(device),
            head_dim=self.head_dim,
            norm_gram=None if self.norm_gram is None else self.norm_gram.to(device),
            split_count=self.split_count,
        )

    def all_reduce(self, group: object = None) -> None:
        """Sum these moments over the ranks of a ``torch.distributed`` process group, in place.

        Each rank shifts its co-moment to the global mean before the sum, which is the exact
        multi-way form of Chan's merge.
        """
        import torch.distributed as dist

        head = torch.tensor(
            [float(self.count), float(self.split_count[0]), float(self.split_count[1])],
            dtype=F64,
            device=self.mean.device,
        )
        dist.all_reduce(head, group=group)
        total = float(head[0])
        weighted = self.mean * self.count
        dist.all_reduce(weighted, group=group)
        global_mean = weighted / total if total else weighted
        shift = self.mean - global_mean
        self.m2.addr_(shift, shift, alpha=float(self.count))
        dist.all_reduce(self.m2, group=group)
        if self.norm_gram is not None:
            dist.all_reduce(self.norm_gram, group=group)
        self.mean.copy_(global_mean)
        self.count = round(total)
        self.split_count = (round(float(head[1])), round(float(head[2])))

    # ------------------------------------------------------------------ derived quantities
    def covariance(self) -> torch.Tensor:
        """Sample covariance (ddof=1, as ``np.cov``); NaN when fewer than two tokens were seen."""
        if self.count < 2:
            return torch.full_like(self.m2, float("nan"))
        return self.m2 / (self.count - 1)

    def gram(self) -> torch.Tensor:
        """The uncentred second moment ``Σ_t x_t x_t^T``."""
        return self.m2 + self.count * torch.outer(self.mean, self.mean)

    def token_gram(self, split: int | None = None) -> torch.Tensor:
        """``Σ_t x̂_t x̂_t^T`` of per-head-normalised vectors, for split 0, 1, or both (None)."""
        if self.norm_gram is None:
            raise ValueError("these moments were accumulated without per-head normalisation")
        return self.norm_gram.sum(0) if split is None else self.norm_gram[split]

    def split_tokens(self, split: int | None = None) -> int:
        return sum(self.split_count) if split is None else self.split_count[split]

    # ------------------------------------------------------------------ serialisation
    def to_tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """Flat ``name → tensor`` dict (CPU, contiguous) for safetensors."""
        out = {
            f"{prefix}.count": torch.tensor([self.count], dtype=torch.int64),
            f"{prefix}.mean": _own_cpu_copy(self.mean),
            f"{prefix}.m2": _own_cpu_copy(self.m2),
        }
        if self.norm_gram is not None:
            out[f"{prefix}.norm_gram"] = _own_cpu_copy(self.norm_gram)
            out[f"{prefix}.split_count"] = torch.tensor(self.split_count, dtype=torch.int64)
        return out

    @classmethod
    def from_tensors(cls, tensors: dict[str, torch.Tensor], prefix: str, head_dim: int | None) -> Moments:
        count = int(tensors[f"{prefix}.count"][0])
        mean = tensors[f"{prefix}.mean"]
        m2 = tensors[f"{prefix}.m2"]
        c = mean.shape[0]
        if mean.dtype != F64 or m2.dtype != F64 or tuple(m2.shape) != (c, c):
            raise ValueError(f"{prefix}: expected float64 mean (C,) and m2 (C, C)")
        gram = tensors.get(f"{prefix}.norm_gram")
        split = (0, 0)
        if gram is not None:
            if tuple(gram.shape) != (2, c, c):
                raise ValueError(f"{prefix}.norm_gram: expected shape (2, {c}, {c})")
            sc = tensors[f"{prefix}.split_count"]
            split = (int(sc[0]), int(sc[1]))
        return cls(count, mean, m2, head_dim if gram is not None else None, gram, split)
