"""Option values the commands share: argparse types and comma-separated lists.

Example:
    >>> gib("0.5"), dpi("300"), int_list("0, 3,12", "--layers")
    (0.5, 300, [0, 3, 12])
"""

from __future__ import annotations

import argparse
import math
import re

from headwidget.cli._errors import UsageError

__all__ = [
    "DPI_RANGE",
    "DTYPES",
    "MAX_COUNT",
    "MAX_GIB",
    "MAX_SEED",
    "ascii_int",
    "count",
    "dpi",
    "gib",
    "int_list",
    "real",
    "seed",
]

#: ``--dpi`` range of ``figure``: beyond it a page-sized PNG needs gigabytes of memory.
DPI_RANGE = (1, 1200)
#: ``--dtype`` choices: the torch dtypes a model may be loaded or run in.
DTYPES = ("float32", "bfloat16", "float16")
#: The largest count (``--max-tokens``, ``--batch-size``...) taken: beyond it a number is a typo.
MAX_COUNT = 2**53
#: The largest ``--max-memory`` in GiB (2**53 bytes).
MAX_GIB = 2**23
#: The largest ``--seed`` (what ``torch.Generator.manual_seed`` and ``heal`` take).
MAX_SEED = 2**63 - 1
#: An integer written in ASCII digits: ``int()`` also reads ``"１２"``, ``"1_000"`` and ``" +3 "``.
_INTEGER = re.compile(r"-?[0-9]+")


def ascii_int(text: str) -> int | None:
    """``text`` as an int when it is an integer in ASCII digits (surrounding spaces allowed), else None.

    Example:
        >>> ascii_int(" 12 "), ascii_int("-3"), ascii_int("１２"), ascii_int("1_000"), ascii_int("")
        (12, -3, None, None, None)
    """
    stripped = text.strip()
    if not _INTEGER.fullmatch(stripped) or len(stripped) > 20:
        return None
    return int(stripped)


def _whole(text: str, low: int, high: int, words: str) -> int:
    value = ascii_int(text)
    if value is None or not low <= value <= high:
        raise argparse.ArgumentTypeError(f"takes {words}, got {text!r}")
    return value


def _ascii_float(text: str) -> float:
    """``float(text)``, or NaN for what is not a number in ASCII without ``_`` (``float()`` also reads
    ``"４"`` and ``"1_0"``)."""
    try:
        return float(text) if text.isascii() and "_" not in text else math.nan
    except ValueError:
        return math.nan


def gib(text: str) -> float:
    """``--max-memory``: a finite number of GiB > 0 (ASCII digits, no ``_``).

    Example:
        >>> gib("4")
        4.0
    """
    value = _ascii_float(text)
    if not (math.isfinite(value) and 0 < value <= MAX_GIB):
        raise argparse.ArgumentTypeError(
            f"takes a finite number of GiB > 0 and at most {MAX_GIB} (like 4 or 0.5), got {text!r}"
        )
    return value


def dpi(text: str) -> int:
    """``--dpi``: a whole number of dots per inch in :data:`DPI_RANGE`.

    Example:
        >>> dpi("150")
        150
    """
    low, high = DPI_RANGE
    return _whole(text, low, high, f"a whole number of dots per inch in {low}..{high}")


def int_list(text: str | None, option: str) -> list[int] | None:
    """Comma-separated integers in ASCII digits (None stays None; leaving the option out means all).

    An empty list (``--layers ""``), an empty item (``1,,2``) or anything but an integer is a
    :class:`UsageError`.

    Example:
        >>> int_list("1,2", "--layers"), int_list(None, "--layers")
        ([1, 2], None)
        >>> try:
        ...     int_list("", "--layers")
        ... except UsageError as err:
        ...     print(err)
        --layers is empty; give comma-separated integers such as 0,1,12, or leave --layers out for its default
    """
    if text is None:
        return None
    if not text.strip():
        raise UsageError(
            f"{option} is empty; give comma-separated integers such as 0,1,12, or leave {option} out for its "
            "default"
        )
    values = [ascii_int(x) for x in text.split(",")]
    if any(v is None for v in values):
        raise UsageError(f"{option} takes comma-separated integers such as 0,1,12, got {text!r}")
    return [v for v in values if v is not None]


def count(text: str) -> int:
    """A whole number ≥ 1 (token counts).

    Example:
        >>> count("2048")
        2048
    """
    return _whole(text, 1, MAX_COUNT, f"a whole number ≥ 1 in ASCII digits (at most {MAX_COUNT})")


def seed(text: str) -> int:
    """``--seed``: a whole number in 0..:data:`MAX_SEED` in ASCII digits.

    Example:
        >>> seed("99999999999999999")
        99999999999999999
    """
    return _whole(text, 0, MAX_SEED, f"a whole number in 0..{MAX_SEED} in ASCII digits")


def real(text: str) -> float:
    """A finite number in ASCII (``float()`` also reads ``"１e-3"``); its range is the command's to check.

    Example:
        >>> real("1e-3"), real(" 0.5 ")
        (0.001, 0.5)
    """
    value = _ascii_float(text)
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(
            f"takes a finite number in ASCII (like 1e-3 or 0.0003), got {text!r}"
        )
    return value
