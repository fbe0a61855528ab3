"""Views turn a state into the right matrices (checked against KVStats and the analyses directly).

These are the plain views of ``headwidget.views`` (no widget): what the notebook shows and the export
saves is their ``grid`` (``test_notebook.py`` checks the widgets send it).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

import headwidget
from headwidget.analysis.alignment import align
from headwidget.analysis.conversions import convert
from headwidget.analysis.operator_space import operator_similarity
from headwidget.core.panels import Panel, encode_panel
from headwidget.errors import ArgumentError
from headwidget.views import AlignmentView, ChannelView, MechanismView
from tiny_models import make_model, ragged_batches


@pytest.fixture(scope="module")
def llama():
    model = make_model("llama_gqa", dtype=torch.float32)
    stats = headwidget.capture(
        model, ragged_batches(), rope="both", inputs=True, cross_layer=True, progress=False
    )
    return model, stats


def decode(panel: dict) -> np.ndarray:
    dtype = {"float16": "<f2", "float32": "<f4"}[panel["dtype"]]
    return np.frombuffer(panel["data"], dtype=dtype).reshape(panel["rows"], panel["cols"]).astype(np.float64)


def test_channel_view_window_matches_stats(llama):
    _, stats = llama
    view = ChannelView(stats, layer=1, channel_start=3, channel_width=9)
    assert [p.id for p in view.grid.panels] == ["key-1", "value-1"]
    np.testing.assert_array_equal(view.grid.panels[0].matrix, stats.channel_corr(1, "key")[3:12, 3:12])
    np.testing.assert_array_equal(view.grid.panels[1].matrix, stats.channel_corr(1, "value")[3:12, 3:12])
    sent = encode_panel(view.grid.panels[0], vmin=view.grid.vmin, vmax=view.grid.vmax)
    assert (sent["row_offset"], sent["row_step"], sent["rows"]) == (3, 1, 9)
    assert np.abs(decode(sent) - stats.channel_corr(1, "key")[3:12, 3:12]).max() <= 4.9e-4


def test_channel_view_follows_state_changes(llama):
    _, stats = llama
    view = ChannelView(stats, layer=0)
    assert view.kinds_available == ["key", "key_post"]
    view.kind = "key_post"
    np.testing.assert_array_equal(view.grid.panels[0].matrix, stats.channel_corr(0, "key_post"))
    view.pinned = [1]
    assert [p.id for p in view.grid.panels] == ["key_post-0", "key_post-1", "value-0", "value-1"]
    assert view.grid.columns == 2
    view.layer = 1
    assert [p.id for p in view.grid.panels] == ["key_post-1", "value-1"]


def test_channel_view_downsamples_with_a_visible_rule(llama):
    _, stats = llama
    view = ChannelView(stats, layer=0, max_cells=5)  # 16 channels → blocks of 4 → 4×4
    panel = view.grid.panels[0]
    full = stats.channel_corr(0, "key")
    expected = np.array(
        [[full[4 * i : 4 * i + 4, 4 * j : 4 * j + 4].mean() for j in range(4)] for i in range(4)]
    )
    np.testing.assert_allclose(panel.matrix, expected, atol=1e-12)
    assert panel.row_step == 4 and "mean of 4×4 blocks" in panel.note


def test_bad_states_show_an_error_and_keep_the_panels(llama):
    _, stats = llama
    view = ChannelView(stats, layer=0)
    before = view.grid
    view.layer = 9
    assert "out of range" in view.error and view.grid is before
    view.layer = 1
    assert view.error == "" and view.grid.panels[0].id == "key-1"
    view.channel_start = 40
    assert "channel_start 40 is outside 0..15" in view.error
    view.channel_start = 0
    view.channel_width = 0
    assert "channel_width must be ≥ 1" in view.error
    only_first = headwidget.capture(
        make_model("llama_gqa", dtype=torch.float32), ragged_batches(), layers=[0], progress=False
    )
    partial = ChannelView(only_first, layer=0)
    shown = partial.grid
    partial.layer = 1
    assert "was not captured" in partial.error and partial.grid is shown
    for name, value in (("kind", "query"), ("channel_start", -5), ("pinned", [7])):
        view = ChannelView(stats, layer=0)
        before = view.grid
        setattr(view, name, value)  # what a control (or Python) does after the view is built
        assert view.error and view.grid is before, name


def test_wire_format_two_bytes_per_cell_and_nan_survives():
    matrix = np.linspace(-1, 1, 1024 * 1024).reshape(1024, 1024)
    matrix[5, 7] = np.nan
    sent = encode_panel(Panel("p", "t", matrix), vmin=-1, vmax=1)
    assert sent["dtype"] == "float16" and len(sent["data"]) == 2 * 1024 * 1024
    back = decode(sent)
    assert np.isnan(back[5, 7]) and np.isnan(back).sum() == 1
    finite = ~np.isnan(matrix)
    assert np.abs(back[finite] - matrix[finite]).max() <= 2**-11
    wide = encode_panel(Panel("q", "t", np.array([[0.0, 250.0]])), vmin=-1, vmax=1)
    assert wide["dtype"] == "float32" and decode(wide)[0, 1] == 250.0


def test_alignment_view_matches_align(llama):
    _, stats = llama
    view = AlignmentView(stats, layer=1)
    keys, values = align(stats, [1], kind="key"), align(stats, [1], kind="value", method="orthogonal")
    got = {p.id: p.matrix for p in view.grid.panels}
    np.testing.assert_array_equal(got["key-before"], keys.before)
    np.testing.assert_array_equal(got["key-after"], keys.shown)
    np.testing.assert_array_equal(got["value-after"], values.shown)
    assert view.grid.panels[0].row_labels == ["L1·H0", "L1·H1"]
    view.alignment = "none"
    np.testing.assert_array_equal(view.grid.panels[1].matrix, view.grid.panels[0].matrix)


def test_alignment_view_over_layers_needs_cross_layer(llama):
    model, stats = llama
    view = AlignmentView(stats, layers=[0, 1])
    assert view.grid.panels[0].matrix.shape == (4, 4) and view.num_layers == 0
    plain = headwidget.capture(model, ragged_batches(), progress=False)
    with pytest.raises(headwidget.CrossLayerMissingError, match=r"cross_layer=\[0, 1\]"):
        AlignmentView(plain, layers=[0, 1])


def test_mechanism_view_matches_conversion(llama):
    model, stats = llama
    view = MechanismView(model, layer=1, mechanisms=["model", "mqa", "lrkv:2"], stats=stats)
    assert [p.title for p in view.grid.panels] == ["model", "mqa", "lrkv:2"]
    expected = operator_similarity(convert(model, 1, "lrkv:2", stats), 1, "qk")
    np.testing.assert_array_equal(view.grid.panels[2].matrix, expected)
    per_layer = convert(model, 1, "mqa").kv_bytes_per_token()
    assert view.grid.panels[1].subtitle.startswith(
        f"KV {2 * per_layer} B/token over 2 layers (bf16; {per_layer} this layer) · eff. rank "
    )
    view.circuit = "ov"
    np.testing.assert_array_equal(
        view.grid.panels[0].matrix, operator_similarity(convert(model, 1, "model"), 1, "ov")
    )
    view.mechanisms = ["gqa:5"]  # 5 groups do not divide 6 heads: that panel says so, nothing else fails
    assert view.error == "" and "gqa:5 needs a divisor of the 6 query heads" in view.grid.panels[0].subtitle


def test_mechanism_view_counts_kv_bytes_in_its_reports_dtype_with_bf16_beside(llama):
    """One convention with the consequences view: a report's dtype (float32 here) where there is one,
    bf16 (evaluate's default) beside it; elements × bytes by hand."""
    model, stats = llama
    report = headwidget.evaluate(
        model, ragged_batches(), ["model", "mqa"], stats=stats, dtype=torch.float32, progress=False
    )
    view = MechanismView(model, layer=1, mechanisms=["mqa"], stats=stats, report=report, prefetch=False)
    elements = convert(model, 1, "mqa").kv_elements  # K and V values a token caches at this layer
    assert view.grid.panels[0].subtitle.startswith(
        f"KV {2 * 4 * elements} B/token over 2 layers (fp32; {4 * elements} this layer) · "
        f"{2 * 2 * elements} B/token in bf16 · eff. rank "
    )
    # ... what the consequences view's trade-off chart puts mqa at
    assert report.kv_bytes_per_token["mqa"] == 2 * 4 * elements
    assert headwidget.ConsequenceView(report).grid.charts[0].x_label.endswith("float32; log)")


def test_mechanism_view_of_several_real_models():
    models = {"llama gqa": make_model("llama_gqa"), "llama mqa": make_model("llama_mqa")}
    view = MechanismView(models, layer=0)
    assert [p.title for p in view.grid.panels] == ["llama gqa", "llama mqa"]
    assert view.grid.panels[0].matrix.shape == (6, 6) and view.grid.panels[1].matrix.shape == (4, 4)


def test_channel_view_prefetches_the_neighbouring_layers(llama):
    _, stats = llama
    view = ChannelView(stats, layer=0, channel_start=2, channel_width=5)
    view._prefetcher.wait()  # wait for the background work queued so far
    assert view._shown.cache_info().currsize == 4  # layer 0 shown, layer 1 prefetched: K and V each
    misses = view._shown.cache_info().misses
    view.layer = 1  # both panels come from the cache: no new computation
    assert view._shown.cache_info().misses == misses
    np.testing.assert_array_equal(view.grid.panels[0].matrix, stats.channel_corr(1, "key")[2:7, 2:7])
    with pytest.raises(AttributeError):
        view.max_cells = 3  # fixed when built: the panels computed ahead were computed with it
    view.close()
    coarse = ChannelView(stats, layer=1, channel_start=2, channel_width=5, max_cells=3, prefetch=False)
    assert coarse.grid.panels[0].row_step == 2
    quiet = ChannelView(stats, layer=0, prefetch=False)
    quiet._prefetcher.wait()
    assert quiet._shown.cache_info().currsize == 2


def test_alignment_view_says_when_negative_scores_are_drawn_as_zero(llama):
    _, stats = llama
    view = AlignmentView(stats, layer=0, metric="pearson")
    lowest = float(np.nanmin(view.grid.panels[0].matrix))
    assert lowest < 0  # heads of this random-init model anti-correlate a little before alignment
    assert (view.grid.vmin, view.grid.vmax, view.grid.colormap) == (0.0, 1.0, "magma")
    assert view.grid.panels[0].note == f"lowest score {lowest:.3f}, drawn as 0"
    assert view.grid.colorbar_label == "head similarity (scores below 0 drawn as 0)"
    after = view.grid.panels[1]
    assert float(np.nanmin(after.matrix)) >= 0 or after.note.startswith("lowest score")


def test_create_reads_the_layers_a_user_names(llama):
    """What the command line, the magic and explore build: the first layer selected, the rest the view's."""
    model, stats = llama
    channels = ChannelView.create(stats, layers=[1, 0], interactive=False)
    assert (channels.layer, channels.pinned, channels.prefetch) == (1, [0], False)
    assert [p.id for p in channels.grid.panels] == ["key-0", "key-1", "value-0", "value-1"]
    assert ChannelView.create(stats, kind="key_post").grid.panels[0].id == "key_post-0"
    flat = AlignmentView.create(stats, layers=[0, 1])
    np.testing.assert_array_equal(flat.grid.panels[0].matrix, align(stats, [0, 1], kind="key").before)
    assert flat.num_layers == 0  # a flattened set has no layer slider
    one = AlignmentView.create(stats, layers=[1])
    assert (one.layer, one.num_layers, one.fixed_layers) == (1, 2, None)
    assert AlignmentView.capture_options([0, 1]) == {"cross_layer": [0, 1]}
    assert AlignmentView.capture_options([1]) == {} == ChannelView.capture_options([0, 1])
    mech = MechanismView.create(stats, model, layers=[1], mechanisms=["mqa"])
    expected = operator_similarity(convert(model, 1, "mqa", stats), 1, "qk")
    np.testing.assert_array_equal(mech.grid.panels[0].matrix, expected)
    assert mech.stats is stats


def test_create_without_what_the_view_needs_says_so(llama):
    model, stats = llama
    with pytest.raises(headwidget.HeadwidgetError, match="the mechanisms view needs a model"):
        MechanismView.create(stats)
    with pytest.raises(headwidget.HeadwidgetError, match="the channels view needs captured statistics"):
        ChannelView.create(model=model)
    assert (MechanismView.sources.main, MechanismView.sources.takes("stats")) == ("model", True)
    assert (ChannelView.sources.takes("model"), AlignmentView.sources.main) == (False, "stats")


def test_initial_state_is_computed_once(llama, monkeypatch):
    _, stats = llama
    calls = []
    original = ChannelView.compute

    def counting(self, state, resolution=None):
        calls.append(state.layer)
        return original(self, state, resolution)

    monkeypatch.setattr(ChannelView, "compute", counting)
    view = ChannelView(
        stats, layer=1, pinned=[0], kind="key_post", channel_start=2, channel_width=5, prefetch=False
    )  # (prefetching would compute the neighbouring layer 0 too, in the background)
    assert calls == [1]
    view.channel_width = 4
    assert calls == [1, 1] and view.grid.panels[0].matrix.shape == (4, 4)


def test_a_failed_construction_raises_its_own_error_and_nothing_after(llama, monkeypatch):
    """A ChannelView whose __init__ fails says why, and nothing after it (a finaliser) adds a second
    "Exception ignored … _prefetcher" report; a view shown in a widget closes with it."""
    import gc
    import sys

    import traitlets

    from headwidget.views import ViewSourceError

    cls = ChannelView
    _, stats = llama
    unraisable: list[object] = []
    monkeypatch.setattr(sys, "unraisablehook", unraisable.append)
    failures = [
        ((stats.channel_corr,), {}, ViewSourceError, r"needs captured statistics \(a KVStats.*got method"),
        ((None,), {}, ViewSourceError, "the channels view needs captured statistics"),
        ((stats,), {"max_cells": "many"}, ArgumentError, "max_cells must be an integer, got the string"),
        ((stats,), {"max_cells": 0}, ArgumentError, "max_cells must be at least 1, got 0"),
        ((stats,), {"layer": 0.5}, ArgumentError, r"layer must be an integer, got 0\.5"),
        ((stats,), {"layer": "one"}, ArgumentError, "layer must be an integer, got the string 'one'"),
    ]
    for args, kwargs, error, message in failures:
        with pytest.raises(error, match=message):
            cls(*args, **kwargs)
        gc.collect()
    # A state the view cannot show is refused when the view is built, with its own error type.
    with pytest.raises(headwidget.LayerIndexError, match="layer 99 is out of range"):
        cls(stats, layer=99)
    gc.collect()
    # A trait set later from Python is refused by its type too: True is not a layer (bool is an int).
    view = cls(stats, prefetch=False)
    widget = view.widget
    for trait, value in (("layer", True), ("channel_start", 0.5), ("pinned", [True])):
        with pytest.raises(traitlets.TraitError, match=f"'{trait}' trait"):
            setattr(view, trait, value)
    assert (widget.layer, widget.channel_start, widget.pinned) == (view.layer, 0, [])
    view.close()
    assert widget.comm is None
    gc.collect()
    assert unraisable == []


# ---------------------------------------------------------------------------- impossible states


@pytest.mark.parametrize("shown", [False, True])
def test_every_view_refuses_an_impossible_initial_state_with_its_own_error(llama, shown):
    """A view built with a state it cannot show raises (no widget reading "layer 99 of 2" and no
    panels); the same state set later is the error line over the last good panels."""
    from headwidget.views import ChannelWindowError, view_class, view_names

    model, stats = llama
    make = view_class
    built_from_a_capture = [n for n in view_names() if view_class(n).sources.main in ("stats", "model")]
    for name in (n for n in built_from_a_capture if view_class(n).shows(stats)):
        with pytest.raises(headwidget.LayerIndexError, match="layer 99 is out of range"):
            make(name).create(stats, model, layers=[99], interactive=False)
    with pytest.raises(headwidget.LayerIndexError, match="layer 5 is out of range"):
        make("channels").create(stats, layers=[0, 5], interactive=False)  # a pinned layer
    cases = [
        ("channels", {"kind": "query"}, headwidget.UnknownKindError, "got 'query'"),
        ("channels", {"kind": "value"}, headwidget.UnknownKindError, "shows keys"),
        ("channels", {"channel_start": -5}, ChannelWindowError, "channel_start -5 is outside 0..15"),
        ("channels", {"channel_start": 16}, ChannelWindowError, "channel_start 16 is outside 0..15"),
        ("channels", {"channel_width": 0}, ChannelWindowError, "channel_width must be ≥ 1"),
        ("channels", {"layer": -1}, headwidget.LayerIndexError, "layer -1 is out of range"),
        ("alignment", {"kind": "query"}, headwidget.UnknownKindError, "got 'query'"),
        ("alignment", {"metric": "l2"}, headwidget.UnknownMetricError, "'l2'"),
        ("alignment", {"alignment": "twist"}, headwidget.UnknownOptionError, "'twist'"),
        ("mechanisms", {"circuit": "xy"}, headwidget.UnknownCircuitError, "'xy'"),
        ("mechanisms", {"layer": -1}, headwidget.LayerIndexError, "layer -1 is out of range"),
    ]
    for name, bad, error, message in cases:
        chosen = {k: v for k, v in bad.items() if k != "layer"}
        layers = [bad["layer"]] if "layer" in bad else []
        with pytest.raises(error, match=message):
            make(name).create(stats, model, layers=layers, interactive=False, **chosen)
        view = make(name).create(stats, model, interactive=False)
        before = view.grid
        sent = view.widget.panels if shown else None  # displayed: the widget keeps its panels too
        for trait, value in bad.items():
            setattr(view, trait, value)
        assert message.strip("'") in view.error and view.grid is before, (name, bad)
        if shown:
            assert view.widget.error == view.error and view.widget.panels == sent
        view.close()


# ---------------------------------------------------------------------------- mechanisms


@pytest.fixture(scope="module")
def minilm():
    from headwidget.embedded import load_minilm

    return load_minilm()[0]


REQUESTED = ["mha", "lrkv:8", "lrkv:16", "mqa", "mla:128"]


def test_mechanism_checklist_offers_the_requested_specs_and_never_drops_one(minilm):
    view = MechanismView(minilm, layer=3, mechanisms=REQUESTED, prefetch=False)
    assert view.mechanisms_available == REQUESTED and [p.title for p in view.grid.panels] == REQUESTED
    # The browser's checklist sends the checked options, in the options' order.
    view.mechanisms = [s for s in view.mechanisms_available if s != "lrkv:16"]
    assert [p.title for p in view.grid.panels] == ["mha", "lrkv:8", "mqa", "mla:128"]
    assert view.mechanisms_available == REQUESTED  # unchecked, still offered
    view.mechanisms = list(view.mechanisms_available)
    assert [p.title for p in view.grid.panels] == REQUESTED
    expected = operator_similarity(convert(minilm, 3, "lrkv:16"), 3, "qk")
    np.testing.assert_allclose(view.grid.panels[2].matrix, expected, atol=1e-12)
    view.mechanisms = ["gqa:4"]  # a spec set from Python joins the offered ones
    assert view.mechanisms_available == [*REQUESTED, "gqa:4"] and [p.title for p in view.grid.panels] == [
        "gqa:4"
    ]
    view.add_mechanism = " lrkv:2 "  # what a typed spec does
    assert view.add_mechanism == "" and view.mechanisms == ["gqa:4", "lrkv:2"]
    assert view.mechanisms_available[-1] == "lrkv:2"


def test_an_impossible_spec_fails_in_its_own_panel(minilm):
    view = MechanismView(
        minilm, layer=3, mechanisms=["mha", "lrkv:64", "mqa", "gqa:5", "lrkv:x"], prefetch=False
    )
    assert view.error == "" and [p.title for p in view.grid.panels] == [
        "mha",
        "lrkv:64",
        "mqa",
        "gqa:5",
        "lrkv:x",
    ]
    mha, lrkv64, mqa, gqa5, unreadable = view.grid.panels
    np.testing.assert_allclose(
        mha.matrix, operator_similarity(convert(minilm, 3, "mha"), 3, "qk"), atol=1e-12
    )
    np.testing.assert_allclose(
        mqa.matrix, operator_similarity(convert(minilm, 3, "mqa"), 3, "qk"), atol=1e-12
    )
    for panel, message in [
        (lrkv64, "r must lie in 0..32"),
        (gqa5, "divisor of the 12"),
        (unreadable, "lrkv:x"),
    ]:
        assert panel.matrix.shape == (12, 12) and np.isnan(panel.matrix).all()
        assert message in panel.subtitle and message in panel.note, panel.title
    with pytest.raises(headwidget.RankRangeError):  # the text is convert's own
        convert(minilm, 3, "lrkv:64")


def test_mechanism_subtitles_say_which_error_and_the_figure_names_model_and_layer(llama, tmp_path):
    model, stats = llama
    bare = MechanismView(model, layer=1, mechanisms=["lrkv:2"], prefetch=False)
    aware = MechanismView(model, layer=1, mechanisms=["lrkv:2"], stats=stats, prefetch=False)
    weight_err = convert(model, 1, "lrkv:2").reconstruction_error
    data_err = convert(model, 1, "lrkv:2", stats).reconstruction_error
    assert abs(weight_err["key"] - data_err["key"]) > 1e-3  # two different numbers behind "err K"
    assert bare.grid.panels[0].subtitle.endswith(
        f"err K {weight_err['key']:.3f} V {weight_err['value']:.3f} (weight-space: no statistics)"
    )
    assert aware.grid.panels[0].subtitle.endswith(
        f"err K {data_err['key']:.3f} V {data_err['value']:.3f} (data-aware over {stats.tokens} tokens)"
    )
    no_inputs = headwidget.capture(model, ragged_batches(), progress=False)
    plain = MechanismView(model, layer=1, mechanisms=["lrkv:2"], stats=no_inputs, prefetch=False)
    assert plain.grid.panels[0].subtitle.endswith("(weight-space: no attention input)")
    assert aware.caption == "LlamaForCausalLM · layer 1" and "LlamaForCausalLM" in aware.layer_label
    channels = ChannelView(stats, layer=1, pinned=[0], prefetch=False)
    assert channels.caption == f"{stats.meta.model_name or stats.meta.model_class} · layers 0, 1"
    assert channels.grid.panels[0].subtitle == f"channels 0–15 · Pearson over {stats.tokens} tokens"
    assert AlignmentView(stats, layer=1).caption.endswith(" · layer 1")
    # The saved figure is titled with the caption (SVG keeps text as text).
    from headwidget.export import save

    svg = save(aware, tmp_path / "mech.svg").read_text()
    assert "LlamaForCausalLM · layer 1" in svg and "data-aware over" in svg
    untitled = save(aware, tmp_path / "plain.svg", title="").read_text()
    assert "LlamaForCausalLM · layer 1" not in untitled


def test_mechanism_view_caches_and_prefetches_neighbours(llama, monkeypatch):
    from headwidget.views import mechanisms as module

    model, stats = llama
    calls: list[tuple[int, str]] = []
    real = module.convert

    def counting(source, layer, spec, stats=None):
        calls.append((layer, spec))
        return real(source, layer, spec, stats)

    monkeypatch.setattr(module, "convert", counting)
    view = MechanismView(model, layer=0, mechanisms=["mqa", "lrkv:2"], stats=stats)
    view._prefetcher.wait()  # wait for the background work queued so far
    assert sorted(calls) == [(0, "lrkv:2"), (0, "mqa"), (1, "lrkv:2"), (1, "mqa")]
    view.layer = 1
    view.circuit = "ov"
    view._prefetcher.wait()
    assert len(calls) == 4  # the neighbour and the other circuit were ready: nothing converted again
    np.testing.assert_array_equal(
        view.grid.panels[0].matrix, operator_similarity(convert(model, 1, "mqa", stats), 1, "ov")
    )
    view.close()
    quiet = MechanismView(model, layer=0, mechanisms=["mqa"], prefetch=False)
    quiet._prefetcher.wait()
    assert len(calls) == 5


# ---------------------------------------------------------------------------- alignment metrics


def test_alignment_view_offers_cka_and_shows_it_unchanged_by_alignment(llama):
    _, stats = llama
    view = AlignmentView(stats, layer=1)
    assert "cka" in view.metrics_available
    view.metric = "cka"
    got = {p.id: p for p in view.grid.panels}
    for kind in ("key", "value"):
        expected = stats.head_similarity(1, kind, "cka")
        np.testing.assert_array_equal(got[f"{kind}-before"].matrix, expected)
        np.testing.assert_array_equal(got[f"{kind}-after"].matrix, expected)
        assert "rotation-invariant" in got[f"{kind}-after"].subtitle
    assert got["key-before"].row_labels == ["L1·H0", "L1·H1"] and view.error == ""
    flat = AlignmentView(stats, layers=[0, 1], metric="cka")
    np.testing.assert_array_equal(flat.grid.panels[0].matrix, stats.head_similarity([0, 1], "key", "cka"))


def test_alignment_subtitles_name_the_metric_as_the_drop_down_does(llama):
    _, stats = llama
    view = AlignmentView(stats, layer=1)
    before, after = view.grid.panels[:2]
    assert before.subtitle == f"per-token cosine, {stats.tokens} tokens"
    assert after.subtitle.startswith("per-token cosine, ") and after.subtitle.endswith(" scores")
    view.metric = "cka"
    assert view.grid.panels[1].subtitle.startswith(f"linear CKA, {stats.tokens} tokens: rotation-invariant")


def test_views_of_a_partial_capture_refuse_an_uncaptured_layer_by_name(llama):
    """The charts-only views check a layer as the heatmap views do: out of the model, or not captured."""
    model, _ = llama
    partial = headwidget.capture(model, ragged_batches(), layers=[1], samples=32, progress=False)
    for cls in (headwidget.TrendView, headwidget.QuantizationView):
        with pytest.raises(
            headwidget.LayerIndexError,
            match=r"layer 0 was not captured in this capture: its layers are \[1\]",
        ):
            cls(partial, layer=0)
        with pytest.raises(
            headwidget.LayerIndexError, match=r"layer 2 is out of range: the model has 2 layers"
        ):
            cls(partial, layer=2)
        view = cls(partial)
        assert view.layer == 1 and view.error == ""
        view.layer = 0
        assert "layer 0 was not captured" in view.error and view.layer == 0
