"""The package's imports run one way: every arrow points down the layers in ``LAYERS``.

Every module's imports are read from its source (module level and inside functions alike, so a lazy
import cannot hide a cycle). A module may import its own unit (the top-level package or module it
belongs to) and any unit of a lower layer; units of the same layer do not import each other; and no
two modules import each other, directly or through others. ``docs/ARCHITECTURE.md`` explains the
layers; this list is their single written form.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "headwidget"

#: Bottom to top. A unit is a top-level module or sub-package of ``headwidget``.
LAYERS: tuple[tuple[str, ...], ...] = (
    ("_version", "errors"),  # leaves: the version, the error types
    ("core", "files", "checks"),  # shared types (layout, Kind, panels, bundle) / file writes / arg checks
    ("moments", "adapters", "embedded", "texts"),  # tensors / model families / model files / sample text
    ("stats",),  # KVStats: moments per layer and kind, files
    ("capture", "analysis", "report"),  # hooks that fill stats / pure maths on stats and weights
    ("evaluation", "tracking"),  # what conversions and quantizers do to predictions / stats over training
    ("healing",),  # what a converted model recovers with a little training (uses evaluation)
    ("views",),  # a user's state → panels; the view registry
    ("widget", "export"),  # anywidget transport / files (PNG, SVG, PDF, HTML)
    ("notebook",),  # the widget shell that displays any view, and explore()
    ("demo", "magic"),  # faces: the demo run, the IPython magic
    ("cli", "__init__"),  # faces: the command line, the package's public names
)


def layer_of(unit: str) -> int:
    for rank, units in enumerate(LAYERS):
        if unit in units:
            return rank
    raise KeyError(unit)


def module_name(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def unit_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def imports_of(path: Path, module: str) -> set[str]:
    """Every ``headwidget`` module that ``path`` imports, anywhere in its source."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name.split(".")[0] == "headwidget")
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".") if is_package else module.split(".")[:-1]
                base = base[: len(base) - (node.level - 1)]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if target.split(".")[0] != "headwidget":
                continue
            for alias in node.names:  # `from headwidget.x import y` may name the submodule x.y
                candidate = f"{target}.{alias.name}"
                found.add(candidate if _module_path(candidate) is not None else target)
    found.discard(module)
    return found


def _module_path(module: str) -> Path | None:
    rel = Path(*module.split(".")[1:])
    for path in (PACKAGE / rel.with_suffix(".py"), PACKAGE / rel / "__init__.py"):
        if path.is_file():
            return path
    return None


def import_graph() -> dict[str, set[str]]:
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        graph[module] = imports_of(path, module)
    return graph


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point to the same or a higher layer outside the importer's own unit."""
    problems = []
    for module, targets in sorted(graph.items()):
        unit = unit_of(module)
        for target in sorted(targets):
            other = unit_of(target)
            if other == unit:
                continue
            if layer_of(other) >= layer_of(unit):
                problems.append(
                    f"{module} (layer {layer_of(unit)}) imports {target} (layer {layer_of(other)})"
                )
    return problems


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each import cycle once, as the list of modules around it (``a → b → … → a``)."""
    found: list[list[str]] = []
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(node: str) -> None:
        state[node] = 1
        path.append(node)
        for nxt in sorted(graph.get(node, ())):
            if state.get(nxt) == 1:
                found.append([*path[path.index(nxt) :], nxt])
            elif nxt not in state:
                visit(nxt)
        path.pop()
        state[node] = 2

    for node in sorted(graph):
        if node not in state:
            visit(node)
    return found


def test_every_unit_has_a_layer() -> None:
    units = {unit_of(m) for m in import_graph()}
    unknown = sorted(u for u in units if not any(u in layer for layer in LAYERS))
    assert not unknown, f"add these to LAYERS in tests/meta/test_layering.py: {unknown}"


def test_imports_point_down() -> None:
    problems = upward_arrows(import_graph())
    assert not problems, "imports that run back up the layers:\n" + "\n".join(problems)


def test_no_import_cycles() -> None:
    found = cycles(import_graph())
    assert not found, "import cycles:\n" + "\n".join(" → ".join(c) for c in found)


def test_stats_import_neither_analysis_nor_capture() -> None:
    graph = import_graph()
    bad = {t for t in graph["headwidget.stats"] if unit_of(t) in ("analysis", "capture")}
    assert not bad


def test_the_checks_catch_a_back_up_import_and_a_cycle() -> None:
    """The checker itself: a synthetic arrow from stats up to analysis, and a two-module cycle."""
    graph = import_graph()
    graph["headwidget.stats"] = {*graph["headwidget.stats"], "headwidget.analysis.alignment"}
    assert any(
        p.startswith("headwidget.stats (layer 3) imports headwidget.analysis") for p in upward_arrows(graph)
    )
    graph = {"headwidget.a": {"headwidget.b"}, "headwidget.b": {"headwidget.a"}}
    assert cycles(graph) == [["headwidget.a", "headwidget.b", "headwidget.a"]]


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from headwidget.stats import KVStats", {"headwidget.stats"}),
        ("def f():\n    from headwidget.export import save", {"headwidget.export"}),
        ("from . import errors", {"headwidget.errors"}),
        ("from .core import layout, Kind", {"headwidget.core.layout", "headwidget.core"}),
        ("import headwidget.core.layout", {"headwidget.core.layout"}),
        ("import numpy", set()),
    ],
)
def test_imports_are_read_including_lazy_and_relative(
    tmp_path: Path, source: str, expected: set[str]
) -> None:
    fake = tmp_path / "cli.py"
    fake.write_text(source)
    assert imports_of(fake, "headwidget.cli") == expected
