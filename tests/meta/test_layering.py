"""The package's imports run one way: every arrow points down the layers in ``LAYERS``.

Every module's imports are read from its source: ``import`` statements at module level and inside
functions alike, and the by-name imports ``importlib.import_module("headwidget.x")`` and
``__import__("headwidget.x")`` (so neither a lazy import nor a by-name one can hide an arrow or a
cycle); a by-name import of a name the test cannot read (not a string literal) fails, unless it is one
of the named entries of :data:`UNREAD`. A module may import its own unit (the top-level package or
module it belongs to) and any unit of a lower layer; units of the same layer do not import each other;
no two modules import each other, directly or through others; and a unit imports another's public
names only (no ``_private`` module or name), but for the named, commented entries of
:data:`PRIVATE`. ``docs/ARCHITECTURE.md`` explains the layers; this list is their single written form.
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


#: Imports of another unit's private module or name, each a deliberate exception (importer, imported),
#: with a comment saying why; an entry goes when its import does (test_the_named_exceptions_are_still_there).
PRIVATE: dict[tuple[str, str], str] = {}

#: By-name imports whose name is not a literal, each deliberate (module → what it imports).
UNREAD: dict[str, str] = {
    # every public module of the views package, by the names pkgutil finds: its own unit
    "headwidget.views": "its own view modules",
    # the top-level package's first-use names (explore, the widgets): headwidget.notebook or .widget
    "headwidget": "the modules of _ON_FIRST_USE",
}


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


#: The functions that import a module by name: ``importlib.import_module`` and ``__import__``.
BY_NAME = ("import_module", "__import__")


def by_name(node: ast.AST) -> ast.expr | None:
    """The name argument of a by-name import call (``importlib.import_module(x)``, ``import_module(x)``,
    ``__import__(x)``), else None."""
    if not isinstance(node, ast.Call) or not node.args:
        return None
    func = node.func
    called = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
    return node.args[0] if called in BY_NAME else None


def literal_start(name: ast.expr) -> str | None:
    """A by-name import's name, or, for an f-string, its literal start up to the last dot before a
    value (``f"transformers.models.{x}"``: ``"transformers.models."``); None: nothing literal."""
    if isinstance(name, ast.Constant) and isinstance(name.value, str):
        return name.value
    if isinstance(name, ast.JoinedStr) and name.values and isinstance(name.values[0], ast.Constant):
        start = str(name.values[0].value)
        return start if "." in start else None
    return None


def imports_of(path: Path, module: str) -> set[str]:
    """Every ``headwidget`` module and name that ``path`` imports, anywhere in its source: by
    ``import`` statements and by name (a name the test cannot read is ``"?"``)."""
    tree = ast.parse(path.read_text(), str(path))
    is_package = path.name == "__init__.py"
    found: set[str] = set()
    for node in ast.walk(tree):
        if (name := by_name(node)) is not None:
            text = literal_start(name)
            if text is None:
                found.add("?")  # a name not read: could be any module
            elif text.split(".")[0] == "headwidget":
                found.add(text if isinstance(name, ast.Constant) else "?")
        elif isinstance(node, ast.Import):
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
            for alias in node.names:  # `from headwidget.x import y` names the submodule x.y or a name
                candidate = f"{target}.{alias.name}"
                found.add(candidate if _module_path(candidate) is not None else target)
                if (
                    alias.name.startswith("_")
                    and not alias.name.endswith("__")
                    and _module_path(candidate) is None
                ):
                    found.add(f"{target}:{alias.name}")  # a private name, not a module
    found.discard(module)
    return found


def _module_path(module: str) -> Path | None:
    rel = Path(*module.split(".")[1:])
    for path in (PACKAGE / rel.with_suffix(".py"), PACKAGE / rel / "__init__.py"):
        if path.is_file():
            return path
    return None


def import_graph(names: bool = False) -> dict[str, set[str]]:
    """Each module's imports of modules (``names``: and of private names, ``module:_name``, and the
    unread by-name imports, ``"?"``)."""
    graph = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path)
        found = imports_of(path, module)
        graph[module] = found if names else {t for t in found if ":" not in t and t != "?"}
    return graph


def private_imports(graph: dict[str, set[str]]) -> list[str]:
    """Imports of another unit's ``_private`` module or name (``module:_name``), but for :data:`PRIVATE`."""
    problems = []
    for module, targets in sorted(graph.items()):
        for target in sorted(targets):
            if target == "?" or unit_of(target.split(":")[0]) == unit_of(module):
                continue
            parts = target.replace(":", ".").split(".")[2:]  # (inside the unit: a unit is not private)
            private = any(p.startswith("_") and not p.endswith("__") for p in parts)
            if private and (module, target.replace(":", ".")) not in PRIVATE:
                problems.append(f"{module} imports {target.replace(':', '.')}, private to {unit_of(target)}")
    return problems


