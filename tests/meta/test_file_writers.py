"""Every file headwidget writes goes through the atomic writer of ``headwidget.files``.

Two checks: the source itself (every call that writes a file, such as ``write_text``, ``savefig`` or
``open(..., "w")``, sits in a ``with atomic_write(...)`` / ``with atomic_output(...)`` block and writes
to what that block gives), and each writer under a disk that fills up midway: the previous file stays
byte for byte and nothing is left beside it.
"""

from __future__ import annotations

import ast
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest

from disk_full import check_the_limit_works, disk_full_after, snapshot
from headwidget.cli._report_files import REPORT_SUFFIXES, write_report
from headwidget.core.panels import Panel, PanelGrid
from headwidget.evaluation import EvaluationReport
from headwidget.evaluation.report_file import REPORT_SUFFIXES as SAVED_SUFFIXES
from headwidget.export import save, save_all, save_html
from headwidget.export._tabs import save_tabbed_html
from headwidget.files import partial_leftovers

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "headwidget"
#: Methods and functions that write a file they are given the path of.
WRITERS = {"write_text", "write_bytes", "savefig", "save_file", "dump", "savetxt", "imsave", "to_csv"}
ATOMIC = {"atomic_write", "atomic_output"}


def _name(node: ast.AST) -> str | None:
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return None


def _opens_for_writing(call: ast.Call) -> bool:
    method = isinstance(call.func, ast.Attribute)
    if _name(call.func) != "open" or (method and _name(call.func.value) == "os"):  # os.open: flags
        return False
    modes = [k.value for k in call.keywords if k.arg == "mode"]
    positional = call.args[:1] if method else call.args[1:2]
    modes += positional
    return any(
        isinstance(m, ast.Constant) and isinstance(m.value, str) and set(m.value) & set("wax+") for m in modes
    )


def _writes(call: ast.Call) -> bool:
    name = _name(call.func)
    if name in WRITERS:
        return True
    if name == "save" and isinstance(call.func, ast.Attribute) and _name(call.func.value) in ("torch", "np"):
        return True
    return _opens_for_writing(call)


def unguarded_writes(tree: ast.AST) -> list[int]:
    """Lines of file-writing calls outside a ``with atomic_*(...) as x`` block that writes to ``x``."""
    bad: list[int] = []

    def visit(node: ast.AST, targets: frozenset[str]) -> None:
        if isinstance(node, (ast.With, ast.AsyncWith)):
            names = set(targets)
            for item in node.items:
                call = item.context_expr
                atomic = isinstance(call, ast.Call) and _name(call.func) in ATOMIC
                if atomic and isinstance(item.optional_vars, ast.Name):
                    names.add(item.optional_vars.id)
            targets = frozenset(names)
        if isinstance(node, ast.Call) and _writes(node):
            used = {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}
            if not used & targets:
                bad.append(node.lineno)
        for child in ast.iter_child_nodes(node):
            visit(child, targets)

    visit(tree, frozenset())
    return bad


def test_the_scan_finds_direct_writes() -> None:
    direct = """
import json, torch
from pathlib import Path
path.write_text("x")
Path(p).write_bytes(b"")
fig.savefig(path, format="png")
json.dump(data, fh)
torch.save(obj, path)
with open(path, "w") as fh:
    fh.write("x")
with path.open("wb") as fh:
    pass
with atomic_output(target) as tmp:
    other.write_text("x")
"""
    assert unguarded_writes(ast.parse(direct)) == [4, 5, 6, 7, 8, 9, 11, 14]
    guarded = """
with atomic_write(path, "w") as fh:
    fh.write(text)
with atomic_output(path) as tmp:
    fig.savefig(tmp, format="png")
    save_file(tensors, str(tmp))
    tmp.write_bytes(b"")
with open(path) as fh, open(path, "rb") as other:
    pass
"""
    assert unguarded_writes(ast.parse(guarded)) == []


def test_every_file_written_goes_through_headwidget_files() -> None:
    found = {}
    for source in sorted(PACKAGE.rglob("*.py")):
        if source == PACKAGE / "files.py":  # the atomic writer itself
            continue
        lines = unguarded_writes(ast.parse(source.read_text(encoding="utf-8")))
        if lines:
            found[str(source.relative_to(PACKAGE))] = lines
    assert not found, f"files written without headwidget.files (file: lines): {found}"


# ---------------------------------------------------------------------- each writer, the disk full midway
def grid(size: int) -> PanelGrid:
    values = np.random.default_rng(0).standard_normal((size, size))
    return PanelGrid([Panel("a", "Keys · layer 0", values)], -3.0, 3.0, "diverging", "correlation")


def page(g: PanelGrid) -> str:
    """A page whose length grows with the grid's."""
    return "<p>a cell</p>" * g.panels[0].matrix.size


