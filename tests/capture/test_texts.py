"""The offline English sample and its calibration / evaluation split."""

from __future__ import annotations

import pytest

from headwidget.texts import EVALUATION_EVERY, english_sample


def test_splits_are_disjoint_and_cover_the_sample() -> None:
    everything = english_sample()
    calibration = english_sample(split="calibration")
    evaluation = english_sample(split="evaluation")
    assert set(calibration).isdisjoint(evaluation)
    distinct = list(dict.fromkeys(everything))  # a few topics repeat a paragraph word for word
    assert len(distinct) < len(everything)
    assert sorted(calibration + evaluation) == sorted(distinct)
    assert len(evaluation) == len(distinct) // EVALUATION_EVERY
    # both parts are large enough for thousands of tokens
    assert sum(map(len, evaluation)) > 80_000 and sum(map(len, calibration)) > 250_000


def test_split_and_max_chars_compose() -> None:
    evaluation = english_sample(split="evaluation", max_chars=5000)
    assert evaluation == english_sample(split="evaluation")[: len(evaluation)]
    assert sum(map(len, evaluation)) <= 5000 or len(evaluation) == 1


def test_the_sample_is_the_same_every_time() -> None:
    assert english_sample(max_chars=3000) == english_sample(max_chars=3000)


def test_an_unknown_split_is_refused() -> None:
    with pytest.raises(ValueError, match="split must be"):
        english_sample(split="test")  # type: ignore[arg-type]
