"""The command line's own error types, and the one-line form every message is printed in.

Example:
    >>> one_line("no such\\n   file")
    'no such file'
    >>> issubclass(ModelLoadError, HeadwidgetError), issubclass(UsageError, HeadwidgetError)
    (True, False)
"""

from __future__ import annotations

from headwidget.errors import HeadwidgetError

__all__ = ["FigureError", "ModelLoadError", "UsageError", "VariantError", "one_line"]


class UsageError(Exception):
    """A command-line mistake: printed and exit code 2."""


class ModelLoadError(HeadwidgetError, OSError):
    """A model directory whose config, weights or tokenizer cannot be loaded."""


class FigureError(HeadwidgetError, ValueError):
    """The requested figure cannot be drawn from these statistics."""


class VariantError(HeadwidgetError, ValueError):
    """A variant spec the model cannot take (the message names the spec and what is possible)."""


def one_line(message: object) -> str:
    """``message`` with its whitespace (newlines too) collapsed: one line of text.

    Example:
        >>> one_line("a\\n b")
        'a b'
    """
    return " ".join(str(message).split())