def report() -> EvaluationReport:
    return EvaluationReport(
        model="tiny",
        kind="causal-lm",
        variants=["model", "mqa"],
        measures={
            "model": {"nll": 2.0, "perplexity": 7.389, "kl": 0.0, "top1": 1.0},
            "mqa": {"nll": 2.5, "perplexity": 12.18, "kl": 0.4, "top1": 0.8},
        },
        kv_bytes_per_token={"model": 512, "mqa": 128},
        tokens=100,
        sequences=4,
        fingerprint="0123456789abcdef",
        dtype="torch.float32",
        layers=[0, 1],
        per_layer={"model": [0.0, 0.0], "mqa": [0.25, 0.125]},
        per_layer_measure="delta_nll",
    )


def small_report() -> EvaluationReport:
    return EvaluationReport(
        model="tiny",
        kind="causal-lm",
        variants=["model"],
        measures={"model": {"nll": 2.0, "perplexity": 7.389, "kl": 0.0, "top1": 1.0}},
        kv_bytes_per_token={"model": 512},
        tokens=100,
        sequences=4,
        fingerprint="0",
        dtype="torch.float32",
    )


WRITES = {
    "export.save .png": (".png", lambda p, g: save(g, p, dpi=30)),
    "save_all .svg": (".svg", lambda p, g: save_all(g, [p], dpi=30)),
    "save_all .pdf": (".pdf", lambda p, g: save_all(g, [p], dpi=30)),
    "save_html": (".html", lambda p, g: save_html(g, p)),
    "save_tabbed_html": (".html", lambda p, g: save_tabbed_html(p, [("one", page(g))], "tabs")),
    "cli report .json": (".json", lambda p, r: write_report(r, p, evaluation="text", calibration="none")),
    "cli report .md": (".md", lambda p, r: write_report(r, p, evaluation="text", calibration="none")),
}


@pytest.mark.parametrize("writer", list(WRITES))
def test_a_writer_whose_disk_fills_up_keeps_the_previous_file(writer: str, tmp_path: Path) -> None:
    check_the_limit_works(tmp_path)
    suffix, write = WRITES[writer]
    small, large = (small_report(), report()) if "report" in writer else (grid(2), grid(60))
    path = tmp_path / f"out{suffix}"
    write(path, small)
    before = snapshot(tmp_path)
    assert before[path.name]
    with disk_full_after(path.stat().st_size), pytest.raises(OSError, match="too large"):
        write(path, large)
    assert snapshot(tmp_path) == before
    assert partial_leftovers(tmp_path) == []
    write(path, large)  # with room again the new content lands
    assert path.stat().st_size > len(before[path.name])


def test_the_command_line_takes_the_report_suffixes_that_save_writes(tmp_path: Path) -> None:
    assert REPORT_SUFFIXES == SAVED_SUFFIXES
    for suffix in REPORT_SUFFIXES:
        small_report().save(tmp_path / f"r{suffix}")
    with pytest.raises(OSError, match=r"\.json, \.md"):
        small_report().save(tmp_path / "r.txt")


# ---------------------------------------------------------------------- every entry point, a NUL byte
def _nul_attempts(bad: Path) -> dict[str, Callable[[], object]]:
    import torch

    from headwidget import HealingRun, KVStats, Timeline, Tracker

    return {
        "KVStats.load": lambda: KVStats.load(f"{bad}.safetensors"),
        "EvaluationReport.save": lambda: small_report().save(f"{bad}.json"),
        "EvaluationReport.load": lambda: EvaluationReport.load(f"{bad}.json"),
        "HealingRun.load": lambda: HealingRun.load(f"{bad}.json"),
        "HealingRun.load_all": lambda: HealingRun.load_all(f"{bad}.json"),
        "Timeline.load": lambda: Timeline.load(bad),
        "Tracker(path=)": lambda: Tracker(torch.ones(1, 4, dtype=torch.long), path=bad),
        "export.save": lambda: save(grid(2), f"{bad}.png", dpi=30),
        "save_html": lambda: save_html(grid(2), f"{bad}.html"),
        "save_tabbed_html": lambda: save_tabbed_html(f"{bad}.html", [("one", "<p>x</p>")], "tabs"),
        "cli report .md": lambda: write_report(
            small_report(), Path(f"{bad}.md"), evaluation="t", calibration="n"
        ),
    }


@pytest.mark.parametrize("entry", list(_nul_attempts(Path("x"))))
def test_a_nul_byte_in_any_save_or_load_path_is_a_headwidget_error(entry: str, tmp_path: Path) -> None:
    """Every function that saves or loads a file refuses a path with a NUL byte by saying so (a bare
    ``ValueError: embedded null byte`` before), and writes nothing. (``KVStats.save``, ``HealingRun.save``
    and the runs' files are tried in their own tests, with statistics and runs to save.)"""
    from headwidget.errors import HeadwidgetError

    with pytest.raises(HeadwidgetError, match=r"holds a NUL byte, which no file name may; remove it"):
        _nul_attempts(tmp_path / "a\x00b")[entry]()
    assert list(tmp_path.iterdir()) == []
