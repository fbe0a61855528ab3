// @vitest-environment jsdom
import { afterEach, describe, expect, it, vi } from "vitest";
import { FRAMES_REPORT_DELAY_MS, View } from "../../js/ui/view";
import { FakeModel, f32View, rawPanel } from "./helpers/fake_model";

const XSS = "<img src=x onerror=alert(1)>";

function mount(state: Record<string, unknown> = {}) {
  const fm = new FakeModel({
    panels: [
      rawPanel({
        id: "a",
        title: XSS,
        subtitle: "s",
        note: "n",
        rows: 2,
        cols: 2,
        data: f32View([0.1, 0.2, 0.3, 0.4], 3),
      }),
      rawPanel({ id: "b", title: "B", rows: 1, cols: 2, data: f32View([1, NaN]) }),
    ],
    vmin: -1,
    vmax: 1,
    colormap: "diverging",
    colorbar_label: "cos",
    columns: 0,
    view: "channels",
    error: "",
    status: "",
    ...state,
  });
  const el = document.createElement("div");
  document.body.replaceChildren(el);
  const view = new View(fm.asModel(), el);
  return { fm, el, view };
}

describe("View", () => {
  it("renders controls, messages and one panel wrapper per panel", () => {
    const { el } = mount();
    expect(el.querySelector(".hw-controls")).not.toBeNull();
    expect(
      [...el.querySelectorAll<HTMLElement>(".hw-panel")].map((p) => p.dataset.panelId),
    ).toEqual(["a", "b"]);
    expect(el.querySelector<HTMLElement>(".hw-root")!.dataset.view).toBe("channels");
  });

  it("renders a hostile title as literal text and creates no element from it", () => {
    const { el } = mount();
    expect(document.querySelector("img")).toBeNull();
    const li = el.querySelector('.hw-sr li[data-panel-id="a"]')!;
    expect(li.textContent).toBe(`${XSS} — s — n`);
  });

  it("reports malformed panels and keeps the rest", () => {
    const { el, fm } = mount();
    fm.set("panels", [
      rawPanel({ id: "bad", rows: 3, data: f32View([1]) }),
      rawPanel({ id: "ok", data: f32View([1]) }),
    ]);
    expect(
      [...el.querySelectorAll<HTMLElement>(".hw-panel")].map((p) => p.dataset.panelId),
    ).toEqual(["ok"]);
    const err = el.querySelector<HTMLElement>(".hw-error")!;
    expect(err.hidden).toBe(false);
    expect(err.textContent).toMatch(/^panel 0 "bad": buffer holds 4 bytes/);
  });

  it("relayouts when columns change", () => {
    const { el, fm } = mount();
    const lefts = () => [...el.querySelectorAll<HTMLElement>(".hw-panel")].map((p) => p.style.left);
    expect(lefts()[1]).not.toBe("0px"); // side by side at the fallback width
    fm.set("columns", 1);
    expect(lefts()).toEqual(["0px", "0px"]);
  });

  it("sends click messages", () => {
    const { el, fm, view } = mount();
    const b = view.grid.layout.boxes[1];
    const x = b.x + b.plot.x + (1.5 * b.plot.w) / 2;
    const y = b.y + b.plot.y + b.plot.h / 2;
    el.querySelector(".hw-panels")!.dispatchEvent(
      new MouseEvent("click", { clientX: x, clientY: y, bubbles: true }),
    );
    expect(fm.sent).toEqual([{ type: "click", panel: "b", row: 0, col: 1 }]);
  });

  it("answers an export request once per model, with an error when there is no canvas", () => {
    const { fm } = mount();
    const second = new View(fm.asModel(), document.createElement("div"));
    fm.emit("msg:custom", { type: "export_png" }, []);
    expect(fm.sent).toEqual([{ type: "png", data_url: null, error: "canvas unavailable" }]);
    fm.emit("msg:custom", { type: "something else" }, []);
    expect(fm.sent).toHaveLength(1);
    second.destroy();
  });

  it("lets the next view answer after the first is destroyed, and cleans up listeners", () => {
    const { fm, view, el } = mount();
    const other = new View(fm.asModel(), document.createElement("div"));
    view.destroy();
    expect(el.children).toHaveLength(0);
    fm.emit("msg:custom", { type: "export_png" }, []);
    expect(fm.sent).toHaveLength(1);
    other.destroy();
    expect(fm.listenerCount()).toBe(0);
  });
});

