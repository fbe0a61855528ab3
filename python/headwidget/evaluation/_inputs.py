"""Evaluation batches: the texts as padded batches, the token budget, positions and a fingerprint.

Positions are derived from the attention mask (:func:`position_ids_from_mask`): each real token's
position is the number of real tokens before it in its row, so a left-padded row is computed exactly as
the same row right-padded or unpadded. (The capture code has its own copy of this rule; evaluation keeps
this small helper so that the two layers stay independent.)

Example:
    >>> import torch
    >>> position_ids_from_mask(torch.tensor([[0, 0, 1, 1], [1, 1, 1, 0]])).tolist()
    [[0, 0, 0, 1], [0, 1, 2, 2]]
    >>> batches = evaluation_batches(torch.arange(1, 21).reshape(2, 10), max_tokens=13)
    >>> [int(b.attention_mask.sum()) for b in batches], predicted_count(batches)
    ([13], 11)
    >>> evaluation_batches(torch.arange(1, 21).reshape(2, 10), max_tokens=6)[0].input_ids.tolist()
    [[1, 2, 3, 4, 5, 6]]
"""

from __future__ import annotations

import hashlib
import inspect
import re
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from headwidget.capture.inputs import Batch, first_tokens, iter_batches, length_batches
from headwidget.errors import ArgumentError, CaptureInputError, EvaluationInputError
from headwidget.evaluation.measures import predicted_positions

__all__ = [
    "PROTOCOL_FORMS",
    "Protocol",
    "check_window",
    "chunk_batches",
    "evaluation_batches",
    "fingerprint",
    "forward_kwargs",
    "parse_protocol",
    "position_ids_from_mask",
    "predicted_count",
    "stride_batches",
    "token_stream",
]


def position_ids_from_mask(attention_mask: torch.Tensor) -> torch.Tensor:
    """(B, T) positions: the count of real tokens before each position in its row (padding gets the
    position of its neighbour; it is never read)."""
    return (attention_mask.long().cumsum(-1) - 1).clamp(min=0)


def predicted_count(batches: list[Batch]) -> int:
    """How many tokens are predicted (a real, scored token following a real token) over ``batches``."""
    return sum(int(predicted_positions(b.attention_mask, b.scored).sum()) for b in batches)


def evaluation_batches(
    texts: Any,
    tokenizer: Any = None,
    *,
    batch_size: int = 8,
    max_length: int = 512,
    max_tokens: int | None = None,
    min_tokens: int = 2,
) -> list[Batch]:
    """The evaluation texts as batches (the forms ``capture`` accepts), cut to ``max_tokens`` real tokens
    (the first ones in text order; strings are then batched by length, as
    :func:`~headwidget.capture.inputs.length_batches` says).

    Raises:
        CaptureInputError: a form of ``texts`` that cannot be read.
        EvaluationInputError: no sequence has ``min_tokens`` real tokens (two for a language model,
            whose first token is never predicted).
    """
    read = length_batches(
        texts, tokenizer, batch_size=batch_size, max_length=max_length, max_tokens=max_tokens
    )
    batches = [b for b in first_tokens(list(read), max_tokens) if int(b.attention_mask.sum())]
    longest = max((int(b.attention_mask.sum(-1).max()) for b in batches), default=0)
    if longest < min_tokens:
        raise EvaluationInputError(
            f"the evaluation texts give at most {longest} real token(s) per sequence; a measure needs "
            f"sequences of at least {min_tokens} tokens (a sequence's first token is not predicted): "
            "give longer texts or raise max_tokens"
        )
    return batches


#: What :func:`parse_protocol` reads.
PROTOCOL_FORMS = (
    "'documents', 'chunks:W' (W a whole number of tokens, e.g. 'chunks:2048'), 'prefill:P' (each "
    "document's first P tokens prefill a KV cache, the rest are scored from it, e.g. 'prefill:256') or "
    "'stride:W/S' (windows of W tokens moved S at a time, e.g. 'stride:1024/512')"
)
#: The text between documents when strings are joined into one stream (``chunks:W``, ``stride:W/S``).
CHUNK_SEPARATOR = "\n\n"


@dataclass(frozen=True)
class Protocol:
    """How the evaluation texts become scored sequences: ``documents`` (each text its own sequences, up
    to ``max_length``), ``chunks:W`` (one stream cut into windows of W), ``stride:W/S`` (windows of W
    every S tokens, each scoring its new tokens) or ``prefill:P`` (documents whose first P tokens
    prefill a KV cache: :mod:`headwidget.evaluation._prefill`)."""

    kind: str
    window: int | None = None
    stride: int | None = None
    prefill: int | None = None

    @property
    def text(self) -> str:
        """The canonical form, as a report records it."""
        if self.kind == "documents":
            return "documents"
        if self.kind == "chunks":
            return f"chunks:{self.window}"
        if self.kind == "prefill":
            return f"prefill:{self.prefill}"
        return f"stride:{self.window}/{self.stride}"


