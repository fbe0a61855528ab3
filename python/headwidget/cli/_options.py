"""Option values the commands share: argparse types and comma-separated lists.

Example:
    >>> gib("0.5"), dpi("300"), int_list("0, 3,12", "--layers")
    (0.5, 300, [0, 3, 12])
"""

from __future__ import annotations

import argparse
import math

from headwidget.cli._errors import UsageError

__all__ = ["DPI_RANGE", "DTYPES", "count", "dpi", "gib", "int_list"]

#: ``--dpi`` range of ``figure``: beyond it a page-sized PNG needs gigabytes of memory.
DPI_RANGE = (1, 1200)
#: ``--dtype`` choices: the torch dtypes a model may be loaded or run in.
DTYPES = ("float32", "bfloat16", "float16")


def gib(text: str) -> float:
    """``--max-memory``: a finite number of GiB > 0.

    Example:
        >>> gib("4")
        4.0
    """
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not (math.isfinite(value) and value > 0):
        raise argparse.ArgumentTypeError(f"takes a finite number of GiB > 0 (like 4 or 0.5), got {text!r}")
    return value


def dpi(text: str) -> int:
    """``--dpi``: a whole number of dots per inch in :data:`DPI_RANGE`.

    Example:
        >>> dpi("150")
        150
    """
    low, high = DPI_RANGE
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(
            f"takes a whole number of dots per inch in {low}..{high}, got {text!r}"
        )
    return value


def int_list(text: str | None, option: str) -> list[int] | None:
    """Comma-separated integers (None stays None); anything else is a :class:`UsageError`.

    Example:
        >>> int_list("1,2", "--layers"), int_list(None, "--layers")
        ([1, 2], None)
    """
    if text is None:
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError as err:
        raise UsageError(f"{option} takes comma-separated integers, got {text!r}") from err


def count(text: str) -> int:
    """A whole number ≥ 1 (token counts).

    Example:
        >>> count("2048")
        2048
    """
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"takes a whole number ≥ 1, got {text!r}")
    return value
