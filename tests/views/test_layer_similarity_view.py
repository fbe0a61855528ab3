"""``LayerSimilarityView``: its matrices against ``layer_similarity`` and float64 brute force on the raw
K/V of a tiny Llama, a clicked pair's head panels against ``align`` and brute force, and how it is
reached (registry, dashboard, command line, magic) or refused (statistics without cross-layer moments)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

import headwidget
from headwidget.analysis.alignment import align
from headwidget.analysis.layer_similarity import layer_similarity
from headwidget.errors import ArgumentError, CrossLayerMissingError, UnknownKindError, UnknownMetricError
from headwidget.notebook import Dashboard
from headwidget.views import LayerSimilarityView, view_class
from tiny_models import make_model, ragged_batches, reference_activations, three_layer_llama

LAYERS = [0, 1, 2]
HEAD_DIM = 16  # three_layer_llama: 2 KV heads of 16 dims, RoPE over all 16 (pairs m, m + 8)


@pytest.fixture(scope="module")
def run() -> dict:
    model = three_layer_llama(seed=3)
    batches = ragged_batches(seed=4, lengths=((40, 33, 37), (38, 29)))
    stats = headwidget.capture(model, batches, rope="both", cross_layer=True, progress=False)
    return {"model": model, "stats": stats, "acts": reference_activations("llama_gqa", model, batches)}


# ---------------------------------------------------------------------------- float64 brute force
def brute_cka(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x - x.mean(0), y - y.mean(0)
    return float(np.linalg.norm(x.T @ y) ** 2 / (np.linalg.norm(x.T @ x) * np.linalg.norm(y.T @ y)))


def brute_subspace(x: np.ndarray, y: np.ndarray, r: int) -> float:
    ux = np.linalg.svd(x, full_matrices=False)[0][:, :r]
    uy = np.linalg.svd(y, full_matrices=False)[0][:, :r]
    return float(np.linalg.norm(ux.T @ uy) ** 2 / r)


def unit_heads(x: np.ndarray) -> np.ndarray:
    """(G, N, d): each token's head vectors scaled to unit length."""
    n, c = x.shape
    heads = x.reshape(n, c // HEAD_DIM, HEAD_DIM).transpose(1, 0, 2)
    return heads / np.linalg.norm(heads, axis=-1, keepdims=True)


def brute_before(x: np.ndarray, y: np.ndarray) -> float:
    """The per-token cosine of two heads, averaged over the tokens."""
    return float(np.mean(np.sum(x * y, axis=1)))


def brute_after(x: np.ndarray, y: np.ndarray, kind: str) -> float:
    """The per-token cosine after the best rotation, in-sample: for values orthogonal Procrustes (the
    nuclear norm of the cross Gram / N); for keys the best proper 2×2 rotation of each RoPE plane
    (closed form sqrt(α² + β²)), summed over planes / N."""
    n = x.shape[0]
    if kind == "value":
        return float(np.linalg.svd(x.T @ y, compute_uv=False).sum() / n)
    total = 0.0
    half = HEAD_DIM // 2
    for m in range(half):
        a, b, c, e = x[:, m], x[:, m + half], y[:, m], y[:, m + half]
        total += np.hypot(np.sum(a * c + b * e), np.sum(a * e - b * c))
    return total / n


def brute_pair(acts: dict, kind: str, a: int, b: int) -> tuple[np.ndarray, np.ndarray]:
    """The G × G head panels (before, after in-sample) of layer a's heads against layer b's."""
    ha, hb = unit_heads(acts[a][kind]), unit_heads(acts[b][kind])
    before = np.array([[brute_before(i, j) for j in hb] for i in ha])
    after = np.array([[brute_after(i, j, kind) for j in hb] for i in ha])
    return before, after


# ---------------------------------------------------------------------------- the matrices
@pytest.mark.parametrize("kind", ["key", "key_post"])
def test_the_matrices_are_layer_similarity_and_equal_brute_force(run: dict, kind: str) -> None:
    acts, stats = run["acts"], run["stats"]
    view = LayerSimilarityView(stats, kind=kind)
    assert view.kinds_available == ["key", "key_post"] and view.layers == LAYERS
    shown = {p.id: p for p in view.grid.panels}
    rows = [f"{each}-{part}" for each in (kind, "value") for part in ("layers", "before", "after")]
    assert list(shown) == rows and view.grid.columns == 3
    for each in (kind, "value"):
        got = shown[f"{each}-layers"].matrix
        np.testing.assert_array_equal(got, layer_similarity(stats, each, "cka"))
        want = np.array([[brute_cka(acts[a][each], acts[b][each]) for b in LAYERS] for a in LAYERS])
        np.testing.assert_allclose(got, want, atol=1e-9)
    view.metric = "subspace:4"
    got = view.grid.panels[0].matrix
    np.testing.assert_array_equal(got, layer_similarity(stats, kind, "subspace", r=4))
    want = np.array([[brute_subspace(acts[a][kind], acts[b][kind], 4) for b in LAYERS] for a in LAYERS])
    np.testing.assert_allclose(got, want, atol=1e-7)
    assert view.grid.panels[0].title == f"{'Keys' if kind == 'key' else 'Keys (post-RoPE)'} · subspace"
    assert view.grid.panels[0].subtitle == "layer × layer: subspace overlap, r = 4 · 177 tokens"


def test_the_aligned_matrix_is_the_mean_of_each_pairs_after_panel(run: dict) -> None:
    """In-sample (brute force of every head pair), and held-out (``align``'s own choice): each cell is the
    mean of the after panel its click shows."""
    acts, stats = run["acts"], run["stats"]
    view = LayerSimilarityView(stats, metric="aligned", heldout=False)
    for kind in ("key", "value"):
        got = view.matrix(kind, "aligned")
        np.testing.assert_array_equal(got, layer_similarity(stats, kind, "aligned", heldout=False))
        want = np.array([[brute_pair(acts, kind, a, b)[1].mean() for b in LAYERS] for a in LAYERS])
        np.testing.assert_allclose(got, want, atol=1e-7)
    held = LayerSimilarityView(stats, metric="aligned")  # 171 tokens < 10·16²: held-out scores
    for a in LAYERS:
        for b in LAYERS:
            held.select_cell("value-layers", a, b)
            panels = {p.id: p for p in held.grid.panels}
            assert panels["value-after"].subtitle.startswith("aligned (orthogonal), held-out scores · mean")
            cell = panels["value-layers"].matrix[a, b]
            assert panels["value-after"].matrix.mean() == pytest.approx(cell, abs=1e-12)
            assert f"layer {a} × layer {b}: {cell:.3f}" in panels["value-layers"].note


# ---------------------------------------------------------------------------- a clicked pair
@pytest.mark.parametrize(("a", "b"), [(0, 2), (2, 0), (1, 1)])
def test_a_click_shows_the_pairs_heads_before_and_after_alignment(run: dict, a: int, b: int) -> None:
    acts, stats = run["acts"], run["stats"]
    view = LayerSimilarityView(stats, heldout=False)
    view.select_cell("key-layers", a, b)
    assert (view.layer, view.paired) == (a, b)
    assert (view.layer_label, view.paired_label) == (f"layer {a} of 0–2", f"layer {b} of 0–2")
    panels = {p.id: p for p in view.grid.panels}
    for kind, method in (("key", "rope"), ("value", "orthogonal")):
        before, after = panels[f"{kind}-before"], panels[f"{kind}-after"]
        want_before, want_after = brute_pair(acts, kind, a, b)
        np.testing.assert_allclose(before.matrix, want_before, atol=1e-6)
        np.testing.assert_allclose(after.matrix, want_after, atol=1e-6)
        # the analysis the alignment view shows: the G × G block of the two layers' alignment
        res = align(stats, a if a == b else [a, b], kind, heldout=False)
        block = (slice(0, 2), slice(len(res.labels) - 2, len(res.labels)))
        np.testing.assert_allclose(before.matrix, res.before[block], atol=1e-12)  # (a rotation fitted from
        np.testing.assert_allclose(after.matrix, res.after[block], atol=1e-12)  # a to b, or from b to a)
        assert res.method == method and after.subtitle.startswith(f"aligned ({method}), in-sample scores")
        assert before.row_labels == [f"L{a}·H0", f"L{a}·H1"] and before.col_labels == [f"L{b}·H0", f"L{b}·H1"]
        head = "Key heads" if kind == "key" else "Value heads"
        assert (before.title, after.title) == (
            f"{head} · L{a} × L{b} · before",
            f"{head} · L{a} × L{b} · after",
        )
        assert f"mean {want_before.mean():.3f}" in before.subtitle
    assert view.caption.endswith(f"linear CKA · layer {a} × layer {b}")


def test_post_rope_keys_change_the_matrix_not_the_heads(run: dict) -> None:
    """RoPE turns two heads' vectors of a token by the same angles: their cosine, and the best
    plane-wise rotation between them, are the same before and after it."""
    view = LayerSimilarityView(run["stats"], layer=0, paired=2)
    pre = {p.id: p.matrix for p in view.grid.panels}
    view.kind = "key_post"
    post = {p.id: p.matrix for p in view.grid.panels}
    np.testing.assert_allclose(post["key_post-before"], pre["key-before"], atol=1e-9)
    np.testing.assert_allclose(post["key_post-after"], pre["key-after"], atol=1e-9)
    assert np.abs(post["key_post-layers"] - pre["key-layers"]).max() > 1e-3
    assert view.grid.panels[1].note.startswith("as before RoPE: it turns a token's heads alike")


def test_clicks_outside_a_matrix_select_nothing(run: dict) -> None:
    view = LayerSimilarityView(run["stats"])
    view.select_cell("key-after", 1, 0)  # a head panel
    view.select_cell("value-layers", 3, 0)  # past the matrix
    assert (view.layer, view.paired) == (0, 1)
    view.paired = 0  # the slider: a layer with itself
    assert view.grid.panels[1].matrix.shape == (2, 2) and view.grid.panels[1].title.endswith(
        "L0 × L0 · before"
    )


def test_negative_scores_are_said_not_clipped_silently(run: dict) -> None:
    view = LayerSimilarityView(run["stats"])
    negative = [p for p in view.grid.panels if np.nanmin(p.matrix) < 0]
    assert negative  # random heads: some cosines below 0
    for panel in negative:
        assert f"lowest score {np.nanmin(panel.matrix):.3f}, drawn as 0" in panel.note
    assert view.grid.colorbar_label == "similarity (scores below 0 drawn as 0)"
    assert (view.grid.vmin, view.grid.vmax, view.grid.colormap) == (0.0, 1.0, "magma")


# ---------------------------------------------------------------------------- layers and options
def test_a_subset_of_cross_layers(run: dict) -> None:
    model = run["model"]
    batches = ragged_batches(seed=4, lengths=((40, 33), (38,)))
    stats = headwidget.capture(model, batches, cross_layer=[0, 2], progress=False)
    view = LayerSimilarityView(stats)
    assert view.layers == [0, 2] and (view.layer, view.paired) == (0, 2) and view.kinds_available == []
    matrix = view.grid.panels[0]
    assert matrix.row_labels == matrix.col_labels == ["0", "2"]
    assert (matrix.row_axis, matrix.col_axis) == ("layer", "paired with")  # what the tooltip names
    assert matrix.hint == "a click on a cell shows its pair's heads" and (
        matrix.mark_row,
        matrix.mark_col,
    ) == (
        0,
        1,
    )
    np.testing.assert_array_equal(matrix.matrix, layer_similarity(stats, "key", "cka"))
    assert view.layer_positions == [0, 2] and view.layer_label == "layer 0 of 0, 2"
    before = view.grid
    view.layer = 1  # no cross-layer statistics: refused, the panels kept
    assert view.error.startswith(
        "layer 1 has no cross-layer statistics here: the matrices are over layers 0, 2"
    )
    assert view.grid is before
    view.select_cell("key-layers", 1, 0)
    assert (view.layer, view.paired) == (2, 0) and len(view.grid.panels) == 6 and view.error == ""
    shown = view.grid.panels[0]  # the selected pair's row and column outlined
    assert (shown.mark_row, shown.mark_col) == (1, 0)
    with pytest.raises(CrossLayerMissingError, match=r"layers \[1\] have no cross-layer statistics"):
        LayerSimilarityView(stats, layers=[0, 1])
    whole = LayerSimilarityView(run["stats"], layers=[2, 0])  # sorted: rows and columns in layer order
    assert whole.layers == [0, 2] and whole.grid.panels[0].row_labels == ["0", "2"]
    full = layer_similarity(run["stats"], "value", "cka")
    np.testing.assert_array_equal(whole.grid.panels[3].matrix, full[np.ix_([0, 2], [0, 2])])
    with pytest.raises(
        CrossLayerMissingError, match="the matrices are over layers 0, 2: build the view with"
    ):
        whole.compute(whole.current_state().replace(paired=1))  # captured, but not among the view's layers


def five_layer_llama() -> torch.nn.Module:
    """A float32 Llama of five layers (2 KV heads of 8 dims): joint statistics of its middle three
    stand for SmolLM2's layers 8–15 of 30."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(5)
    config = LlamaConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=5,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    return LlamaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def middle() -> headwidget.KVStats:
    """Keys (before and after RoPE) and values of every layer; joint moments of layers 1–3 only."""
    return headwidget.capture(
        five_layer_llama(), ragged_batches(seed=6), rope="both", cross_layer=[1, 2, 3], progress=False
    )


def test_the_sliders_span_only_the_captured_cross_layers(middle: headwidget.KVStats) -> None:
    view = LayerSimilarityView(middle)
    assert view.layers == [1, 2, 3] and (view.layer, view.paired) == (1, 2) and view.num_layers == 5
    controls = {c.trait: c.to_json() for c in view.view_controls()}
    for trait in ("layer", "paired"):  # the positions of both sliders: the captured layers, as numbered
        assert controls[trait]["type"] == "slider"
        assert getattr(view, controls[trait]["positions"]) == [1, 2, 3]
    assert (view.layer_label, view.paired_label) == ("layer 1 of 1–3", "layer 2 of 1–3")
    view.select_cell("value-layers", 2, 0)  # the click targets: the matrices' rows and columns
    assert (view.layer, view.paired, view.error) == (3, 1, "")
    assert view.grid.panels[1].title == "Key heads · L3 × L1 · before"
    view.select_cell("value-layers", 3, 0)  # past the matrix: nothing
    assert (view.layer, view.paired) == (3, 1)


@pytest.mark.parametrize(("field", "value"), [("layer", 0), ("paired", 4), ("layer", 7)])
def test_a_layer_without_joint_statistics_is_refused_naming_the_captured_ones(
    middle: headwidget.KVStats, field: str, value: int
) -> None:
    said = (
        "layer 7 is out of range: the model has 5 layers (0..4)"
        if value == 7
        else f"layer {value} has no cross-layer statistics here: the matrices are over layers 1–3 (captured "
        "with cross_layer=[1, 2, 3]): choose one of them, or capture with cross_layer=[...] naming it"
    )
    with pytest.raises((CrossLayerMissingError, headwidget.LayerIndexError)) as raised:
        LayerSimilarityView(middle, **{field: value})
    assert str(raised.value) == said
    view = LayerSimilarityView(middle)
    before = view.grid
    setattr(view, field, value)  # from Python: said in the error line, the panels kept
    assert view.error == said and view.grid is before and view.caption.endswith("layer 1 × layer 2")
    view.set_state(layer=3, paired=3)
    assert view.error == "" and view.grid.panels[1].title == "Key heads · L3 × L3 · before"


def test_the_saved_page_holds_and_counts_the_captured_layers_states_only(middle: headwidget.KVStats) -> None:
    from headwidget.export import page_data

    view = LayerSimilarityView(middle)
    metrics, kinds = view.metrics_available, view.kinds_available
    assert metrics == ["cka", "aligned", "subspace:4", "subspace:8"] and kinds == ["key", "key_post"]
    data = page_data(view, max_states=10, progress=False)
    axes = {a["trait"]: a["values"] for a in data["axes"]}
    assert axes == {"layer": [1, 2, 3], "paired": [1, 2, 3], "metric": metrics, "kind": kinds}
    reachable = 3 * 3 * len(metrics) * len(kinds)
    assert f"this page holds 10 of the {reachable} states its controls reach" in data["state"]["status"]
    assert data["state"]["layer_positions"] == [1, 2, 3] and data["errors"] == {}
    whole = page_data(view, max_states=reachable, progress=False)
    assert len(whole["frames"]) == reachable and whole["errors"] == {} and whole["state"]["status"] == ""
    held = {tuple(json.loads(key)[:2]) for key in whole["frames"]}
    assert held == {(a, b) for a in (1, 2, 3) for b in (1, 2, 3)}


def test_the_metric_options_and_refusals(run: dict) -> None:
    stats = run["stats"]
    view = LayerSimilarityView(stats, metric="subspace", r=6)
    ranks = [f"subspace:{r}" for r in (4, 6, 8, 16)]  # the powers of two below 32, and 6
    assert view.metric == "subspace:6" and view.metrics_available == ["cka", "aligned", *ranks]
    assert LayerSimilarityView(stats, metric="subspace").metric == "subspace:8"  # a quarter of 32
    with pytest.raises(ArgumentError, match="r is the rank of metric='subspace'"):
        LayerSimilarityView(stats, r=4)
    with pytest.raises(ArgumentError, match="r must be at most 32"):
        LayerSimilarityView(stats, metric="subspace", r=33)
    with pytest.raises(UnknownMetricError, match="choose cka, aligned or subspace:r"):
        LayerSimilarityView(stats, metric="pearson")
    with pytest.raises(UnknownKindError, match="got 'value'"):
        LayerSimilarityView(stats, kind="value")
    with pytest.raises(headwidget.LayerIndexError, match="layer 7 is out of range"):
        LayerSimilarityView(stats, paired=7)
    before = view.grid
    view.metric = "subspace:x"  # a later bad state: said, the last panels kept
    assert "unknown metric 'subspace:x'" in view.error and view.grid is before


def test_statistics_without_cross_layer_moments_are_refused_with_how_to_capture(run: dict) -> None:
    stats = headwidget.capture(run["model"], ragged_batches(), progress=False)
    assert not LayerSimilarityView.shows(stats) and LayerSimilarityView.shows(run["stats"])
    with pytest.raises(CrossLayerMissingError, match=r"capture\(model, texts, cross_layer=True\)"):
        LayerSimilarityView(stats)
    with pytest.raises(CrossLayerMissingError, match="cross_layer=True"):
        view_class("layer_similarity").create(stats)
    assert LayerSimilarityView.capture_options([3]) == {"cross_layer": True}
    assert LayerSimilarityView.capture_options([3, 5]) == {"cross_layer": [3, 5]}
    assert "layer_similarity" not in Dashboard(stats).views  # no tab rather than a broken one


# ---------------------------------------------------------------------------- how it is reached
def test_the_registry_builds_it_for_the_named_layers(run: dict) -> None:
    cls = view_class("layer_similarity")
    assert cls is LayerSimilarityView is headwidget.LayerSimilarityView and cls.title == "Layer similarity"
    assert cls.create(run["stats"], layers=[2, 0]).layers == [0, 2]
    one = cls.create(run["stats"], layers=[1], interactive=False)
    assert (one.layers, one.layer, one.paired) == (LAYERS, 1, 2)


def test_a_dashboard_tab_whose_click_moves_every_tabs_layer() -> None:
    model = make_model("llama_gqa", dtype=torch.float32)
    stats = headwidget.capture(model, ragged_batches(), cross_layer=True, progress=False)
    dash = Dashboard(stats)
    tab = dash.layer_similarity
    assert isinstance(tab, LayerSimilarityView) and "Layer similarity" in dash.tabs.titles
    tab.select_cell("value-layers", 1, 0)
    assert dash.channels.layer == dash.alignment.layer == 1 and tab.paired == 0
    dash.channels.layer = 0
    assert (tab.layer, tab.paired) == (0, 0)


def test_figure_from_the_command_line(run: dict, tmp_path, capsys) -> None:
    from headwidget.cli import main

    path = run["stats"].save(tmp_path / "cross.safetensors")
    out = tmp_path / "layers.svg"
    assert (
        main(["figure", str(path), "--view", "layer_similarity", "--layers", "2,0", "--out", str(out)]) == 0
    )
    svg = out.read_text()
    assert "Keys · linear CKA" in svg and "Value heads · L0 × L2 · after" in svg
    plain = headwidget.capture(run["model"], ragged_batches(), progress=False).save(
        tmp_path / "plain.safetensors"
    )
    assert main(["figure", str(plain), "--view", "layer_similarity", "--out", str(tmp_path / "x.png")]) == 1
    assert "cross_layer=True" in capsys.readouterr().err


def test_the_magic_captures_the_cross_layer_statistics_it_needs() -> None:
    from IPython.core.interactiveshell import InteractiveShell

    shell = InteractiveShell.instance()
    shell.run_line_magic("load_ext", "headwidget")
    try:
        model = make_model("llama_gqa", dtype=torch.float32)
        shell.user_ns.update(model=model, batches=ragged_batches())
        view = shell.run_line_magic(
            "headwidget", "model --texts batches --view layer_similarity --layers 1,0"
        )
        assert isinstance(view, LayerSimilarityView) and view.layers == [0, 1] and view.error == ""
        assert view.stats.meta.cross_layers == [0, 1]
    finally:
        shell.run_line_magic("unload_ext", "headwidget")


def test_a_dashboard_opens_the_tab_on_its_layers_and_moves_it_only_to_them(
    middle: headwidget.KVStats,
) -> None:
    dash = Dashboard(middle)  # (its other tabs open on layer 0, which has no joint statistics)
    tab = dash.layer_similarity
    assert (dash.channels.layer, tab.layer, tab.paired, tab.error) == (0, 1, 2, "")
    dash.channels.layer = 4  # not offered: the tab keeps its pair
    assert (tab.layer, tab.paired, tab.error) == (1, 2, "")
    dash.channels.layer = 3
    assert (tab.layer, tab.paired, tab.error) == (3, 2, "")
    tab.select_cell("key-layers", 1, 0)
    assert dash.channels.layer == dash.alignment.layer == 2 and tab.paired == 1


def test_the_read_out_of_many_spaced_layers_stays_short() -> None:
    """Every other layer of a 12-layer model: the sliders' read-out names the spacing, not ten numbers
    (a saved page of SmolLM2's 15 even layers overflowed a 760 px window with the list)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=32,
        num_hidden_layers=12,
        num_attention_heads=4,
        num_key_value_heads=2,
    )
    model = LlamaForCausalLM(config).eval()
    stats = headwidget.capture(
        model, torch.randint(0, 64, (2, 24)), cross_layer=list(range(0, 12, 2)), progress=False
    )
    view = LayerSimilarityView(stats)
    assert view.layer_positions == [0, 2, 4, 6, 8, 10]
    assert (view.layer_label, view.paired_label) == ("layer 0 of 0–10 every 2", "layer 2 of 0–10 every 2")
    view.layer = 1
    assert "the matrices are over layers 0–10 every 2" in view.error
