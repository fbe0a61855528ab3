"""What a capture gives a model: the checks of a batch's token ids, and the call of one forward pass.

:func:`check_batch_ids` is the one token-id check of the package: a capture runs it on each batch, and
evaluation, allocation and healing on theirs before any forward (an embedding would raise a bare
``IndexError``).

Example:
    >>> import torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> from headwidget.capture.inputs import Batch
    >>> feed = ModelFeed.of(GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)))
    >>> feed.vocab, sorted(feed.call(Batch(torch.ones(1, 3, dtype=torch.long), torch.ones(1, 3)), 0))
    (50, ['attention_mask', 'input_ids', 'use_cache'])
    >>> feed.check_ids(Batch(torch.tensor([[3, 50]]), torch.ones(1, 2)), 4)
    Traceback (most recent call last):
    ...
    headwidget.errors.CaptureInputError: batch 4: its largest token id is 50, but GPT2LMHeadModel's ...
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headwidget.capture.inputs import Batch
from headwidget.capture.plan import module_device
from headwidget.errors import CaptureInputError

__all__ = ["ModelFeed", "check_batch_ids", "vocab_size"]


def _embeddings(model: nn.Module) -> Any:
    get_embeddings = getattr(model, "get_input_embeddings", None)
    return get_embeddings() if callable(get_embeddings) else None


def vocab_size(model: nn.Module) -> int | None:
    """The number of token ids ``model`` embeds (its input embedding's, else its config's), or None."""
    embeddings = _embeddings(model)
    if isinstance(embeddings, nn.Embedding):
        return int(embeddings.num_embeddings)
    size = getattr(getattr(model, "config", None), "vocab_size", None)
    return int(size) if size else None


def check_batch_ids(batch: Batch, number: int, vocab: int | None, model: nn.Module) -> None:
    """Refuse batch ``number``'s token ids if one is negative or at least ``vocab`` (None: no bound).

    Raises:
        CaptureInputError: the message names the batch, the id and the vocabulary size.
    """
    ids = batch.input_ids
    low, high = int(ids.min()), int(ids.max())
    name = type(model).__name__
    if low < 0:
        raise CaptureInputError(
            f"batch {number}: its smallest token id is {low}, but token ids cannot be negative "
            "(-100 marks ignored labels, not inputs). Pad input_ids with the tokenizer's pad_token_id "
            "and mark the padding with attention_mask 0"
        )
    if vocab is not None and high >= vocab:
        raise CaptureInputError(
            f"batch {number}: its largest token id is {high}, but {name}'s vocabulary has {vocab} ids "
            f"(0..{vocab - 1}). Tokenize with this model's own tokenizer"
        )


@dataclass(frozen=True)
class ModelFeed:
    """A model's forward as a capture calls it: the device its inputs go to, the keywords its
    ``forward`` takes (``position_ids`` for left-padded rows, ``use_cache=False`` where it has a cache)
    and its vocabulary size."""

    model: nn.Module
    device: torch.device
    takes: frozenset[str]
    vocab: int | None

    @classmethod
    def of(cls, model: nn.Module) -> ModelFeed:
        embeddings = _embeddings(model)
        device = module_device(embeddings if isinstance(embeddings, nn.Module) else model)
        takes = frozenset(inspect.signature(model.forward).parameters)
        return cls(model, device, takes, vocab_size(model))

    def check_ids(self, batch: Batch, number: int) -> None:
        """:func:`check_batch_ids` with this model's vocabulary."""
        check_batch_ids(batch, number, self.vocab, self.model)

    def call(self, batch: Batch, number: int) -> dict[str, Any]:
        """The keyword arguments of batch ``number``'s forward pass, its tensors on :attr:`device`.

        Raises:
            CaptureInputError: the batch is left-padded (or has gaps) and ``forward`` takes no
                ``position_ids``.
        """
        tensors = {"input_ids": batch.input_ids, "attention_mask": batch.attention_mask}
        positions = batch.position_ids()
        if positions is not None:
            if "position_ids" not in self.takes:
                raise CaptureInputError(
                    f"batch {number} is left-padded (or has gaps), but {type(self.model).__name__}.forward "
                    "takes no position_ids, so its real tokens would sit at shifted positions. "
                    "Pad on the right"
                )
            tensors["position_ids"] = positions
        call: dict[str, Any] = {k: v.to(self.device) for k, v in tensors.items()}
        if "use_cache" in self.takes:
            call["use_cache"] = False
        return call
