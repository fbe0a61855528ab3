"""Rendering benchmarks of the widget, measured side by side in one run (headless chromium).

(a) first paint of a 4096-channel layer: a :class:`ChannelView` over synthetic statistics with
    C = 4096 (K and V panels, each block-averaged to 1024×1024) in the static harness page; time from
    setting ``panels`` to the next animation frame (decode, colour, layout, draw). Target ≤ 100 ms.
(a') a layer step in the page: the K and V panels of another layer replacing those shown (same shapes,
    so the widget colours into the canvases it has); time from setting ``panels`` to the next frame.
(b) re-render of a 1024×1024 full-resolution window (K and V): relayout plus drawing the cached images,
    forced to raster by a pixel read; a recolour (new colour range); and a hover (tooltip, crosshair and
    ``data-hover`` for a new cell). Targets ≤ 5 ms.
(c) bytes on the wire per displayed cell: the panels' binary buffers, and everything the kernel
    websocket received for one first visit of a layer in JupyterLab (JSON, framing, other traits).
    Target ≤ 2. A revisit sends the panels as frame keys alone (the page holds their cells, see
    ``js/lib/frames.ts``): its bytes are given beside.
(d) the JupyterLab round trip for the 4096-channel layer: slider ``change`` event in the page to the
    first animation frame after the new panels are drawn, split at the websocket send (the slider
    debounce before it) and the arrival of the panels (kernel compute and transfer before it);
    first visits of a layer (target ≤ 100 ms) and revisits (the kernel has the panels cached and the
    page their cells, so the kernel sends frame keys alone; target ≤ 50 ms).
    The page reports its plot side in device pixels and the kernel sends no more cells per side than
    that; the same moves are timed again with a view that ignores the page's size and sends 1024²
    per panel (how every move went before), side by side as a ratio; and again with a view that
    computes the next layers as soon as it has sent the panels instead of once the page says it drew
    them (``drawn``), so that the kernel's work competes with the page's drawing (how first visits
    went before). The page's share is split by
    the widget's User Timing marks: the host's handling of the
    message (JupyterLab and ipywidgets, up to ``headwidget:panels``), the widget's decode, colour,
    layout and draw (up to ``headwidget:drawn``), and the browser's frame after it.
(e) anchors on the same 4096×4096 float32 matrix: a plotly heatmap in an offline HTML file (time to
    the first frame showing it, file size; only when ``plotly`` is installed), and JSON lists
    (encode time, size).
(f) the layer × layer view (:class:`~headwidget.LayerSimilarityView`) of SmolLM2 in JupyterLab, its
    statistics captured with every layer's joint moments (keys before and after RoPE, values; 4096
    tokens; every other layer where the capture's memory estimate is over its budget, and the run
    says so): the first paint, from Shift+Enter on ``view = LayerSimilarityView(stats); view`` to the
    frame after its six panels are drawn (the view's construction included: the L × L CKA matrices
    of keys and values, and the first pair's heads), and of a view built in an earlier cell (its
    display alone); a click on a cell of the keys' matrix (a layer pair not shown before: the kernel
    aligns the pair's heads) to the frame after the panels of that pair are drawn, split at the
    click message's send and the panels' arrival; the same pairs clicked again (kept: frame keys);
    and the kernel's own times, in the kernel. Target ≤ 100 ms for the first paint and a click. The
    display of a minimal anywidget (its render draws one canvas), built in an earlier cell, is timed
    the same way beside them: the floor of any widget's display in this JupyterLab; and the same widget
    made in the cell that shows it (``Tiny()``), as a view's widget is: its comm opened and its model
    and module made on the page, the floor of any first paint. The floor of this view is that widget's
    first paint plus what this view cannot leave out: the kernel's CKA of the matrices shown (timed
    alone, in the kernel), computed before its widget is made as every view's panels are, and the page
    drawing its panels.
    ``--screenshot PATH`` saves the view as JupyterLab shows it.

    ``--compare DIR`` runs (f) side by side with another checkout of headwidget (``npm run build``
    done there): a notebook and kernel each, importing headwidget from its own ``python/``, in one
    JupyterLab, their trials taken in turn; both are printed, and their ratios.

Run: ``.venv/bin/python bench/render.py`` (after ``npm run build``; needs chromium, playwright and
jupyterlab as for the browser tests; ``--quick`` for a smaller run; ``--only layer_similarity`` for
(f) alone, ``--layer-stats FILE`` to read its statistics from a file instead of capturing them).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import functools
import http.server
import importlib.util
import json
import math
import os
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
BROWSER_TESTS = ROOT / "tests" / "browser"
CHROMIUM = Path(os.environ.get("HEADWIDGET_CHROMIUM", "/usr/bin/chromium"))
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
#: Traits the harness page's fake model takes besides ``panels`` and those the view's controls read.
STATE_TRAITS = ("vmin", "vmax", "colormap", "colorbar_label", "columns", "view", "controls")


# ---------------------------------------------------------------------------------------- data
def synthetic_stats(
    channels: int = 4096, layers: int = 4, head_dim: int = 128, rank: int = 64, seed: int = 0
) -> Any:
    """``KVStats`` of key and value moments with low-rank-plus-diagonal covariances, per-head blocks.

    >>> synthetic_stats(256, layers=2, head_dim=64).channel_corr(1, "value").shape
    (256, 256)
    """
    from headwidget.core.layout import AttentionLayout
    from headwidget.moments import Moments
    from headwidget.stats import KVStats, StatsMeta

    gen = torch.Generator().manual_seed(seed)
    heads, tokens = channels // head_dim, 100_000
    layout = AttentionLayout(
        family="llama",
        mechanism="mha",
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=heads,
        head_dim=head_dim,
        value_head_dim=head_dim,
        hidden_size=channels,
    )
    meta = StatsMeta("synthetic", "Synthetic", layout, list(range(layers)), ["key", "value"], tokens=tokens)
    moments = {}
    for layer in range(layers):
        for kind in ("key", "value"):
            f = torch.randn(channels, rank, generator=gen, dtype=torch.float64)
            scale = torch.randn(heads, 8, generator=gen, dtype=torch.float64) * 3
            f[:, :8] *= torch.repeat_interleave(scale, head_dim, dim=0)  # shared directions per head
            noise = torch.diag(torch.rand(channels, generator=gen, dtype=torch.float64) * rank)
            m2 = (f @ f.T + noise) * tokens
            moments[(layer, kind)] = Moments(tokens, torch.zeros(channels, dtype=torch.float64), m2)
    return KVStats(meta, moments)


def harness_state(view: Any) -> dict[str, Any]:
    """The view's traits for the harness page, panels' bytes as base64."""
    widget = view.widget
    state = {k: getattr(widget, k) for k in STATE_TRAITS}
    for control in type(view).view_controls():
        state.update({name: getattr(widget, name) for name in control.traits()})
    state["panels"] = [{**p, "data": base64.b64encode(p["data"]).decode()} for p in widget.panels]
    return state


def median(xs: list[float]) -> float:
    return float(statistics.median(xs)) if xs else float("nan")


# ---------------------------------------------------------------------------------------- browser
@contextlib.contextmanager
def static_server(directory: Path) -> Iterator[str]:
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, format: str, *args: Any) -> None:
            pass

    handler = functools.partial(Quiet, directory=str(directory))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


HARNESS_SETUP = """(state) => {
  const dv = (b64) => { const s = atob(b64); const u = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) u[i] = s.charCodeAt(i); return new DataView(u.buffer); };
  window.benchBufs = state.panels.map((p) => dv(p.data));
  window.benchPanels = () => state.panels.map((p, i) => hw.panel({ ...p, data: window.benchBufs[i] }));
  hw.mount({ ...state, panels: [] });
}"""

FIRST_PAINT = """async (runs) => {
  const frame = () => new Promise((r) => requestAnimationFrame(() => r()));
  await frame();
  const sync = [], paint = [];
  for (let k = 0; k < runs; k++) {
    const panels = benchPanels();
    const t0 = performance.now();
    model.kernelSet('panels', panels);       // decode + colour + layout + draw
    const t1 = performance.now();
    await frame();
    sync.push(t1 - t0); paint.push(performance.now() - t0);
    model.kernelSet('panels', []);
    await frame();
  }
  return { sync, paint };
}"""

LAYER_STEP = """async ([runs, other]) => {
  const frame = () => new Promise((r) => requestAnimationFrame(() => r()));
  const dv = (b64) => { const s = atob(b64); const u = new Uint8Array(s.length);
    for (let i = 0; i < s.length; i++) u[i] = s.charCodeAt(i); return new DataView(u.buffer); };
  const otherBufs = other.map((p) => dv(p.data));
  const sets = [benchPanels, () => other.map((p, i) => hw.panel({ ...p, data: otherBufs[i] }))];
  model.kernelSet('panels', sets[0]());
  await frame();
  const sync = [], paint = [];
  for (let k = 0; k < runs; k++) {
    const panels = sets[(k + 1) % 2]();
    const t0 = performance.now();
    model.kernelSet('panels', panels);       // another layer: same shapes, canvases reused
    const t1 = performance.now();
    await frame();
    sync.push(t1 - t0); paint.push(performance.now() - t0);
  }
  return { sync, paint };
}"""

RERENDER = """async (runs) => {
  const frame = () => new Promise((r) => requestAnimationFrame(() => r()));
  model.kernelSet('panels', benchPanels());
  await frame();
  const heat = document.querySelector('.hw-heatmap').getContext('2d');
  const redraw = [], recolour = [];
  for (let k = 0; k < runs; k++) {
    let t0 = performance.now();
    model.kernelSet('columns', (k + 1) % 2);   // relayout + drawImage of the cached images
    heat.getImageData(0, 0, 1, 1);              // the canvas is rasterised before the clock stops
    redraw.push(performance.now() - t0);
    t0 = performance.now();
    model.kernelSet('vmax', k % 2 ? 1 : 0.9);   // recolour every cell, then draw
    heat.getImageData(0, 0, 1, 1);
    recolour.push(performance.now() - t0);
    await frame();
  }
  const panels = document.querySelector('.hw-panels');
  const r = panels.getBoundingClientRect();
  const hover = [];
  for (let k = 0; k < runs * 4; k++) {   // tooltip, crosshair and data-hover for a new cell
    const at = { clientX: r.left + 100 + k, clientY: r.top + 100 + k, bubbles: true };
    const ev = new MouseEvent('mousemove', at);
    const t0 = performance.now();
    panels.dispatchEvent(ev);
    hover.push(performance.now() - t0);
  }
  return { redraw, recolour, hover };
}"""


def bench_harness(browser: Any, server: str, stats: Any, runs: int) -> dict[str, Any]:
    from headwidget import ChannelView

    page = browser.new_page(viewport={"width": 1300, "height": 1000})
    page.goto(f"{server}/tests/browser/harness.html")
    page.wait_for_function("window.hwReady === true")
    out: dict[str, Any] = {}

    view = ChannelView(stats, layer=0)  # whole layer: 4096 channels, shown as 1024×1024 blocks
    page.evaluate(HARNESS_SETUP, harness_state(view))
    t = page.evaluate(FIRST_PAINT, runs + 1)
    out["paint_cold"] = t["paint"][0]
    out["paint"] = median(t["paint"][1:])
    out["paint_sync"] = median(t["sync"][1:])
    sent = view.widget.panels
    out["buffer_bytes_per_cell"] = sum(len(p["data"]) for p in sent) / sum(
        p["rows"] * p["cols"] for p in sent
    )
    out["panel_shape"] = f"{sent[0]['rows']}×{sent[0]['cols']}"
    out["panels"] = len(sent)
    out["displayed_cells"] = sum(p["rows"] * p["cols"] for p in sent)
    other = ChannelView(stats, layer=1, prefetch=False)
    t = page.evaluate(LAYER_STEP, [runs * 2, harness_state(other)["panels"]])
    out["step"] = median(t["paint"])
    out["step_sync"] = median(t["sync"])
    cold = ChannelView(stats, layer=0, prefetch=False)  # nothing computed ahead: a real first visit
    for name, resolution, layer in (("whole", None, 1), ("fitted", 820, 2)):
        cold.resolution = resolution
        started = time.perf_counter()
        cold.layer = layer
        out[f"kernel_first_{name}"] = (time.perf_counter() - started) * 1000
    cold.layer = 1
    started = time.perf_counter()
    cold.layer = 2  # at the resolution it was first computed at: cached
    out["kernel_revisit"] = (time.perf_counter() - started) * 1000
    cold.close()

    window = ChannelView(stats, layer=0, channel_start=0, channel_width=1024)  # full resolution
    assert window.widget.panels[0]["row_step"] == 1 and window.widget.panels[0]["rows"] == 1024
    page.evaluate(HARNESS_SETUP, harness_state(window))
    t = page.evaluate(RERENDER, runs * 2)
    out["redraw"] = median(t["redraw"])
    out["recolour"] = median(t["recolour"])
    out["hover"] = median(t["hover"])
    page.close()
    return out


# ---------------------------------------------------------------------------------------- JupyterLab
#: Timestamps in the JupyterLab page: slider changes, websocket traffic, heatmap draws, frames.
LAB_RECORDER = """(() => {
  const T = window.__bench = { changes: [], sends: [], recvs: [], draws: [], frames: [] };
  const size = (d) => d == null ? 0 : (d.byteLength ?? d.size ?? d.length ?? 0);
  document.addEventListener('change', (e) => {
    if (e.target?.dataset?.trait === 'layer') T.changes.push(performance.now());
  }, true);
  const WS = window.WebSocket;
  window.WebSocket = class extends WS {
    constructor(...args) {
      super(...args);   // listen before JupyterLab's own handler: arrival time, not handling time
      this.addEventListener('message', (ev) => T.recvs.push([performance.now(), size(ev.data)]));
    }
    send(data) { T.sends.push([performance.now(), size(data)]); return super.send(data); }
  };
  const draw = CanvasRenderingContext2D.prototype.drawImage;
  CanvasRenderingContext2D.prototype.drawImage = function (...args) {
    const r = draw.apply(this, args);
    if (this.canvas.classList && this.canvas.classList.contains('hw-heatmap')) {
      T.draws.push(performance.now());
      requestAnimationFrame(() => T.frames.push(performance.now()));
    }
    return r;
  };
})();"""

MOVE_SLIDER = """(layer) => {
  const s = document.querySelector('.hw-root[data-view="channels"] input[data-trait="layer"]');
  window.__benchMark = performance.now();
  s.value = String(layer);
  s.dispatchEvent(new Event('input', { bubbles: true }));
  s.dispatchEvent(new Event('change', { bubbles: true }));
  return window.__benchMark;
}"""

REDRAWN = """([since, panels]) => {
  const T = window.__bench;
  const draws = T.draws.filter((t) => t > since);
  return draws.length >= panels && T.frames.some((t) => t > draws[panels - 1]);
}"""

TRIAL = """([since, panels]) => {
  const T = window.__bench;
  const change = T.changes.find((t) => t >= since);
  const send = T.sends.find(([t]) => t >= change)[0];
  const draws = T.draws.filter((t) => t > since);
  const drawn = draws[panels - 1];
  const frame = T.frames.find((t) => t > drawn);
  const recvs = T.recvs.filter(([t]) => t > send && t <= drawn);
  const panelsMsg = recvs.reduce((a, b) => (b[1] > a[1] ? b : a));
  const mark = (name) => performance.getEntriesByName(name, 'mark').map((e) => e.startTime).pop() ?? null;
  return { change, send, arrive: panelsMsg[0], start: mark('headwidget:panels'),
           end: mark('headwidget:drawn'), drawn, frame,
           bytes: recvs.reduce((s, [, n]) => s + n, 0), messages: recvs.length };
}"""


def lab_cell(channels: int, layers: int, fit: bool, held: bool = True) -> str:
    """The notebook cell: a channel view of synthetic statistics; ``fit=False``: one that ignores the
    page's plot size and sends ``max_cells`` (1024) per side whatever the page draws (the old way);
    ``held=False``: one that computes the next layers at once, while the page draws (the old way)."""
    view = "ChannelView" if fit else "Whole"
    eager = "" if held else "\n_prefetch.Prefetcher.hold = lambda self: None  # computes ahead at once"
    return f"""\
