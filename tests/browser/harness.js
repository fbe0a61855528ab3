// Minimal stand-in for an anywidget model, enough to drive the bundle in a
// real browser: get/set/on/off/save_changes/send plus test helpers.
import widget from "/python/headwidget/static/widget.js";

class FakeModel {
  constructor(state) {
    this.state = { ...state };
    this.listeners = new Map();
    this.saves = [];
    this.sent = [];
    this.widget_manager = {};
  }
  get(key) {
    return this.state[key];
  }
  set(key, value) {
    const old = this.state[key];
    this.state[key] = value;
    const same =
      old === value ||
      (Array.isArray(old) &&
        Array.isArray(value) &&
        old.length === value.length &&
        old.every((x, i) => x === value[i]));
    if (!same) this.emit(`change:${key}`, this, value);
  }
  on(event, cb) {
    if (!this.listeners.has(event)) this.listeners.set(event, []);
    this.listeners.get(event).push(cb);
  }
  off(event, cb) {
    if (event == null) {
      this.listeners.clear();
      return;
    }
    if (cb == null) {
      this.listeners.delete(event);
      return;
    }
    const list = this.listeners.get(event) || [];
    const i = list.indexOf(cb);
    if (i >= 0) list.splice(i, 1);
  }
  emit(event, ...args) {
    for (const cb of [...(this.listeners.get(event) || [])]) cb(...args);
  }
  save_changes() {
    this.saves.push({ ...this.state });
  }
  send(content) {
    this.sent.push(content);
  }
  // What Python would do: set a trait and notify views.
  kernelSet(key, value) {
    this.set(key, value);
  }
  kernelSend(msg) {
    this.emit("msg:custom", msg, []);
  }
}

/** Float32 little-endian values in a DataView at byteOffset `pad` of a larger buffer. */
function f32(values, pad = 0) {
  const buf = new ArrayBuffer(pad + 4 * values.length + 3);
  const dv = new DataView(buf, pad, 4 * values.length);
  values.forEach((v, i) => {
    dv.setFloat32(4 * i, v, true);
  });
  return dv;
}

function u8(bytes, pad = 0) {
  const buf = new ArrayBuffer(pad + bytes.length);
  new Uint8Array(buf, pad).set(bytes);
  return new DataView(buf, pad, bytes.length);
}

/** Panel dict as Python sends it; `data` is a DataView. */
function panel(fields) {
  return {
    id: "p",
    title: "",
    subtitle: "",
    rows: 1,
    cols: 1,
    row_labels: null,
    col_labels: null,
    row_offset: 0,
    col_offset: 0,
    row_step: 1,
    col_step: 1,
    dtype: "float32",
    note: "",
    ...fields,
  };
}

/** A control bar with one control of every type, as a view's `controls` trait describes it. */
const CONTROLS = [
  { trait: "layer", type: "slider", label: "Layer", count: "num_layers", text: "layer_label" },
  {
    trait: "channel_start",
    type: "window",
    label: "Channels",
    width: "channel_width",
    total: "num_channels",
  },
  { trait: "kind", type: "toggles", label: "Kind", options: "kinds_available" },
  { trait: "metric", type: "select", label: "Metric", options: "metrics_available" },
  { trait: "alignment", type: "select", label: "Alignment", options: "alignments_available" },
  { trait: "mechanisms", type: "checklist", label: "Mechanisms", options: "mechanisms_available" },
];

const DEFAULTS = {
  controls: CONTROLS,
  panels: [],
  vmin: -1,
  vmax: 1,
  colormap: "diverging",
  colorbar_label: "",
  columns: 0,
  view: "channels",
  layer: 0,
  num_layers: 0,
  layer_label: "",
  channel_start: 0,
  channel_width: 0,
  num_channels: 0,
  kind: "key",
  kinds_available: [],
  metric: "",
  metrics_available: [],
  alignment: "",
  alignments_available: [],
  mechanisms: [],
  mechanisms_available: [],
  error: "",
  status: "",
};

let cleanup = null;

function mount(state) {
  if (cleanup) cleanup();
  const el = document.getElementById("root");
  el.replaceChildren();
  const model = new FakeModel({ ...DEFAULTS, ...state });
  cleanup = widget.render({ model, el });
  window.model = model;
  return model;
}

window.hw = { FakeModel, f32, u8, panel, mount, DEFAULTS };
window.hwReady = true;
