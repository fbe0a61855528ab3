"""The offline English sample and its calibration / evaluation split."""

from __future__ import annotations

import pytest

from headwidget.texts import EVALUATION_EVERY, SHARED_RUN_WORDS, english_sample, shared_runs


def test_splits_are_disjoint_and_cover_the_sample() -> None:
    everything = english_sample()
    calibration = english_sample(split="calibration")
    evaluation = english_sample(split="evaluation")
    assert set(calibration).isdisjoint(evaluation)
    distinct = list(dict.fromkeys(everything))  # a few topics repeat a paragraph word for word
    assert len(distinct) < len(everything)
    fourth = distinct[EVALUATION_EVERY - 1 :: EVALUATION_EVERY]
    assert calibration == [p for p in distinct if p not in fourth]
    # the evaluation split is every fourth paragraph but those that share text with the calibration
    left_out = [p for p in fourth if p not in evaluation]
    assert evaluation == [p for p in fourth if p not in left_out]
    assert 0 < len(left_out) < len(fourth) // 5
    # both parts are large enough for thousands of tokens
    assert sum(map(len, evaluation)) > 75_000 and sum(map(len, calibration)) > 250_000


def test_no_evaluation_text_was_seen_in_calibration() -> None:
    """Brute force, by substring search of every window of words: no evaluation paragraph shares a
    run of SHARED_RUN_WORDS words with the calibration text, and every fourth paragraph left out
    does (the reference repeats sentences across topics: "with EXPRESSION as TARGET: SUITE is
    semantically equivalent to", say)."""
    calibration = english_sample(split="calibration")
    evaluation = english_sample(split="evaluation")
    joined = "\n".join(" ".join(p.split()) for p in calibration)  # one line per paragraph

    def seen(paragraph: str) -> bool:
        w = paragraph.split()
        n = SHARED_RUN_WORDS
        windows = (" ".join(w[i : i + n]) for i in range(len(w) - n + 1))
        return any(f" {window} " in f" {line} " for window in windows for line in _lines_with(joined, window))

    assert not any(seen(p) for p in evaluation)
    distinct = list(dict.fromkeys(english_sample()))
    left_out = [p for p in distinct[EVALUATION_EVERY - 1 :: EVALUATION_EVERY] if p not in evaluation]
    assert left_out and all(seen(p) for p in left_out)


def _lines_with(joined: str, window: str) -> list[str]:
    """The lines of ``joined`` that contain ``window`` as a substring (then checked word by word)."""
    found, start = [], joined.find(window)
    while start >= 0:
        line_start = joined.rfind("\n", 0, start) + 1
        line_end = joined.find("\n", start)
        line_end = len(joined) if line_end < 0 else line_end
        found.append(joined[line_start:line_end])
        start = joined.find(window, line_end)
    return found


def test_shared_runs_counts_whole_words_only() -> None:
    assert shared_runs(["a b c d"], ["x a b c"], words=3) == [0]
    assert shared_runs(["a b c d"], ["a b", "c d"], words=3) == []  # not across paragraphs
    assert shared_runs(["ab c d"], ["b c d"], words=3) == []  # words, not characters


def test_split_and_max_chars_compose() -> None:
    evaluation = english_sample(split="evaluation", max_chars=5000)
    assert evaluation == english_sample(split="evaluation")[: len(evaluation)]
    assert sum(map(len, evaluation)) <= 5000 or len(evaluation) == 1


def test_the_sample_is_the_same_every_time() -> None:
    assert english_sample(max_chars=3000) == english_sample(max_chars=3000)


def test_an_unknown_split_is_refused() -> None:
    with pytest.raises(ValueError, match="split must be"):
        english_sample(split="test")  # type: ignore[arg-type]