import importlib.util, sys
spec = importlib.util.spec_from_file_location("headwidget_bench_render", {str(Path(__file__).resolve())!r})
bench = importlib.util.module_from_spec(spec); sys.modules[spec.name] = bench; spec.loader.exec_module(bench)
from headwidget import ChannelView
from headwidget.views import _prefetch{eager}
class Whole(ChannelView):  # the page's size is ignored: always the view's own limit
    resolution = property(lambda self: None, lambda self, cells: None)
view = {view}(bench.synthetic_stats({channels}, layers={layers}), layer=0)
view"""


def bench_lab(
    browser: Any, channels: int, layers: int, revisits: int, fit: bool = True, held: bool = True
) -> dict[str, Any]:
    sys.path.insert(0, str(BROWSER_TESTS))
    from jupyter_fixtures import LabPage, running_jupyterlab, write_notebook

    with tempfile.TemporaryDirectory() as tmp:
        root, work = Path(tmp, "notebooks"), Path(tmp, "jupyter")
        root.mkdir()
        work.mkdir()
        write_notebook(root / "render_bench.ipynb", lab_cell(channels, layers, fit, held))
        with running_jupyterlab(root, work) as lab:
            context = browser.new_context(viewport={"width": 1400, "height": 1100})
            context.add_init_script(LAB_RECORDER)
            page = context.new_page()
            page.set_default_timeout(120_000)
            lp = LabPage(page=page, lab=lab)
            lp.open("render_bench.ipynb")
            lp.run_cell(0, timeout_s=180)
            page.wait_for_selector('.hw-root[data-view="channels"] .hw-panel canvas.hw-heatmap')
            npanels = page.locator('.hw-root[data-view="channels"] .hw-panel').count()
            first, again = [], []
            order = list(range(1, layers)) + [i % layers for i in range(revisits)]
            for n, layer in enumerate(order):
                time.sleep(0.3)  # let the previous update settle
                since = page.evaluate(MOVE_SLIDER, layer)
                page.wait_for_function(REDRAWN, arg=[since, npanels], polling=5)
                (first if n < layers - 1 else again).append(page.evaluate(TRIAL, [since, npanels]))
            check = lp.run(
                "print(view.layer, view.widget.panel_pixels, view.widget.panels[0]['rows'])"
            ).split()
            assert check[0] == str(order[-1]), check
            pixels, sent = int(check[1]), int(check[2])
            context.close()

    def summary(trials: list[dict[str, float]]) -> dict[str, float]:
        marked = [t for t in trials if t["start"] is not None and t["end"] is not None]
        return {
            "total": median([t["frame"] - t["change"] for t in trials]),
            "debounce": median([t["send"] - t["change"] for t in trials]),
            "kernel": median([t["arrive"] - t["send"] for t in trials]),
            "page": median([t["frame"] - t["arrive"] for t in trials]),
            "host": median([t["start"] - t["arrive"] for t in marked]),
            "widget": median([t["end"] - t["start"] for t in marked]),
            "frame": median([t["frame"] - t["end"] for t in marked]),
            "bytes": median([t["bytes"] for t in trials]),
        }

    return {
        "first": summary(first),
        "revisit": summary(again),
        "n_first": len(first),
        "n_again": len(again),
        "pixels": pixels,
        "sent": sent,
        "panels": npanels,
    }


# ---------------------------------------------------------------------------------------- layer × layer
#: The capture (f) reads: SmolLM2 over the English sample, keys before and after RoPE, values.
LAYER_CAPTURE: dict[str, Any] = {"max_tokens": 4096, "max_length": 256, "rope": "both"}


def layer_statistics(directory: Path) -> tuple[Path, str]:
    """SmolLM2's statistics with the joint moments of every layer (every other layer when the
    capture's estimate is over its memory budget), saved in ``directory``; and the layers in words."""
    import gc

    import headwidget
    from headwidget.embedded import load_smollm2
    from headwidget.errors import MemoryBudgetError
    from headwidget.texts import english_sample

    model, tok = load_smollm2()
    layers = int(model.config.num_hidden_layers)
    for cross, words in ((True, f"all {layers} layers"), (list(range(0, layers, 2)), "every other layer")):
        need = headwidget.estimate(
            model, cross_layer=cross, rope=LAYER_CAPTURE["rope"], max_length=LAYER_CAPTURE["max_length"]
        )
        print(f"cross-layer capture of {words}: estimate {need / 2**30:.2f} GiB", flush=True)
        try:
            stats = headwidget.capture(
                model, english_sample(), tokenizer=tok, cross_layer=cross, progress=False, **LAYER_CAPTURE
            )
        except MemoryBudgetError as err:
            print(f"  refused: {err}", flush=True)
            continue
        path = stats.save(directory / "smollm2_cross_layer.safetensors")
        del stats
        gc.collect()
        return path, f"SmolLM2, {words} cross-layer ({LAYER_CAPTURE['max_tokens']} tokens)"
    raise SystemExit("no cross-layer capture of SmolLM2 fits this machine's memory: pass --layer-stats FILE")


