"""The healing losses against float64 brute-force loops over tokens (padding and first tokens excluded)."""

from __future__ import annotations

import math

import pytest
import torch

from headwidget.healing._loss import hidden_mse, kd_loss, lm_loss

F64 = torch.float64


def _padded(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Teacher and student logits (3, 7, 11) and ids, rows padded on the right, on the left, not at all."""
    g = torch.Generator().manual_seed(0)
    teacher = torch.randn(3, 7, 11, generator=g, dtype=F64).to(dtype)
    student = torch.randn(3, 7, 11, generator=g, dtype=F64).to(dtype)
    ids = torch.randint(0, 11, (3, 7), generator=g)
    mask = torch.tensor([[1, 1, 1, 1, 1, 0, 0], [0, 0, 1, 1, 1, 1, 1], [1] * 7])
    return teacher, student, ids, mask


def _pairs(mask: torch.Tensor) -> list[tuple[int, int]]:
    """(row, t) where position t predicts the real token t + 1 from a real token t."""
    return [
        (b, t)
        for b in range(mask.shape[0])
        for t in range(mask.shape[1] - 1)
        if mask[b, t] and mask[b, t + 1]
    ]


def _log_softmax(row: list[float]) -> list[float]:
    top = max(row)
    log_z = top + math.log(sum(math.exp(x - top) for x in row))
    return [x - log_z for x in row]


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_kd_loss_is_the_mean_kl_over_predicted_tokens(dtype: torch.dtype) -> None:
    teacher, student, _, mask = _padded(dtype)
    total = 0.0
    pairs = _pairs(mask)
    for b, t in pairs:
        lt = _log_softmax(teacher[b, t].double().tolist())
        ls = _log_softmax(student[b, t].double().tolist())
        total += sum(math.exp(a) * (a - c) for a, c in zip(lt, ls, strict=True))
    expected = total / len(pairs)
    assert len(pairs) == 4 + 4 + 6
    tol = 1e-12 if dtype == F64 else 1e-6
    assert float(kd_loss(teacher, student, mask)) == pytest.approx(expected, rel=tol)


def test_kd_loss_gradient_is_the_naive_formulas() -> None:
    teacher, student, _, mask = _padded(F64)
    a = student.clone().requires_grad_(True)
    kd_loss(teacher, a, mask).backward()
    b = student.clone().requires_grad_(True)
    keep = torch.zeros(3, 7, dtype=torch.bool)
    for row, t in _pairs(mask):
        keep[row, t] = True
    lt, ls = torch.log_softmax(teacher[keep], -1), torch.log_softmax(b[keep], -1)
    (lt.exp() * (lt - ls)).sum(-1).mean().backward()
    assert a.grad is not None and b.grad is not None
    assert torch.allclose(a.grad, b.grad, rtol=0, atol=1e-15)
    assert float(a.grad[0, 5:].abs().max()) == 0.0  # padding, and the last real token, predict nothing


def test_lm_loss_is_the_mean_next_token_cross_entropy() -> None:
    _, student, ids, mask = _padded(F64)
    pairs = _pairs(mask)
    expected = sum(-_log_softmax(student[b, t].tolist())[int(ids[b, t + 1])] for b, t in pairs) / len(pairs)
    assert float(lm_loss(student, ids, mask)) == pytest.approx(expected, rel=1e-12)


def test_hidden_mse_is_the_mean_square_over_real_tokens_and_dims() -> None:
    g = torch.Generator().manual_seed(1)
    a, b = torch.randn(2, 5, 3, generator=g, dtype=F64), torch.randn(2, 5, 3, generator=g, dtype=F64)
    mask = torch.tensor([[1, 1, 1, 0, 0], [0, 1, 1, 1, 1]])
    cells = [
        (float(b[r, t, d]) - float(a[r, t, d])) ** 2
        for r in range(2)
        for t in range(5)
        if mask[r, t]
        for d in range(3)
    ]
    assert float(hidden_mse(a, b, mask)) == pytest.approx(sum(cells) / len(cells), rel=1e-12)
