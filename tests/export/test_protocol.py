"""The kernel's and the front end's protocol modules say the same, and a panel survives the trip.

``core/protocol.py`` and ``js/lib/protocol.ts`` are twins: this test bundles the TypeScript one (with
the front end's own panel decoder) with esbuild, runs it in node, and compares the tables; then it
encodes panels here and checks what the decoder there reads back: every field, and every cell as the
float16 or float32 value the wire format promises.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from headwidget.core import protocol
from headwidget.core.charts import Chart, Series, encode_chart
from headwidget.core.panels import Panel, encode_panel
from headwidget.widget import HeadWidget

ROOT = Path(__file__).resolve().parents[2]
ESBUILD = ROOT / "node_modules" / ".bin" / "esbuild"
DRIVER = ROOT / "tests" / "js" / "helpers" / "protocol_driver.ts"


def run_front_end(panels: list[dict], tmp_path: Path) -> dict:
    node = shutil.which("node")
    if node is None or not ESBUILD.is_file():
        if os.environ.get("CI") == "true":
            pytest.fail("node and node_modules (npm ci) are needed for the protocol test")
        pytest.skip("needs node and `npm ci`")
    bundle = tmp_path / "driver.mjs"
    subprocess.run(
        [str(ESBUILD), str(DRIVER), "--bundle", "--format=esm", "--platform=node", f"--outfile={bundle}"],
        check=True,
        capture_output=True,
        cwd=ROOT,
    )
    sent = [{**p, "data": base64.b64encode(p["data"]).decode("ascii")} for p in panels]
    out = subprocess.run(
        [node, str(bundle)], input=json.dumps(sent), capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_both_sides_list_the_same_traits_messages_and_fields(tmp_path):
    tables = run_front_end([], tmp_path)["tables"]
    for name in ("KERNEL_TRAITS", "PAGE_TRAITS", "PANEL_FIELDS", "CHART_FIELDS"):
        assert list(tables[name].items()) == list(getattr(protocol, name).items()), name  # same order too
    for name in ("PAGE_MESSAGES", "KERNEL_MESSAGES"):
        assert tables[name] == {k: list(v) for k, v in getattr(protocol, name).items()}, name
    # The kernel's own encoders and widget follow the tables.
    panel = encode_panel(Panel("a", "A", np.eye(2)), vmin=-1.0, vmax=1.0)
    assert list(panel) == list(protocol.PANEL_FIELDS)
    chart = Chart("c", "C", "x", "y", [Series("s", [1.0], [2.0], ["p"])])
    assert list(encode_chart(chart)) == list(protocol.CHART_FIELDS)
    synced = set(HeadWidget.class_trait_names(sync=True))
    assert set(protocol.KERNEL_TRAITS) | set(protocol.PAGE_TRAITS) <= synced


def test_a_panel_encoded_by_the_kernel_decodes_to_the_same_cells(tmp_path):
    rng = np.random.default_rng(0)
    inside = np.tanh(rng.normal(size=(3, 5)))  # in the colour range: float16 on the wire
    inside[1, 2] = np.nan
    outside = rng.normal(scale=100.0, size=(2, 2))  # beyond it: float32
    panels = [
        Panel(
            "k",
            "Keys · layer 0",
            inside,
            subtitle="channels 0–4",
            row_labels=["a", "b", "c"],
            row_offset=4,
            col_step=2,
            row_group=2,
            axis_prefix="K",
            row_axis="head",
            note="n",
            window_subtitle="channels {first}–{last}",
        ),
        Panel("v", "Values", outside, col_labels=["x", "y"], col_axis="layer"),
    ]
    encoded = [encode_panel(p, vmin=-1.0, vmax=1.0) for p in panels]
    front = run_front_end(encoded, tmp_path)
    assert front["problems"] == []
    for sent, got, panel in zip(encoded, front["decoded"], panels, strict=True):
        for name, value in sent.items():
            if name not in ("data", "window_subtitle"):  # the decoder keeps what the page draws
                assert got[name] == value, name
        wire = np.float16 if sent["dtype"] == "float16" else np.float32
        expected = panel.matrix.astype(wire).astype(np.float64).ravel()
        values = np.array([np.nan if v is None else v for v in got["values"]])
        np.testing.assert_array_equal(values, expected)
    assert [s["dtype"] for s in encoded] == ["float16", "float32"]
    # Sent again as keys alone: a page that kept the cells decodes the same panels; one that did not
    # asks for every key.
    keys = [p["key"] for p in encoded]
    assert front["frames"]["added"] is True and front["frames"]["kept"] == keys
    assert front["frames"]["againMissing"] == [] and front["frames"]["revisited"] == front["decoded"]
    assert front["missing"] == keys