#: JupyterLab's Shift+Enter (the time a cell is asked to run) and clicks, besides LAB_RECORDER's marks.
RUN_RECORDER = """(() => {
  const T = window.__bench;
  T.runs = [];
  document.addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && e.shiftKey) T.runs.push(performance.now());
  }, true);
})()"""

#: The latest layer similarity view on the page.
LAYER_ROOT = "const roots = document.querySelectorAll('.hw-root[data-view=\"layer_similarity\"]'); \
const root = roots[roots.length - 1];"

SHOW_CELL = (
    """([row, col]) => {
  """
    + LAYER_ROOT
    + """
  root.querySelector('.hw-panel[data-panel-id="key-layers"]').scrollIntoView({ block: 'center' });
}"""
)

CLICK_CELL = (
    """([row, col, n]) => {
  """
    + LAYER_ROOT
    + """
  const w = root.querySelector('.hw-panel[data-panel-id="key-layers"]');
  const p = JSON.parse(w.dataset.plotRect);
  const r = w.getBoundingClientRect();
  const at = { clientX: r.left + p.x + (col + 0.5) * p.w / n, clientY: r.top + p.y + (row + 0.5) * p.h / n,
               bubbles: true };
  const t = performance.now();
  root.querySelector('.hw-panels').dispatchEvent(new MouseEvent('click', at));
  return t;
}"""
)

