"""Every view's exported figure is laid out: its axes have a usable size, no text leaves the figure and
no two texts overlap — read from the boxes matplotlib renders (the PNG) and from the saved SVG and PDF
files (``tests/figure_layout.py``), on the real SmolLM2 (its long model name and sample counts are the
texts that ran over), with the longest texts a view writes: allocations' mixed specs, KV bytes in two
dtypes, a loss logged from a later step than the first snapshot. A figure says nothing of clicks, and
a panel small enough for the widget to print its cells' values prints them too."""

from __future__ import annotations

import dataclasses
import warnings

import numpy as np
import pytest
import torch
from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

import headwidget
from figure_layout import layout_problems, pdf_layout_problems, svg_layout_problems, svg_texts
from headwidget.export import export_style, figure, save_all
from headwidget.export._cells import CELL_PT
from headwidget.texts import english_sample

pytestmark = pytest.mark.slow

LAYERS = [0, 1, 2]


@pytest.fixture(scope="module")
def views(smollm2):
    model, tok = smollm2
    stats = headwidget.capture(
        model,
        english_sample(),
        tokenizer=tok,
        max_tokens=512,
        max_length=128,
        rope="both",
        samples=256,
        inputs=True,
        layers=LAYERS,
        progress=False,
    )
    variants = ["model", "kv:int4", "kv:int2", "mqa"]
    report = headwidget.evaluate(
        model,
        english_sample(split="evaluation"),
        variants,
        tokenizer=tok,
        stats=stats,
        layers=LAYERS,
        max_tokens=16,  # the layout is the point; every forward of the sweep costs per token
        per_layer=True,
        dtype=torch.float32,  # bfloat16, the default, is emulated (about 5× slower) on CPUs without it
        progress=False,
    )
    mechanisms = ["model", "mqa", "lrkv:16", "mla:128"]
    cross = headwidget.capture(  # ten layers' joint statistics: two-digit layer ticks and head labels
        model,
        english_sample(),
        tokenizer=tok,
        max_tokens=256,
        max_length=128,
        rope="both",
        layers=range(10),
        cross_layer=True,
        progress=False,
    )
    snapshots = headwidget.Timeline.from_checkpoints(  # two snapshots of one model: the layout is the point
        [model, model],
        [0, 1000],
        english_sample(),
        tokenizer=tok,
        max_tokens=256,
        max_length=128,
        layers=LAYERS,
    )
    # The trainer's loss, first logged at step 5: the two charts share one step axis.
    losses = {5: {"loss": 3.1}, 250: {"loss": 2.6}, 500: {"loss": 2.4}, 1000: {"loss": 2.25}}
    timeline = headwidget.Timeline({step: snapshots[step] for step in snapshots.steps}, logs=losses)
    return {
        "channels": headwidget.ChannelView(stats, layer=0, pinned=[1], channel_width=32),
        "alignment": headwidget.AlignmentView(stats, layer=1),
        "mechanisms": headwidget.MechanismView(model, layer=0, mechanisms=mechanisms, stats=stats),
        "mechanisms+report": headwidget.MechanismView(
            model, layer=0, mechanisms=mechanisms, stats=stats, report=report, prefetch=False
        ),
        "quantization": headwidget.QuantizationView(stats, layer=0),
        "quantization+report": headwidget.QuantizationView(stats, layer=0, report=report),
        "consequences": headwidget.ConsequenceView(with_allocations(report), layer=1),
        "timeline": headwidget.TimelineView(timeline, layer=1),
        "timeline+heads": headwidget.TimelineView({"run A": timeline, "run B": timeline}, show="heads"),
        "healing": headwidget.HealingView({"mqa": _run("mqa", 6.7), "mqa+align": _run("mqa+align", 3.2)}),
        "trends": headwidget.TrendView(stats, model=model, mechanisms=["mqa", "mla:128"]),
        "layer_similarity": headwidget.LayerSimilarityView(cross, layer=9, paired=0),
        "layer_similarity+subset": headwidget.LayerSimilarityView(
            cross, layers=[0, 3, 6, 9], layer=6, paired=3, metric="subspace", kind="key_post"
        ),
    }


#: Two allocations over SmolLM2's 30 layers, as allocate_frontier writes them: the longest row labels
#: and notes a damage map has.
ALLOCATIONS = (
    "kv:int4@0,2-5,7,9-12,14,16-18;kv:int8@1,6,8,13,15,19-29",
    "kv:int2@0-9;kv:int4@10-19;kv:int8@20-29",
)


def with_allocations(report: headwidget.EvaluationReport) -> headwidget.EvaluationReport:
    """``report`` with :data:`ALLOCATIONS` as variants, their numbers those of its quantizers scaled
    (the layout is the point)."""
    for spec, like, scale in zip(ALLOCATIONS, ("kv:int4", "kv:int2"), (1.4, 1.2), strict=True):
        measures = {k: v * scale if k != "top1" else v for k, v in report.measures[like].items()}
        report = dataclasses.replace(
            report,
            variants=[*report.variants, spec],
            measures={**report.measures, spec: measures},
            kv_bytes_per_token={**report.kv_bytes_per_token, spec: report.kv_bytes_per_token[like] * scale},
            per_layer={**(report.per_layer or {}), spec: [v * scale for v in (report.per_layer or {})[like]]},
        )
    return report


