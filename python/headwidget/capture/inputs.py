"""Turn what a user passes as ``texts`` into padded batches of token ids with an attention mask.

Every batch has at most ``batch_size`` rows and ``max_length`` positions, whatever its source, so the
memory a capture needs is bounded by what :func:`headwidget.estimate` assumes. A long string is
tokenised incrementally: only a prefix that surely covers the kept tokens is ever tokenised.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch

from headwidget.errors import CaptureInputError

__all__ = ["Batch", "first_tokens", "iter_batches", "length_batches", "tokenize_truncated"]

#: Tokens a tokenised prefix must hold beyond the kept ones, so the kept tokens are far from the cut.
PREFIX_MARGIN = 32
#: Characters per kept token in the first prefix tried (doubled until the prefix holds enough tokens).
CHARS_PER_TOKEN = 8

_RUN_START = re.compile(r"(?<=\S)\s")  # a whitespace character that follows a non-whitespace one
_RUN_END = re.compile(r"\s(?=\S)")  # a whitespace character that precedes a non-whitespace one


@dataclass
class Batch:
    """Token ids (B, T) and a 0/1 attention mask (B, T), both CPU int64; for evaluation, optionally
    ``scored`` (B, T) 0/1: the tokens whose prediction is measured (None: every real token that follows
    a real one; a sliding-window protocol scores only each window's new tokens)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    scored: torch.Tensor | None = None

    def position_ids(self) -> torch.Tensor | None:
        """Positions of the real tokens counted from each row's first one, or None when they are 0, 1, 2...

        None means every row's real tokens form one run that starts at position 0 (no padding, or
        right padding only), where a model's default positions are already right. Otherwise (left
        padding, or gaps) each real token gets the number of real tokens before it in its row, as
        generation does, so a left-padded row is computed exactly as the same row unpadded.

        >>> Batch(torch.ones(2, 3, dtype=torch.long), torch.tensor([[1, 1, 0], [1, 1, 1]])).position_ids()
        >>> Batch(torch.ones(2, 3, dtype=torch.long), torch.tensor([[0, 1, 1], [1, 1, 1]])).position_ids()
        tensor([[0, 0, 1],
                [0, 1, 2]])
        """
        mask = self.attention_mask
        # A row is a plain prefix when its mask never rises from 0 to 1.
        if not bool((mask[:, 1:] > mask[:, :-1]).any()):
            return None
        return (mask.cumsum(-1) - 1).clamp(min=0)


def _pad(rows: list[list[int]], pad_id: int) -> Batch:
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, : len(row)] = torch.tensor(row, dtype=torch.long)
        mask[i, : len(row)] = 1
    return Batch(ids, mask)


def _whole_text_limit(max_length: int) -> int:
    """Texts up to this many characters are tokenised whole (that is cheap enough)."""
    return 2 * CHARS_PER_TOKEN * (max_length + PREFIX_MARGIN) + 4096


def _ids(encoded: Any, max_length: int) -> list[int]:
    ids = [int(i) for i in encoded["input_ids"]]
    if len(ids) > max_length:  # tokenizers give up truncating when the special tokens alone are longer
        raise CaptureInputError(
            f"the tokenizer returned {len(ids)} tokens for max_length={max_length}: it cannot truncate "
            "that short (its special tokens alone are longer). Raise max_length"
        )
    return ids


