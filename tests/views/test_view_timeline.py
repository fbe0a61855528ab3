"""``TimelineView``: a training step's K/V panels equal that snapshot's matrices (computed here from its
float64 moments, and as the frozen-checkpoint views compute them), the trend lines equal
``Timeline.summary``, the step slider spans the snapshots, two timelines share it, and bad input is
refused with its own error."""

from __future__ import annotations

import json
import math
from types import SimpleNamespace

import numpy as np
import pytest
import torch

import headwidget
from figure_layout import layout_problems
from headwidget import Timeline, Tracker, notebook
from headwidget.analysis.alignment import align
from headwidget.errors import ArgumentError, LayerIndexError, UnknownKindError, UnknownOptionError
from headwidget.export import ExportError, figure, page_data, save
from headwidget.tracking import SUMMARY_METRICS
from headwidget.views import (
    AlignmentView,
    ChannelView,
    StepIndexError,
    TimelineStepsError,
    TimelineView,
    ViewSourceError,
    view_class,
    view_names,
)
from tiny_models import VOCAB, make_model

STEPS = [0, 3, 6]
PROBE = torch.randint(1, VOCAB, (3, 20), generator=torch.Generator().manual_seed(7))


def trained_timeline(name: str, seed: int) -> Timeline:
    """A tiny model trained by hand for 7 steps, a snapshot every 3 (steps 0, 3, 6), the loss logged."""
    model = make_model(name, dtype=torch.float32, seed=seed).train()
    tracker = Tracker(PROBE, every=3)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    gen = torch.Generator().manual_seed(seed)
    for step in range(7):
        if step % tracker.every == 0:
            tracker.snapshot(model, step)
        batch = torch.randint(1, VOCAB, (4, 16), generator=gen)
        loss = model(input_ids=batch, labels=batch).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        tracker.on_log(None, SimpleNamespace(global_step=step), None, logs={"loss": loss.item()})
    return tracker.timeline


@pytest.fixture(scope="module")
def gqa() -> Timeline:
    return trained_timeline("llama_gqa", seed=0)


@pytest.fixture(scope="module")
def mha() -> Timeline:
    return trained_timeline("llama_mha", seed=1)


def reference_corr(stats: headwidget.KVStats, layer: int, kind: str) -> np.ndarray:
    """Pearson correlation from the snapshot's co-moment, in float64 numpy (NaN: a constant channel)."""
    m2 = stats.moments(layer, kind).m2.to(torch.float64).numpy()
    scale = np.sqrt(np.diag(m2))
    with np.errstate(divide="ignore", invalid="ignore"):
        corr = m2 / np.outer(scale, scale)
    corr[~np.isfinite(corr)] = np.nan
    return corr


def grid_at(view: TimelineView, **state):
    return view.compute(view.current_state().replace(**state))


# ----------------------------------------------------------------------------------------- panels


def test_channel_panels_at_a_step_are_that_snapshots_correlation(gqa):
    view = TimelineView(gqa, prefetch=False)
    assert view.steps == STEPS and view.num_steps == 3 and view.kinds_available == ["key", "key_post"]
    for index, step in enumerate(STEPS):
        stats = gqa[step]
        for layer in (0, 1):
            for kind in ("key", "key_post"):
                grid = grid_at(view, step=index, layer=layer, kind=kind)
                assert [p.id for p in grid.panels] == [kind, "value"] and grid.columns == 2  # K beside V
                assert (grid.vmin, grid.vmax, grid.colormap) == (-1.0, 1.0, "diverging")
                for panel, k in zip(grid.panels, (kind, "value"), strict=True):
                    np.testing.assert_allclose(panel.matrix, reference_corr(stats, layer, k), atol=1e-9)
                    assert f"step {step}" in panel.title and f"layer {layer}" in panel.subtitle
                # exactly what the channel view shows for that snapshot
                frozen = ChannelView(stats, layer=layer, kind=kind, prefetch=False).grid
                for panel, theirs in zip(grid.panels, frozen.panels, strict=True):
                    np.testing.assert_array_equal(panel.matrix, theirs.matrix)


def test_the_snapshots_differ_so_the_panels_follow_the_step(gqa):
    view = TimelineView(gqa, prefetch=False)
    first, last = (grid_at(view, step=i).panels[0].matrix for i in (0, 2))
    assert not np.allclose(first, last, equal_nan=True)


