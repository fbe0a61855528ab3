// Offline stand-in for the anywidget model of a saved headwidget page (see _html.py).
// It reads the page's JSON blob, imports the inlined widget bundle from a data: URL and renders it
// with a model that has get/set/on/off/save_changes/send. When the layer slider commits a layer,
// save_changes() swaps in that layer's precomputed panels (or shows why it is missing). A frame
// marked `window` holds whole square matrices (one cell per channel): the channel window's sliders
// crop them here, as the kernel would, and the panel subtitles name the window. A page with a
// toggle (`option_trait`, e.g. the kind of keys) holds each option's frames under `options`; the
// toggle switches between them. Matrices live in `blobs` (each once; `packed: "upper"` = the upper
// triangle of a symmetric one, unpacked here).
// No request leaves the page.

const data = JSON.parse(document.getElementById("headwidget-data").textContent);
const FRAME_TRAITS = ["vmin", "vmax", "colormap", "colorbar_label", "columns", "charts"];

function base64Bytes(text) {
  const raw = atob(text);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

/** A panel's matrix as the widget reads it: n×n row-major, the upper triangle mirrored if packed. */
function panelData(p, blobs) {
  const bytes = base64Bytes(blobs[p.blob]);
  if (p.packed !== "upper") return new DataView(bytes.buffer);
  const n = p.rows;
  const Cells = p.dtype === "float16" ? Uint16Array : Uint32Array;
  const upper = new Cells(bytes.buffer);
  const full = new Cells(n * n);
  let k = 0;
  for (let r = 0; r < n; r++) {
    for (let c = r; c < n; c++) {
      full[r * n + c] = upper[k];
      full[c * n + r] = upper[k++];
    }
  }
  return new DataView(full.buffer);
}

function same(a, b) {
  if (a === b) return true;
  return (
    Array.isArray(a) && Array.isArray(b) && a.length === b.length && a.every((x, i) => x === b[i])
  );
}

class OfflineModel {
  constructor(page) {
    this.page = page;
    this.state = { ...page.state };
    this.listeners = new Map();
    this.decoded = new Map();
    this.sent = []; // clicks and PNG replies: there is no kernel to receive them
    this.widget_manager = {};
    this.shown = null;
    this.show(this.state.layer, false);
  }

  get(key) {
    return this.state[key];
  }

  set(key, value) {
    const old = this.state[key];
    this.state[key] = value;
    if (!same(old, value)) this.emit(`change:${key}`, this, value);
  }

  on(event, callback) {
    if (!this.listeners.has(event)) this.listeners.set(event, []);
    this.listeners.get(event).push(callback);
  }

  off(event, callback) {
    if (event == null) return this.listeners.clear();
    if (callback == null) return this.listeners.delete(event);
    const list = this.listeners.get(event) || [];
    const i = list.indexOf(callback);
    if (i >= 0) list.splice(i, 1);
  }

  emit(event, ...args) {
    for (const callback of [...(this.listeners.get(event) || [])]) callback(...args);
  }

  save_changes() {
    if (this.state.layer !== this.shown || this.option() !== this.shownOption) {
      this.show(this.state.layer, true);
    } else if (this.windowKey() !== this.cropped) this.show(this.state.layer, true);
  }

  /** The toggle's current option ("" without one). */
  option() {
    const trait = this.page.state.option_trait;
    return trait ? String(this.state[trait]) : "";
  }

  /** The frames and errors of the current option (the page's own without a toggle). */
  source() {
    const options = this.page.options;
    return options?.[this.option()] ?? this.page;
  }

  windowKey() {
    return `${this.state.channel_start}:${this.state.channel_width}`;
  }

  /** A panel cropped to channels [start, start + width), as the channel view's kernel would send. */
  crop(p) {
    const start = Math.max(0, Math.min(this.state.channel_start | 0, p.rows - 1));
    const n = Math.max(1, Math.min(this.state.channel_width | 0, p.rows - start));
    const size = p.dtype === "float16" ? 2 : 4;
    const src = new Uint8Array(p.data.buffer, p.data.byteOffset, p.data.byteLength);
    const out = new Uint8Array(n * n * size);
    for (let r = 0; r < n; r++) {
      const from = ((start + r) * p.cols + start) * size;
      out.set(src.subarray(from, from + n * size), r * n * size);
    }
    const subtitle = p.subtitle.replace(/^channels \d+–\d+/, `channels ${start}–${start + n - 1}`);
    return {
      ...p,
      rows: n,
      cols: n,
      row_offset: start,
      col_offset: start,
      subtitle,
      data: new DataView(out.buffer),
    };
  }

  send(content) {
    this.sent.push(content);
  }

  /** Panels of a layer with their data decoded to DataViews (once), or null if not exported. */
  frame(layer) {
    const frame = this.source().frames[String(layer)];
    if (!frame) return null;
    const key = `${this.option()}|${layer}`;
    if (!this.decoded.has(key)) {
      this.decoded.set(
        key,
        frame.panels.map((p) => ({ ...p, data: panelData(p, this.page.blobs) })),
      );
    }
    return { ...frame, panels: this.decoded.get(key) };
  }

  show(layer, notify) {
    const set = notify ? (k, v) => this.set(k, v) : (k, v) => (this.state[k] = v);
    this.shown = layer;
    this.shownOption = this.option();
    const frame = this.frame(layer);
    if (!frame) {
      const held = Object.keys(this.source().frames).join(", ");
      const why = this.source().errors[String(layer)];
      set(
        "error",
        why
          ? `layer ${layer}: ${why}`
          : `layer ${layer} is not in this file (it holds layers ${held}); ` +
              "export it with save(view, path, layers=[...])",
      );
      set("layer_label", `layer ${layer} (not in this file)`);
      return;
    }
    for (const key of FRAME_TRAITS) set(key, frame[key]);
    set("layer_label", frame.layer_label);
    this.cropped = this.windowKey();
    set("panels", frame.window ? frame.panels.map((p) => this.crop(p)) : frame.panels);
    set("error", "");
  }
}

const root = document.getElementById("headwidget-root");
try {
  const widget = (await import(`data:text/javascript;base64,${data.bundle}`)).default;
  const model = new OfflineModel(data);
  widget.render({ model, el: root });
  window.headwidget = { model };
  document.documentElement.dataset.headwidgetReady = "true";
} catch (err) {
  root.textContent = `headwidget could not start: ${err instanceof Error ? err.message : err}`;
  document.documentElement.dataset.headwidgetReady = "error";
}
