"""Which token positions of a batch enter the statistics, which held-out split each belongs to, and
which of them enter the token samples."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["ReservoirStep", "TokenReservoir", "TokenSelection", "narrow_to_selection", "select_tokens"]

SPLIT_SEED = 20240531


@dataclass
class TokenSelection:
    """Flat (B·T) row indices of the counted tokens, split-A rows first, and the split-A count."""

    index: torch.Tensor
    split_a: int
    _on_device: dict[torch.device, torch.Tensor] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return int(self.index.numel())

    def on(self, device: torch.device) -> torch.Tensor:
        """The index on ``device`` (copied once per device and batch)."""
        idx = self._on_device.get(device)
        if idx is None:
            idx = self.index.to(device, non_blocking=True)
            self._on_device[device] = idx
        return idx


def select_tokens(
    attention_mask: torch.Tensor,
    *,
    batch_number: int,
    skip_first_token: bool = False,
    limit: int | None = None,
    seed: int = SPLIT_SEED,
) -> TokenSelection:
    """Pick the non-padding tokens of a (B, T) mask; optionally drop each row's first real token.

    Tokens are assigned to split A or B by a seeded pseudo-random bit of (batch number, position),
    so the same data always gives the same split. ``limit`` keeps only the first ``limit`` tokens
    in row-major order.

    >>> sel = select_tokens(torch.tensor([[1, 1, 0], [1, 1, 1]]), batch_number=0)
    >>> sorted(sel.index.tolist())
    [0, 1, 3, 4, 5]
    """
    mask = attention_mask.to(torch.bool).cpu().clone()
    if skip_first_token:
        has_any = mask.any(dim=1)
        first = mask.to(torch.int8).argmax(dim=1)
        rows = torch.arange(mask.shape[0])[has_any]
        mask[rows, first[has_any]] = False
    flat = mask.reshape(-1).nonzero().squeeze(1)
    if limit is not None:
        flat = flat[: max(limit, 0)]
    gen = torch.Generator().manual_seed(seed * 1_000_003 + batch_number)
    bits = torch.randint(0, 2, (mask.numel(),), generator=gen, dtype=torch.int8)[flat]
    in_a = flat[bits == 0]
    in_b = flat[bits == 1]
    return TokenSelection(torch.cat([in_a, in_b]), int(in_a.numel()))


def narrow_to_selection(
    selection: TokenSelection, shape: tuple[int, int], *, causal: bool
) -> tuple[int, int, TokenSelection]:
    """The rows and columns of a (B, T) batch that its selected tokens need computed, and the selection
    indexed into that narrower batch: ``(rows, width, selection)``.

    Rows are independent, so rows after the last one with a selected token need no forward; in a causal
    model neither do the columns after the last selected position (a token sees only the ones before
    it). A bidirectional model keeps every column: its tokens see the whole row. A ``max_tokens`` capture
    whose budget ends early in a batch computes only what it counts, with the same tokens, the same
    split and the same sample as the full batch.

    >>> sel = select_tokens(torch.ones(4, 6, dtype=torch.long), batch_number=0, limit=8)
    >>> rows, width, narrow = narrow_to_selection(sel, (4, 6), causal=True)
    >>> rows, width, sorted(narrow.index.tolist()) == list(range(8)), narrow.split_a == sel.split_a
    (2, 6, True, True)
    >>> three = select_tokens(torch.ones(4, 6), batch_number=0, limit=3)
    >>> [narrow_to_selection(three, (4, 6), causal=c)[:2] for c in (True, False)]
    [(1, 3), (1, 6)]
    """
    b, t = shape
    index = selection.index
    if index.numel() == 0:
        return b, t, selection
    row, column = index // t, index % t
    rows = int(row.max()) + 1
    width = int(column.max()) + 1 if causal else t
    if (rows, width) == (b, t):
        return b, t, selection
    return rows, width, TokenSelection(row * width + column, selection.split_a)


@dataclass
class ReservoirStep:
    """Where one batch's selected rows go in the reservoir: row ``rows[i]`` to slot ``slots[i]``."""

    slots: torch.Tensor
    rows: torch.Tensor
    _on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)

    @property
    def count(self) -> int:
        return int(self.rows.numel())

    def on(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor]:
        """``(slots, rows)`` on ``device`` (copied once per device and batch)."""
        pair = self._on_device.get(device)
        if pair is None:
            pair = (self.slots.to(device, non_blocking=True), self.rows.to(device, non_blocking=True))
            self._on_device[device] = pair
        return pair


class TokenReservoir:
    """A uniform reservoir of ``size`` token slots over a stream of batches ("random keys").

    Every token gets an independent uniform key from a seeded generator; the reservoir keeps the
    ``size`` tokens with the smallest keys, which makes it a uniform sample of the tokens seen (every
    ``size``-subset equally likely). Per batch, one top-k over the kept keys and the new ones (only
    those below the largest kept key can enter) says which slots the new rows overwrite; the row
    buffers of every (layer, kind), wherever they live, apply the same :class:`ReservoirStep`, so
    they hold the same tokens. The keys stay on the CPU.

    >>> reservoir = TokenReservoir(size=3, seed=0)
    >>> [reservoir.step(2).count, reservoir.step(5).count <= 3, reservoir.filled]
    [2, True, 3]
    >>> sorted(reservoir.order().tolist())
    [0, 1, 2]
    """

    def __init__(self, size: int, seed: int) -> None:
        self.size = size
        self.keys = torch.empty(size, dtype=torch.float64)
        self.filled = 0
        self.generator = torch.Generator().manual_seed(seed)

    def step(self, n: int) -> ReservoirStep:
        """Draw keys for ``n`` new rows and say which of them enter which slots."""
        new = torch.rand(n, generator=self.generator, dtype=torch.float64)
        filled, size = self.filled, self.size
        if filled + n <= size:
            slots = torch.arange(filled, filled + n)
            self.keys[slots] = new
            self.filled = filled + n
            return ReservoirStep(slots, torch.arange(n))
        kept = self.keys[:filled]
        if filled == size:  # only keys below the largest kept one can enter
            candidates = (new < kept.max()).nonzero().squeeze(1)
            if not candidates.numel():
                return ReservoirStep(candidates, candidates)
        else:
            candidates = torch.arange(n)
        combined = torch.cat([kept, new[candidates]])
        chosen = torch.topk(combined, size, largest=False, sorted=False).indices
        stays = torch.zeros(size, dtype=torch.bool)
        stays[chosen[chosen < filled]] = True  # slots >= filled are empty, hence free
        rows = candidates[chosen[chosen >= filled] - filled]
        slots = (~stays).nonzero().squeeze(1)
        self.keys[slots] = new[rows]
        self.filled = size
        return ReservoirStep(slots, rows)

    def order(self) -> torch.Tensor:
        """The filled slots by increasing key: a uniformly random order of the sampled tokens."""
        return torch.argsort(self.keys[: self.filled])
