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

from collections.abc import Iterable
from typing import Any

import numpy as np
import torch

from headwidget.checks import optional_whole_number, whole_numbers
from headwidget.errors import ArgumentError, ChannelSelectionError
from headwidget.moments.streaming import Moments

__all__ = [
    "ChannelSelectionError",
    "channel_corr_from_moments",
    "corr_from_comoment",
    "effective_rank",
    "off_diagonal_mean",
    "resolve_channels",
]


def off_diagonal_mean(matrix: Any, *, absolute: bool = False) -> float:
    """The mean of a square matrix's entries off its diagonal (of their absolute values with
    ``absolute``), NaN entries left out (``np.nanmean``); NaN when none is finite. The one per-layer
    summary of a correlation or similarity matrix: ``KVStats.summary``, the trend chart and the demo
    use it.

    Example:
        >>> import numpy as np
        >>> m = np.array([[1.0, -0.5], [0.25, 1.0]])
        >>> off_diagonal_mean(m), off_diagonal_mean(m, absolute=True)
        (-0.125, 0.375)
        >>> off_diagonal_mean(np.full((2, 2), np.nan))
        nan
    """
    values = np.asarray(matrix, dtype=np.float64)
    off = values[~np.eye(len(values), dtype=bool)]
    off = np.abs(off) if absolute else off
    return float(np.nanmean(off)) if np.isfinite(off).any() else float("nan")


def effective_rank(m2: Any) -> float:
    """The entropy effective rank (Roy & Vetterli, 2007) of a co-moment or covariance: ``exp(H(p))``
    with ``p`` its eigenvalues (negative rounding clipped to 0) divided by their sum; 1 for vectors on
    a line, C for C channels of equal, uncorrelated variance; NaN when every eigenvalue is 0 or one is
    not finite. Computed in float64.

    Example:
        >>> import numpy as np
        >>> effective_rank(np.diag([1.0, 1.0, 1.0, 1.0])), effective_rank(np.diag([1.0, 0.0, 0.0]))
        (4.0, 1.0)
    """
    values = np.asarray(m2.detach().cpu() if isinstance(m2, torch.Tensor) else m2, dtype=np.float64)
    if not np.isfinite(values).all():
        return float("nan")
    eigen = np.clip(np.linalg.eigvalsh((values + values.T) / 2), 0.0, None)
    total = eigen.sum()
    if total <= 0:
        return float("nan")
    p = eigen[eigen > 0] / total
    return float(np.exp(-(p * np.log(p)).sum()))


def corr_from_comoment(m2: torch.Tensor) -> torch.Tensor:
    """Normalise a (C×C) co-moment or covariance to a correlation; NaN where a variance is zero."""
    std = torch.sqrt(torch.diagonal(m2).clamp_min(0))
    # 1/std, NaN for a zero-variance channel: NaN then fills its row and column.
    inv = torch.where(std > 0, 1.0 / torch.where(std > 0, std, 1.0), float("nan"))
    return (m2 * inv[:, None]).mul_(inv[None, :]).clamp_(-1.0, 1.0)


def resolve_channels(channels: slice | range | list[int] | None, total: int) -> torch.Tensor | slice:
    """Turn a user's channel selection into an index (slice or LongTensor), checking its bounds.

    ``channels``: None (all), a slice of integers, or an iterable of integer channel indices in
    ``0 .. total - 1`` (a float, a bool or a string is refused, never truncated).

    >>> resolve_channels(slice(0, 4), 8), resolve_channels([3, 1], 8).tolist()
    (slice(0, 4, 1), [3, 1])
    >>> resolve_channels([0.5], 8)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    headwidget.errors.ChannelSelectionError: channels[0] must be an integer, got 0.5 (float)...

    Raises:
        ChannelSelectionError: an empty selection, indices outside the channels, or not integers.
    """
    if channels is None:
        return slice(0, total)
    if isinstance(channels, slice):
        try:
            for part in ("start", "stop", "step"):
                optional_whole_number(f"channels.{part}", getattr(channels, part), minimum=-(2**53))
            if channels.step == 0:
                raise ArgumentError("channels.step must not be 0")
        except ArgumentError as err:
            raise ChannelSelectionError(str(err)) from None
        start, stop, step = channels.indices(total)
        if start >= stop:
            raise ChannelSelectionError(f"channel window {channels} is empty for {total} channels")
        return slice(start, stop, step)
    if isinstance(channels, (str, bytes)) or not isinstance(channels, Iterable):
        raise ChannelSelectionError(
            f"channels must be a slice or a list of channel indices (such as slice(0, 32) or [0, 5]), "
            f"got {channels!r}"
        )
    if isinstance(channels, torch.Tensor):  # an integer tensor of indices
        if channels.is_floating_point() or channels.is_complex() or channels.dtype == torch.bool:
            raise ChannelSelectionError(
                f"channels must hold integer channel indices, got a {channels.dtype} tensor"
            )
        idx = channels.detach().flatten().long().cpu()
    else:
        try:
            idx = torch.as_tensor(
                whole_numbers("channels", channels, hint="channel indices"), dtype=torch.long
            )
        except ArgumentError as err:
            raise ChannelSelectionError(str(err)) from None
    if idx.numel() == 0:
        raise ChannelSelectionError("empty channel selection")
    if int(idx.min()) < 0 or int(idx.max()) >= total:
        raise ChannelSelectionError(
            f"channel indices must lie in [0, {total}); got {int(idx.min())}..{int(idx.max())}"
        )
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