def tokenize_truncated(tokenizer: Any, text: str, max_length: int) -> list[int]:
    """``tokenizer(text, truncation=True, max_length=max_length)["input_ids"]``, for texts of any length.

    A long text is not tokenised whole: a growing piece of it (cut where a run of whitespace begins,
    or for ``truncation_side="left"`` where one ends) is tokenised until it holds
    :data:`PREFIX_MARGIN` tokens more than are kept, so the kept tokens lie far from the cut and are
    the ones the whole text gives. Work and memory are proportional to the kept piece, not the text.

    Example:
        >>> class Words:  # a stand-in tokenizer: one id per word, truncated on the right
        ...     truncation_side = "right"
        ...     def __call__(self, text, truncation=False, max_length=None, add_special_tokens=True):
        ...         ids = [len(w) for w in text.split()]
        ...         return {"input_ids": ids[:max_length] if truncation else ids}
        >>> tokenize_truncated(Words(), "a bb ccc " * 1_000_000, max_length=4)
        [1, 2, 3, 1]
    """
    if len(text) <= _whole_text_limit(max_length):
        return _ids(tokenizer(text, truncation=True, max_length=max_length), max_length)
    from_left = getattr(tokenizer, "truncation_side", "right") == "left"
    chars = CHARS_PER_TOKEN * (max_length + PREFIX_MARGIN)
    while chars < len(text):
        if from_left:
            cut = _cut_before(text, len(text) - chars)
            piece = None if cut is None else text[cut:]
        else:
            cut = _cut_after(text, chars)
            piece = None if cut is None else text[:cut]
        if piece is None:
            break
        if len(tokenizer(piece, add_special_tokens=False)["input_ids"]) >= max_length + PREFIX_MARGIN:
            return _ids(tokenizer(piece, truncation=True, max_length=max_length), max_length)
        chars = 2 * len(piece)
    return _ids(tokenizer(text, truncation=True, max_length=max_length), max_length)


def _cut_after(text: str, at: int) -> int | None:
    """The first index ≥ ``at`` where a run of whitespace begins (None if there is none)."""
    found = _RUN_START.search(text, at)
    return None if found is None else found.start()


def _cut_before(text: str, at: int) -> int | None:
    """The last index ≤ ``at`` where a run of whitespace ends before a word (None if there is none)."""
    window = 1024
    while True:
        low = max(0, at - window)
        last = None
        for found in _RUN_END.finditer(text, low, at + 2):
            if found.start() <= at:
                last = found.start()
        if last is not None or low == 0:
            return last
        window *= 2


def _string_rows(
    texts: list[str], tokenizer: Any, batch_size: int, max_length: int
) -> Iterator[list[list[int]]]:
    """The token ids of ``texts`` (at most ``max_length`` each), ``batch_size`` texts at a time; an empty
    text gives ``[]``."""
    if tokenizer is None:
        raise CaptureInputError(
            "texts are strings but no tokenizer was given: pass tokenizer=AutoTokenizer.from_pretrained(...)"
            " or give token ids (a LongTensor) instead"
        )
    for text in texts:
        if not isinstance(text, str):
            raise CaptureInputError(f"texts must all be strings; found {type(text).__name__}: {text!r:.60}")
    limit = _whole_text_limit(max_length)
    for start in range(0, len(texts), batch_size):
        chunk = texts[start : start + batch_size]
        # Tokenise without padding and pad ourselves: the tokenizer is never modified.
        short = [i for i, t in enumerate(chunk) if len(t) <= limit]
        rows: list[list[int]] = [[] for _ in chunk]
        if short:
            encoded = tokenizer(
                [chunk[i] for i in short], truncation=True, max_length=max_length, padding=False
            )
            for i, row in zip(short, encoded["input_ids"], strict=True):
                rows[i] = _ids({"input_ids": row}, max_length)
        for i, text in enumerate(chunk):
            if len(text) > limit:
                rows[i] = tokenize_truncated(tokenizer, text, max_length)
        yield rows


def _pad_id(tokenizer: Any) -> int:
    pad_id = getattr(tokenizer, "pad_token_id", None)
    return 0 if pad_id is None else int(pad_id)


def _from_strings(texts: list[str], tokenizer: Any, batch_size: int, max_length: int) -> Iterator[Batch]:
    pad_id = _pad_id(tokenizer)
    for rows in _string_rows(texts, tokenizer, batch_size, max_length):
        empty = [i for i, r in enumerate(rows) if not r]
        batch = _pad([r if r else [pad_id] for r in rows], pad_id)
        for i in empty:
            batch.attention_mask[i] = 0
        yield batch


def _by_length(
    texts: list[str],
    tokenizer: Any,
    batch_size: int,
    max_length: int,
    max_tokens: int | None,
    skip_first_token: bool,
) -> Iterator[Batch]:
    pad_id = _pad_id(tokenizer)
    kept: list[list[int]] = []
    last: list[int] | None = None  # the row in which the budget ends
    counted = 0
    for rows in _string_rows(texts, tokenizer, batch_size, max_length):
        for row in rows:
            if not row:
                continue
            counted += len(row) - int(skip_first_token)
            if max_tokens is not None and counted >= max_tokens:
                last = row
                break
            kept.append(row)
        if last is not None:
            break
    kept.sort(key=len)  # stable: rows of one length stay in text order
    if last is not None:
        kept.append(last)  # last, so the budget still ends inside it in row order
    for start in range(0, len(kept), batch_size):
        yield _pad(kept[start : start + batch_size], pad_id)


