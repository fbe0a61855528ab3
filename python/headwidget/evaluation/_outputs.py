"""Run a model on an evaluation batch and keep what the measures read; say where outputs go non-finite.

A causal language model gives the logits of its predicted positions (position t predicting token t + 1
of the same row, both real) and their targets; an encoder (BERT/MiniLM: no language-model head) its
last hidden states with the attention mask.

The language-model head computes only the predicted positions: while the runner's forward runs, a
hook on the model's output embeddings (in the runner's thread only) hands the head the hidden states
of those rows, so the forward returns their ``(N, V)`` logits and no ``(B, T, V)`` logits of the whole
batch exist, nor a copy of the rows picked out of them (under ``stride:W/S``, where a window scores S
of its W tokens, that is W/S times less). What the model does to the head's output (a logit scale,
soft-capping) still applies, row by row. A model whose head is not called on the ``(B, T, d)`` hidden
states gets its full logits, and the rows are picked out of them.

Example:
    >>> import torch
    >>> from transformers import GPT2Config, GPT2LMHeadModel
    >>> from headwidget.capture.inputs import Batch
    >>> gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_embd=32, n_layer=1, n_head=4)).eval()
    >>> run = OutputRunner.for_model(gpt2)
    >>> out = run(gpt2, Batch(torch.tensor([[3, 4, 5]]), torch.tensor([[1, 1, 0]])))
    >>> run.kind, tuple(out.values.shape), out.targets.tolist()
    ('causal-lm', (1, 64), [4])
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
from torch import nn

from headwidget.adapters import Adapter, adapter_for
from headwidget.capture.inputs import Batch
from headwidget.errors import NonFiniteLogitsError
from headwidget.evaluation._inputs import forward_kwargs
from headwidget.evaluation._layers import LayerBlocks, first_tensor
from headwidget.evaluation.measures import predicted_positions

__all__ = ["BatchOutput", "OutputRunner", "predicted_logits", "raise_non_finite"]


@dataclass
class BatchOutput:
    """Logits rows (N, V) and targets (N,) of a language model, or hidden states (B, T, D) and the
    mask of an encoder (``targets`` None)."""

    values: torch.Tensor
    targets: torch.Tensor | None
    mask: torch.Tensor | None = None

    def finite(self) -> bool:
        if self.mask is None:
            return all_finite(self.values)
        return all_finite(self.values[self.mask.bool().to(self.values.device)])


def all_finite(values: torch.Tensor) -> bool:
    """Whether no value is NaN or ±inf: one pass for the extremes (NaN propagates to both), no
    boolean copy of the tensor (20× faster than ``isfinite(values).all()`` on a batch of logits).

    >>> all_finite(torch.tensor([1.0, -2.0])), all_finite(torch.tensor([1.0, float("nan")]))
    (True, False)
    >>> all_finite(torch.tensor([-float("inf"), 0.0])), all_finite(torch.empty(0))
    (False, True)
    """
    if values.numel() == 0 or not values.is_floating_point():
        return True
    low, high = torch.aminmax(values)
    return bool(torch.isfinite(low) & torch.isfinite(high))


@dataclass(frozen=True)
class OutputRunner:
    """How to read the measured outputs of one kind of model (``"causal-lm"`` or ``"encoder"``)."""

    kind: str
    device: torch.device

    @classmethod
    def for_model(cls, model: nn.Module, *, adapter: Adapter | None = None) -> OutputRunner:
        adapter = adapter or adapter_for(model)
        get_head = getattr(model, "get_output_embeddings", None)
        has_head = callable(get_head) and get_head() is not None
        kind = "causal-lm" if adapter.causal and has_head else "encoder"
        return cls(kind, next(model.parameters()).device)

    @torch.no_grad()
    def __call__(self, model: nn.Module, batch: Batch) -> BatchOutput:
        if self.kind != "causal-lm":
            out = model(**forward_kwargs(model, batch, self.device))
            hidden = getattr(out, "last_hidden_state", None)
            if hidden is None:
                hidden = out[0]
            return BatchOutput(hidden, None, batch.attention_mask)
        keep = predicted_positions(batch.attention_mask, batch.scored).to(self.device)
        targets = batch.input_ids.to(self.device)[:, 1:][keep]
        return BatchOutput(predicted_logits(model, forward_kwargs(model, batch, self.device), keep), targets)


def predicted_logits(model: nn.Module, kwargs: dict[str, Any], keep: torch.Tensor) -> torch.Tensor:
    """The logits (N, V) of the positions ``keep`` (B, T − 1) marks, of ``model(**kwargs)`` on T tokens a
    row: its head computes those rows alone (module docstring)."""
    with _head_on_rows(model, keep) as picked:
        logits = model(**kwargs).logits
    if picked and logits.shape[:2] == (1, int(keep.sum())):
        return logits[0]
    if picked:  # the model reshaped what its head gave: run it whole
        logits = model(**kwargs).logits
    return logits[:, :-1][keep]


@contextmanager
def _head_on_rows(model: nn.Module, keep: torch.Tensor) -> Iterator[list[bool]]:
    """Inside, the output embeddings of ``model`` (its LM head), called in this thread on hidden states
    (B, T, d) with ``keep`` (B, T − 1), get the predicted rows (1, N, d) instead; the list it yields
    says whether they did."""
    get_head = getattr(model, "get_output_embeddings", None)
    head = get_head() if callable(get_head) else None
    picked: list[bool] = []
    if not isinstance(head, nn.Module):
        yield picked
        return
    thread = threading.get_ident()
    rows, width = keep.shape

    def pick(module: nn.Module, args: tuple[Any, ...]) -> tuple[Any, ...] | None:
        hidden = args[0] if args else None
        if (
            threading.get_ident() != thread
            or picked
            or not isinstance(hidden, torch.Tensor)
            or hidden.ndim != 3
            or tuple(hidden.shape[:2]) != (rows, width + 1)
        ):
            return None
        picked.append(True)
        return (hidden[:, :-1][keep.to(hidden.device)].unsqueeze(0), *args[1:])

    handle = head.register_forward_pre_hook(pick)
    try:
        yield picked
    finally:
        handle.remove()


@torch.no_grad()
def _first_non_finite_layer(model: nn.Module, batch: Batch, device: torch.device) -> int | None:
    blocks = LayerBlocks.of(model, adapter_for(model))
    sink: list[object] = []
    with blocks.recording(model, sink):
        model(**forward_kwargs(model, batch, device))
    real = batch.attention_mask.bool().to(device)
    for layer, output in enumerate(sink):
        hidden = first_tensor(output)
        if hidden is not None and not bool(torch.isfinite(hidden[real]).all()):
            return layer
    return None


def raise_non_finite(model: nn.Module, batch: Batch, device: torch.device, spec: str, converted: str) -> None:
    """Raise :class:`NonFiniteLogitsError` for variant ``spec`` on ``batch``, naming the first layer
    whose output is not finite at a real token."""
    layer = _first_non_finite_layer(model, batch, device)
    where = (
        f"the hidden states first become non-finite at the output of layer {layer}"
        if layer is not None
        else "every layer's output is finite, so the final norm or the head overflows"
    )
    dtype = next((p.dtype for p in model.parameters() if p.is_floating_point()), torch.float32)
    if dtype.itemsize >= 4:  # (not rounding: a padded batch the model's own code cannot take, say)
        advice = (
            f"It ran in {str(dtype).removeprefix('torch.')}, so this is not overflow from a narrow dtype: "
            "try the texts one at a time or without padding (batch_size=1), or convert fewer layers "
            "(layers=[...])"
        )
    else:
        advice = "Evaluate in a wider dtype (dtype=torch.float32), or convert fewer layers (layers=[...])"
    raise NonFiniteLogitsError(f"variant {spec!r} ({converted}) gives non-finite outputs: {where}. {advice}")