PAINTED = """([since, panels]) => {
  const T = window.__bench;
  const run = T.runs.filter((t) => t >= since)[0];
  const send = T.sends.find(([t]) => t >= run)[0];
  const draws = T.draws.filter((t) => t > since);
  const drawn = draws[panels - 1];
  const frame = T.frames.find((t) => t > drawn);
  const mark = (name) => performance.getEntriesByName(name, 'mark').map((e) => e.startTime)
    .filter((t) => t > since && t <= drawn)[0] ?? null;
  return { run, send, start: mark('headwidget:panels'), drawn, frame };
}"""

CLICKED = """([since, panels]) => {
  const T = window.__bench;
  const send = T.sends.find(([t]) => t >= since)[0];
  const draws = T.draws.filter((t) => t > since);
  const drawn = draws[panels - 1];
  const frame = T.frames.find((t) => t > drawn);
  const recvs = T.recvs.filter(([t]) => t > send && t <= drawn);
  const panelsMsg = recvs.reduce((a, b) => (b[1] > a[1] ? b : a));
  const bytes = recvs.reduce((s, [, n]) => s + n, 0);
  return { click: since, send, arrive: panelsMsg[0], drawn, frame, bytes };
}"""

#: The cells of the notebook (f) runs: read the statistics; build and show a view; build one; show it;
#: and the same for a channel view of one layer (K and V panels of 192 channels), side by side.
LAYER_CELLS = (
    "import time\nimport headwidget\nfrom headwidget.stats import KVStats\nstats = KVStats.load({path!r})",
    "view = headwidget.LayerSimilarityView(stats)\nview",
    "built = headwidget.LayerSimilarityView(stats)",
    "built",
    "channels = headwidget.ChannelView(stats, layer=0, prefetch=False)",
    "channels",
    "tiny = Tiny()",
    "tiny",
    "Tiny()",
)
#: The floor of any widget's display in this JupyterLab: an anywidget whose render draws one canvas
#: (of the class the page's recorder times).
TINY_ESM = (
    "export default { render({ el }) {"
    ' const c = document.createElement("canvas"); c.className = "hw-heatmap"; c.width = c.height = 8;'
    ' el.appendChild(c); c.getContext("2d").drawImage(document.createElement("canvas"), 0, 0); } };'
)
TINY_WIDGET = f"\nimport anywidget\nclass Tiny(anywidget.AnyWidget):\n    _esm = {TINY_ESM!r}"
#: Pairs of layers clicked (row, column of the keys' matrix), each a pair not shown before.
LAYER_PAIRS = [(3, 7), (10, 11), (29, 0), (15, 16), (5, 25), (20, 21), (1, 2), (27, 28), (12, 19), (24, 8)]
#: What the kernel times in itself: a view built (its first grid computed) and a click on a new pair.
KERNEL_TIMES = """\
import statistics
def _ms(f):
    t = time.perf_counter(); f(); return (time.perf_counter() - t) * 1000
_built = [_ms(lambda: headwidget.LayerSimilarityView(stats).grid) for _ in range(3)]
_v = headwidget.LayerSimilarityView(stats)
_clicks = [_ms(lambda: (_v.select_cell("key-layers", a, b), _v.grid)) for a, b in [(4, 9), (13, 22), (26, 6)]]
_cka = [_ms(lambda: [headwidget.layer_similarity(stats, k, "cka") for k in _v.kinds]) for _ in range(3)]
print(*(round(statistics.median(x), 1) for x in (_built, _clicks, _cka)), len(_v.layers))"""


