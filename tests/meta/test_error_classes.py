"""Every error class lives in ``headwidget/errors.py`` and is a ``HeadwidgetError``, but for the named
entries of :data:`ELSEWHERE`; a module that raised one of them keeps it importable (a re-export)."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "headwidget"

#: Exception classes defined outside errors.py, each deliberate (module → class: why).
ELSEWHERE: dict[tuple[str, str], str] = {
    # control flow inside one module, never raised to a caller
    ("healing/_heal.py", "_NonFinite"): "becomes NonFiniteLossError with the run so far",
    ("capture/session.py", "_ForwardDone"): "ends a forward early",
    # the command line's usage mistake: printed with exit code 2, not a headwidget error (its doctest)
    ("cli/_errors.py", "UsageError"): "argparse-like",
}


def exception_classes(path: Path) -> list[str]:
    """The classes of ``path`` that derive from a name ending in Error or Exception."""
    tree = ast.parse(path.read_text(), str(path))
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef):
            bases = [
                b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                for b in node.bases
            ]
            if any(b.endswith(("Error", "Exception")) for b in bases):
                names.append(node.name)
    return names


def test_error_classes_live_in_errors_py() -> None:
    found = {
        (path.relative_to(PACKAGE).as_posix(), name)
        for path in sorted(PACKAGE.rglob("*.py"))
        if path.name != "errors.py" or path.parent != PACKAGE
        for name in exception_classes(path)
    }
    assert found - set(ELSEWHERE) == set(), (
        "move these to headwidget/errors.py (re-export them where they were)"
    )
    assert set(ELSEWHERE) <= found, "an entry of ELSEWHERE is no longer true: take it out"


def test_every_error_class_is_a_headwidget_error() -> None:
    errors = importlib.import_module("headwidget.errors")
    classes = [c for _, c in inspect.getmembers(errors, inspect.isclass) if c.__module__ == errors.__name__]
    assert len(classes) > 40
    assert [c.__name__ for c in classes if not issubclass(c, errors.HeadwidgetError)] == []


@pytest.mark.parametrize(
    ("module", "name"),
    [
        ("headwidget.core.charts", "ChartError"),
        ("headwidget.files", "NotRegularFileError"),
        ("headwidget.stats", "NoSamplesError"),
        ("headwidget.analysis", "ChannelEntropyError"),
        ("headwidget.embedded", "EmbeddedModelMissingError"),
        ("headwidget.embedded", "UnknownEmbeddedModelError"),
        ("headwidget.export", "ExportError"),
        ("headwidget.magic", "MagicUsageError"),
        ("headwidget.cli._errors", "ModelLoadError"),
        ("headwidget.cli._errors", "FigureError"),
        ("headwidget.cli._errors", "VariantError"),
        ("headwidget.moments.correlation", "ChannelSelectionError"),
        ("headwidget.views", "ViewSourceError"),
        ("headwidget.views.consequences", "UnknownDamageMeasureError"),
        ("headwidget.views", "ChannelWindowError"),
        ("headwidget.views.quantization", "QuantizationViewError"),
        ("headwidget.views", "StepIndexError"),
        ("headwidget.views", "TimelineStepsError"),
    ],
)
def test_a_moved_error_is_still_importable_where_it_was(module: str, name: str) -> None:
    errors = importlib.import_module("headwidget.errors")
    assert getattr(importlib.import_module(module), name) is getattr(errors, name)
