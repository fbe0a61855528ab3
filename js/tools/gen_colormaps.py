"""Generate python/headwidget/colormaps.json, the single source of the colour tables.

Run from the repository root with a Python that has matplotlib and numpy:

    .venv/bin/python js/tools/gen_colormaps.py

Tables (256 entries of [r, g, b], 0-255 integers):

* "diverging": blue -> white -> red, built from the ColorBrewer RdBu anchors
  (RdBu_r orientation) with a pure-white centre.  Entry 128 is exactly
  [255, 255, 255]; entry 127 is the last step of the blue half and is
  white-ish (>= 250 in every channel).  With vmin=-1, vmax=1 the value 0
  maps to index round(0.5 * 255) = 128 (round half up), i.e. exactly white.
* "magma": matplotlib's magma ListedColormap (256 colours), rounded.
* "nan_color": neutral grey used for undefined (NaN) cells; it is far from
  every entry of both tables.
"""

import json
import pathlib

import numpy as np
from matplotlib import colormaps

BLUE_HALF = [  # position 0 -> 1 on the lower half (index 0 -> 128)
    (5, 48, 97),
    (33, 102, 172),
    (67, 147, 195),
    (146, 197, 222),
    (209, 229, 240),
    (255, 255, 255),
]
RED_HALF = [  # position 0 -> 1 on the upper half (index 128 -> 255)
    (255, 255, 255),
    (253, 219, 199),
    (244, 165, 130),
    (214, 96, 77),
    (178, 24, 43),
    (103, 0, 31),
]
NAN_COLOR = [128, 128, 128]


def interp(anchors, s):
    a = np.asarray(anchors, dtype=float)
    x = np.linspace(0.0, 1.0, len(a))
    return [float(np.interp(s, x, a[:, k])) for k in range(3)]


def diverging():
    out = []
    for i in range(256):
        rgb = interp(BLUE_HALF, i / 128) if i <= 128 else interp(RED_HALF, (i - 128) / 127)
        out.append([round(c) for c in rgb])
    assert out[128] == [255, 255, 255]
    assert min(out[127]) >= 250
    return out


def magma():
    colors = np.asarray(colormaps["magma"].colors, dtype=float)
    assert colors.shape == (256, 3)
    return [[round(c * 255) for c in row] for row in colors]


def main():
    tables = {"diverging": {"stops": diverging()}, "magma": {"stops": magma()}, "nan_color": NAN_COLOR}
    for name in ("diverging", "magma"):
        d = np.abs(np.asarray(tables[name]["stops"]) - np.asarray(NAN_COLOR)).sum(axis=1).min()
        assert d >= 60, (name, d)
    root = pathlib.Path(__file__).resolve().parents[2]
    path = root / "python" / "headwidget" / "colormaps.json"

    def rows(stops):
        return ",\n".join("      " + json.dumps(s) for s in stops)

    text = "{\n"
    for name in ("diverging", "magma"):
        text += f'  "{name}": {{\n    "stops": [\n{rows(tables[name]["stops"])}\n    ]\n  }},\n'
    text += f'  "nan_color": {json.dumps(NAN_COLOR)}\n}}\n'
    assert json.loads(text) == tables
    path.write_text(text)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