describe("View frames", () => {
  const keyed = (key: string, data: DataView) => rawPanel({ id: key, key, rows: 1, cols: 2, data });
  const empty = () => new DataView(new ArrayBuffer(0));
  const ids = (el: HTMLElement) =>
    [...el.querySelectorAll<HTMLElement>(".hw-panel")].map((p) => p.dataset.panelId);
  /** The messages of one type the page sent. */
  const sentOf = (fm: FakeModel, type: string) => fm.sent.filter((m) => m.type === type);

  it("tells the kernel the frames it holds and draws a revisited frame from them", () => {
    vi.useFakeTimers();
    const { el, fm, view } = mount({ panels: [keyed("k1", f32View([0.5, -0.5]))] });
    expect(sentOf(fm, "frames")).toEqual([]); // told once the frame is drawn, not while drawing it
    vi.advanceTimersByTime(FRAMES_REPORT_DELAY_MS);
    expect(sentOf(fm, "frames")).toEqual([{ type: "frames", keys: ["k1"] }]);
    fm.set("panels", [keyed("k2", f32View([0.25, 0.75]))]);
    fm.set("panels", [keyed("k3", f32View([0.5, 0.5]))]); // quick steps: one message
    vi.advanceTimersByTime(FRAMES_REPORT_DELAY_MS);
    expect(sentOf(fm, "frames")).toEqual([
      { type: "frames", keys: ["k1"] },
      { type: "frames", keys: ["k1", "k2", "k3"] },
    ]);
    fm.set("panels", [keyed("k1", empty())]); // back to the first: its key alone
    expect(sentOf(fm, "frames")).toHaveLength(2); // nothing new to tell
    expect(sentOf(fm, "missing")).toEqual([]); // nothing missing
    expect(ids(el)).toEqual(["k1"]);
    expect(Array.from(view.grid.current?.panels[0]?.values ?? [])).toEqual([0.5, -0.5]);
    // A second view of the model (another output of the same widget) shares the frames.
    const other = new View(fm.asModel(), document.createElement("div"));
    vi.advanceTimersByTime(FRAMES_REPORT_DELAY_MS);
    expect(sentOf(fm, "frames")).toHaveLength(2);
    other.destroy();
    vi.useRealTimers();
  });

  it("asks for the frames it lacks and keeps the last panels until they come whole", () => {
    vi.useFakeTimers();
    const { el, fm } = mount({ panels: [keyed("k1", f32View([0.5, -0.5]))] });
    fm.set("panels", [keyed("k7", empty())]);
    expect(fm.sent).toEqual([{ type: "missing", keys: ["k7"] }]); // at once: nothing to draw
    vi.advanceTimersByTime(FRAMES_REPORT_DELAY_MS);
    expect(sentOf(fm, "drawn")).toEqual([{ type: "drawn", keys: ["k1"] }]); // (the first panels)
    expect(ids(el)).toEqual(["k1"]);
    fm.set("panels", [keyed("k7", f32View([0.1, 0.2]))]);
    expect(ids(el)).toEqual(["k7"]);
    vi.advanceTimersByTime(FRAMES_REPORT_DELAY_MS);
    expect(sentOf(fm, "frames").at(-1)).toEqual({ type: "frames", keys: ["k1", "k7"] });
    expect(sentOf(fm, "drawn").at(-1)).toEqual({ type: "drawn", keys: ["k7"] });
    vi.useRealTimers();
  });

  it("tells the kernel which panels it drew once the frame that shows them is done", () => {
    vi.useFakeTimers();
    const frames: FrameRequestCallback[] = [];
    const raf = vi.spyOn(window, "requestAnimationFrame").mockImplementation((cb) => {
      frames.push(cb);
      return frames.length;
    });
    const { fm } = mount({ panels: [keyed("k1", f32View([0.5, -0.5]))] });
    fm.set("panels", [keyed("k2", f32View([0.25, 0.75]))]); // two steps before the frame
    vi.advanceTimersByTime(10);
    expect(sentOf(fm, "drawn")).toEqual([]); // not before the frame
    expect(frames).toHaveLength(1); // one report asked for both steps
    frames[0](0);
    expect(sentOf(fm, "drawn")).toEqual([]); // nor in the frame: in a task after it
    vi.advanceTimersByTime(0);
    expect(sentOf(fm, "drawn")).toEqual([{ type: "drawn", keys: ["k2"] }]); // the panels shown now
    fm.set("panels", [keyed("k1", empty())]); // a revisit is reported too
    frames[1](0);
    vi.advanceTimersByTime(0);
    expect(sentOf(fm, "drawn").at(-1)).toEqual({ type: "drawn", keys: ["k1"] });
    raf.mockRestore();
    vi.useRealTimers();
  });
});

