"""Per converted layer: how far the variant's attention output is from the original's, teacher-forced.

For layer ℓ, ``h`` is the original model's hidden state entering ℓ's attention, and the error is
``‖attn_variant(h) − attn_model(h)‖_F / ‖attn_model(h)‖_F`` over the real tokens of the evaluation
batches. One forward of the original does it for every layer: a hook on each converted layer's
attention of the original calls the variant's attention of that layer on the same arguments (hidden
states, mask, positions, rotary embeddings) and sums the squares in float64. The hooks see only this
thread's forwards of the original's working copy.

Example:
    >>> import torch, headwidget
    >>> from transformers import LlamaConfig, LlamaForCausalLM
    >>> from headwidget.capture.inputs import Batch
    >>> model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64,
    ...     num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2)).eval()
    >>> batch = Batch(torch.randint(0, 64, (2, 8)), torch.ones(2, 8, dtype=torch.long))
    >>> errors = AttentionErrors([1])
    >>> errors.measure(model, headwidget.apply(model, "mqa", layers=[1]), [batch])
    >>> errors.values()[0] > 0, AttentionErrors([0]).values()
    (True, [nan])
"""

from __future__ import annotations

import math
import threading
from collections.abc import Sequence
from typing import Any

import torch
from torch import nn

from headwidget.adapters import adapter_for
from headwidget.capture.inputs import Batch
from headwidget.evaluation.running import first_tensor, forward_kwargs

__all__ = ["AttentionErrors"]

F64 = torch.float64


class AttentionErrors:
    """Float64 sums of the squared attention-output difference and reference, per layer."""

    def __init__(self, layers: Sequence[int]) -> None:
        self.layers = list(layers)
        self.diff_sq = [0.0] * len(self.layers)
        self.ref_sq = [0.0] * len(self.layers)

    def values(self) -> list[float]:
        """The relative error of each layer (NaN where the original's outputs were all zero)."""
        return [
            math.sqrt(d / r) if r > 0 else math.nan for d, r in zip(self.diff_sq, self.ref_sq, strict=True)
        ]

    @torch.no_grad()
    def measure(self, original: nn.Module, variant: nn.Module, batches: Sequence[Batch]) -> None:
        """Add ``batches``: one forward of ``original``, each layer's variant attention on its inputs."""
        ours, theirs = adapter_for(original), adapter_for(variant)
        owner = threading.get_ident()
        device = next(original.parameters()).device
        real: list[torch.Tensor] = []

        def hook_for(i: int, other: nn.Module) -> Any:
            def hook(_m: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], output: Any) -> None:
                if threading.get_ident() != owner:
                    return
                ref = first_tensor(output)
                out = first_tensor(other(*args, **kwargs))
                if ref is None or out is None:
                    raise RuntimeError("an attention module returned no tensor")
                mask = real[0]
                r, o = ref[mask].to(F64), out[mask].to(F64)
                self.diff_sq[i] += float((o - r).square().sum())
                self.ref_sq[i] += float(r.square().sum())

            return hook

        handles = [
            ours.attention_at(layer).register_forward_hook(
                hook_for(i, theirs.attention_at(layer)), with_kwargs=True
            )
            for i, layer in enumerate(self.layers)
        ]
        try:
            for batch in batches:
                real[:] = [batch.attention_mask.bool().to(device)]
                original(**forward_kwargs(original, batch, device))
        finally:
            for handle in handles:
                handle.remove()

    def merge(self, totals: list[float]) -> None:
        """Replace the sums by ``totals`` (``diff_sq`` then ``ref_sq``, as :meth:`flat` gives them)."""
        n = len(self.layers)
        self.diff_sq, self.ref_sq = list(totals[:n]), list(totals[n:])

    def flat(self) -> list[float]:
        return [*self.diff_sq, *self.ref_sq]
