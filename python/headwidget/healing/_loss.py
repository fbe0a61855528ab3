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

import torch
from torch.nn import functional

from headwidget.evaluation.measures import predicted_positions, work_dtype

__all__ = ["LOSS_NAMES", "hidden_mse", "kd_loss", "lm_loss"]

#: What each (method, kind of model) minimises, as the run records it.
LOSS_NAMES = {("kd", "causal-lm"): "kd", ("lm", "causal-lm"): "lm", ("kd", "encoder"): "hidden_mse"}


def _rows(logits: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    return logits[:, :-1][keep].to(work_dtype(logits))


def kd_loss(teacher: torch.Tensor, student: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Mean ``KL(softmax(teacher) ‖ softmax(student))`` over the predicted positions (B, T, V logits)."""
    keep = predicted_positions(attention_mask.to(student.device))
    t = torch.log_softmax(_rows(teacher.detach(), keep), dim=-1)
    s = torch.log_softmax(_rows(student, keep), dim=-1)
    return functional.kl_div(s, t, log_target=True, reduction="sum") / max(1, int(keep.sum()))


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
