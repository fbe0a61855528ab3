"""The view registry and what views declare: state traits, their controls, and no widget imports."""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import numpy as np
import pytest
import traitlets as t

from headwidget.core.kinds import KIND_LABELS
from headwidget.core.panels import Panel, PanelGrid
from headwidget.errors import UnknownViewError
from headwidget.views import (
    AlignmentView,
    ChannelView,
    Control,
    LayerState,
    LayerView,
    MechanismView,
    View,
    ViewSourceError,
    ViewSources,
    ViewState,
    _registry,
    register_view,
    select,
    slider,
    state,
    view_class,
    view_names,
    window,
)

PACKAGE = Path(__file__).resolve().parents[2] / "python" / "headwidget"


@pytest.fixture(scope="module")
def llama_stats():
    import torch

    import headwidget
    from tiny_models import make_model, ragged_batches

    return headwidget.capture(make_model("llama_gqa", dtype=torch.float32), ragged_batches(), progress=False)


def test_the_built_in_views_are_registered_in_their_order():
    assert view_names()[:3] == ["channels", "alignment", "mechanisms"]
    assert [view_class(n) for n in view_names()[:3]] == [ChannelView, AlignmentView, MechanismView]
    assert [view_class(n).title for n in view_names()[:3]] == ["Channels", "Head alignment", "Mechanisms"]
    assert ChannelView.view_name == "channels"


def test_an_unknown_view_lists_the_names():
    with pytest.raises(UnknownViewError, match="unknown view 'heads'; the views are channels, alignment"):
        view_class("heads")


def test_each_view_declares_its_state_and_controls_once():
    assert ChannelView.state_traits() == ["channel_start", "channel_width", "kind", "layer", "pinned"]
    assert AlignmentView.state_traits() == ["alignment", "kind", "layer", "metric"]
    assert MechanismView.state_traits() == ["circuit", "layer", "mechanisms"]
    assert [c.to_json() for c in ChannelView.view_controls()] == [
        {"trait": "layer", "type": "slider", "label": "Layer", "count": "num_layers", "text": "layer_label"},
        {
            "trait": "channel_start",
            "type": "window",
            "label": "Channels",
            "width": "channel_width",
            "total": "num_channels",
            "step": "channel_step",
        },
        {
            "trait": "kind",
            "type": "toggles",
            "label": "Kind",
            "options": "kinds_available",
            "labels": KIND_LABELS,
        },
    ]
    assert KIND_LABELS["key_post"] == "keys, post-RoPE"  # what the kind buttons say
    assert [(c.trait, c.type, c.options) for c in AlignmentView.view_controls()[1:]] == [
        ("kind", "toggles", "kinds_available"),
        ("metric", "select", "metrics_available"),
        ("alignment", "select", "alignments_available"),
    ]
    assert [(c.trait, c.type, c.label) for c in MechanismView.view_controls()[1:]] == [
        ("circuit", "select", "Circuit"),
        ("mechanisms", "checklist", "Mechanisms"),
        ("add_mechanism", "entry", "Add mechanism"),  # input, not state: it adds to mechanisms
    ]
    for view in (ChannelView, AlignmentView, MechanismView):
        for control in view.view_controls():  # every trait a control reads exists and is synced
            for name in control.traits():
                assert view.class_traits()[name].metadata.get("sync") is True, (view, name)


@dataclasses.dataclass(frozen=True)
class ScaledState(LayerState):
    factor: float = state(1.0, select("Factor", options="factors"))


def test_a_new_view_is_registered_with_its_controls_and_recomputes_on_its_state():
    class Scaled(LayerView[ScaledState]):
        factors = t.List(t.Unicode()).tag(sync=True)

        def compute(self, state, resolution=None) -> PanelGrid:
            if state.layer < 0:
                raise ValueError("layer must be ≥ 0")
            m = state.factor * np.eye(2) + state.layer
            return PanelGrid([Panel("m", "scaled", m)], -1.0, 1.0, "diverging", "")

    try:
        register_view("scaled-test", order=15)(Scaled)
        assert view_names()[:2] == ["channels", "scaled-test"] and view_class("scaled-test") is Scaled
        assert [c.trait for c in Scaled.view_controls()] == ["layer", "factor"]
        view = Scaled()
        assert view.grid.panels[0].matrix[0, 0] == 1.0
        view.factor = 0.5
        view.layer = 2
        assert view.grid.panels[0].matrix.tolist() == [[2.5, 2.0], [2.0, 2.5]]
        before = view.grid
        view.layer = -1
        assert view.error == "layer must be ≥ 0" and view.grid is before
        with pytest.raises(ValueError, match="already registered"):
            register_view("scaled-test")(type("Other", (Scaled,), {}))
    finally:
        _registry._VIEWS.pop("scaled-test", None)
        _registry._ORDER.pop("scaled-test", None)
    assert "scaled-test" not in view_names()


def test_controls_describe_what_they_read():
    layer = slider("Layer", count="num_layers", text="layer_label").bind("layer")
    assert layer.traits() == ["layer", "num_layers", "layer_label"]
    win = window("Channels", width="w", total="n").bind("start")
    assert win.to_json() == {
        "trait": "start",
        "type": "window",
        "label": "Channels",
        "width": "w",
        "total": "n",
    }
    with pytest.raises(ValueError, match="unknown control type 'dial'"):
        Control("dial", "X")  # type: ignore[arg-type]
    assert View.view_controls() == [] and View.state_traits() == []


