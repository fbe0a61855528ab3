"""The output head and the healing loss run on chunks of rows: a batch's logits are never whole.

A language model's healing loss reads the logits of every predicted position: ``B·T·V`` numbers for
each of the student and the teacher (8.4 GB apiece for Llama-3-8B's vocabulary at 8×2048 tokens in
float32), and as many again for their gradient. Here the head runs on the final hidden states a chunk of
rows at a time (:func:`chunk_rows`). For each chunk, inside the forward pass:

1. the student's logits of the chunk (through the head as the model computes them: its linear map and
   any scaling or soft-capping, :class:`OutputHead`), and for ``kd`` the teacher's;
2. the loss rows in float32 (float64 for float64 logits), summed in float64 with their weights (each
   predicted row ``1/N``), and the gradient of the loss with respect to the student's logits, which has a
   closed form: ``w·(softmax(s) − softmax(t))`` for the KL, ``w·(softmax(s) − onehot(y))`` for the
   cross-entropy;
3. that gradient carried through the head by autograd at once: the gradient of the chunk's hidden rows
   (and of any head weight being trained), kept; the chunk's logits are freed.

The forward returns the loss and keeps only those gradients (N × D, the size of the hidden states); the
backward scales them by the upstream gradient. Nothing of the head is recomputed or kept for the
backward: this is the fused linear-loss technique of Liger-Kernel (``LigerFusedLinearCrossEntropy``),
written here for both losses and any head.

The numbers are those of :func:`~headwidget.healing._loss.kd_loss` and
:func:`~headwidget.healing._loss.lm_loss` on the whole logits, to float32 rounding.

Example:
    >>> import torch
    >>> from torch import nn
    >>> head = OutputHead(nn.Linear(4, 7, bias=False))
    >>> hidden = torch.randn(2, 5, 4, requires_grad=True)
    >>> mask = torch.ones(2, 5, dtype=torch.long)
    >>> same = head_kd_loss(head, head, hidden.detach(), hidden, mask)
    >>> abs(float(same)) < 1e-6
    True
    >>> from headwidget.healing._loss import kd_loss
    >>> teacher = torch.randn(2, 5, 4)
    >>> whole = kd_loss(head.logits(teacher), head.logits(hidden), mask)
    >>> bool(torch.isclose(head_kd_loss(head, head, teacher, hidden, mask), whole, rtol=1e-5))
    True
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch
from torch import nn

from headwidget.evaluation.measures import predicted_positions, work_dtype

__all__ = ["CHUNK_BYTES", "OutputHead", "chunk_rows", "head_kd_loss", "head_lm_loss"]

F64 = torch.float64

#: The float32 logits of one chunk are at most this many bytes, unless the chunk is no larger than the
#: hidden rows themselves (:func:`chunk_rows`).
CHUNK_BYTES = 32 * 2**20


def chunk_rows(rows: int, vocab: int, hidden: int) -> int:
    """Rows per chunk of the head: as many as :data:`CHUNK_BYTES` of float32 logits hold, or as many as
    make the chunk's logits the size of all ``rows`` hidden rows (large batches on a GPU: fewer, larger
    products), at least 1 and at most ``rows``.

    >>> chunk_rows(4096, 49152, 576), chunk_rows(16384, 128256, 4096), chunk_rows(10, 49152, 576)
    (170, 523, 10)
    """
    by_bytes = CHUNK_BYTES // (4 * max(1, vocab))
    by_hidden = rows * hidden // max(1, vocab)
    return max(1, min(rows, max(by_bytes, by_hidden)))


@dataclass(frozen=True)
class OutputHead:
    """How a causal LM turns its final hidden states into logits: its output linear map, then (as the
    family's forward does) a multiplication (Cohere's ``logit_scale``), a division (Granite's
    ``logits_scaling``) and a soft-cap (Gemma-2's ``final_logit_softcapping``: ``c·tanh(x/c)``)."""

    linear: nn.Module
    multiply: float | None = None
    divide: float | None = None
    softcap: float | None = None

    @classmethod
    def of(cls, model: nn.Module) -> OutputHead | None:
        """The head of ``model`` (None when it has none)."""
        get_head = getattr(model, "get_output_embeddings", None)
        linear = get_head() if callable(get_head) else None
        if not isinstance(linear, nn.Module):
            return None
        config = getattr(model, "config", None)
        multiply = getattr(model, "logit_scale", None)
        divide = getattr(config, "logits_scaling", None)
        softcap = getattr(config, "final_logit_softcapping", None)

        def number(value: Any) -> float | None:
            return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None

        return cls(linear, number(multiply), number(divide), number(softcap))

    def on(self, model: nn.Module) -> OutputHead:
        """This head's rule with ``model``'s own output linear map (a copy of the model this head was read
        from)."""
        linear = OutputHead.of(model)
        assert linear is not None, "a copy of a model with a head has one"
        return replace(self, linear=linear.linear)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The logits of ``hidden`` (..., D), as the model's forward computes them."""
        out = self.linear(hidden)
        if self.multiply is not None:
            out = out * self.multiply
        if self.divide is not None:
            out = out / self.divide
        if self.softcap is not None:
            out = torch.tanh(out / self.softcap) * self.softcap
        return out


def body(model: nn.Module) -> nn.Module:
    """The model without its head (``model.base_model``: its last hidden states, after the final norm)."""
    base = getattr(model, "base_model", model)
    return base if isinstance(base, nn.Module) else model


def last_hidden(output: Any) -> torch.Tensor:
    """The last hidden states of a body's output (a ModelOutput or a tuple)."""
    hidden = getattr(output, "last_hidden_state", None)
    return output[0] if hidden is None else hidden


#: A chunk's loss rule: (student logits in the work dtype, rows) → (the loss's terms, (rows, V) or
#: (rows, 1), whose sum over a row is the row's loss; d loss / d logits per row, before the row weights).
_Rule = Callable[[torch.Tensor, slice], tuple[torch.Tensor, torch.Tensor]]


def _weights(keep: torch.Tensor) -> torch.Tensor:
    count = max(1, int(keep.sum()))
    return torch.full((int(keep.sum()),), 1.0 / count, dtype=F64, device=keep.device)


class _HeadLoss(torch.autograd.Function):
    """``Σ_rows w_row · loss_row`` of the head's logits of ``hidden`` (N, D), formed chunk by chunk with
    its gradients (module docstring); ``params`` are the head's trained tensors."""

    @staticmethod
    def forward(
        ctx: Any,
        head: OutputHead,
        rule: _Rule,
        weights: torch.Tensor,
        hidden: torch.Tensor,
        *params: torch.Tensor,
    ) -> torch.Tensor:
        grad_hidden = torch.zeros_like(hidden)
        grad_params = [torch.zeros_like(p) for p in params]
        total = torch.zeros((), dtype=F64, device=hidden.device)
        work = torch.float32
        count = int(hidden.shape[0])
        vocab = int(getattr(head.linear, "out_features", 0) or 0) or int(head.logits(hidden[:1]).shape[-1])
        step = chunk_rows(count, vocab, int(hidden.shape[-1]))
        for start in range(0, count, step):
            rows = slice(start, start + step)
            h = hidden[rows].detach().requires_grad_(True)
            with torch.enable_grad():
                logits = head.logits(h)
            work = work_dtype(logits)
            loss, grad = rule(logits.detach().to(work), rows)
            w = weights[rows].to(work)[:, None]
            total += loss.mul_(w).sum(dtype=F64)  # a row's terms weighted, then summed in float64
            grad.mul_(w)
            found = torch.autograd.grad(logits, [h, *params], grad_outputs=grad.to(logits.dtype))
            grad_hidden[rows] = found[0]
            for acc, g in zip(grad_params, found[1:], strict=True):
                acc.add_(g)
            del logits, loss, grad, found
        ctx.save_for_backward(grad_hidden, *grad_params)
        return total.to(work)

    @staticmethod
    def backward(ctx: Any, upstream: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        grad_hidden, *grad_params = ctx.saved_tensors
        scaled = [grad_hidden * upstream.to(grad_hidden.dtype)]
        scaled += [g * upstream.to(g.dtype) for g in grad_params]
        return (None, None, None, *scaled)


def _trained(head: OutputHead) -> list[torch.Tensor]:
    return [p for p in head.linear.parameters() if p.requires_grad]


def _predicted(hidden: torch.Tensor, attention_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    keep = predicted_positions(attention_mask.to(hidden.device))
    return hidden[:, :-1][keep], keep


def head_kd_loss(
    teacher: OutputHead,
    student: OutputHead,
    teacher_hidden: torch.Tensor,
    student_hidden: torch.Tensor,
    attention_mask: torch.Tensor,
) -> torch.Tensor:
    """Mean ``KL(softmax(teacher) ‖ softmax(student))`` over the predicted positions, from the final
    hidden states (B, T, D) of both models and their heads, in chunks of rows (module docstring)."""
    rows, keep = _predicted(student_hidden, attention_mask)
    with torch.no_grad():
        target = teacher_hidden.detach()[:, :-1][keep.to(teacher_hidden.device)]

    def rule(logits: torch.Tensor, chunk: slice) -> tuple[torch.Tensor, torch.Tensor]:
        with torch.no_grad():
            lt = torch.log_softmax(teacher.logits(target[chunk]).to(logits.dtype), dim=-1)
        pt = lt.exp()
        ls = torch.log_softmax(logits, dim=-1)
        loss = torch.mul(pt, lt.sub_(ls), out=lt)  # in place: four chunks of logits at a time
        return loss, ls.exp_().sub_(pt)

    return _HeadLoss.apply(student, rule, _weights(keep), rows, *_trained(student))


def head_lm_loss(
    student: OutputHead, hidden: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor
) -> torch.Tensor:
    """Mean next-token cross-entropy over the predicted positions, from the final hidden states (B, T, D)
    and the head, in chunks of rows (module docstring)."""
    rows, keep = _predicted(hidden, attention_mask)
    targets = input_ids.to(hidden.device)[:, 1:][keep]

    def rule(logits: torch.Tensor, chunk: slice) -> tuple[torch.Tensor, torch.Tensor]:
        ls = torch.log_softmax(logits, dim=-1)
        wanted = targets[chunk, None]
        loss = -ls.gather(1, wanted)
        grad = ls.exp_()
        grad.scatter_add_(1, wanted, torch.full_like(wanted, -1, dtype=grad.dtype))
        return loss, grad

    return _HeadLoss.apply(student, rule, _weights(keep), rows, *_trained(student))


def same_logits(model: nn.Module, head: OutputHead, kwargs: dict[str, Any]) -> bool:
    """Whether ``head`` on ``model``'s body gives ``model``'s own logits on one small input (``kwargs``,
    as :func:`~headwidget.evaluation.running.forward_kwargs` builds them), to float rounding: a family
    whose forward changes its logits in a way :class:`OutputHead` does not know keeps the whole-logits
    loss."""
    with torch.no_grad():
        whole = model(**kwargs).logits
        parts = head.logits(last_hidden(body(model)(**kwargs)))
    if whole.shape != parts.shape:
        return False
    tol = 1e-12 if whole.dtype == F64 else 1e-5 if whole.dtype == torch.float32 else 1e-2
    return bool(torch.allclose(whole, parts, rtol=tol, atol=tol * float(whole.abs().max().clamp(min=1))))
