"""How many bits groups of channels need together: joint against summed marginal entropies.

The argument of Coupled Quantization ("KV Cache is 1 Bit Per Channel"): when the joint entropy of c
channels grows more slowly than the sum of their marginal entropies, channels quantized together need
fewer bits than channels quantized one by one. Measured here on a uniform sample of real token rows
(``capture(..., samples=R)``, :meth:`KVStats.samples <headwidget.stats.KVStats.samples>`), exactly so:

- the C channels split into whole groups of c contiguous channels ``[g·c, (g+1)·c)``; the last
  ``C mod c`` channels, which fill no whole group, are left out for that c;
- each channel is cut into ``bins`` equal-width bins between its sample minimum ``lo`` and maximum
  ``hi``: a value ``x`` falls in bin ``min(floor(((x − lo) / (hi − lo)) · bins), bins − 1)``, computed in
  float64 (so the maximum falls in the last bin); a constant channel (``hi = lo``) is one bin;
- ``joint`` is the plug-in entropy, in bits, of the c-tuple of a group's bin indices over the N
  samples, ``log2 N − Σ n_i log2 n_i / N`` over its non-empty cells ``n_i``; ``marginal_sum`` is the sum
  of the plug-in entropies of the group's c channels; both are averaged over the groups.

**The shuffled control.** The plug-in estimator's low bias makes even independent channels look
coupled once ``bins**c`` is not small against N. :func:`shuffled_rows` permutes every channel on its
own across the rows (same marginals, no dependence) and :func:`coupling_control` measures the same
entropies on them: only the gap between the real ratio ``joint / marginal_sum`` and the control's is
coupling; the control's own gap from 1 is the estimator's bias.

``joint ≤ marginal_sum`` always holds for plug-in estimates (the empirical distribution is a
distribution, and entropy is sub-additive). The plug-in estimate is biased low when the number of
cells ``bins**c`` is not small against N: the result flags ``bins**c > N / 5`` in ``biased``. The
Miller–Madow correction (``miller_madow=True``) adds ``(m − 1) / (2 N ln 2)`` bits to each entropy,
``m`` its number of non-empty cells (to the joint entropy once, to each channel's marginal entropy
before they are summed).

Everything runs in torch on the samples' device, batched over the groups (each tuple is encoded as
one int64 code per group, and one ``torch.unique`` counts the cells of all groups of a chunk).

Example:
    >>> import torch
    >>> x = torch.arange(64.0)[:, None]  # one channel, 16 values per bin of 4
    >>> r = channel_entropy_of(torch.cat([x, x, -x], 1), group_sizes=(1, 2, 3), bins=4)
    >>> r.joint, r.marginal_sum  # copies of one channel need no more bits than one of them
    ({1: 2.0, 2: 2.0, 3: 2.0}, {1: 2.0, 2: 4.0, 3: 6.0})
    >>> r.biased
    {1: False, 2: True, 3: True}
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, TypeVar

import numpy as np
import torch

from headwidget.checks import flag, whole_number, whole_numbers
from headwidget.core.kinds import Kind
from headwidget.errors import ArgumentError, ChannelEntropyError
from headwidget.stats import KVStats

__all__ = [
    "BINS_MAX",
    "ChannelEntropy",
    "ChannelEntropyError",
    "channel_entropy",
    "channel_entropy_of",
    "coupling_control",
    "shuffled_rows",
]

#: Codes stay below this bound (int64), with room for the per-group offsets.
_CODE_LIMIT = 2**62
#: Bin indices handled at a time (samples × channels of a chunk of groups).
_CHUNK = 1 << 24
#: The most bins per channel: more than a million equal-width bins is a typo (and ``bins**c`` codes
#: of larger counts would overflow int64 between renumberings).
BINS_MAX = 2**20

T = TypeVar("T")


def _checked(check: Callable[..., T], *args: Any, **kwargs: Any) -> T:
    """``check(*args, **kwargs)`` of :mod:`headwidget.checks`, its error raised as a ChannelEntropyError."""
    try:
        return check(*args, **kwargs)
    except ArgumentError as err:
        raise ChannelEntropyError(str(err)) from None


@dataclass(frozen=True)
class ChannelEntropy:
    """Joint and summed marginal entropies (bits) of groups of contiguous channels, per group size.

    ``joint[c]`` and ``marginal_sum[c]`` are averages over the ``C // c`` whole groups;
    ``joint_per_group[c]`` and ``marginal_per_group[c]`` hold each group's value; ``per_channel`` each
    channel's marginal entropy; ``biased[c]`` says whether ``bins**c > samples / 5`` (the plug-in
    estimate is then biased low). See :mod:`headwidget.analysis.entropy` for the exact definition.

    >>> import torch
    >>> r = channel_entropy_of(torch.tensor([[0.0, 1.0], [1.0, 0.0]] * 8), group_sizes=(2,), bins=2)
    >>> r.joint[2], r.marginal_sum[2], r.samples, r.channels
    (1.0, 2.0, 16, 2)
    """

    joint: dict[int, float]
    marginal_sum: dict[int, float]
    joint_per_group: dict[int, np.ndarray]
    marginal_per_group: dict[int, np.ndarray]
    per_channel: np.ndarray
    samples: int
    channels: int
    bins: int
    biased: dict[int, bool]
    miller_madow: bool = False


def channel_entropy(
    stats: KVStats,
    layer: int,
    kind: Kind = "key",
    group_sizes: Iterable[int] = (1, 2, 4, 8),
    bins: int = 16,
    miller_madow: bool = False,
) -> ChannelEntropy:
    """Joint and summed marginal entropies of channel groups of one layer and kind's token samples.

    The samples are :meth:`KVStats.samples <headwidget.stats.KVStats.samples>` (``capture(...,
    samples=R)``); see :func:`channel_entropy_of` for the arguments.

    Raises:
        NoSamplesError: the statistics were captured without ``samples=R``.
        UnknownKindError, LayerIndexError: ``kind`` or ``layer`` was not captured.
        ChannelEntropyError: bad ``group_sizes`` or ``bins``, or fewer than two samples.

    Example:
        >>> import torch, headwidget
        >>> from transformers import GPT2Config, GPT2LMHeadModel
        >>> model = GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=32, n_head=4, vocab_size=50)).eval()
        >>> stats = headwidget.capture(model, torch.randint(0, 50, (8, 64)), samples=512, progress=False)
        >>> r = channel_entropy(stats, 0, "value", group_sizes=(1, 2), bins=8)
        >>> r.samples, r.joint[2] <= r.marginal_sum[2], r.biased
        (512, True, {1: False, 2: False})
    """
    return channel_entropy_of(
        stats.samples(layer, kind), group_sizes=group_sizes, bins=bins, miller_madow=miller_madow
    )


def channel_entropy_of(
    samples: Any,
    group_sizes: Iterable[int] = (1, 2, 4, 8),
    bins: int = 16,
    miller_madow: bool = False,
) -> ChannelEntropy:
    """Joint and summed marginal entropies of channel groups of a ``(N, C)`` sample of token rows.

    Args:
        samples: a 2-D torch tensor or numpy array, N token rows of C channels (finite, N ≥ 2); the
            computation runs on its device.
        group_sizes: the group sizes c, each ``1 ≤ c ≤ C``.
        bins: equal-width bins per channel (1 ≤ bins ≤ :data:`BINS_MAX`).
        miller_madow: add the Miller–Madow correction ``(m − 1) / (2 N ln 2)`` bits.

    Returns:
        :class:`ChannelEntropy` (the definition is in :mod:`headwidget.analysis.entropy`).

    Raises:
        ChannelEntropyError: bad arguments, naming what to pass instead.

    >>> import torch
    >>> gen = torch.Generator().manual_seed(0)
    >>> r = channel_entropy_of(torch.rand(20000, 4, generator=gen), group_sizes=(1, 2), bins=4)
    >>> round(r.joint[1], 3), round(r.joint[2], 3), round(r.marginal_sum[2], 3)  # independent: additive
    (2.0, 4.0, 4.0)
    """
    bins = _checked(whole_number, "bins", bins, minimum=1, maximum=BINS_MAX, hint="bins per channel")
    miller_madow = _checked(flag, "miller_madow", miller_madow)
    x = _as_rows(samples)
    n, channels = x.shape
    sizes = _group_sizes(group_sizes, channels)
    lo = x.amin(0).double()
    hi = x.amax(0).double()
    per_channel = _group_entropies(x, lo, hi, 1, bins, miller_madow)
    joint: dict[int, float] = {}
    marginal: dict[int, float] = {}
    joint_groups: dict[int, np.ndarray] = {}
    marginal_groups: dict[int, np.ndarray] = {}
    for c in sizes:
        groups = channels // c
        per_group = per_channel if c == 1 else _group_entropies(x, lo, hi, c, bins, miller_madow)
        summed = per_channel[: groups * c].reshape(groups, c).sum(1)
        joint_groups[c] = per_group.cpu().numpy()
        marginal_groups[c] = summed.cpu().numpy()
        joint[c] = float(joint_groups[c].mean())
        marginal[c] = float(marginal_groups[c].mean())
    return ChannelEntropy(
        joint=joint,
        marginal_sum=marginal,
        joint_per_group=joint_groups,
        marginal_per_group=marginal_groups,
        per_channel=per_channel.cpu().numpy(),
        samples=n,
        channels=channels,
        bins=bins,
        biased={c: bins**c * 5 > n for c in sizes},
        miller_madow=bool(miller_madow),
    )


# ---------------------------------------------------------------------------------- arguments
def _as_rows(samples: Any) -> torch.Tensor:
    x = torch.from_numpy(np.asarray(samples)) if not isinstance(samples, torch.Tensor) else samples
    if x.ndim != 2:
        raise ChannelEntropyError(
            f"samples must be a 2-D (tokens, channels) array, got shape {tuple(x.shape)}"
        )
    if not (x.is_floating_point() or x.dtype in (torch.int8, torch.int16, torch.int32, torch.int64)):
        raise ChannelEntropyError(f"samples must be a real-valued array, got {x.dtype}")
    if x.shape[0] < 2:
        raise ChannelEntropyError(
            f"entropies need at least 2 samples, got {x.shape[0]}; capture with samples=R (R ≥ 2) over "
            "at least 2 tokens"
        )
    if x.shape[1] < 1:
        raise ChannelEntropyError("samples have no channels")
    if x.is_floating_point() and not bool(torch.isfinite(x).all()):
        raise ChannelEntropyError("samples hold NaN or infinite values; entropies need finite values")
    return x.detach()


def _group_sizes(group_sizes: Iterable[int] | int, channels: int) -> list[int]:
    if isinstance(group_sizes, numbers.Integral) and not isinstance(group_sizes, bool):
        group_sizes = [int(group_sizes)]
    sizes: list[int] = []
    for c in _checked(whole_numbers, "group_sizes", group_sizes, hint="channels per group, as (1, 2, 4)"):
        if not 1 <= c <= channels:
            raise ChannelEntropyError(
                f"group size {c} is outside 1..{channels}: groups of c contiguous channels need "
                f"1 ≤ c ≤ C = {channels}"
            )
        if int(c) not in sizes:
            sizes.append(int(c))
    if not sizes:
        raise ChannelEntropyError("group_sizes is empty: pass sizes such as (1, 2, 4, 8)")
    return sizes


# ---------------------------------------------------------------------------------- counting
def _bin_indices(x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, bins: int) -> torch.Tensor:
    """Each value's bin, ``min(floor(((x − lo) / (hi − lo)) · bins), bins − 1)``; 0 on constant channels."""
    width = hi - lo
    constant = width == 0
    t = (x.double() - lo) / torch.where(constant, torch.ones_like(width), width)
    index = torch.floor(t * bins).to(torch.int64).clamp_(0, bins - 1)
    return index.masked_fill_(constant, 0)