def test_head_panels_at_a_step_are_the_alignment_views(gqa):
    view = TimelineView(gqa, show="heads", layer=1, prefetch=False)
    for index, step in enumerate(STEPS):
        stats = gqa[step]
        grid = grid_at(view, step=index)
        assert [p.id for p in grid.panels] == ["key-before", "key-after", "value-before", "value-after"]
        assert (grid.vmin, grid.vmax, grid.colormap, grid.columns) == (0.0, 1.0, "magma", 2)
        frozen = AlignmentView(stats, layer=1).grid
        for panel, theirs in zip(grid.panels, frozen.panels, strict=True):
            np.testing.assert_array_equal(panel.matrix, theirs.matrix)
        # and from the analysis directly: before is the snapshot's per-token cosine of the heads
        for kind, method in (("key", None), ("value", "orthogonal")):
            res = align(stats, [1], kind=kind, method=method)
            np.testing.assert_allclose(grid.panels[0 if kind == "key" else 2].matrix, res.before)
            np.testing.assert_allclose(
                stats.head_similarity(1, kind, "token_cosine"),
                res.before,
                atol=1e-12,
            )


# ----------------------------------------------------------------------------------------- trends


def test_trend_lines_are_the_timeline_summary_and_mark_the_step(gqa):
    view = TimelineView(gqa, layer=1, prefetch=False)
    summary = [row for row in gqa.summary() if row["layer"] == 1]
    assert [row["step"] for row in summary] == STEPS
    grid = grid_at(view, step=1)
    trends, loss = grid.charts
    assert trends.id == "trends" and loss.id == "loss"
    lines = {s.name: s for s in trends.series}
    assert list(lines) == [*SUMMARY_METRICS.values(), "step 3"]
    for metric, words in SUMMARY_METRICS.items():
        assert lines[words].x == [float(s) for s in STEPS]
        assert lines[words].y == pytest.approx([row[metric] for row in summary], abs=0, rel=1e-12)
    marker = lines["step 3"]
    assert marker.x == [3.0, 3.0] and marker.dashed
    values = [v for words in SUMMARY_METRICS.values() for v in lines[words].y]
    assert marker.y == [min(values), max(values)]
    # the same numbers through the one per-layer series function
    assert gqa.layer_series(1) == {m: [row[m] for row in summary] for m in SUMMARY_METRICS}


def test_the_loss_chart_is_the_trainers_log(gqa):
    view = TimelineView(gqa, prefetch=False)
    loss = grid_at(view, step=2).charts[1]
    logged = [(step, values["loss"]) for step, values in gqa.logs.items()]
    assert len(logged) == 7
    assert loss.series[0].x == [float(s) for s, _ in logged]
    assert loss.series[0].y == [v for _, v in logged]
    assert loss.series[-1].x == [6.0, 6.0]


def test_the_trend_and_loss_charts_share_one_step_axis(gqa):
    """A loss logged from step 5 (the snapshots from 0): both charts span steps 0 to 6, so the step
    shown is marked at the same place in each (the front end and the figure pad the same range alike)."""
    late = Timeline({s: gqa[s] for s in gqa.steps}, logs={s: v for s, v in gqa.logs.items() if s >= 5})
    trends, loss = TimelineView(late, prefetch=False).grid.charts
    assert loss.series[0].x == [5.0, 6.0] and trends.series[0].x == [0.0, 3.0, 6.0]
    assert trends.x_range == loss.x_range == [0.0, 6.0]
    assert trends.series[-1].x == loss.series[-1].x == [0.0, 0.0]  # the markers of step 0
    assert "click" not in trends.note + loss.note and "click" in trends.hint and "click" in loss.hint


def test_no_loss_chart_without_a_logged_loss(gqa):
    bare = Timeline({step: gqa[step] for step in gqa.steps})
    assert [c.id for c in TimelineView(bare, prefetch=False).grid.charts] == ["trends"]


# ----------------------------------------------------------------------------------------- state