def bench_layer_view(
    browser: Any, stats_path: Path, runs: int, screenshot: Path | None, sources: dict[str, Path]
) -> dict[str, dict[str, Any]]:
    """(f) for each of ``sources`` (a name → the ``python/`` folder its kernel imports headwidget from,
    with its built bundle), side by side: one notebook and kernel each in one JupyterLab, their trials
    taken in turn."""
    sys.path.insert(0, str(BROWSER_TESTS))
    from jupyter_fixtures import LabPage, running_jupyterlab, write_notebook

    with tempfile.TemporaryDirectory() as tmp:
        root, work = Path(tmp, "notebooks"), Path(tmp, "jupyter")
        root.mkdir()
        work.mkdir()
        for n, python in enumerate(sources.values()):
            first = f"import sys\nsys.path.insert(0, {str(python)!r})\n" + LAYER_CELLS[0].format(
                path=str(stats_path)
            )
            first += TINY_WIDGET + "\nprint(headwidget.__file__)"  # (the checkout this kernel imports)
            write_notebook(root / f"layer_bench_{n}.ipynb", first, *LAYER_CELLS[1:])
        with running_jupyterlab(root, work) as lab:
            pages: dict[str, tuple[Any, Any]] = {}
            for n, (name, python) in enumerate(sources.items()):
                context = browser.new_context(viewport={"width": 1400, "height": 1100})
                context.add_init_script(LAB_RECORDER)
                page = context.new_page()
                page.set_default_timeout(120_000)
                lp = LabPage(page=page, lab=lab)
                lp.open(f"layer_bench_{n}.ipynb")
                page.evaluate(RUN_RECORDER)
                where = lp.run_cell(0, timeout_s=300).split()[-1]  # the statistics read (not timed)
                assert where.startswith(str(python)), (name, where, python)
                pages[name] = (page, lp)
            trials = {
                name: {k: [] for k in ("built", "shown", "channels", "tiny", "tiny_made")} for name in sources
            }
            shown = (
                (1, "built", 6),
                (3, "shown", 6),
                (5, "channels", 2),
                (7, "tiny", 1),
                (8, "tiny_made", 1),
            )
            for _ in range(runs):
                for name, (page, lp) in pages.items():  # (the sources in turn: side by side)
                    for cell, into, panels in shown:
                        if cell in (3, 5, 7):
                            lp.run_cell(cell - 1, timeout_s=60)  # a new view, not yet shown
                        time.sleep(0.3)
                        since = page.evaluate("performance.now()")
                        lp.run_cell(cell, timeout_s=60)
                        page.wait_for_function(REDRAWN, arg=[since, panels], polling=5)
                        trials[name][into].append(page.evaluate(PAINTED, [since, panels]))
            first_page, first_lp = next(iter(pages.values()))
            root_panels = first_page.locator('.hw-root[data-view="layer_similarity"]').last.locator(
                ".hw-panel"
            )
            npanels = root_panels.count()
            assert npanels == 6, npanels
            layers = int(first_lp.run("print(len(built.layers))").split()[-1])
            pairs = [(a % layers, b % layers) for a, b in LAYER_PAIRS]
            clicked: dict[str, tuple[list[Any], list[Any]]] = {name: ([], []) for name in sources}
            for n, (a, b) in enumerate(pairs + pairs[: len(pairs) // 2]):
                for name, (page, _) in pages.items():
                    page.evaluate(SHOW_CELL, [a, b])
                    time.sleep(0.3)  # let the previous update settle
                    since = page.evaluate(CLICK_CELL, [a, b, layers])
                    page.wait_for_function(REDRAWN, arg=[since, npanels], polling=5)
                    clicked[name][0 if n < len(pairs) else 1].append(page.evaluate(CLICKED, [since, npanels]))
            last = pairs[len(pairs) // 2 - 1]
            kernel: dict[str, list[float]] = {}
            for name, (_, lp) in pages.items():
                check = lp.run("print(built.layer, built.paired, built.error or 'ok')").split()
                assert check == [str(built_layer) for built_layer in last] + ["ok"], (name, check, last)
                kernel[name] = [float(x) for x in lp.run(KERNEL_TIMES, timeout_s=300).split()]
            if screenshot is not None:
                first_page.evaluate(SHOW_CELL, list(last))
                first_page.locator(".jp-Cell").nth(3).screenshot(path=str(screenshot))
            for page, _ in pages.values():
                page.context.close()

    def paint(trials: list[dict[str, float]]) -> dict[str, float]:
        marked = [t for t in trials if t["start"] is not None]  # (none for the minimal widget)
        return {
            "total": median([t["frame"] - t["run"] for t in trials]),
            "lab_out": median([t["send"] - t["run"] for t in trials]),
            "kernel": median([t["start"] - t["send"] for t in marked]) if marked else math.nan,
            "widget": median([t["drawn"] - t["start"] for t in marked]) if marked else math.nan,
            "frame": median([t["frame"] - t["drawn"] for t in trials]),
        }

    def clicks(trials: list[dict[str, float]]) -> dict[str, float]:
        return {
            "total": median([t["frame"] - t["click"] for t in trials]),
            "page_out": median([t["send"] - t["click"] for t in trials]),
            "kernel": median([t["arrive"] - t["send"] for t in trials]),
            "page": median([t["frame"] - t["arrive"] for t in trials]),
            "bytes": median([t["bytes"] for t in trials]),
        }

    return {
        name: {
            "built": paint(trials[name]["built"]),
            "shown": paint(trials[name]["shown"]),
            "channels": paint(trials[name]["channels"]),
            "tiny": paint(trials[name]["tiny"]),
            "tiny_made": paint(trials[name]["tiny_made"]),
            "runs": runs,
            "first": clicks(clicked[name][0]),
            "again": clicks(clicked[name][1]),
            "n_first": len(clicked[name][0]),
            "n_again": len(clicked[name][1]),
            "kernel_built": kernel[name][0],
            "kernel_click": kernel[name][1],
            "kernel_cka": kernel[name][2],
            "layers": int(kernel[name][3]),
        }
        for name in sources
    }


def layer_rows(f: dict[str, Any], source: str) -> list[tuple[str, str, str, str]]:
    """The table's rows of (f)."""

    def split(t: dict[str, float]) -> str:
        return (
            f"lab {t['lab_out']:.0f} + kernel, wire & lab {t['kernel']:.0f} + widget {t['widget']:.0f} + "
            f"frame {t['frame']:.0f} ms"
        )

    tiny, made = f["tiny"], f["tiny_made"]
    made_between = made["total"] - made["lab_out"] - made["frame"]
    tiny_between = tiny["total"] - tiny["lab_out"] - tiny["frame"]
    rows = [
        (
            "(f) layer view: first paint",
            f"{f['built']['total']:.0f} ms",
            "≤ 100 ms",
            f"Shift+Enter on `view = LayerSimilarityView(stats); view` → frame with its 6 panels "
            f"(n={f['runs']}); {source}, {f['layers']}×{f['layers']} matrices",
        ),
        ("", "", "", split(f["built"])),
        (
            "    of a view built before",
            f"{f['shown']['total']:.0f} ms",
            "≤ 100 ms",
            f"Shift+Enter on `built` → frame (its display alone): {split(f['shown'])}",
        ),
        (
            "    a channel view built before",
            f"{f['channels']['total']:.0f} ms",
            "",
            f"the same for `ChannelView(stats, layer=0)` (K and V, 192²): {split(f['channels'])}",
        ),
        (
            "    a minimal anywidget built before",
            f"{tiny['total']:.0f} ms",
            "",
            "the same for an anywidget whose render draws one canvas (any widget's floor here): lab "
            f"{tiny['lab_out']:.0f} + kernel, wire, lab & render {tiny_between:.0f} + frame "
            f"{tiny['frame']:.0f} ms",
        ),
        (
            "    a minimal anywidget made and shown",
            f"{made['total']:.0f} ms",
            "",
            "Shift+Enter on `Tiny()`: the same widget made in the cell that shows it, as a view's widget "
            f"is (its comm opened, its model and module made): lab {made['lab_out']:.0f} + kernel, wire, "
            f"lab & render {made_between:.0f} + frame {made['frame']:.0f} ms",
        ),
        (
            "    kernel: a view built",
            f"{f['kernel_built']:.0f} ms",
            "",
            "in the kernel: K and V CKA over every cross layer, and the first pair's heads",
        ),
        (
            "    floor of this view here",
            f"{made['total'] + f['kernel_cka'] + f['built']['widget']:.0f} ms",
            "",
            f"a minimal anywidget made and shown {made['total']:.0f} + the kernel's CKA of K and V alone "
            f"{f['kernel_cka']:.0f} + this view's drawing {f['built']['widget']:.0f} ms: the soonest a view "
            "computed before its widget is made (as every view is) paints these panels on this machine",
        ),
    ]
    for name, key, n in (("a new pair", "first", f["n_first"]), ("a pair again", "again", f["n_again"])):
        t = f[key]
        split = f"page → send {t['page_out']:.0f} + kernel&wire {t['kernel']:.0f} + page {t['page']:.0f} ms"
        rows.append(
            (
                f"(f) layer view: click, {name}",
                f"{t['total']:.0f} ms",
                "≤ 100 ms",
                f"{split}; {t['bytes'] / 1e3:.1f} kB received (n={n})",
            )
        )
    rows.append(
        (
            "    kernel: a click on a new pair",
            f"{f['kernel_click']:.0f} ms",
            "",
            "in the kernel: select_cell and the grid (K and V heads of the pair aligned)",
        )
    )
    return rows


def compared_rows(views: dict[str, dict[str, Any]], source: str) -> list[tuple[str, str, str, str]]:
    """(f)'s rows for this checkout, then for each checkout it was compared with (measured in turn
    with it), with the ratios of the two."""
    (_, this), *others = views.items()
    rows = layer_rows(this, source)
    for name, other in others:
        rows.append((f"(f) compared with {name}", "", "", "the same trials, taken in turn with the above"))
        rows += [(f"  {a}" if a else a, b, c, d) for a, b, c, d in layer_rows(other, source)]
        for what, get in (
            ("first paint", lambda f: f["built"]["total"]),
            ("display of a view built before", lambda f: f["shown"]["total"]),
            ("a minimal anywidget made and shown", lambda f: f["tiny_made"]["total"]),
            ("kernel: a view built", lambda f: f["kernel_built"]),
            ("click, a new pair", lambda f: f["first"]["total"]),
            ("kernel: a click on a new pair", lambda f: f["kernel_click"]),
        ):
            ratio = f"{get(other) / get(this):.2f}×"
            rows.append((f"    {name} / this: {what}", ratio, "", f"{get(other):.0f} / {get(this):.0f} ms"))
    return rows


def print_rows(rows: list[tuple[str, str, str, str]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(3)]
    print()
    print(f"{'quantity':<{widths[0]}}  {'measured':>{widths[1]}}  {'target':<{widths[2]}}  notes")
    for row in rows:
        print(f"{row[0]:<{widths[0]}}  {row[1]:>{widths[1]}}  {row[2]:<{widths[2]}}  {row[3]}")


# ---------------------------------------------------------------------------------------- anchors
def bench_json(matrix: np.ndarray) -> dict[str, float]:
    started = time.perf_counter()
    text = json.dumps(matrix.tolist())
    return {"seconds": time.perf_counter() - started, "bytes": len(text.encode())}


PLOTLY_DRAWN = """() => {
  const img = document.querySelector('.js-plotly-plot .heatmaplayer image');
  return img && img.getAttribute('href') ? performance.now() : false;
}"""


def bench_plotly(browser: Any, matrix: np.ndarray, directory: Path) -> dict[str, float] | None:
    if importlib.util.find_spec("plotly") is None:
        return None
    import plotly.graph_objects as go

    path = directory / "plotly_heatmap.html"
    started = time.perf_counter()
    fig = go.Figure(go.Heatmap(z=matrix, zmin=-1, zmax=1, colorscale="RdBu_r"))
    fig.write_html(path, include_plotlyjs=True, full_html=True)
    write_s = time.perf_counter() - started
    with static_server(directory) as server:
        page = browser.new_page(viewport={"width": 1300, "height": 1000})
        page.goto(f"{server}/{path.name}", wait_until="commit", timeout=300_000)
        drawn = page.wait_for_function(PLOTLY_DRAWN, polling="raf", timeout=300_000).json_value()
        page.close()
    return {"first_frame_ms": float(drawn), "bytes": path.stat().st_size, "write_s": write_s}


# ---------------------------------------------------------------------------------------- main
def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--channels", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=7, help="repeats in the harness page (medians)")
    parser.add_argument("--layers", type=int, default=6, help="layers of the synthetic statistics")
    parser.add_argument("--revisits", type=int, default=6, help="cached layer changes in JupyterLab")
    parser.add_argument("--quick", action="store_true", help="2048 channels, fewer repeats, no plotly")
    parser.add_argument("--only", choices=("all", "layer_similarity"), default="all", help="(f) alone")
    parser.add_argument("--layer-stats", type=Path, default=None, help="(f)'s cross-layer statistics file")
    parser.add_argument("--screenshot", type=Path, default=None, help="(f): save the view as shown (.png)")
    parser.add_argument(
        "--compare",
        type=Path,
        default=None,
        help="(f) side by side with another checkout of headwidget (its bundle built), e.g. main's",
    )
    args = parser.parse_args()
    if args.quick:
        args.channels, args.runs, args.revisits = 2048, 3, 2
    bundle = ROOT / "python" / "headwidget" / "static" / "widget.js"
    if not bundle.is_file():
        raise SystemExit(f"{bundle} is missing: run `npm ci && npm run build` first")
    from playwright.sync_api import sync_playwright

    c = args.channels
    print(f"headwidget render bench: C = {c}, {sys.executable} {' '.join(sys.argv)}", flush=True)
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        if args.layer_stats is None:
            stats_path, source = layer_statistics(Path(tmp))
        else:
            stats_path, source = args.layer_stats, f"{args.layer_stats.name}"
        print(f"(f)'s statistics: {source}, {time.perf_counter() - started:.0f} s", flush=True)
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
            sources = {"this checkout": ROOT / "python"}
            if args.compare is not None:
                sources[f"{args.compare}"] = args.compare.resolve() / "python"
            layer_views = bench_layer_view(browser, stats_path, args.runs, args.screenshot, sources)
            browser.close()
        print("JupyterLab, layer similarity view: done", flush=True)
    if args.only == "layer_similarity":
        print_rows(compared_rows(layer_views, source))
        print(f"\ncommand: cd {ROOT} && {sys.executable} {' '.join(sys.argv)}")
        print(f"total {time.perf_counter() - started:.0f} s")
        return
    stats = synthetic_stats(c, layers=args.layers)
    matrix = stats.channel_corr(0, "key").astype(np.float32)
    print(f"synthetic statistics: {time.perf_counter() - started:.1f} s", flush=True)

    with sync_playwright() as p, tempfile.TemporaryDirectory() as tmp:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), headless=True, args=CHROMIUM_ARGS)
        with static_server(ROOT) as server:
            h = bench_harness(browser, server, stats, args.runs)
        print("harness page: done", flush=True)
        lab = bench_lab(browser, c, args.layers, args.revisits)
        print("JupyterLab: done", flush=True)
        whole = bench_lab(browser, c, args.layers, args.revisits, fit=False)
        print("JupyterLab, page size ignored: done", flush=True)
        eager = bench_lab(browser, c, args.layers, args.revisits, held=False)
        print("JupyterLab, computing ahead at once: done", flush=True)
        plot = None if args.quick else bench_plotly(browser, matrix, Path(tmp))
        browser.close()
    js = bench_json(matrix)

    cells = h["displayed_cells"]
    r, first = lab["revisit"], lab["first"]
    sent_cells = lab["panels"] * lab["sent"] ** 2
    rows = [
        (
            "(a) first paint, whole layer",
            f"{h['paint']:.1f} ms",
            "≤ 100 ms",
            f"{h['panels']} panels of {h['panel_shape']} (C={c} block-averaged); draw call "
            f"{h['paint_sync']:.1f} ms; first ever {h['paint_cold']:.1f} ms",
        ),
        (
            "(a') layer step in the page",
            f"{h['step']:.1f} ms",
            "",
            f"K and V of another layer replace those shown; draw call {h['step_sync']:.1f} ms",
        ),
        (
            "(b) re-render 1024×1024 window",
            f"{h['redraw']:.2f} ms",
            "≤ 5 ms",
            f"K+V full resolution, relayout+draw; recolour {h['recolour']:.1f} ms; "
            f"hover {h['hover']:.2f} ms (target ≤ 5 ms)",
        ),
        (
            "(c) bytes per displayed cell",
            f"{h['buffer_bytes_per_cell']:.2f} B",
            "≤ 2 B",
            f"binary buffers; websocket total {first['bytes'] / sent_cells:.3f} B/cell sent on a first "
            f"visit ({first['bytes'] / 1e6:.2f} MB), {r['bytes'] / 1e6:.3f} MB on a revisit (frame keys)",
        ),
    ]
    rows.append(
        (
            "(d) cells sent per panel side",
            f"{lab['sent']}",
            "≤ pixels",
            f"the page reports a {lab['pixels']}-device-pixel plot (viewport 1400×1100, ratio 1)",
        )
    )
    for name, key, n, target in (
        ("revisit", "revisit", lab["n_again"], "≤ 50 ms"),
        ("1st visit", "first", lab["n_first"], "≤ 100 ms"),
    ):
        t, old = lab[key], whole[key]
        split = f"debounce {t['debounce']:.0f} + kernel&wire {t['kernel']:.0f} + page {t['page']:.0f} ms"
        rows.append((f"(d) lab slider → frame, {name}", f"{t['total']:.0f} ms", target, f"{split} (n={n})"))
        page = f"host {t['host']:.0f} + widget {t['widget']:.0f} + frame {t['frame']:.0f} ms"
        who = "(JupyterLab, headwidget, browser)"
        rows.append((f"    page, {name}", f"{t['page']:.0f} ms", "", f"{page} {who}"))
        note = (
            f"the same move sending {whole['sent']}² per panel whatever the page draws: "
            f"{old['total']:.0f} ms (kernel&wire {old['kernel']:.0f}, page {old['page']:.0f}), "
            f"{old['bytes'] / 1e6:.2f} MB"
        )
        ratio = f"{old['total'] / t['total']:.1f}×"
        rows.append((f"    page size ignored / fitted, {name}", ratio, "", note))
        if key == "first":
            e = eager[key]
            note = (
                "the same moves computing the next layers at once, while the page draws: "
                f"{e['total']:.0f} ms (kernel&wire {e['kernel']:.0f}, page {e['page']:.0f}, "
                f"of which frame {e['frame']:.0f})"
            )
            rows.append((f"    ahead at once / held, {name}", f"{e['total'] / t['total']:.2f}×", "", note))
    rows.append(
        (
            "    kernel refresh (in process)",
            f"{h['kernel_revisit']:.0f} ms",
            "",
            f"revisit; first visit {h['kernel_first_fitted']:.0f} ms at 820² per panel, "
            f"{h['kernel_first_whole']:.0f} ms at 1024² (correlation from moments + block means)",
        )
    )
    if plot is None:
        rows.append(("(e) plotly heatmap", "skipped", "anchor", "plotly not installed (or --quick)"))
    else:
        size = plot["bytes"]
        note = f"{c}×{c} float32; HTML {size / 1e6:.1f} MB = {size / c**2:.2f} B/cell"
        rows.append(
            (
                "(e) plotly heatmap, offline HTML",
                f"{plot['first_frame_ms']:.0f} ms",
                "anchor",
                f"{note}; write_html {plot['write_s']:.1f} s",
            )
        )
    note = f"{js['bytes'] / 1e6:.1f} MB = {js['bytes'] / c**2:.2f} B/cell (encode only)"
    rows.append(("(e) JSON lists of the matrix", f"{js['seconds'] * 1000:.0f} ms", "anchor", note))
    if plot is not None:
        rows.append(
            ("    plotly / headwidget first paint", f"{plot['first_frame_ms'] / h['paint']:.0f}×", "", "")
        )
    sent = cells * h["buffer_bytes_per_cell"]
    note = "JSON holds the full C×C; headwidget sends what is displayed"
    rows.append(("    JSON / headwidget bytes", f"{js['bytes'] / sent:.0f}×", "", note))

    rows += compared_rows(layer_views, source)
    print_rows(rows)
    print(f"\ncommand: cd {ROOT} && {sys.executable} {' '.join(sys.argv)}")
    print(f"total {time.perf_counter() - started:.0f} s")


if __name__ == "__main__":
    main()