def length_batches(
    texts: Any,
    tokenizer: Any = None,
    *,
    batch_size: int = 8,
    max_length: int = 512,
    max_tokens: int | None = None,
    skip_first_token: bool = False,
) -> Iterator[Batch]:
    """:func:`iter_batches`, except that strings are batched by length: the texts whose tokens the first
    ``max_tokens`` counted tokens reach (all of them without a budget; a row's first token is not
    counted with ``skip_first_token``) are tokenised, in text order, and their rows grouped shortest
    first, ``batch_size`` at a time, with the row in which the budget ends placed last. The first
    ``max_tokens`` counted tokens in row order are then the same tokens as in text order, but a batch
    holds rows of similar length: natural paragraphs batched in text order are about 40 % padding,
    which a forward computes as it computes real tokens. Empty texts are left out. Token ids and dict
    batches are batched as given.

    >>> class Words:  # a tokenizer: one id per word
    ...     pad_token_id = 0
    ...     def __call__(self, texts, **kwargs):
    ...         return {"input_ids": [[len(w) for w in t.split()] for t in texts]}
    >>> texts = ["a bb ccc dddd", "e", "", "ff gg", "hhh iii jjj", "k l m n o p"]
    >>> [b.input_ids.tolist() for b in length_batches(texts, Words(), batch_size=2, max_tokens=8)]
    [[[1, 0], [2, 2]], [[1, 2, 3, 4], [3, 3, 3, 0]]]
    >>> def positions(read):  # what the forwards compute, padding included
    ...     return sum(b.input_ids.numel() for b in read(texts, Words(), batch_size=2))
    >>> positions(iter_batches), positions(length_batches)
    (24, 18)
    """
    if isinstance(texts, str):
        texts = [texts]
    if not (isinstance(texts, (list, tuple)) and texts and isinstance(texts[0], str)):
        return iter_batches(texts, tokenizer, batch_size=batch_size, max_length=max_length)
    if batch_size < 1 or max_length < 1:
        raise CaptureInputError(f"batch_size and max_length must be ≥ 1 (got {batch_size}, {max_length})")
    return _by_length(list(texts), tokenizer, batch_size, max_length, max_tokens, skip_first_token)


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


_INTEGER = (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8)


def _checked_mapping(i: int, item: Any) -> tuple[torch.Tensor, torch.Tensor]:
    if not isinstance(item, Mapping) or "input_ids" not in item:
        raise CaptureInputError(
            f"batch {i} is a {type(item).__name__}; an iterable of batches must yield dicts "
            "with 'input_ids' (and optionally 'attention_mask')"
        )
    ids = torch.as_tensor(item["input_ids"])
    if ids.dtype not in _INTEGER:
        raise CaptureInputError(f"batch {i}: input_ids must hold integer token ids, got {ids.dtype}")
    if ids.dim() == 1:
        ids = ids.unsqueeze(0)
    if ids.dim() != 2 or ids.numel() == 0:
        raise CaptureInputError(
            f"batch {i}: input_ids must be a non-empty (batch, length) array, got shape {tuple(ids.shape)}"
        )
    raw = item.get("attention_mask")
    if raw is None:
        return ids, torch.ones_like(ids)
    mask = torch.as_tensor(raw)
    if mask.dim() == 1 and torch.as_tensor(item["input_ids"]).dim() == 1:
        mask = mask.unsqueeze(0)
    if tuple(mask.shape) != tuple(ids.shape):
        raise CaptureInputError(
            f"batch {i}: attention_mask has shape {tuple(mask.shape)} but input_ids has shape "
            f"{tuple(ids.shape)}; give one mask entry per token id, in the same (batch, length) layout"
        )
    if mask.dtype.is_complex or not bool(((mask == 0) | (mask == 1)).all()):
        raise CaptureInputError(
            f"batch {i}: attention_mask must hold only 0 (padding) and 1 (real token); "
            f"found values {sorted({float(v) for v in mask.unique()[:6].tolist()})}"
        )
    return ids, mask


