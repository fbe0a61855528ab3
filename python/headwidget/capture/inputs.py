"""Turn what a user passes as ``texts`` into padded batches of token ids with an attention mask."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from headwidget.errors import CaptureInputError

__all__ = ["Batch", "iter_batches"]


@dataclass
class Batch:
    """Token ids (B, T) and a 0/1 attention mask (B, T), both CPU int64."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor


def _pad(rows: list[list[int]], pad_id: int) -> Batch:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return Batch(ids, mask)


def _from_strings(texts: list[str], tokenizer: Any, batch_size: int, max_length: int) -> Iterator[Batch]:
    if tokenizer is None:
        raise CaptureInputError(
            "texts are strings but no tokenizer was given: pass tokenizer=AutoTokenizer.from_pretrained(...)"
            " or give token ids (a LongTensor) instead"
        )
    for text in texts:
        if not isinstance(text, str):
            raise CaptureInputError(f"texts must all be strings; found {type(text).__name__}: {text!r:.60}")
    pad_id = getattr(tokenizer, "pad_token_id", None)
    pad_id = 0 if pad_id is None else int(pad_id)
    for start in range(0, len(texts), batch_size):
        chunk = texts[start : start + batch_size]
        # Tokenise without padding and pad ourselves: the tokenizer is never modified.
        encoded = tokenizer(chunk, truncation=True, max_length=max_length, padding=False)
        rows = [list(r) for r in encoded["input_ids"]]
        rows = [r if r else [pad_id] for r in rows]
        batch = _pad(rows, pad_id)
        for i, r in enumerate(encoded["input_ids"]):
            if not r:
                batch.attention_mask[i] = 0
        yield batch


def _from_ids(ids: torch.Tensor, batch_size: int, max_length: int) -> Iterator[Batch]:
    if ids.dtype not in (torch.int64, torch.int32):
        raise CaptureInputError(f"token ids must be an integer tensor, got {ids.dtype}")
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.numel() == 0:
        raise CaptureInputError(
            f"token ids must be a non-empty (batch, length) tensor, got shape {tuple(ids.shape)}"
        )
    ids = ids[:, :max_length].long().cpu()
    for start in range(0, ids.shape[0], batch_size):
        chunk = ids[start : start + batch_size]
        yield Batch(chunk, torch.ones_like(chunk))


def _from_mappings(batches: Iterable[Any], max_length: int) -> Iterator[Batch]:
    for i, item in enumerate(batches):
        if not isinstance(item, Mapping) or "input_ids" not in item:
            raise CaptureInputError(
                f"batch {i} is a {type(item).__name__}; an iterable of batches must yield dicts "
                "with 'input_ids' (and optionally 'attention_mask')"
            )
        ids = torch.as_tensor(item["input_ids"])
        if ids.dim() == 1:
            ids = ids.unsqueeze(0)
        mask = item.get("attention_mask")
        mask = torch.ones_like(ids) if mask is None else torch.as_tensor(mask).reshape(ids.shape)
        yield Batch(ids[:, :max_length].long().cpu(), mask[:, :max_length].long().cpu())


def iter_batches(
    texts: Any, tokenizer: Any = None, *, batch_size: int = 8, max_length: int = 512
) -> Iterator[Batch]:
    """Batches from a string, a list of strings, a LongTensor of ids, or an iterable of dict batches.

    >>> b = next(iter_batches(torch.tensor([[5, 6, 7]])))
    >>> b.input_ids.tolist(), b.attention_mask.tolist()
    ([[5, 6, 7]], [[1, 1, 1]])
    """
    if batch_size < 1 or max_length < 1:
        raise CaptureInputError(f"batch_size and max_length must be ≥ 1 (got {batch_size}, {max_length})")
    if isinstance(texts, str):
        texts = [texts]
    if isinstance(texts, torch.Tensor):
        return _from_ids(texts, batch_size, max_length)
    if isinstance(texts, (list, tuple)):
        if len(texts) == 0:
            raise CaptureInputError("texts is empty: give at least one string, token-id row or batch")
        if isinstance(texts[0], str):
            return _from_strings(list(texts), tokenizer, batch_size, max_length)
        if isinstance(texts[0], Mapping):
            return _from_mappings(texts, max_length)
        raise CaptureInputError(
            f"a list of texts must hold strings or dict batches, not {type(texts[0]).__name__}"
        )
    if isinstance(texts, Iterable):
        return _from_mappings(texts, max_length)
    raise CaptureInputError(
        f"cannot capture from {type(texts).__name__}: pass a string, a list of strings (with a "
        "tokenizer), a LongTensor of token ids, or an iterable of dicts with 'input_ids'"
    )