def _densify(code: torch.Tensor, bound: int) -> tuple[torch.Tensor, int]:
    """Codes ``(N, G)`` below ``bound`` renumbered per group to ``0..distinct − 1`` (bound N)."""
    groups = code.shape[1]
    offsets = torch.arange(groups, device=code.device, dtype=torch.int64) * bound
    values, inverse = torch.unique(code + offsets, return_inverse=True)
    starts = torch.searchsorted(values, offsets)
    return inverse - starts, int(code.shape[0])


def _group_entropies(
    x: torch.Tensor, lo: torch.Tensor, hi: torch.Tensor, c: int, bins: int, miller_madow: bool
) -> torch.Tensor:
    """Plug-in entropy (bits, float64) of the bin-index tuple of every whole group of ``c`` channels."""
    n, channels = x.shape
    groups = channels // c
    step = max(1, _CHUNK // (n * c))
    out = []
    for first in range(0, groups, step):
        count = min(step, groups - first)
        span = slice(first * c, (first + count) * c)
        index = _bin_indices(x[:, span], lo[span], hi[span], bins).reshape(n, count, c)
        code, bound = index[:, :, 0], bins
        for j in range(1, c):
            if bound * bins * count >= _CODE_LIMIT:
                code, bound = _densify(code, bound)
            code, bound = code * bins + index[:, :, j], bound * bins
        if bound * count >= _CODE_LIMIT:
            code, bound = _densify(code, bound)
        offsets = torch.arange(count, device=x.device, dtype=torch.int64) * bound
        cells, sizes = torch.unique((code + offsets).reshape(-1), return_counts=True)
        group = torch.div(cells, bound, rounding_mode="floor")
        sizes64 = sizes.to(torch.float64)
        spread = torch.zeros(count, dtype=torch.float64, device=x.device)
        spread.scatter_add_(0, group, sizes64 * torch.log2(sizes64))
        entropy = math.log2(n) - spread / n
        if miller_madow:
            occupied = torch.zeros(count, dtype=torch.float64, device=x.device)
            occupied.scatter_add_(0, group, torch.ones_like(sizes64))
            entropy = entropy + (occupied - 1) / (2 * n * math.log(2))
        out.append(entropy)
    return torch.cat(out)


def shuffled_rows(samples: Any, seed: int) -> torch.Tensor:
    """``samples`` (N, C) with every channel permuted on its own across the rows, by a generator
    seeded with ``seed``: each channel keeps its values (its marginal), the rows lose their dependence.

    >>> x = torch.arange(12.0).reshape(6, 2)
    >>> y = shuffled_rows(x, seed=0)
    >>> bool((y.sort(0).values == x).all()), bool((y == x).all())
    (True, False)
    """
    x = _as_rows(samples)
    gen = torch.Generator().manual_seed(_checked(whole_number, "seed", seed, minimum=0))
    order = torch.argsort(torch.rand(x.shape, generator=gen), dim=0).to(x.device)
    return torch.gather(x, 0, order)


def coupling_control(
    stats: KVStats,
    layer: int,
    kind: Kind = "key",
    group_sizes: Iterable[int] = (1, 2, 4, 8),
    bins: int = 16,
    miller_madow: bool = False,
    seed: int | None = None,
) -> ChannelEntropy:
    """:func:`channel_entropy` of the layer's token sample shuffled channel by channel
    (:func:`shuffled_rows`, ``seed`` default: the layer): what the estimator reports for independent
    channels with the same marginals. Compare ``joint / marginal_sum`` with the real one's.
    """
    rows = stats.samples(layer, kind).float().cpu()
    control = shuffled_rows(rows, layer if seed is None else seed)
    return channel_entropy_of(control, group_sizes=group_sizes, bins=bins, miller_madow=miller_madow)
