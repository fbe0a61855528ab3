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


# ---------------------------------------------------------------------------------------------- chunked head
def _head(dtype: torch.dtype, softcap: float | None = None, multiply: float | None = None):
    """A head of 11 logits over hidden size 5 (with a bias), and its float64 brute-force twin."""
    from headwidget.healing._chunked import OutputHead

    g = torch.Generator().manual_seed(3)
    linear = torch.nn.Linear(5, 11).to(F64)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(11, 5, generator=g, dtype=F64))
        linear.bias.copy_(torch.randn(11, generator=g, dtype=F64))
    head = OutputHead(linear.to(dtype), multiply=multiply, softcap=softcap)

    def row_logits(h: list[float]) -> list[float]:
        w, b = linear.weight.double().tolist(), linear.bias.double().tolist()
        out = [sum(wi * hi for wi, hi in zip(row, h, strict=True)) + bi for row, bi in zip(w, b, strict=True)]
        if multiply is not None:
            out = [x * multiply for x in out]
        if softcap is not None:
            out = [math.tanh(x / softcap) * softcap for x in out]
        return out

    return head, row_logits


def _hidden(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(4)
    return (
        torch.randn(3, 7, 5, generator=g, dtype=F64).to(dtype),
        torch.randn(3, 7, 5, generator=g, dtype=F64).to(dtype),
    )


@pytest.fixture
def small_chunks(monkeypatch: pytest.MonkeyPatch) -> None:
    """Chunks of 2 rows (11 logits of 4 bytes: 88 bytes), so every loss below runs in several chunks."""
    import headwidget.healing._chunked as chunked

    monkeypatch.setattr(chunked, "CHUNK_BYTES", 2 * 4 * 11)
    assert chunked.chunk_rows(14, 11, 5) == 6 and chunked.chunk_rows(14, 11, 1) == 2


@pytest.mark.parametrize("dtype", [torch.float32, F64])
@pytest.mark.parametrize("shape", [{}, {"softcap": 2.0, "multiply": 0.5}])
def test_chunked_head_kd_loss_is_the_mean_kl_over_predicted_tokens(
    small_chunks: None, dtype: torch.dtype, shape: dict
) -> None:
    from headwidget.healing._chunked import head_kd_loss

    head, row_logits = _head(dtype, **shape)
    teacher, student = _hidden(dtype)
    _, _, _, mask = _padded(dtype)
    total = 0.0
    pairs = _pairs(mask)
    for b, t in pairs:
        lt = _log_softmax(row_logits(teacher[b, t].double().tolist()))
        ls = _log_softmax(row_logits(student[b, t].double().tolist()))
        total += sum(math.exp(a) * (a - c) for a, c in zip(lt, ls, strict=True))
    got = float(head_kd_loss(head, head, teacher, student, mask))
    assert got == pytest.approx(total / len(pairs), rel=1e-12 if dtype == F64 else 1e-5)


def test_chunked_head_kd_gradients_are_autograd_of_the_whole_logits(small_chunks: None) -> None:
    """The hidden rows' gradient (formed in the forward, chunk by chunk) and a trained head weight's, against
    autograd through the whole logits and the naive KL."""
    from headwidget.healing._chunked import head_kd_loss

    head, _ = _head(F64, softcap=3.0)
    teacher, student = _hidden(F64)
    _, _, _, mask = _padded(F64)
    a = student.clone().requires_grad_(True)
    head_kd_loss(head, head, teacher, a, mask).backward(torch.tensor(2.5, dtype=F64))
    weight_grad = head.linear.weight.grad.clone()
    head.linear.zero_grad()
    b = student.clone().requires_grad_(True)
    keep = torch.zeros(3, 7, dtype=torch.bool)
    for row, t in _pairs(mask):
        keep[row, t] = True
    lt = torch.log_softmax(head.logits(teacher[keep]).detach(), -1)
    ls = torch.log_softmax(head.logits(b[keep]), -1)
    (2.5 * (lt.exp() * (lt - ls)).sum(-1).mean()).backward()
    assert a.grad is not None and b.grad is not None
    assert torch.allclose(a.grad, b.grad, rtol=0, atol=1e-14)
    assert torch.allclose(weight_grad, head.linear.weight.grad, rtol=0, atol=1e-14)
    assert float(a.grad[0, 5:].abs().max()) == 0.0  # padding, and the last real token, predict nothing


@pytest.mark.parametrize("dtype", [torch.float32, F64])
def test_chunked_head_lm_loss_and_its_gradient(small_chunks: None, dtype: torch.dtype) -> None:
    from headwidget.healing._chunked import head_lm_loss

    head, row_logits = _head(dtype)
    _, student = _hidden(dtype)
    _, _, ids, mask = _padded(dtype)
    pairs = _pairs(mask)
    expected = sum(
        -_log_softmax(row_logits(student[b, t].double().tolist()))[int(ids[b, t + 1])] for b, t in pairs
    ) / len(pairs)
    a = student.clone().requires_grad_(True)
    loss = head_lm_loss(head, a, ids, mask)
    assert float(loss) == pytest.approx(expected, rel=1e-12 if dtype == F64 else 1e-5)
    loss.backward()
    b = student.clone().requires_grad_(True)
    lm_loss(head.logits(b), ids, mask).backward()
    assert a.grad is not None and b.grad is not None
    assert torch.allclose(a.grad, b.grad, rtol=0, atol=1e-13 if dtype == F64 else 1e-6)


def test_chunked_losses_equal_the_whole_logits_losses_in_float32(small_chunks: None) -> None:
    """What heal minimised before the head ran in chunks, to float32 rounding: the same value and the same
    gradient of the hidden states."""
    from headwidget.healing._chunked import head_kd_loss, head_lm_loss

    head, _ = _head(torch.float32)
    teacher, student = _hidden(torch.float32)
    _, _, ids, mask = _padded(torch.float32)
    for chunked, whole in (
        (
            lambda h: head_kd_loss(head, head, teacher, h, mask),
            lambda h: kd_loss(head.logits(teacher), head.logits(h), mask),
        ),
        (lambda h: head_lm_loss(head, h, ids, mask), lambda h: lm_loss(head.logits(h), ids, mask)),
    ):
        a, b = student.clone().requires_grad_(True), student.clone().requires_grad_(True)
        x, y = chunked(a), whole(b)
        x.backward()
        y.backward()
        assert float(x) == pytest.approx(float(y), rel=2e-6)
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7)