def parse_protocol(protocol: Any) -> Protocol:
    """The :class:`Protocol` a protocol string names.

    >>> parse_protocol("chunks:2048").window, parse_protocol("documents").text
    (2048, 'documents')
    >>> parse_protocol(" Stride:1024/256 ")
    Protocol(kind='stride', window=1024, stride=256, prefill=None)
    >>> parse_protocol("prefill:256").text
    'prefill:256'
    """
    if isinstance(protocol, str):
        text = protocol.strip().lower()
        if text == "documents":
            return Protocol("documents")
        m = re.fullmatch(r"chunks:([0-9]{1,9})", text)
        if m and int(m.group(1)) >= 2:
            return Protocol("chunks", int(m.group(1)))
        m = re.fullmatch(r"prefill:([0-9]{1,9})", text)
        if m and int(m.group(1)) >= 1:
            return Protocol("prefill", prefill=int(m.group(1)))
        m = re.fullmatch(r"stride:([0-9]{1,9})/([0-9]{1,9})", text)
        if m:
            window, stride = int(m.group(1)), int(m.group(2))
            if window >= 2 and 1 <= stride <= window:
                return Protocol("stride", window, stride)
            raise ArgumentError(
                f"protocol {protocol!r}: a stride:W/S window needs W ≥ 2 and 1 ≤ S ≤ W (S tokens are new in "
                f"each window of W), got W = {window}, S = {stride}"
            )
    raise ArgumentError(f"protocol must be {PROTOCOL_FORMS}, with W ≥ 2 and P ≥ 1; got {protocol!r}")


def token_stream(texts: Any, tokenizer: Any, max_tokens: int | None) -> torch.Tensor:
    """Every real token of ``texts`` as one stream, its first ``max_tokens`` (all for None): strings
    joined by :data:`CHUNK_SEPARATOR` and tokenized once; token ids (and dict batches) row after row,
    padding left out."""
    stream = _whole_stream(texts, tokenizer)
    return stream if max_tokens is None else stream[: int(max_tokens)]


def _whole_stream(texts: Any, tokenizer: Any) -> torch.Tensor:
    if isinstance(texts, str):
        texts = [texts]
    if isinstance(texts, (list, tuple)) and texts and all(isinstance(t, str) for t in texts):
        if tokenizer is None:
            raise CaptureInputError(
                "strings need a tokenizer: pass tokenizer=AutoTokenizer.from_pretrained(...)"
            )
        ids = tokenizer(CHUNK_SEPARATOR.join(texts), return_tensors="pt")["input_ids"]
        return torch.as_tensor(ids, dtype=torch.long).reshape(-1)
    rows = [
        ids[mask.bool()]
        for batch in iter_batches(texts, tokenizer, batch_size=64, max_length=2**31 - 1)
        for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True)
    ]
    return torch.cat(rows) if rows else torch.zeros(0, dtype=torch.long)


def check_window(protocol: Protocol, context: int | None) -> None:
    """Refuse a ``chunks:W`` or ``stride:W/S`` window longer than the model's context (``context``
    positions; None: no limit known)."""
    window = protocol.window
    if window is not None and context is not None and window > context:
        stride = None if protocol.stride is None else min(protocol.stride, context)
        shorter = replace(protocol, window=context, stride=stride).text
        raise EvaluationInputError(
            f"protocol {protocol.text} cuts windows of {window} tokens, longer than the model's context of "
            f"{context} positions; use {shorter} or less"
        )


def chunk_batches(
    texts: Any, tokenizer: Any, window: int, *, batch_size: int, max_tokens: int | None, context: int | None
) -> list[Batch]:
    """``texts`` as one token stream cut into non-overlapping windows of ``window`` tokens, each scored
    whole, a final partial window dropped (the GPTQ-style WikiText-2 protocol).

    >>> [b.input_ids.tolist() for b in chunk_batches(torch.arange(1, 8).reshape(1, 7), None, 3,
    ...                                               batch_size=8, max_tokens=None, context=None)]
    [[[1, 2, 3], [4, 5, 6]]]

    Raises:
        EvaluationInputError: a window longer than the model's context (``context``), or texts with
            fewer than ``window`` tokens.
    """
    check_window(Protocol("chunks", window), context)
    stream = token_stream(texts, tokenizer, max_tokens)
    count = stream.numel() // window
    if count == 0:
        raise EvaluationInputError(
            f"protocol chunks:{window}: the texts give {stream.numel()} tokens, not one whole window of "
            f"{window}; give more text (or raise max_tokens) or use a shorter window"
        )
    windows = stream[: count * window].reshape(count, window)
    return [
        Batch(windows[i : i + batch_size].clone(), torch.ones_like(windows[i : i + batch_size]))
        for i in range(0, count, batch_size)
    ]


