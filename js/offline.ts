/**
 * The model a saved headwidget page runs in place of a kernel (see
 * `export/_html.py`).  It reads the page's JSON, imports the inlined widget
 * bundle from a data: URL and renders it with a model that has
 * get/set/on/off/save_changes/send.  When a control commits a state,
 * `save_changes` looks the state up (`lib/offline.ts`) and shows its frame, or
 * why the file has none.  No request leaves the page.
 */

import {
  cropPanel,
  type Frame,
  frameCharts,
  missingState,
  type PageData,
  pageProblems,
  type StoredPanel,
  stateKey,
  unpackUpper,
} from "./lib/offline";

type Callback = (...args: unknown[]) => void;
type DecodedPanel = StoredPanel & { data: DataView };

/** The grid traits a frame sets, besides its panels, charts and text traits. */
const FRAME_TRAITS = ["vmin", "vmax", "colormap", "colorbar_label", "columns"];

function base64Bytes(text: string): Uint8Array<ArrayBuffer> {
  const raw = atob(text);
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

function same(a: unknown, b: unknown): boolean {
  if (a === b) return true;
  return (
    Array.isArray(a) &&
    Array.isArray(b) &&
    a.length === b.length &&
    a.every((x, i) => same(x, b[i]))
  );
}

export class OfflineModel {
  readonly state: Record<string, unknown>;
  /** Clicks and PNG replies: there is no kernel to receive them. */
  readonly sent: unknown[] = [];
  readonly widget_manager = {};
  private readonly listeners = new Map<string, Callback[]>();
  private readonly decoded = new Map<string, DecodedPanel[]>();
  private readonly window: { trait: string; width: string } | null;
  private readonly textTraits: Record<string, string> = {};
  /** What is wrong with the page's JSON (said in the error line of every state). */
  private readonly problems: string[];
  private shown = "";

  constructor(private readonly page: PageData) {
    this.state = { ...page.state };
    this.problems = pageProblems(page);
    const controls = Array.isArray(page.state.controls)
      ? (page.state.controls as Record<string, string>[])
      : [];
    const window = controls.find((c) => c.type === "window");
    this.window = window ? { trait: window.trait, width: window.width } : null;
    for (const c of controls) if (c.type === "slider" && c.text) this.textTraits[c.trait] = c.text;
    this.show(false);
  }

  get(key: string): unknown {
    return this.state[key];
  }

  set(key: string, value: unknown): void {
    const old = this.state[key];
    this.state[key] = value;
    if (!same(old, value)) this.emit(`change:${key}`, this, value);
  }

  on(event: string, callback: Callback): void {
    const list = this.listeners.get(event) ?? [];
    list.push(callback);
    this.listeners.set(event, list);
  }

  off(event?: string | null, callback?: Callback | null): void {
    if (event == null) {
      this.listeners.clear();
      return;
    }
    if (callback == null) {
      this.listeners.delete(event);
      return;
    }
    const list = this.listeners.get(event) ?? [];
    const i = list.indexOf(callback);
    if (i >= 0) list.splice(i, 1);
  }

  private emit(event: string, ...args: unknown[]): void {
    for (const callback of [...(this.listeners.get(event) ?? [])]) callback(...args);
  }

  send(content: unknown): void {
    this.sent.push(content);
  }

  save_changes(): void {
    if (this.viewKey() !== this.shown) this.show(true);
  }

  /** The state shown: its key, and the window when the page crops one. */
  private viewKey(): string {
    const key = stateKey(this.page.axes, (t) => this.state[t]);
    if (!this.window) return key;
    return `${key}|${this.state[this.window.trait]}:${this.state[this.window.width]}`;
  }

  /** A frame's panels with their matrices decoded to DataViews (once per frame). */
  private panels(key: string, frame: Frame): DecodedPanel[] {
    let panels = this.decoded.get(key);
    if (!panels) {
      panels = frame.panels.map((p) => {
        const bytes = base64Bytes(this.page.blobs[p.blob]);
        if (p.packed !== "upper") return { ...p, data: new DataView(bytes.buffer) };
        const Cells = p.dtype === "float16" ? Uint16Array : Uint32Array;
        const full = unpackUpper(new Cells(bytes.buffer), p.rows);
        return { ...p, data: new DataView(full.buffer) };
      });
      this.decoded.set(key, panels);
    }
    return panels;
  }

  private show(notify: boolean): void {
    const set = notify
      ? (k: string, v: unknown) => this.set(k, v)
      : (k: string, v: unknown) => (this.state[k] = v);
    this.shown = this.viewKey();
    const key = stateKey(this.page.axes, (t) => this.state[t]);
    const frame = this.page.frames[key];
    const problems = this.problems.join("\n");
    if (!frame) {
      const missing = missingState(this.page, key, (t) => this.state[t], this.textTraits);
      for (const [k, v] of Object.entries(missing.traits)) set(k, v);
      set("error", [missing.error, problems].filter((e) => e).join("\n"));
      return;
    }
    for (const trait of FRAME_TRAITS) set(trait, frame[trait]);
    set("charts", frameCharts(this.page, frame));
    for (const [k, v] of Object.entries(frame.traits ?? {})) set(k, v);
    const panels = this.panels(key, frame);
    const window = this.window;
    set(
      "panels",
      frame.window && window
        ? panels.map((p) =>
            cropPanel(p, Number(this.state[window.trait]), Number(this.state[window.width])),
          )
        : panels,
    );
    set("error", problems);
  }
}

async function start(): Promise<void> {
  const root = document.getElementById("headwidget-root");
  if (!root) return;
  try {
    const page = JSON.parse(
      document.getElementById("headwidget-data")?.textContent ?? "{}",
    ) as PageData;
    const widget = (await import(`data:text/javascript;base64,${page.bundle}`)).default;
    const model = new OfflineModel(page);
    widget.render({ model, el: root });
    (window as unknown as { headwidget: unknown }).headwidget = { model };
    document.documentElement.dataset.headwidgetReady = "true";
  } catch (err) {
    root.textContent = `headwidget could not start: ${err instanceof Error ? err.message : err}`;
    document.documentElement.dataset.headwidgetReady = "error";
  }
}

if (typeof document !== "undefined" && document.getElementById("headwidget-data")) void start();