def test_the_step_slider_spans_the_snapshots(gqa):
    view = TimelineView(gqa, prefetch=False)
    controls = {c["trait"]: c for c in view.widget.controls}
    assert list(controls) == ["step", "layer", "matrices", "kind"]
    assert controls["step"] == {
        "trait": "step",
        "type": "slider",
        "label": "Step",
        "count": "num_steps",
        "text": "step_label",
        "play": True,
    }
    assert "play" not in controls["layer"]
    assert view.num_steps == 3 and view.step_label == "step 0 (1 of 3: steps 0–6)"
    view.step = 2
    assert view.step_label == "step 6 (3 of 3: steps 0–6)" and view.grid.panels[0].title == "Keys · step 6"
    last = view.grid
    view.step = 3  # one past the last snapshot: said in the error line, the last panels stay
    assert view.error.startswith("step index 3 is out of range: the timeline holds 3 snapshots")
    assert view.grid is last
    with pytest.raises(StepIndexError, match=r"indices 0\.\.2, steps 0\.\.6"):
        grid_at(view, step=3)
    view.step = 1
    assert view.error == "" and view.step_label.startswith("step 3 ")


def test_neighbours_are_the_next_step_and_the_next_layer(gqa):
    view = TimelineView(gqa, prefetch=False)
    state = view.current_state()
    assert [(n.step, n.layer) for n in view.neighbours(state)] == [(1, 0), (0, 1)]
    assert [(n.step, n.layer) for n in view.neighbours(state.replace(step=2, layer=1))] == []


def test_compute_is_a_function_of_the_state(gqa):
    view = TimelineView(gqa, prefetch=False)
    saved = view.current_state()
    heads = grid_at(view, step=2, layer=1, matrices="heads")
    assert view.current_state() == saved and heads.panels[0].title == "Keys · before"
    assert heads.panels[0].subtitle.startswith("step 6 · layer 1 · per-token cosine")
    again = grid_at(view, step=2, layer=1, matrices="heads")
    for a, b in zip(heads.panels, again.panels, strict=True):
        np.testing.assert_array_equal(a.matrix, b.matrix)


def test_a_click_on_a_trend_point_shows_its_step(gqa):
    view = headwidget.TimelineView(gqa, prefetch=False)  # its widget: a click arrives as an event
    view.widget._clicked({"chart": "trends", "series": 0, "point": 2})
    assert view.step == 2
    view.widget._clicked({"chart": "loss", "series": 0, "point": 4})  # logged at step 4: nearest snapshot 3
    assert view.step == 1
    marker = len(SUMMARY_METRICS)  # the last series of the trend chart
    view.widget._clicked({"chart": "trends", "series": marker, "point": 0})  # the marker: nothing
    view.widget._clicked({"chart": "nowhere", "series": 0, "point": 0})
    assert view.step == 1


# ----------------------------------------------------------------------------------------- side by side


def test_two_timelines_side_by_side_share_the_step_slider(gqa, mha):
    view = TimelineView({"GQA": gqa, "MHA": mha}, layer=1, prefetch=False)
    assert (
        view.num_steps == 3
        and view.caption == "GQA: LlamaForCausalLM vs MHA: LlamaForCausalLM · layer 1 · step 0"
    )
    grid = grid_at(view, step=2)
    assert [p.id for p in grid.panels] == ["GQA:key", "MHA:key", "GQA:value", "MHA:value"]
    assert grid.columns == 2 and grid.panels[1].title == "MHA · Keys · step 6"
    for panel, (timeline, kind) in zip(
        grid.panels, [(gqa, "key"), (mha, "key"), (gqa, "value"), (mha, "value")], strict=True
    ):
        np.testing.assert_allclose(panel.matrix, reference_corr(timeline[6], 1, kind), atol=1e-9)
    trends = grid.charts[0]
    names = [s.name for s in trends.series]
    m = len(SUMMARY_METRICS)
    assert names[:m] == [f"GQA · {w}" for w in SUMMARY_METRICS.values()]
    assert names[m : 2 * m] == [f"MHA · {w}" for w in SUMMARY_METRICS.values()] and names[2 * m] == "step 6"
    assert [s.dashed for s in trends.series[: 2 * m]] == [False] * m + [True] * m
    assert trends.series[m].y == mha.layer_series(1)["key_abs_corr"]
    heads = grid_at(view, matrices="heads")
    assert heads.columns == 4 and [p.id for p in heads.panels][:4] == [
        "GQA:key-before",
        "GQA:key-after",
        "MHA:key-before",
        "MHA:key-after",
    ]
    assert heads.panels[2].matrix.shape == (4, 4) and heads.panels[0].matrix.shape == (2, 2)


def test_timelines_with_different_steps_are_refused(gqa, mha):
    fewer = Timeline({step: mha[step] for step in mha.steps[:2]})
    with pytest.raises(
        TimelineStepsError, match=r"'GQA' has 3 steps \(0, 3, 6\), 'MHA' has 2 steps \(0, 3\)"
    ):
        TimelineView({"GQA": gqa, "MHA": fewer})
    assert issubclass(TimelineStepsError, headwidget.TrackingError)


