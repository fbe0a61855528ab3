"""Which token positions of a batch enter the statistics, and which held-out split each belongs to."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

__all__ = ["TokenSelection", "select_tokens"]

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
