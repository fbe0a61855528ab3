"""A real English text sample that is available offline: Python's own reference documentation.

CPython ships the prose of its language reference topics (the text behind ``help("if")``,
``help("class")``, ...) as :mod:`pydoc_data.topics`: about 460,000 characters of English, written by
people, in every Python installation. :func:`english_sample` cuts it into paragraphs in a fixed order,
so every run sees the same text.

Two disjoint parts serve fits and measurements: ``split="calibration"`` (three distinct paragraphs
of every four) for statistics and fitted conversions, ``split="evaluation"`` (the fourth) for judging what a
conversion does to the model, so a fit is never scored on the tokens it was fitted on. The reference
repeats sentences across topics, so a fourth paragraph that shares a run of
:data:`SHARED_RUN_WORDS` words (whitespace-separated, as written) with any calibration paragraph is
left out of the evaluation split (and stays out of the calibration split): held-out text is never
text a fit has seen, even in part.

Example:
    >>> texts = english_sample(max_chars=2000)
    >>> len(texts) > 0 and all(isinstance(t, str) for t in texts)
    True
    >>> calibration, evaluation = english_sample(split="calibration"), english_sample(split="evaluation")
    >>> set(calibration).isdisjoint(evaluation)
    True
    >>> shared_runs(["one two three four", "four five six"], ["zero one two three", "four five"], words=3)
    [0]
"""

from __future__ import annotations

import functools
import re
from typing import Literal

from headwidget.checks import optional_whole_number, whole_number
from headwidget.errors import ArgumentError

__all__ = ["EVALUATION_EVERY", "SAMPLE_SOURCE", "SHARED_RUN_WORDS", "english_sample", "shared_runs"]

SAMPLE_SOURCE = "CPython's pydoc_data.topics (the Python Language Reference topics, English prose)"
#: Paragraph ``i`` belongs to the evaluation split when ``i % EVALUATION_EVERY == EVALUATION_EVERY - 1``.
EVALUATION_EVERY = 4
#: An evaluation paragraph that shares a run of this many words with a calibration paragraph is left out.
SHARED_RUN_WORDS = 12


def english_sample(
    *,
    max_chars: int | None = None,
    min_chars: int = 200,
    max_paragraph_chars: int = 2000,
    split: Literal["calibration", "evaluation"] | None = None,
) -> list[str]:
    """Paragraphs of English prose from :mod:`pydoc_data.topics`, in a fixed order.

    Paragraphs shorter than ``min_chars`` are joined with their successor; longer than
    ``max_paragraph_chars`` are cut at a sentence end. ``split`` keeps only the calibration or the
    evaluation paragraphs (disjoint, and no evaluation paragraph shares a run of
    :data:`SHARED_RUN_WORDS` words with a calibration one; see the module docstring). ``max_chars``
    bounds the total.

    Raises:
        ArgumentError: a count that is not a whole number (≥ 1; ``min_chars`` ≥ 0), or a
            ``split`` other than ``"calibration"``, ``"evaluation"`` or None.
    """
    max_chars = optional_whole_number("max_chars", max_chars, minimum=1, hint="characters in all")
    min_chars = whole_number("min_chars", min_chars, minimum=0, hint="characters of the shortest paragraph")
    max_paragraph_chars = whole_number(
        "max_paragraph_chars", max_paragraph_chars, minimum=1, hint="characters of the longest paragraph"
    )
    if split is not None and split not in ("calibration", "evaluation"):
        raise ArgumentError(f"split must be 'calibration', 'evaluation' or None, got {split!r}")
    from pydoc_data.topics import topics

    paragraphs: list[str] = []
    pending = ""
    for name in sorted(topics):
        for block in re.split(r"\n\s*\n", topics[name]):
            text = " ".join(block.split())
            if not text or not re.search(r"[A-Za-z]{3,}", text):
                continue
            pending = f"{pending} {text}".strip()
            if len(pending) < min_chars:
                continue
            while len(pending) > max_paragraph_chars:
                cut = pending.rfind(". ", 0, max_paragraph_chars) + 1 or max_paragraph_chars
                paragraphs.append(pending[:cut].strip())
                pending = pending[cut:].strip()
            if pending:
                paragraphs.append(pending)
            pending = ""
    if pending:
        paragraphs.append(pending)
    if split is not None:
        paragraphs = list(_splits(tuple(paragraphs))[split == "evaluation"])
    if max_chars is not None:
        out: list[str] = []
        total = 0
        for p in paragraphs:
            if total + len(p) > max_chars and out:
                break
            out.append(p)
            total += len(p)
        return out
    return paragraphs


@functools.lru_cache(maxsize=8)
def _splits(paragraphs: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The calibration and evaluation paragraphs of ``paragraphs`` (see the module docstring)."""
    # Some topics repeat a paragraph word for word: keep its first occurrence only.
    unique = list(dict.fromkeys(paragraphs))
    last = EVALUATION_EVERY - 1
    calibration = [p for i, p in enumerate(unique) if i % EVALUATION_EVERY != last]
    fourth = [p for i, p in enumerate(unique) if i % EVALUATION_EVERY == last]
    seen = set(shared_runs(fourth, calibration))
    return tuple(calibration), tuple(p for i, p in enumerate(fourth) if i not in seen)


def shared_runs(texts: list[str], others: list[str], *, words: int = SHARED_RUN_WORDS) -> list[int]:
    """The indices of ``texts`` that share a run of ``words`` consecutive words (split at whitespace,
    compared as written) with any of ``others``."""

    def runs(text: str) -> set[tuple[str, ...]]:
        w = text.split()
        return {tuple(w[i : i + words]) for i in range(len(w) - words + 1)}

    known: set[tuple[str, ...]] = set()
    for other in others:
        known |= runs(other)
    return [i for i, text in enumerate(texts) if not runs(text).isdisjoint(known)]
