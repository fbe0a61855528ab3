"""The losses :func:`~headwidget.healing.heal` minimises, over the real predicted tokens of a batch.

- ``kd`` (language models): the mean over predicted tokens of ``KL(p_model ‖ p_variant)`` of the
  next-token distributions; the original model is the teacher (run without gradients);
- ``lm``: the mean next-token cross-entropy of the variant on the text;
- ``kd`` for an encoder (no LM head): ``hidden_mse``, the mean squared difference of the last hidden
  states over real tokens and hidden dims.

Position ``t`` predicts token ``t + 1`` of the same row, both real (the first token and padding never
count), as in :mod:`headwidget.evaluation.measures`. Log-softmax and KL run in float32 (float64 for
float64 logits).

Example:
    >>> import torch
    >>> logits = torch.randn(2, 5, 7)
    >>> mask = torch.ones(2, 5, dtype=torch.long)
    >>> float(kd_loss(logits, logits, mask)) == 0.0
    True
    >>> ids = torch.randint(0, 7, (2, 5))
    >>> bool(lm_loss(logits, ids, mask) > 0)
    True
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional

from headwidget.evaluation.measures import chunk_rows, predicted_positions, work_dtype

__all__ = ["LOSS_NAMES", "hidden_mse", "kd_loss", "lm_loss"]

#: What each (method, kind of model) minimises, as the run records it.
LOSS_NAMES = {("kd", "causal-lm"): "kd", ("lm", "causal-lm"): "lm", ("kd", "encoder"): "hidden_mse"}


def _rows(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return logits[:, :-1][keep].to(work_dtype(logits))


class _DistillationKL(torch.autograd.Function):
    """``Σ_rows w_row · KL(softmax(t_row) ‖ softmax(s_row))`` over (N, V) logits, in chunks of rows.

    The gradient with respect to the student's logits is ``w_row · (softmax(s_row) − softmax(t_row))``,
    computed in the forward pass chunk by chunk (no graph through log-softmax, no full-size temporaries).
    """

    @staticmethod
    def forward(
        ctx: Any, student: torch.Tensor, teacher: torch.Tensor, weights: torch.Tensor
    ) -> torch.Tensor:
        work = work_dtype(student)
        grad = torch.empty(student.shape, dtype=work, device=student.device)
        total = torch.zeros((), dtype=torch.float64, device=student.device)
        step = chunk_rows(int(student.shape[-1]))
        for start in range(0, int(student.shape[0]), step):
            rows = slice(start, start + step)
            w = weights[rows].to(work)[:, None]
            lt = torch.log_softmax(teacher[rows].to(work), dim=-1)
            pt = lt.exp()
            ls = torch.log_softmax(student[rows].to(work), dim=-1)
            total += (pt * (lt - ls) * w).sum(dtype=torch.float64)
            grad[rows] = ls.exp_().sub_(pt).mul_(w)
        ctx.save_for_backward(grad)
        ctx.dtype = student.dtype
        return total.to(work)

    @staticmethod
    def backward(ctx: Any, upstream: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        (grad,) = ctx.saved_tensors
        return (grad * upstream).to(ctx.dtype), None, None


def kd_loss(teacher: torch.Tensor, student: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean ``KL(softmax(teacher) ‖ softmax(student))`` over the predicted positions (B, T, V logits).

    The rows are read where they are (every position, the ones that predict nothing weighted 0), so
    packed windows cost no copy of the logits.
    """
    keep = predicted_positions(attention_mask.to(student.device))
    weights = torch.zeros(student.shape[:2], dtype=torch.float64, device=student.device)
    weights[:, :-1] = keep.to(torch.float64) / max(1, int(keep.sum()))
    vocab = int(student.shape[-1])
    rows = student.reshape(-1, vocab)
    return _DistillationKL.apply(rows, teacher.detach().reshape(-1, vocab), weights.reshape(-1))


def lm_loss(student: torch.Tensor, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the predicted positions."""
    keep = predicted_positions(attention_mask.to(student.device))
    targets = input_ids.to(student.device)[:, 1:][keep]
    return functional.cross_entropy(_rows(student, keep), targets, reduction="mean")


def hidden_mse(teacher: torch.Tensor, student: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean squared difference of last hidden states (B, T, D) over real tokens and dims."""
    real = attention_mask.to(student.device).bool()
    work = work_dtype(student)
    diff = student[real].to(work) - teacher.detach()[real].to(work)
    return diff.square().mean()