# ----------------------------------------------------------------------------------------- bad input

BAD_COUNTS = [0.5, 2.0, True, "1", math.nan, math.inf, 2**62, None]


@pytest.mark.parametrize("name", ["step", "layer", "max_cells"])
@pytest.mark.parametrize("value", BAD_COUNTS, ids=repr)
def test_a_bad_count_is_refused_by_name(gqa, name, value):
    if name == "layer" and value is None:
        return  # None: the first captured layer
    with pytest.raises(ArgumentError, match=rf"^{name} must be"):
        TimelineView(gqa, **{name: value})


def test_bad_arguments_get_their_own_errors(gqa):
    with pytest.raises(ArgumentError, match=r"^step must be at least 0"):
        TimelineView(gqa, step=-1)
    with pytest.raises(StepIndexError, match="step index 3 is out of range"):
        TimelineView(gqa, step=3)
    with pytest.raises(LayerIndexError, match="layer 2 is out of range: the model has 2 layers"):
        TimelineView(gqa, layer=2)
    with pytest.raises(
        UnknownOptionError, match="unknown show 'diagonal': the timeline view shows 'channels' or 'heads'"
    ):
        TimelineView(gqa, show="diagonal")
    with pytest.raises(UnknownKindError, match="shows keys"):
        TimelineView(gqa, kind="value")
    with pytest.raises(ArgumentError, match=r"^prefetch must be True or False"):
        TimelineView(gqa, prefetch="yes")
    with pytest.raises(ArgumentError, match=r"^max_cells must be at least 1"):
        TimelineView(gqa, max_cells=0)


def test_what_is_not_a_timeline_is_refused(gqa):
    stats = gqa[0]
    with pytest.raises(ViewSourceError, match=r"needs a headwidget\.Timeline .* got KVStats"):
        TimelineView(stats)
    with pytest.raises(ViewSourceError, match="got an empty dict"):
        TimelineView({})
    with pytest.raises(ViewSourceError, match="this timeline holds none"):
        TimelineView(Timeline({}))
    with pytest.raises(ViewSourceError, match=r"timeline 'a' must be a headwidget\.Timeline"):
        TimelineView({"a": stats})
    with pytest.raises(ViewSourceError, match="non-empty strings, got 3"):
        TimelineView({3: gqa})
    with pytest.raises(ViewSourceError, match=r"timeline=tracker\.timeline"):
        TimelineView.create(stats)


def test_a_layer_some_snapshot_did_not_capture_is_refused(gqa):
    model = make_model("llama_gqa", dtype=torch.float32)
    partial = Timeline.from_checkpoints([model], [0], PROBE, layers=[1])
    with pytest.raises(
        LayerIndexError, match=r"layer 0 was not captured in the timeline: its layers are \[1\]"
    ):
        TimelineView(partial, layer=0)
    assert TimelineView(partial, prefetch=False).layer == 1


# ----------------------------------------------------------------------------------------- registry


def test_it_is_registered_and_offered_only_with_a_timeline(gqa):
    assert view_class("timeline") is TimelineView and "timeline" in view_names()
    assert headwidget.TimelineView.view_name == "timeline" and not TimelineView.shows(gqa[0])
    created = TimelineView.create(layers=[1], timeline=gqa, interactive=False, show="heads")
    assert (created.layer, created.matrices, created.prefetch) == (1, "heads", False)
    stats = gqa[6]
    dash = notebook.Dashboard(stats, options={"channels": {"channel_width": 4}})
    assert "timeline" not in dash.views and dash.timeline is None
    dash = notebook.explore(gqa)
    assert list(dash.views)[-1] == "timeline" and "mechanisms" not in dash.views
    assert dash.timeline is not None and dash.tabs.titles[-1] == "Over training"
    assert dash.channels.stats is gqa[6]  # the other tabs show the last snapshot
    dash.channels.layer = 1
    assert dash.timeline.layer == 1


# ----------------------------------------------------------------------------------------- export


