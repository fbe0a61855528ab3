"""The panel wire format's head fields, the encoding of cached read-only matrices, and the window
control's step reference."""

from __future__ import annotations

import numpy as np
import pytest

from headwidget.core.panels import Panel, encode_panel
from headwidget.views._controls import REFERENCES, window


def test_head_fields_travel_with_the_panel():
    p = Panel("k", "Keys", np.eye(4), row_group=64, col_group=32, axis_prefix="K")
    sent = encode_panel(p, vmin=-1, vmax=1)
    assert (sent["row_group"], sent["col_group"], sent["axis_prefix"]) == (64, 32, "K")
    plain = encode_panel(Panel("p", "t", np.eye(2)), vmin=-1, vmax=1)
    assert (plain["row_group"], plain["col_group"], plain["axis_prefix"]) == (0, 0, "")
    named = encode_panel(Panel("d", "t", np.eye(2), row_axis="variant", col_axis="layer"), vmin=-1, vmax=1)
    assert (named["row_axis"], named["col_axis"], plain["row_axis"], plain["col_axis"]) == (
        "variant",
        "layer",
        "",
        "",
    )
    with pytest.raises(ValueError, match="row_group and col_group"):
        encode_panel(Panel("p", "t", np.eye(2), col_group=-1), vmin=-1, vmax=1)


@pytest.mark.parametrize(
    ("values", "dtype"),
    [
        ([[0.5, np.nan], [-1.0, 1.0]], "float16"),
        ([[np.nan, np.nan]], "float16"),
        ([[np.inf, 0.5]], "float16"),  # an infinity: only finite values decide
        ([[-np.inf, 3.0]], "float32"),
        ([[0.0, 250.0]], "float32"),
        ([[0.0, 70000.0]], "float32"),
    ],
)
def test_wire_dtype_depends_on_the_finite_values(values, dtype):
    sent = encode_panel(Panel("p", "t", np.array(values)), vmin=-1, vmax=1)
    assert sent["dtype"] == dtype
    back = np.frombuffer(sent["data"], dtype="<f2" if dtype == "float16" else "<f4").reshape(len(values), -1)
    np.testing.assert_array_equal(np.isnan(back), np.isnan(values))
    finite = np.isfinite(values)
    np.testing.assert_allclose(back[finite], np.asarray(values)[finite], rtol=1e-3)


def test_read_only_matrices_are_encoded_once():
    m = np.linspace(-1, 1, 64 * 64).reshape(64, 64).copy()
    m.setflags(write=False)
    first = encode_panel(Panel("a", "t", m), vmin=-1, vmax=1)
    again = encode_panel(Panel("b", "other title", m, row_offset=3), vmin=-1, vmax=1)
    assert again["data"] is first["data"]  # not converted again
    assert (again["id"], again["title"], again["row_offset"]) == ("b", "other title", 3)
    other_scale = encode_panel(Panel("a", "t", m), vmin=0, vmax=1)
    assert other_scale["data"] is not first["data"]
    assert other_scale["data"] == first["data"]


def test_writable_matrices_are_encoded_every_time():
    m = np.zeros((8, 8))
    first = encode_panel(Panel("a", "t", m), vmin=-1, vmax=1)
    m[0, 0] = 0.5  # changed in place
    again = encode_panel(Panel("a", "t", m), vmin=-1, vmax=1)
    assert np.frombuffer(again["data"], "<f2")[0] == 0.5
    assert np.frombuffer(first["data"], "<f2")[0] == 0.0
    # a read-only view of a writable array can still change: not remembered either
    base = np.zeros((8, 8))
    view = base[:]
    view.setflags(write=False)
    encode_panel(Panel("v", "t", view), vmin=-1, vmax=1)
    base[1, 1] = -0.25
    assert np.frombuffer(encode_panel(Panel("v", "t", view), vmin=-1, vmax=1)["data"], "<f2")[9] == -0.25


def test_window_control_names_its_step_trait():
    assert "step" in REFERENCES
    control = window("Channels", width="channel_width", total="num_channels", step="channel_step")
    assert control.bind("channel_start").to_json() == {
        "trait": "channel_start",
        "type": "window",
        "label": "Channels",
        "width": "channel_width",
        "total": "num_channels",
        "step": "channel_step",
    }
    assert "step" not in window("Channels", width="w", total="n").bind("s").to_json()
