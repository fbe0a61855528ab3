"""Token samples: a uniform random sample of the real token rows of every captured (layer, kind).

``capture(..., samples=R)`` keeps, next to the moments, ``min(R, N)`` of the ``N`` token rows that
entered them (padding and skipped first tokens never do), as float32, every ``R``-subset of the tokens
equally likely. Every (layer, kind) of one capture holds the same tokens in the same order: row ``i``
of the key sample and row ``i`` of the value sample of a layer are one token.

Two samples merge into a uniform sample of the union (:func:`merge_samples`): each side's sample stands
for its ``N`` tokens, so the merged sample of ``k = min(R, N_a + N_b)`` rows takes
``k_a ~ Hypergeometric(N_a + N_b, N_a, k)`` rows from side a (a uniform subset of its sample) and the
other ``k − k_a`` from side b, in a random order. A uniform subset of a uniform sample is a uniform
sample, so every ``k``-subset of the union is equally likely. The draw is seeded by the two sides'
seeds and token counts, so a merge is reproducible; captures that are meant to be merged should be
drawn with different seeds (``sample_seed=rank``): with one seed, two captures pick the same token
positions, which keeps every token's chance of being picked equal but not the picks independent.

Example:
    >>> import torch
    >>> a = SamplePart({(0, "key"): torch.arange(4.0)[:, None]}, tokens=4, seed=1)
    >>> b = SamplePart({(0, "key"): 10 + torch.arange(4.0)[:, None]}, tokens=40, seed=2)
    >>> rows, seed = merge_samples([a, b], size=4)
    >>> rows[(0, "key")].shape
    torch.Size([4, 1])
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, cast

import numpy as np
import torch

from headwidget.core.kinds import Kind
from headwidget.errors import NoSamplesError

__all__ = ["SAMPLE_SEED", "NoSamplesError", "SamplePart", "merge_samples", "merged_seed"]

#: The seed of a capture's token samples when ``sample_seed`` is not given.
SAMPLE_SEED = 20240602
#: Seeds are non-negative and below this bound (they are stored as JSON integers and int64 tensors).
SEED_LIMIT = 2**63

SampleRows = dict[tuple[int, Kind], torch.Tensor]


@dataclass(frozen=True)
class SamplePart:
    """One side of a merge: the sample rows per (layer, kind), the tokens they stand for, their seed.

    >>> SamplePart({}, tokens=0, seed=0).rows
    {}
    """

    rows: SampleRows
    tokens: int
    seed: int

    @property
    def count(self) -> int:
        """Rows in this part's sample (the same for every (layer, kind))."""
        return next((int(t.shape[0]) for t in self.rows.values()), 0)


def merged_seed(parts: Sequence[tuple[int, int]]) -> int:
    """The seed of a merge of samples with these ``(seed, tokens)``, in order: a hash, below 2**63.

    >>> merged_seed([(1, 10), (2, 20)]) == merged_seed([(1, 10), (2, 20)]) != merged_seed([(2, 20), (1, 10)])
    True
    """
    text = json.dumps([[int(seed), int(tokens)] for seed, tokens in parts])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "big") % SEED_LIMIT


def merge_samples(parts: Sequence[SamplePart], size: int) -> tuple[SampleRows, int]:
    """A uniform sample of up to ``size`` rows of the union of ``parts``' tokens, and its seed.

    Each part must hold a uniform sample of ``min(size, tokens)`` rows or more of its own tokens. The
    split of the ``min(size, Σ tokens)`` rows between the parts is multivariate hypergeometric in their
    token counts; each part gives a uniform subset of its rows; the result is in a random order. The
    same subsets are taken for every (layer, kind), so rows of one token stay aligned across them.

    >>> import torch
    >>> part = SamplePart({(0, "value"): torch.arange(6.0).reshape(3, 2)}, tokens=3, seed=0)
    >>> rows, _ = merge_samples([part, part], size=8)
    >>> sorted(rows[(0, "value")][:, 0].tolist())
    [0.0, 0.0, 2.0, 2.0, 4.0, 4.0]
    """
    seed = merged_seed([(p.seed, p.tokens) for p in parts])
    keys = sorted(parts[0].rows) if parts else []
    total = sum(p.tokens for p in parts)
    k = min(size, total)
    for p in parts:
        need = min(k, p.tokens)
        if p.count < need or any(tuple(p.rows[key].shape[:1]) != (p.count,) for key in keys):
            raise ValueError(
                f"a sample of {p.count} rows over {p.tokens} tokens cannot give the up to {need} rows "
                "a merged sample may take from it"
            )
    rng = np.random.default_rng(seed)
    takes = [0] * len(parts)
    if k:
        takes = [
            int(t) for t in rng.multivariate_hypergeometric([p.tokens for p in parts], k, method="marginals")
        ]
    picks = [torch.from_numpy(rng.permutation(p.count)[:take]) for p, take in zip(parts, takes, strict=True)]
    order = torch.from_numpy(rng.permutation(k))
    out: SampleRows = {}
    for key in keys:
        device = parts[0].rows[key].device
        chosen = [
            p.rows[key].to(device).index_select(0, pick.to(device))
            for p, pick in zip(parts, picks, strict=True)
        ]
        out[key] = torch.cat(chosen).index_select(0, order.to(device))
    return out, seed


def all_reduce_samples(
    rows: SampleRows, tokens: int, seed: int, size: int, group: object = None
) -> tuple[SampleRows, int, int]:
    """Merge every rank's sample (``torch.distributed``): the merged rows, their seed and size.

    Every rank gathers every rank's sample and draws the same merge (:func:`merge_samples` over the
    ranks in rank order), so every rank ends with the same sample; the size is the smallest rank's.
    """
    import torch.distributed as dist

    world = dist.get_world_size(cast(Any, group))
    keys = sorted(rows)
    device = rows[keys[0]].device if keys else torch.device("cpu")
    head = torch.tensor([tokens, size if keys else 0, seed], dtype=torch.int64, device=device)
    heads = [torch.empty_like(head) for _ in range(world)]
    dist.all_gather(heads, head, group=group)
    facts = [tuple(int(v) for v in h.cpu()) for h in heads]
    merged_size = min(f[1] for f in facts)
    if merged_size == 0:
        return {}, 0, 0
    counts = [min(f[0], f[1]) for f in facts]
    longest = max(counts)
    gathered: dict[tuple[int, Kind], list[torch.Tensor]] = {}
    for key in keys:
        mine = rows[key]
        padded = torch.zeros((longest, *mine.shape[1:]), dtype=mine.dtype, device=mine.device)
        padded[: mine.shape[0]] = mine
        pieces = [torch.empty_like(padded) for _ in range(world)]
        dist.all_gather(pieces, padded, group=group)
        gathered[key] = [piece[:n] for piece, n in zip(pieces, counts, strict=True)]
    parts = [
        SamplePart({key: gathered[key][r] for key in keys}, tokens=f[0], seed=f[2])
        for r, f in enumerate(facts)
    ]
    out, merged = merge_samples(parts, merged_size)
    return out, merged, merged_size