@pytest.mark.parametrize("show", ["channels", "heads"])
def test_the_figure_of_two_timelines_is_laid_out(gqa, mha, show):
    view = TimelineView({"GQA": gqa, "MHA": mha}, show=show, step=1, prefetch=False)
    fig = figure(view, dpi=100)
    assert layout_problems(fig) == []
    assert fig.texts[0].get_text() == "GQA: LlamaForCausalLM vs MHA: LlamaForCausalLM · layer 0 · step 3"


@pytest.mark.parametrize("suffix", [".png", ".svg", ".pdf"])
def test_a_figure_of_the_chosen_step_is_saved(gqa, tmp_path, suffix):
    view = TimelineView(gqa, step=1, prefetch=False)
    path = save(view, tmp_path / f"timeline{suffix}", dpi=60)
    assert path.stat().st_size > 2000


def test_the_offline_page_holds_every_step(gqa, tmp_path):
    view = TimelineView(gqa, layer=1, prefetch=False)
    data = page_data(view, progress=False)
    assert [a["trait"] for a in data["axes"]] == ["step", "layer", "matrices", "kind"]
    assert len(data["frames"]) == 3 * 2 * 2 * 2 and data["state"]["status"] == ""
    frame = data["frames"]['[2,1,"heads","key_post"]']
    assert frame["traits"]["step_label"] == "step 6 (3 of 3: steps 0–6)"
    assert [c["id"] for c in frame["charts"]] == ["trends", "loss"]
    assert save(view, tmp_path / "timeline.html").stat().st_size > 10_000
    # A page too small for every state keeps every step of the saved layer and show, and says so
    one = page_data(view, progress=False, max_bytes=40_000)
    held = [tuple(json.loads(k)) for k in one["frames"]]
    assert {(s, 1, "channels", "key") for s in range(3)} <= set(held)
    assert len(held) < 24 and "every position of “Step” is held first" in one["state"]["status"]
    with pytest.raises(ExportError, match="more than 0 MiB of panel data"):
        page_data(view, progress=False, max_bytes=1_000)


def test_a_step_outside_the_snapshots_is_said_at_assignment_in_every_widget(gqa):
    """Issue 44, defect 7: ``view.step = 99`` or ``-1`` is the error line over the last good panels, as
    a layer outside the model is for the layer views, and a widget shown afterwards says it too (it
    used to clear the view's error: the researcher saw nothing)."""
    for view in (TimelineView(gqa, prefetch=False), ChannelView(gqa[0], prefetch=False)):
        trait = "step" if isinstance(view, TimelineView) else "layer"
        grid = view.grid
        for bad in (99, -1):
            said = f"{trait} {'index ' if trait == 'step' else ''}{bad} is out of range"
            setattr(view, trait, bad)
            assert said in view.error and view.grid is grid
            widget = view.widget  # (first made after the bad value) it says so, and so does the view
            assert said in widget.error and widget.error == view.error and getattr(widget, trait) == bad
        with pytest.raises(ExportError, match="cannot show its current state"):
            page_data(view, progress=False)
        setattr(view, trait, 0)
        assert view.error == "" and view.widget.error == ""
        view.close()


def test_a_timeline_of_600_snapshots_saves_its_page_with_the_charts_once(gqa, tmp_path):
    """Issue 44, defect 12: every state of a timeline's page held the trend charts again (600 steps of
    six lines each), so a page of ~450 snapshots or more was refused; the page holds each series once."""
    snapshot, steps = gqa[0], list(range(0, 6000, 10))
    timeline = Timeline(dict.fromkeys(steps, snapshot), logs={s: {"loss": 5.0 - s / 6000} for s in steps})
    view = TimelineView(timeline, layer=0, prefetch=False)
    page = save(view, tmp_path / "long.html")  # (refused before: "more than 64 MiB of panel data")
    assert page.stat().st_size < 16 * 2**20
    text = page.read_text(encoding="utf-8").split('<script type="application/json" id="headwidget-data">')[1]
    data = json.loads(text.split("</script>")[0])
    assert {json.loads(key)[0] for key in data["frames"]} == set(range(600))  # every step
    trend_lines = 6 + 1  # the six metrics and the loss, each once; a marker per step
    assert len(data["series"]) == trend_lines + 600 * 2
    frame = data["frames"]['[599,0,"channels","key"]']
    chart = frame["charts"][0]
    lines = [data["series"][i] for i in chart["series"]]
    assert [s["name"] for s in lines[:6]] == list(SUMMARY_METRICS.values())
    assert lines[0]["y"] == view.grid.charts[0].series[0].y and lines[-1]["x"] == [5990.0, 5990.0]
