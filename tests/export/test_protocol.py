"""The kernel's and the front end's protocol modules say the same, and a panel survives the trip.

``core/protocol.py`` and ``js/lib/protocol.ts`` are twins: this test bundles the TypeScript one (with
the front end's own panel decoder, control bar parser and saved-page reader) with esbuild, runs it in
node, and compares the tables; then it encodes panels here and checks what the decoder there reads
back: every field, and every cell as the float16 or float32 value the wire format promises. Every
registered view's controls are read there as they are sent (a control of an unknown type is said,
not dropped), and saved pages of views with every kind of control are read there against the page
tables, as they are checked here.
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import typing
from pathlib import Path

import numpy as np
import pytest
import torch

import headwidget
from headwidget.core import protocol
from headwidget.core.charts import Chart, Series, encode_chart
from headwidget.core.panels import Panel, encode_panel
from headwidget.export import page_data
from headwidget.export._axes import RULES
from headwidget.views import ControlType, view_class, view_names
from headwidget.widget import HeadWidget
from tiny_models import make_model, ragged_batches

ROOT = Path(__file__).resolve().parents[2]
ESBUILD = ROOT / "node_modules" / ".bin" / "esbuild"
DRIVER = ROOT / "tests" / "js" / "helpers" / "protocol_driver.ts"


def run_front_end(
    panels: list[dict], tmp_path: Path, *, controls: list | None = None, pages: list | None = None
) -> dict:
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
    given = {"panels": sent, "controls": controls or [], "pages": pages or []}
    out = subprocess.run(
        [node, str(bundle)], input=json.dumps(given), capture_output=True, text=True, check=True
    )
    return json.loads(out.stdout)


def test_both_sides_list_the_same_traits_messages_and_fields(tmp_path):
    front = run_front_end([], tmp_path)
    tables = front["tables"]
    names = [n for n in protocol.__all__ if n not in ("PAGE_MESSAGES", "KERNEL_MESSAGES", "CONTROL_TYPES")]
    for name in names:
        assert list(tables[name].items()) == list(getattr(protocol, name).items()), name  # same order too
    for name in ("PAGE_MESSAGES", "KERNEL_MESSAGES", "CONTROL_TYPES"):
        assert tables[name] == {k: list(v) for k, v in getattr(protocol, name).items()}, name
    assert set(tables) == set(protocol.__all__)  # every table on both sides
    # Each control type has its page rules on both sides, and its type for mypy.
    assert list(RULES) == front["rules"] == list(protocol.CONTROL_TYPES) == list(typing.get_args(ControlType))
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


def json_problems(value: object, fields: dict[str, str], where: str) -> list[str]:
    """What ``value`` lacks or holds beyond ``fields`` (a protocol table), or holds of another type."""
    kinds = {str: "string", bool: "boolean", int: "number", float: "number", list: "list", dict: "object"}
    if not isinstance(value, dict):
        return [f"{where}: expected an object"]
    problems = [f"{where}: no {f}" for f, kind in fields.items() if f not in value and not kind.endswith("?")]
    problems += [f"{where}: unknown field {f}" for f in value if f not in fields]
    for name, item in value.items():
        kind = "null" if item is None else kinds.get(type(item), "?")
        if name in fields and kind not in fields[name].rstrip("?").split("|"):
            problems.append(f"{where}: {name} is a {kind}")
    return problems


@pytest.fixture(scope="module")
def tiny_views():
    model = make_model("llama_gqa", dtype=torch.float32)
    stats = headwidget.capture(model, ragged_batches(), rope="both", inputs=True, progress=False)
    return [  # a slider, a window, toggles, selects, a checklist and an entry; charts beside heatmaps
        headwidget.ChannelView(stats, channel_width=8, prefetch=False),
        headwidget.MechanismView(model, mechanisms=["model", "mqa"], stats=stats, prefetch=False),
        headwidget.TrendView(stats),
    ]


def test_every_views_controls_are_read_by_the_page_and_an_unknown_type_is_said(tiny_views, tmp_path):
    sent = [[c.to_json() for c in view_class(name).view_controls()] for name in view_names()]
    for controls in sent:
        for control in controls:
            assert json_problems(control, protocol.CONTROL_FIELDS, control["trait"]) == []
    planted = [*sent[0], {"trait": "knob", "type": "dial", "label": "Knob"}]
    read = run_front_end([], tmp_path, controls=[*sent, planted])["controls"]
    for controls, parsed in zip(sent, read, strict=False):
        assert parsed["problems"] == [] and [s["trait"] for s in parsed["specs"]] == [
            c["trait"] for c in controls
        ]
    known = ", ".join(protocol.CONTROL_TYPES)
    assert read[-1]["problems"] == [f'control "knob": unknown control type "dial" (this page knows {known})']


def test_a_saved_page_has_the_fields_of_the_page_tables_on_both_sides(tiny_views, tmp_path):
    pages = [page_data(view, progress=False) for view in tiny_views]
    for page in pages:
        found = json_problems(page, protocol.PAGE_FIELDS, "page")
        found += [
            p for i, a in enumerate(page["axes"]) for p in json_problems(a, protocol.AXIS_FIELDS, f"axis {i}")
        ]
        found += [
            p for i, s in enumerate(page["series"]) for p in json_problems(s, protocol.SERIES_FIELDS, f"{i}")
        ]
        for key, frame in page["frames"].items():
            found += json_problems(frame, protocol.FRAME_FIELDS, key)
            found += [p for s in frame["panels"] for p in json_problems(s, protocol.STORED_PANEL_FIELDS, key)]
            found += [p for c in frame["charts"] for p in json_problems(c, protocol.CHART_FIELDS, key)]
        assert found == []
    assert {a["type"] for page in pages for a in page["axes"]} == {"slider", "select", "checklist", "toggles"}
    broken = json.loads(json.dumps(pages[0]))
    broken["axes"][0]["type"] = "dial"
    del broken["frames"][next(iter(broken["frames"]))]["traits"]
    assert run_front_end([], tmp_path, pages=[*pages, broken])["pages"] == [
        [],
        [],
        [],
        [
            'axis 0 ("layer"): unknown control type "dial"',
            f"frame {next(iter(pages[0]['frames']))}: no traits",
        ],
    ]