def imported_modules(path: Path) -> set[str]:
    """Every absolute module name a source file imports (module level and inside functions)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            found.add(node.module)
            found.update(f"{node.module}.{a.name}" for a in node.names)
    return found


def module_file(name: str) -> Path | None:
    rel = Path(*name.split(".")[1:])
    for path in (PACKAGE / rel.with_suffix(".py"), PACKAGE / rel / "__init__.py"):
        if path.is_file():
            return path
    return None


def test_views_import_no_widget_or_plotting_library():
    """Nor does anything they import from headwidget, however deep."""
    todo = list((PACKAGE / "views").glob("*.py"))
    seen: set[Path] = set()
    outside: set[str] = set()
    while todo:
        path = todo.pop()
        if path in seen:
            continue
        seen.add(path)
        for name in imported_modules(path):
            if name.split(".")[0] == "headwidget":
                if (found := module_file(name)) is not None:
                    todo.append(found)
            else:
                outside.add(name.split(".")[0])
    assert {PACKAGE / "core" / "panels.py", PACKAGE / "analysis" / "alignment.py"} <= seen
    assert {"traitlets", "numpy", "torch"} <= outside
    assert not outside & {"anywidget", "ipywidgets", "bqplot", "matplotlib", "IPython"}


def test_what_each_view_is_built_from_is_declared_once():
    """Every built-in view: its ``sources`` names what it is built from, and ``create`` (the command
    line's, the magic's and explore's way in) is the base's, for all of them."""
    expected = {
        "channels": ("stats", (), "pinned", True),
        "alignment": ("stats", (), "layers", False),
        "mechanisms": ("model", ("stats", "report"), "layer", True),
        "consequences": ("report", (), "layer", False),
        "healing": ("healing", (), "layer", False),
        "quantization": ("stats", ("report",), "layer", False),
        "timeline": ("timeline", (), "layer", True),
        "trends": ("stats", ("model",), "layer", False),
    }
    for name in expected:
        cls = view_class(name)
        made = cls.sources
        assert (made.main, made.optional, made.layers, made.prefetch) == expected[name], name
        assert "create" not in vars(cls) and "__init__" in vars(cls), name  # one constructor of its own


def test_a_view_names_its_sources_and_renaming_a_parameter_changes_nothing(llama_stats):
    """What a view is built from is its ``sources``, never its constructor's parameter names: a view
    whose first parameter is called anything is built from what it declares; a source that is not
    one, or a ``sources`` that is not a ViewSources, is refused when declared or registered."""

    class Renamed(LayerView[LayerState]):
        sources = ViewSources("stats", layers="layer")

        def __init__(self, captured, *, layer: int = 0) -> None:
            self.captured = captured
            super().__init__()
            self.set_up(LayerState(layer=layer), num_layers=2)

        def compute(self, state, resolution=None) -> PanelGrid:
            return PanelGrid([Panel("m", "m", np.eye(2) * state.layer)], -1.0, 1.0, "diverging", "")

    try:
        register_view("renamed-test")(Renamed)
        view = view_class("renamed-test").create(llama_stats, layers=[1])
        assert view.captured is llama_stats and view.layer == 1
    finally:
        _registry._VIEWS.pop("renamed-test", None)
        _registry._ORDER.pop("renamed-test", None)
    with pytest.raises(ValueError, match="built from one of stats, model, report, timeline, healing"):
        ViewSources("runs")

    class Unsaid(View[ViewState]):
        sources = "stats"  # type: ignore[assignment]

    with pytest.raises(TypeError, match=r"Unsaid.sources must say what the view is built from"):
        register_view("misnamed-test")(Unsaid)
    assert "misnamed-test" not in view_names()


def test_create_maps_the_named_layers_and_sources_onto_the_constructor():
    """A throw-away view whose constructor records what it was given: ``create`` passes the source it
    is built from positionally, the optional sources it takes when given, the first layer, the rest
    as pinned, ``interactive`` as ``prefetch``; sources it does not take are ignored."""

    class Recorded(LayerView[LayerState]):
        sources = ViewSources("report", ("model",), "pinned", prefetch=True)

        def __init__(self, report, *, layer=0, pinned=(), model=None, prefetch=True, flavour="plain"):
            self.given = {"report": report, "layer": layer, "pinned": pinned, "model": model}
            self.given.update(prefetch=prefetch, flavour=flavour)
            super().__init__()

        def compute(self, state, resolution=None) -> PanelGrid:
            return PanelGrid([Panel("m", "m", np.eye(2))], -1.0, 1.0, "diverging", "")

    made = Recorded.sources
    assert (made.main, made.optional, made.layers, made.prefetch) == ("report", ("model",), "pinned", True)
    view = Recorded.create("stats", "model", layers=[3, 1, 2], interactive=False, report="r", timeline="x")
    assert view.given == {
        "report": "r",
        "layer": 3,
        "pinned": [1, 2],
        "model": "model",
        "prefetch": False,
        "flavour": "plain",
    }
    assert Recorded.create(report="r", flavour="bold").given == {
        "report": "r",
        "layer": 0,
        "pinned": (),
        "model": None,
        "prefetch": True,
        "flavour": "bold",
    }
    assert Recorded.create(report="r", layers=[4], layer=2).given["layer"] == 2  # an explicit layer wins
    with pytest.raises(ViewSourceError, match="the Recorded view needs an evaluation report: report="):
        Recorded.create("stats", "model")
