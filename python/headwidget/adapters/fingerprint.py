"""A weight fingerprint: a short hash of a few projection rows per layer, telling one model's weights
from another's of the same architecture (a base model from its fine-tune).

:func:`weight_fingerprint` hashes, for each of the given layers, the rows the adapter names in
:meth:`~headwidget.adapters.Adapter.fingerprint_rows` (the first row of the first and of the last head
of the query, key and value projections, and their biases): a few kilobytes per layer, never a whole
weight matrix.

The rows are hashed in a form that does not depend on the dtype the weights are held in: each value is
taken to float32, rounded to bfloat16 (round to nearest even), and values at most ``2**-14`` in
magnitude (below float16's normal range) count as zero. So the same weights held in float32, float64
or bfloat16 (a model cast to bfloat16 for evaluation), and bfloat16 weights held in float16, give the
same fingerprint, on any device. A float16 *copy* of float32 weights rounds each value on its own
grid and does not (it reads as other weights): compare statistics against the model as it was loaded,
which is what :func:`~headwidget.evaluation.evaluate` does before it casts its copy to ``dtype``.

Example:
    >>> import copy, torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> from headwidget.adapters import adapter_for
    >>> gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=2, n_head=4))
    >>> mine = weight_fingerprint(adapter_for(gpt2), [0, 1])
    >>> len(mine), weight_fingerprint(adapter_for(copy.deepcopy(gpt2).to(torch.bfloat16)), [0, 1]) == mine
    (16, True)
    >>> before = [weight_fingerprint(adapter_for(gpt2), [layer]) for layer in (0, 1)]
    >>> with torch.no_grad():
    ...     gpt2.transformer.h[1].attn.c_attn.weight[0, 32] += 0.1  # in the first key row of layer 1
    >>> [weight_fingerprint(adapter_for(gpt2), [layer]) == was for layer, was in zip((0, 1), before)]
    [True, False]
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from headwidget.adapters.base import Adapter

__all__ = ["FLUSH", "canonical_rows", "weight_fingerprint"]

#: Values at most this large in magnitude hash as zero (float16's smallest normal number).
FLUSH = 2.0**-14


def canonical_rows(rows: torch.Tensor) -> torch.Tensor:
    """``rows`` on the CPU as the fingerprint hashes them: bfloat16, values ``|x| <= FLUSH`` as +0.

    >>> canonical_rows(torch.tensor([1.0 + 2**-9, 1e-5, -0.0, 3.0], dtype=torch.float64)).tolist()
    [1.0, 0.0, 0.0, 3.0]
    """
    x = rows.detach().to("cpu").to(torch.float32).to(torch.bfloat16)
    return torch.where(x.abs() <= FLUSH, torch.zeros_like(x), x)


def weight_fingerprint(adapter: Adapter, layers: Iterable[int]) -> str | None:
    """16 hexadecimal digits identifying the weights of ``layers`` (see the module docstring).

    None when a layer's rows cannot be read (:meth:`~headwidget.adapters.Adapter.fingerprint_rows`:
    quantised or offloaded weights): such weights have no fingerprint.
    """
    digest = hashlib.sha256()
    for layer in layers:
        rows = adapter.fingerprint_rows(layer)
        if rows is None:
            return None
        for name, t in rows.items():
            x = canonical_rows(t)
            digest.update(f"{layer}.{name}{tuple(x.shape)}".encode())
            digest.update(x.view(torch.int16).numpy().astype("<i2").tobytes())
    return digest.hexdigest()[:16]
