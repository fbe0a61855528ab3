"""Prediction and encoder measures against brute-force float64 loops over tokens and sentences."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from headwidget.evaluation.measures import EncoderTotals, PredictionTotals, predicted_positions


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max()
    return x - math.log(np.exp(x).sum())


def _brute_force(ref_logits, var_logits, ids, mask):
    nll, kl, hits, n = 0.0, 0.0, 0, 0
    for b in range(ids.shape[0]):
        for t in range(ids.shape[1] - 1):
            if not (mask[b, t] and mask[b, t + 1]):
                continue
            lr = _log_softmax(ref_logits[b, t].astype(np.float64))
            lv = _log_softmax(var_logits[b, t].astype(np.float64))
            nll -= lv[ids[b, t + 1]]
            kl += float((np.exp(lr) * (lr - lv)).sum())
            hits += int(lr.argmax() == lv.argmax())
            n += 1
    return nll / n, kl / n, hits / n, n


@pytest.mark.parametrize("padding", ["right", "left", "none"])
def test_prediction_measures_equal_a_token_loop(padding: str) -> None:
    gen = torch.Generator().manual_seed(3)
    b, t, v = 3, 9, 17
    ref = torch.randn(b, t, v, generator=gen) * 3
    var = ref + torch.randn(b, t, v, generator=gen)
    ids = torch.randint(0, v, (b, t), generator=gen)
    mask = torch.ones(b, t, dtype=torch.long)
    if padding == "right":
        mask[0, 6:] = 0
        mask[2, 2:] = 0
    elif padding == "left":
        mask[1, :4] = 0
    totals = PredictionTotals()
    totals.add(ref[:2], var[:2], ids[:2], mask[:2])  # two batches add up to one
    totals.add(ref[2:], var[2:], ids[2:], mask[2:])
    nll, kl, top1, n = _brute_force(ref.numpy(), var.numpy(), ids.numpy(), mask.numpy())
    assert totals.tokens == n
    assert totals.nll == pytest.approx(nll, abs=1e-5)
    assert totals.perplexity == pytest.approx(math.exp(nll), rel=1e-5)
    assert totals.kl == pytest.approx(kl, abs=1e-5)
    assert totals.kl > 0.05  # the variant really differs
    assert totals.top1 == pytest.approx(top1)


def test_identical_logits_have_zero_kl_and_full_agreement() -> None:
    logits = torch.randn(2, 6, 5)
    ids = torch.randint(0, 5, (2, 6))
    totals = PredictionTotals()
    totals.add(logits, logits.clone(), ids, torch.ones(2, 6, dtype=torch.long))
    assert totals.kl == 0.0
    assert totals.top1 == 1.0
    assert totals.tokens == 10


def test_no_predicted_token_gives_nan_not_zero() -> None:
    totals = PredictionTotals()
    totals.add(
        torch.randn(1, 1, 4), torch.randn(1, 1, 4), torch.zeros(1, 1, dtype=torch.long), torch.ones(1, 1)
    )
    assert totals.tokens == 0
    assert math.isnan(totals.nll) and math.isnan(totals.kl) and math.isnan(totals.top1)


def test_predicted_positions_need_both_tokens_real() -> None:
    mask = torch.tensor([[1, 0, 1, 1], [1, 1, 1, 1]])
    assert predicted_positions(mask).tolist() == [[False, False, True], [True, True, True]]


def test_encoder_measures_equal_a_sentence_loop() -> None:
    gen = torch.Generator().manual_seed(5)
    ref = torch.randn(3, 7, 4, generator=gen)
    var = ref + 0.3 * torch.randn(3, 7, 4, generator=gen)
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, 5:] = 0
    mask[2, :3] = 0
    totals = EncoderTotals()
    totals.add(ref, var, mask)
    r, v, m = ref.double().numpy(), var.double().numpy(), mask.numpy().astype(bool)
    diff = sum(float(((v[b][m[b]] - r[b][m[b]]) ** 2).sum()) for b in range(3))
    norm = sum(float((r[b][m[b]] ** 2).sum()) for b in range(3))
    cos = []
    for b in range(3):
        pr, pv = r[b][m[b]].mean(0), v[b][m[b]].mean(0)
        cos.append(float(pr @ pv / (np.linalg.norm(pr) * np.linalg.norm(pv))))
    assert totals.hidden_rel_error == pytest.approx(math.sqrt(diff / norm), rel=1e-12)
    assert totals.embedding_cosine == pytest.approx(np.mean(cos), rel=1e-12)
    assert totals.tokens == int(m.sum()) and totals.sentences == 3


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_all_finite_agrees_with_isfinite_wherever_the_bad_value_sits(dtype):
    from headwidget.evaluation._outputs import all_finite

    values = torch.randn(7, 13, dtype=torch.float64).to(dtype)
    assert all_finite(values)
    for bad in (float("nan"), float("inf"), -float("inf")):
        for row, col in ((0, 0), (3, 5), (6, 12)):
            spoilt = values.clone()
            spoilt[row, col] = bad
            assert not bool(torch.isfinite(spoilt).all())
            assert all_finite(spoilt) is False
    assert all_finite(torch.full((2, 2), torch.finfo(dtype).max, dtype=dtype))  # large, still finite