def stride_batches(
    texts: Any,
    tokenizer: Any,
    window: int,
    stride: int,
    *,
    batch_size: int,
    max_tokens: int | None,
    context: int | None,
) -> list[Batch]:
    """``texts`` as one token stream read by a sliding window (the perplexity guide of transformers):
    windows of ``window`` tokens starting every ``stride`` tokens, the last one ending at the stream's
    end; the first window scores all its tokens but its first, each later one only the tokens no earlier
    window reached (its last ``stride``, fewer at the end). So every token but the stream's first is
    scored exactly once, from up to ``window − 1`` tokens of context. With ``stride == window`` a window
    would start at its first new token, which has no context there (the guide leaves it unscored): each
    window after the first starts one token earlier instead, so windows start every ``window − 1``
    tokens. Rows are right-padded; ``scored`` marks the scored tokens.

    >>> batches = stride_batches(torch.arange(1, 8).reshape(1, 7), None, 4, 2, batch_size=8,
    ...                          max_tokens=None, context=None)
    >>> batches[0].input_ids.tolist(), batches[0].scored.tolist()
    ([[1, 2, 3, 4], [3, 4, 5, 6], [5, 6, 7, 0]], [[0, 1, 1, 1], [0, 0, 1, 1], [0, 0, 1, 0]])
    >>> batches = stride_batches(torch.arange(1, 8).reshape(1, 7), None, 3, 3, batch_size=8,
    ...                          max_tokens=None, context=None)
    >>> batches[0].input_ids.tolist(), batches[0].scored.tolist()
    ([[1, 2, 3], [3, 4, 5], [5, 6, 7]], [[0, 1, 1], [0, 1, 1], [0, 1, 1]])

    Raises:
        EvaluationInputError: a window longer than the model's context (``context``), or texts with
            fewer than two tokens.
    """
    check_window(Protocol("stride", window, stride), context)
    stream = token_stream(texts, tokenizer, max_tokens)
    n = stream.numel()
    if n < 2:
        raise EvaluationInputError(
            f"protocol stride:{window}/{stride}: the texts give {n} token(s); a measure needs at least 2 "
            "(the first token is never predicted): give more text or raise max_tokens"
        )
    rows: list[tuple[torch.Tensor, int]] = []  # a window's ids and the index of its first scored token
    begin = reached = 0
    while True:
        end = min(begin + window, n)
        rows.append((stream[begin:end], max(reached - begin, 1)))
        reached = end
        if end == n:
            break
        begin = min(begin + stride, reached - 1)  # S = W: one token of context for the first new one
    out = []
    for i in range(0, len(rows), batch_size):
        group = rows[i : i + batch_size]
        width = max(ids.numel() for ids, _ in group)
        ids = torch.zeros((len(group), width), dtype=torch.long)
        mask = torch.zeros_like(ids)
        scored = torch.zeros_like(ids)
        for r, (row, first) in enumerate(group):
            ids[r, : row.numel()] = row
            mask[r, : row.numel()] = 1
            scored[r, first : row.numel()] = 1
        out.append(Batch(ids, mask, scored))
    return out


def fingerprint(batches: list[Batch]) -> str:
    """A short hash of the real token ids of every sequence, in order (padding and layout ignored).

    >>> a = Batch(torch.tensor([[5, 6, 0]]), torch.tensor([[1, 1, 0]]))
    >>> b = Batch(torch.tensor([[0, 5, 6]]), torch.tensor([[0, 1, 1]]))
    >>> fingerprint([a]) == fingerprint([b]), len(fingerprint([a]))
    (True, 16)
    """
    digest = hashlib.sha256()
    for batch in batches:
        for ids, mask in zip(batch.input_ids, batch.attention_mask, strict=True):
            row = ids[mask.bool()].to(torch.int64).numpy()
            digest.update(len(row).to_bytes(8, "little"))
            digest.update(row.tobytes())
    return digest.hexdigest()[:16]


def forward_kwargs(model: nn.Module, batch: Batch, device: torch.device) -> dict[str, Any]:
    """Keyword arguments for ``model(**kwargs)`` on ``batch``: ids, mask, positions from the mask
    (when the forward takes ``position_ids``) and ``use_cache=False`` (when it takes ``use_cache``)."""
    params = inspect.signature(model.forward).parameters
    kwargs: dict[str, Any] = {
        "input_ids": batch.input_ids.to(device),
        "attention_mask": batch.attention_mask.to(device),
    }
    if "position_ids" in params:
        kwargs["position_ids"] = position_ids_from_mask(batch.attention_mask).to(device)
    if "use_cache" in params:
        kwargs["use_cache"] = False
    return kwargs
