"""Every example notebook runs top to bottom in a fresh kernel without an error."""

from __future__ import annotations

from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

NOTEBOOKS = sorted((Path(__file__).resolve().parents[2] / "example_notebooks").glob("*.ipynb"))
#: Token counts, and the layers captured and converted or quantized, of the notebooks that read them from
#: the environment (consequences, quantization, allocation, healing, cross_layer; their defaults are the full
#: run's: every layer). Three of SmolLM2's 30 layers, the first among them, keep each layer-dependent path
#: (the first layer, a middle one, the last) at a tenth of the fits; cross_layer takes the pairs they start
#: (0-1, 14-15, and 28-29 for the last).
SMALL_RUN = {
    "HEADWIDGET_NOTEBOOK_TOKENS": "64",
    "HEADWIDGET_NOTEBOOK_CALIBRATION_TOKENS": "256",
    "HEADWIDGET_NOTEBOOK_SWEEP_TOKENS": "16",
    # the reference-figure notebooks and the quickstart: their captures' token counts
    "HEADWIDGET_NOTEBOOK_CAPTURE_TOKENS": "256",
    "HEADWIDGET_NOTEBOOK_LAYERS": "0,14,29",
    # allocation: two candidates beside the model, no refine round (the full run is the saved outputs)
    "HEADWIDGET_NOTEBOOK_CANDIDATES": "model,mla:64,kv:int4",
    "HEADWIDGET_NOTEBOOK_REFINE": "0",
    # cross_layer: the held-out tokens of its per-pair sweeps under prefill:32 (the saved outputs: 1,024),
    # and its third axis beside the candidates above: one cross-layer candidate, the only one under 1/12
    # of the float32 cache (the per-layer candidates' 1/12 is refused before any forward, and said)
    "HEADWIDGET_NOTEBOOK_GROUP_TOKENS": "64",
    "HEADWIDGET_NOTEBOOK_CROSS_CANDIDATES": "mla:64+share:2",
    # allocation: float32 (bfloat16 is emulated, about 5× slower, on CPUs without bfloat16 instructions)
    "HEADWIDGET_NOTEBOOK_DTYPE": "float32",
    # training: 20 steps with a snapshot every 10 (the saved outputs are 2,000 steps, every 100)
    "HEADWIDGET_NOTEBOOK_TRAIN_STEPS": "20",
    "HEADWIDGET_NOTEBOOK_TRACK_EVERY": "10",
    # healing: the three layers above converted, one step of 1×16 tokens a variant, one point after it
    # on 16 held-out tokens (the saved outputs are every layer, 65,536 tokens in steps of 8×512, a point
    # every 16,384 on 4,096); a forward of SmolLM2 on so few tokens costs what reading its weights costs,
    # so each of the six runs is its seven forwards and one backward
    "HEADWIDGET_NOTEBOOK_HEAL_TOKENS": "16",
    "HEADWIDGET_NOTEBOOK_HEAL_EVERY": "16",
    "HEADWIDGET_NOTEBOOK_HEAL_EVAL_TOKENS": "16",
    "HEADWIDGET_NOTEBOOK_HEAL_BATCH": "1",
    "HEADWIDGET_NOTEBOOK_HEAL_LENGTH": "16",
}

#: What one notebook runs smaller still. cross_layer: a single per-layer candidate beside the model (the
#: allocation notebook's small run sweeps mla:64 per layer; here its fits are the cross-layer candidate's
#: mla:64+share:2, and the sweep's forwards, a read of SmolLM2's weights each, drop from 75 cells to 45).
SMALLER = {"cross_layer": {"HEADWIDGET_NOTEBOOK_CANDIDATES": "model,kv:int4"}}


def test_there_is_a_quickstart_and_one_notebook_per_reference_figure():
    names = {p.stem for p in NOTEBOOKS}
    assert {"quickstart", "channel_correlation", "head_alignment", "mechanisms", "consequences"} <= names
    assert {"quantization", "allocation", "training", "healing"} <= names  # costs, allocator, training runs
    assert "cross_layer" in names  # the third axis: layer × layer similarity, sharing, merging, xKV


@pytest.mark.slow
@pytest.mark.parametrize("path", NOTEBOOKS, ids=[p.stem for p in NOTEBOOKS])
def test_notebook_executes(path, tmp_path, monkeypatch):
    for name, value in {**SMALL_RUN, **SMALLER.get(path.stem, {})}.items():  # (the kernel inherits them)
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # what a notebook saves to tempfile.mkdtemp() is cleaned up
    book = nbformat.read(path, as_version=4)
    NotebookClient(
        book, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(tmp_path)}}
    ).execute()
    errors = [o for c in book.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors
    widgets = [
        o
        for c in book.cells
        if c.cell_type == "code"
        for o in c.outputs
        if "application/vnd.jupyter.widget-view+json" in o.get("data", {})
    ]
    assert widgets, "each notebook displays at least one widget"