def _first_columns(
    ids: torch.Tensor, mask: torch.Tensor, max_length: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of a dict batch cut to ``max_length`` columns from its first real token (the last
    ``max_length`` columns where fewer remain): a row padded on the left keeps its first ``max_length``
    real tokens, as one padded on the right does (a cut at column ``max_length`` would keep its padding
    and lose real tokens).

    >>> ids = torch.tensor([[1, 2, 3, 4], [0, 0, 5, 6], [0, 7, 8, 9], [0, 0, 0, 5]])
    >>> [t.tolist() for t in _first_columns(ids, (ids > 0).long(), 2)]
    [[[1, 2], [5, 6], [7, 8], [0, 5]], [[1, 1], [1, 1], [1, 1], [0, 1]]]
    """
    width = int(ids.shape[1])
    if width <= max_length:
        return ids, mask
    real = mask.bool()
    first = torch.where(real.any(1), real.int().argmax(1), 0)  # (argmax: the first real column)
    index = first.clamp(max=width - max_length).unsqueeze(1) + torch.arange(max_length, device=ids.device)
    return ids.gather(1, index), mask.gather(1, index)


def _from_mappings(batches: Iterable[Any], batch_size: int, max_length: int) -> Iterator[Batch]:
    for i, item in enumerate(batches):
        ids, mask = _checked_mapping(i, item)
        ids, mask = _first_columns(ids.long().cpu(), mask.long().cpu(), max_length)
        for start in range(0, ids.shape[0], batch_size):
            yield Batch(ids[start : start + batch_size], mask[start : start + batch_size])


def first_tokens(batches: list[Batch], max_tokens: int | None) -> list[Batch]:
    """The first ``max_tokens`` real tokens of ``batches``, in row order; the rows and the trailing
    columns left with no real token are cut away (padding need not be computed: a 512-token row scored
    on its first 64 tokens would cost eight times what it measures).

    >>> ids = torch.arange(1, 21).reshape(2, 10)
    >>> [b.input_ids.tolist() for b in first_tokens([Batch(ids, torch.ones_like(ids))], 6)]
    [[[1, 2, 3, 4, 5, 6]]]
    """
    if max_tokens is None:
        return batches
    out, left = [], int(max_tokens)
    for batch in batches:
        if left <= 0:
            break
        mask = batch.attention_mask.clone()
        real = mask.sum(-1)
        for row in range(mask.shape[0]):
            n = int(real[row])
            if n > left:  # keep this row's first `left` real tokens, drop the rest
                idx = torch.nonzero(mask[row]).flatten()
                mask[row, idx[left:]] = 0
                n = left
            left -= n
        keep = mask.sum(-1) > 0
        ids, mask = batch.input_ids[keep], mask[keep]
        width = int(mask.any(0).nonzero()[-1]) + 1 if bool(keep.any()) else 0
        out.append(Batch(ids[:, :width], mask[:, :width]))
    return out


def iter_batches(
    texts: Any, tokenizer: Any = None, *, batch_size: int = 8, max_length: int = 512
) -> Iterator[Batch]:
    """Batches of at most ``batch_size`` rows and ``max_length`` positions (each text, or each row of a
    dict batch whether padded on the left or the right, keeps its first ``max_length`` tokens).

    ``texts`` is a string, a list of strings, a LongTensor of ids, or an iterable of dict batches
    (a dict batch with more rows is split).

    >>> b = next(iter_batches(torch.tensor([[5, 6, 7]])))
    >>> b.input_ids.tolist(), b.attention_mask.tolist()
    ([[5, 6, 7]], [[1, 1, 1]])
    >>> [b.input_ids.shape[0] for b in iter_batches([{"input_ids": torch.ones(5, 3, dtype=torch.long)}],
    ...                                               batch_size=2)]
    [2, 2, 1]
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
            return _from_mappings(texts, batch_size, max_length)
        raise CaptureInputError(
            f"a list of texts must hold strings or dict batches, not {type(texts[0]).__name__}"
        )
    if isinstance(texts, Iterable):
        return _from_mappings(texts, batch_size, max_length)
    raise CaptureInputError(
        f"cannot capture from {type(texts).__name__}: pass a string, a list of strings (with a "
        "tokenizer), a LongTensor of token ids, or an iterable of dicts with 'input_ids'"
    )