def unread_imports(graph: dict[str, set[str]]) -> list[str]:
    """Modules that import by a name the test cannot read, but for :data:`UNREAD`."""
    return [
        f"{m} imports a module by a name that is not a literal"
        for m, t in graph.items()
        if "?" in t and m not in UNREAD
    ]


def upward_arrows(graph: dict[str, set[str]]) -> list[str]:
    """Imports that point to the same or a higher layer outside the importer's own unit."""
    problems = []
    for module, targets in sorted(graph.items()):
        unit = unit_of(module)
        for target in sorted(t for t in targets if ":" not in t and t != "?"):  # (modules only)
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


def test_units_import_each_others_public_names_only() -> None:
    problems = private_imports(import_graph(names=True))
    assert not problems, "imports of another unit's private module or name:\n" + "\n".join(problems)


def test_every_by_name_import_is_read() -> None:
    problems = unread_imports(import_graph(names=True))
    assert not problems, "\n".join(problems) + "\n(import by a literal name, or add a named entry to UNREAD)"


def test_the_named_exceptions_are_still_there() -> None:
    """An exception that no longer happens is taken out of the list (the list says what is true)."""
    graph = import_graph(names=True)
    for importer, target in PRIVATE:
        module, name = target.rsplit(".", 1)
        assert {target, f"{module}:{name}"} & graph[importer], (importer, target)
    assert all("?" in graph[m] for m in UNREAD)


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
    ("source", "check", "said"),
    [
        # the upward by-name import views/_base.py had (layer 7 up to 9), three ways
        (
            "def p():\n    importlib.import_module('headwidget.notebook')",
            upward_arrows,
            "imports headwidget.notebook",
        ),
        (
            "from importlib import import_module\nimport_module('headwidget.notebook')",
            upward_arrows,
            "(layer 9)",
        ),
        (
            "def p():\n    __import__('headwidget.notebook')",
            upward_arrows,
            "imports headwidget.notebook (layer 9)",
        ),
        ("from headwidget.stats._file import read", private_imports, "stats._file, private to stats"),
        ("from headwidget.stats import _secret", private_imports, "stats._secret, private to stats"),
        ("import headwidget.stats._file", private_imports, "imports headwidget.stats._file"),
        ("importlib.import_module(f'headwidget.{name}')", unread_imports, "not a literal"),
    ],
)
def test_each_kind_of_violation_planted_in_a_module_fails(
    tmp_path: Path, source: str, check: object, said: str
) -> None:
    """The checks themselves: a module of the views (layer 7) with one violation planted is caught;
    the same module without it is not."""
    planted = tmp_path / "_planted.py"
    planted.write_text(f"import importlib\n{source}\n")
    graph = import_graph(names=True)
    assert callable(check) and not any("_planted" in p for p in check(graph))
    graph["headwidget.views._planted"] = imports_of(planted, "headwidget.views._planted")
    found = [p for p in check(graph) if "_planted" in p]
    assert found and said in found[0], found
    graph["headwidget.notebook"] = {*graph.get("headwidget.notebook", set()), "headwidget.views._planted"}
    if check is upward_arrows:  # with the arrow up, notebook → views → notebook is a cycle
        assert any("headwidget.views._planted" in c for c in cycles(graph))


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from headwidget.stats import KVStats", {"headwidget.stats"}),
        ("def f():\n    from headwidget.export import save", {"headwidget.export"}),
        ("from . import errors", {"headwidget.errors"}),
        ("from .core import layout, Kind", {"headwidget.core.layout", "headwidget.core"}),
        ("import headwidget.core.layout", {"headwidget.core.layout"}),
        ("import numpy", set()),
        ("import importlib\nimportlib.import_module('headwidget.notebook')", {"headwidget.notebook"}),
        ("def f():\n    __import__('headwidget.widget')", {"headwidget.widget"}),
        (
            "from headwidget.analysis.conversions import _check",
            {"headwidget.analysis.conversions", "headwidget.analysis.conversions:_check"},
        ),
        ("importlib.import_module(name)", {"?"}),
        ("importlib.import_module('numpy')", set()),
    ],
)
def test_imports_are_read_including_lazy_and_relative(
    tmp_path: Path, source: str, expected: set[str]
) -> None:
    fake = tmp_path / "cli.py"
    fake.write_text(source)
    assert imports_of(fake, "headwidget.cli") == expected