def _run(spec: str, untrained: float) -> headwidget.HealingRun:
    """A healing run of SmolLM2's 30 layers, its numbers made up (the layout is the point)."""
    points = [0, 16384, 32768, 65536]
    damage = [untrained / (1 + i) for i in range(len(points))]
    curve = [
        {"tokens": t, "step": t // 4096, "nll": 3.3 + d, "kl": d, "top1": 0.2 + 0.1 * i, "delta_nll": d}
        for i, (t, d) in enumerate(zip(points, damage, strict=True))
    ]
    per_layer = [[0.9 / (1 + i) + 0.01 * layer for layer in range(30)] for i in range(len(points))]
    return headwidget.HealingRun(
        model_name="SmolLM2-135M-Instruct",
        spec=spec,
        kind="causal-lm",
        method="kd",
        loss="kd",
        trainable="kv",
        lr=1e-3,
        batch_size=8,
        max_length=512,
        tokens=65536,
        seed=0,
        dtype="torch.float32",
        steps=16,
        tokens_seen=65536,
        reference_nll=3.3,
        kv_bytes_per_token=15360.0,
        layers=list(range(30)),
        curve=curve,
        per_layer=per_layer,
        losses=[1.0] * 16,
        healing_fingerprint="ab",
        evaluation_fingerprint="cd",
        evaluation_tokens=4096,
    )


CASES = [
    "channels",
    "alignment",
    "mechanisms",
    "mechanisms+report",
    "quantization",
    "quantization+report",
    "consequences",
    "timeline",
    "timeline+heads",
    "healing",
    "trends",
    "layer_similarity",
    "layer_similarity+subset",
]


#: The cases whose panels are small enough for the widget to print every cell's value (3 KV heads, a
#: damage map of 5 variants × 3 layers).
VALUES_IN_CELLS = ("alignment", "consequences", "timeline+heads")


def test_every_registered_view_is_among_the_cases():
    from headwidget.views._registry import view_names

    assert {case.split("+")[0] for case in CASES} == set(view_names())


@pytest.mark.parametrize("case", CASES)
def test_exported_figure_is_laid_out(views, case, tmp_path):
    view = views[case]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        fig = figure(view, dpi=100)
        problems = layout_problems(fig)
    assert problems == []
    assert not [w for w in caught if "collapsed" in str(w.message)]
    _, svg, pdf = paths = [tmp_path / f"{case}{suffix}" for suffix in (".png", ".svg", ".pdf")]
    for path in save_all(view, paths, dpi=100):  # one frozen geometry, written in every format
        assert path.stat().st_size > 2000
    assert svg_layout_problems(svg) == []
    assert pdf_layout_problems(pdf, svg) == []
    _, texts = svg_texts(svg)
    assert not [t for t, *_ in texts if "click" in t]  # a figure cannot be clicked
    if case in VALUES_IN_CELLS:  # small panels: every cell's value printed, as the widget prints it
        shown = sum(int(np.isfinite(p.matrix).sum()) for p in view.full_grid().panels)
        assert sum(1 for _, size, *_ in texts if size == CELL_PT) == shown


def test_the_layout_check_sees_what_it_is_for():
    fig = Figure(figsize=(3, 2), dpi=100)
    FigureCanvasAgg(fig)
    ax = fig.add_axes((0.1, 0.1, 0.05, 0.8))  # a plot 0.15 inches wide
    ax.plot([0, 1], [0, 1])
    fig.text(0.3, 0.5, "one text here")
    fig.text(0.32, 0.5, "and another on it")
    fig.text(0.9, 0.9, "running off the right edge")
    problems = layout_problems(fig)
    assert any("overlap" in p and "one text here" in p for p in problems)
    assert any("leaves the figure" in p and "running off" in p for p in problems)
    assert any(p.startswith("chart axes") and "0.15×1.60 in" in p for p in problems)


def test_the_file_checks_see_what_they_are_for(tmp_path):
    """The SVG check reads a text off the page and two on each other from the file; the PDF check sees a
    PDF whose texts are not where the SVG's are."""
    fig = Figure(figsize=(3, 2), dpi=100)
    fig.text(0.3, 0.5, "one text here")
    fig.text(0.32, 0.5, "and another on it")
    fig.text(0.9, 0.9, "running off the right edge")
    fig.text(0.02, 0.5, "turned past the top", rotation=90)
    with export_style():  # (text kept as text in the SVG)
        fig.savefig(tmp_path / "bad.svg")
    problems = svg_layout_problems(tmp_path / "bad.svg")
    assert any("overlap" in p and "one text here" in p for p in problems)
    assert any("leaves the page" in p and "running off" in p for p in problems)
    assert any("leaves the page" in p and "turned past" in p for p in problems)
    fig.texts[0].set_x(0.05)  # the PDF of a figure whose first text moved
    fig.savefig(tmp_path / "moved.pdf")
    assert any(
        "not where the SVG's 'one text here'" in p
        for p in pdf_layout_problems(tmp_path / "moved.pdf", tmp_path / "bad.svg")
    )
    fig.texts[0].set_x(0.3)
    fig.savefig(tmp_path / "same.pdf")
    assert pdf_layout_problems(tmp_path / "same.pdf", tmp_path / "bad.svg") == []
