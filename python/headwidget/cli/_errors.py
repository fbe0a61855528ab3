"""The command line's own error types, and the one-line form every message is printed in.

Example:
    >>> one_line("no such\\n   file")
    'no such file'
    >>> from headwidget.errors import HeadwidgetError
    >>> issubclass(ModelLoadError, HeadwidgetError), issubclass(UsageError, HeadwidgetError)
    (True, False)
"""

from __future__ import annotations

from headwidget.errors import FigureError, ModelLoadError, VariantError

__all__ = ["FigureError", "ModelLoadError", "UsageError", "VariantError", "one_line"]


class UsageError(Exception):
    """A command-line mistake: printed and exit code 2."""


def one_line(message: object) -> str:
    """``message`` with its whitespace (newlines too) collapsed: one line of text.

    Example:
        >>> one_line("a\\n b")
        'a b'
    """
    return " ".join(str(message).split())
