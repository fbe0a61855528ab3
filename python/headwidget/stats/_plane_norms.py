"""Token sums of the 2-norm of every rotary pair of the queries and keys: partial RoPE's ranking.

For one layer with query heads ``h``, KV heads ``g`` and rotary planes ``m = (a, b)`` (the dim pairs of
:meth:`RopeLayout.planes <headwidget.core.layout.RopeLayout.planes>`, in that order), a
:class:`PlaneNorms` holds over the ``count`` captured tokens ``t``

- ``query[h, m] = Σ_t ‖(q_{t,h,a}, q_{t,h,b})‖`` (H, planes), float64;
- ``key[g, m] = Σ_t ‖(k_{t,g,a}, k_{t,g,b})‖`` (G, planes), float64;

of the queries and keys as the model rotates them (after any ``q_norm``/``k_norm``, before RoPE; a
2-D rotation leaves a pair's norm unchanged, so before and after RoPE give the same sums). Sums and
counts merge by addition, so a merge or an ``all_reduce`` is exact. The token means
:meth:`PlaneNorms.query_mean` and :meth:`PlaneNorms.key_mean` are what MHA2MLA's ``2_norm.py`` ranks the
rotary pairs by (:mod:`headwidget.analysis.partial_rope`).

Example:
    >>> q = torch.tensor([[[3.0, 0.0, 4.0, 1.0]]])  # one token, one head of 4 dims: planes (0, 2), (1, 3)
    >>> norms = PlaneNorms.empty(heads=1, kv_heads=1, planes=2)
    >>> norms.update(q, q.clone(), torch.tensor([0, 1, 2, 3]))
    >>> norms.query_mean().tolist(), norms.count
    ([[5.0, 1.0]], 1)
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = ["PlaneNorms", "pair_norm_sums"]

F64 = torch.float64


def pair_norm_sums(
    x: torch.Tensor, pairs: torch.Tensor | None, rows: torch.Tensor | None = None
) -> torch.Tensor:
    """``Σ_t ‖(x_{t,n,a_m}, x_{t,n,b_m})‖`` (heads, planes), float64, over rows ``t`` of ``x`` (N, heads, d).

    ``pairs`` (2·planes,) lists the first dims ``a_m`` of every plane, then the second dims ``b_m``;
    None means the planes are ``(m, m + d/2)`` of the whole head (half-split RoPE on every dim), which
    needs no gather. ``rows`` (LongTensor) sums only those rows (None: all); the norms of the other rows
    are computed and dropped, so they may be anything, even NaN. The norms are taken in ``x``'s
    precision (float32 for narrower floats; pairs beyond about 1e19 overflow to infinity in float32)
    and summed in it by one matrix-vector product, as a batch's Gram is formed in float32 in
    :class:`~headwidget.moments.Moments`.

    >>> x = torch.tensor([[[3.0, 4.0, 1.0]], [[0.0, 1.0, 0.0]], [[float("nan"), 0.0, 0.0]]])
    >>> pair_norm_sums(x, torch.tensor([0, 1]), rows=torch.tensor([1, 0]))
    tensor([[6.]], dtype=torch.float64)
    """
    picked = x if pairs is None else x.index_select(-1, pairs)
    half = picked.shape[-1] // 2
    first, second = picked[..., :half], picked[..., half:]
    if picked.dtype not in (torch.float32, torch.float64):
        first, second = first.float(), second.float()
    norms = first.square().addcmul_(second, second).sqrt_()  # one buffer of (N, heads, planes)
    flat = norms.reshape(norms.shape[0], -1)
    if rows is not None:
        flat = flat.index_select(0, rows)
    ones = torch.ones(flat.shape[0], dtype=flat.dtype, device=flat.device)
    return (ones @ flat).to(F64).reshape(norms.shape[1:])


@dataclass
class PlaneNorms:
    """Float64 token sums of every rotary pair's 2-norm of one layer (see the module docstring)."""

    count: int
    query: torch.Tensor
    key: torch.Tensor

    @classmethod
    def empty(
        cls, *, heads: int, kv_heads: int, planes: int, device: torch.device | str = "cpu"
    ) -> PlaneNorms:
        """Zero sums for ``heads`` query heads, ``kv_heads`` KV heads and ``planes`` rotary planes."""
        return cls(
            count=0,
            query=torch.zeros(heads, planes, dtype=F64, device=device),
            key=torch.zeros(kv_heads, planes, dtype=F64, device=device),
        )

    @staticmethod
    def nbytes(heads: int, kv_heads: int, planes: int) -> int:
        """Bytes of the float64 sums of this shape."""
        return 8 * (heads + kv_heads) * planes

    @property
    def planes(self) -> int:
        return int(self.key.shape[1])

    def update(
        self,
        queries: torch.Tensor,
        keys: torch.Tensor,
        pairs: torch.Tensor | None,
        rows: torch.Tensor | None = None,
        *,
        checks: list[torch.Tensor] | None = None,
    ) -> None:
        """Fold in the tokens ``rows`` (None: all) of ``queries`` (N, H, d) and ``keys`` (N, G, d).

        ``pairs`` and ``rows`` as :func:`pair_norm_sums` takes them, on their device. With ``checks``
        (a list), a (2,) bool tensor is appended in the form of :meth:`Moments.update
        <headwidget.moments.Moments.update>`'s flags: whether this batch's sums are free of NaN (NaN
        activations), and whether they are finite (no pair norm overflowed).
        """
        if int(queries.shape[0]) != int(keys.shape[0]):
            raise ValueError(
                f"{int(queries.shape[0])} query rows but {int(keys.shape[0])} key rows: they must be "
                "the same tokens"
            )
        n = int(queries.shape[0]) if rows is None else int(rows.numel())
        if n == 0:
            return
        q = pair_norm_sums(queries, pairs, rows)
        k = pair_norm_sums(keys, pairs, rows)
        if checks is not None:
            both = torch.cat([q.reshape(-1), k.reshape(-1)])
            checks.append(torch.stack([~torch.isnan(both).any(), torch.isfinite(both).all()]))
        self.query.add_(q)
        self.key.add_(k)
        self.count += n

    def query_mean(self) -> torch.Tensor:
        """``mean_t ‖q_{h,m}‖`` (H, planes); zero when no tokens were counted."""
        return self.query / max(self.count, 1)

    def key_mean(self) -> torch.Tensor:
        """``mean_t ‖k_{g,m}‖`` (G, planes); zero when no tokens were counted."""
        return self.key / max(self.count, 1)

    def merge(self, other: PlaneNorms) -> PlaneNorms:
        """The sums of both token sets together.

        >>> a = PlaneNorms(2, torch.full((1, 1), 3.0, dtype=F64), torch.ones(1, 1, dtype=F64))
        >>> b = PlaneNorms(1, torch.full((1, 1), 6.0, dtype=F64), torch.ones(1, 1, dtype=F64))
        >>> a.merge(b).query_mean().tolist(), a.merge(b).count
        ([[3.0]], 3)
        """
        if other.query.shape != self.query.shape or other.key.shape != self.key.shape:
            raise ValueError(
                f"cannot merge plane norms of shapes {tuple(self.query.shape)}/{tuple(self.key.shape)} "
                f"with {tuple(other.query.shape)}/{tuple(other.key.shape)}"
            )
        return PlaneNorms(
            self.count + other.count,
            self.query + other.query.to(self.query.device),
            self.key + other.key.to(self.key.device),
        )

    def to(self, device: torch.device | str) -> PlaneNorms:
        """A copy on ``device``."""
        return PlaneNorms(self.count, self.query.to(device), self.key.to(device))

    def all_reduce(self, group: object = None) -> None:
        """Sum over the ranks of a ``torch.distributed`` process group, in place."""
        import torch.distributed as dist

        count = torch.tensor([float(self.count)], dtype=F64, device=self.query.device)
        dist.all_reduce(count, group=group)
        dist.all_reduce(self.query, group=group)
        dist.all_reduce(self.key, group=group)
        self.count = round(float(count[0]))

    def to_tensors(self, prefix: str) -> dict[str, torch.Tensor]:
        """Flat ``name → tensor`` dict (CPU, contiguous) for safetensors."""
        return {
            f"{prefix}.count": torch.tensor([self.count], dtype=torch.int64),
            f"{prefix}.query": self.query.detach().cpu().contiguous(),
            f"{prefix}.key": self.key.detach().cpu().contiguous(),
        }
