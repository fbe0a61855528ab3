"""Channel × channel Pearson correlation from streaming moments.

``rho_ab = cov(a, b) / sqrt(var(a) var(b))``, equal to ``np.corrcoef(X.T)`` of the captured tokens.
A channel with zero variance has no defined correlation: its row and column are NaN.

Example:
    >>> import torch
    >>> from headwidget.moments import Moments
    >>> x = torch.randn(500, 4, dtype=torch.float64)
    >>> m = Moments.empty(4); m.update(x.float(), split_a=500)
    >>> rho = channel_corr_from_moments(m)
    >>> bool(abs(rho[0, 1] - torch.corrcoef(x.T)[0, 1]) < 1e-6)
    True
"""

from __future__ import annotations

import torch

from headwidget.moments.streaming import Moments

__all__ = ["channel_corr_from_moments", "corr_from_comoment", "resolve_channels"]


def corr_from_comoment(m2: torch.Tensor) -> torch.Tensor:
    """Normalise a (C×C) co-moment or covariance to a correlation; NaN where a variance is zero."""
    std = torch.sqrt(torch.diagonal(m2).clamp_min(0))
    # 1/std, NaN for a zero-variance channel: NaN then fills its row and column.
    inv = torch.where(std > 0, 1.0 / torch.where(std > 0, std, 1.0), float("nan"))
    return (m2 * inv[:, None]).mul_(inv[None, :]).clamp_(-1.0, 1.0)


def resolve_channels(channels: slice | range | list[int] | None, total: int) -> torch.Tensor | slice:
    """Turn a user's channel selection into an index (slice or LongTensor), checking its bounds."""
    if channels is None:
        return slice(0, total)
    if isinstance(channels, slice):
        start, stop, step = channels.indices(total)
        if start >= stop:
            raise IndexError(f"channel window {channels} is empty for {total} channels")
        return slice(start, stop, step)
    idx = torch.as_tensor(list(channels), dtype=torch.long)
    if idx.numel() == 0:
        raise IndexError("empty channel selection")
    if int(idx.min()) < 0 or int(idx.max()) >= total:
        raise IndexError(f"channel indices must lie in [0, {total}); got {int(idx.min())}..{int(idx.max())}")
    return idx


def channel_corr_from_moments(
    moments: Moments, channels: slice | range | list[int] | None = None
) -> torch.Tensor:
    """Pearson correlation of the selected channels (float64, on the moments' device)."""
    sel = resolve_channels(channels, moments.channels)
    m2 = moments.m2[sel][:, sel]
    if moments.count < 2:
        return torch.full_like(m2, float("nan"))
    return corr_from_comoment(m2)