describe("View sizing", () => {
  const five = () =>
    Array.from({ length: 5 }, (_, i) =>
      rawPanel({ id: `p${i}`, rows: 64, cols: 64, data: f32View(new Array(64 * 64).fill(0.5)) }),
    );
  const lines = (el: HTMLElement) =>
    new Set([...el.querySelectorAll<HTMLElement>(".hw-panel")].map((p) => p.style.top)).size;
  const width = (el: HTMLElement) =>
    Number.parseFloat(el.querySelector<HTMLElement>(".hw-grid")!.style.width);
  const realRO = window.ResizeObserver;
  afterEach(() => {
    window.ResizeObserver = realRO;
  });

  it("lays out again on the window's resize event where there is no ResizeObserver", () => {
    // jsdom has none: the fallback is the window's resize event.
    expect(window.ResizeObserver).toBeUndefined();
    const { el, view } = mount({ panels: five() });
    let w = 2000;
    Object.defineProperty(view.root, "clientWidth", { get: () => w });
    window.dispatchEvent(new Event("resize"));
    expect(lines(el)).toBe(1);
    expect(width(el)).toBeLessThanOrEqual(2000);
    w = 968;
    window.dispatchEvent(new Event("resize"));
    expect(lines(el)).toBe(2);
    expect(width(el)).toBeLessThanOrEqual(968);
    view.destroy();
    w = 2000;
    window.dispatchEvent(new Event("resize")); // no listener left
  });

  it("follows the width a ResizeObserver reports", () => {
    const observers: { cb: ResizeObserverCallback; el: Element | null; on: boolean }[] = [];
    window.ResizeObserver = class {
      private readonly rec: { cb: ResizeObserverCallback; el: Element | null; on: boolean };
      constructor(cb: ResizeObserverCallback) {
        this.rec = { cb, el: null, on: true };
        observers.push(this.rec);
      }
      observe(el: Element) {
        this.rec.el = el;
      }
      unobserve() {}
      disconnect() {
        this.rec.on = false;
      }
    } as unknown as typeof ResizeObserver;
    const { el, view } = mount({ panels: five() });
    const ro = observers[observers.length - 1];
    expect(ro.el).toBe(view.root);
    const report = (w: number) =>
      ro.cb(
        [{ contentRect: { width: w } } as ResizeObserverEntry],
        ro as unknown as ResizeObserver,
      );
    report(968);
    expect(lines(el)).toBe(2);
    const narrow = width(el);
    report(2400);
    expect(lines(el)).toBe(1);
    expect(width(el)).toBeGreaterThan(narrow);
    view.destroy();
    expect(ro.on).toBe(false);
  });

  it("tells the kernel its longest plot side in device pixels, and again only when it changes", () => {
    const { fm, el, view } = mount({ panels: five().slice(0, 1) });
    const side = () =>
      Math.max(
        ...[...el.querySelectorAll<HTMLElement>(".hw-panel")].map((p) => {
          const r = JSON.parse(p.dataset.plotRect!);
          return Math.max(r.w, r.h);
        }),
      );
    expect(fm.get("panel_pixels")).toBe(Math.ceil(side()));
    const saves = fm.saves.length;
    expect(saves).toBeGreaterThan(0);
    view.relayout(); // same size: nothing to say
    expect(fm.saves.length).toBe(saves);
    let w = 2400;
    Object.defineProperty(view.root, "clientWidth", { get: () => w });
    window.dispatchEvent(new Event("resize"));
    expect(fm.get("panel_pixels")).toBe(Math.ceil(side()));
    const wide = side();
    w = 500;
    window.dispatchEvent(new Event("resize"));
    expect(side()).toBeLessThan(wide);
    expect(fm.get("panel_pixels")).toBe(Math.ceil(side()));
    const dpr = window.devicePixelRatio;
    Object.defineProperty(window, "devicePixelRatio", { value: 2, configurable: true });
    try {
      window.dispatchEvent(new Event("resize"));
      expect(fm.get("panel_pixels")).toBe(Math.ceil(side() * 2));
    } finally {
      Object.defineProperty(window, "devicePixelRatio", { value: dpr, configurable: true });
    }
    view.destroy();
  });

  it("reports the larger of two views of one model, so that they do not undo each other", () => {
    const { fm, view } = mount({ panels: five() });
    const wide = view.root;
    Object.defineProperty(wide, "clientWidth", { get: () => 2400 });
    view.relayout();
    const large = fm.get("panel_pixels");
    const el2 = document.createElement("div");
    document.body.appendChild(el2);
    const narrow = new View(fm.asModel(), el2);
    Object.defineProperty(narrow.root, "clientWidth", { get: () => 400 });
    narrow.relayout();
    const alone = new FakeModel({ panels: five() });
    const el3 = document.createElement("div");
    document.body.appendChild(el3);
    const single = new View(alone.asModel(), el3);
    Object.defineProperty(single.root, "clientWidth", { get: () => 400 });
    single.relayout();
    expect(alone.get("panel_pixels")).toBeLessThan(large); // what the narrow one alone would say
    single.destroy();
    fm.set("panels", five()); // both lay out again
    expect(fm.get("panel_pixels")).toBe(large);
    narrow.destroy();
    view.destroy();
  });

  it("keeps the controls outside the box that scrolls", () => {
    const { el } = mount({ panels: five() });
    const figure = el.querySelector(".hw-figure")!;
    expect(figure.contains(el.querySelector(".hw-grid"))).toBe(true);
    expect(figure.contains(el.querySelector(".hw-bar"))).toBe(false);
  });
});
