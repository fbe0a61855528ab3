/**
 * One rendered view of the model: wires traits to the controls, messages,
 * panel grid and export.  Data flows one way: traits -> parsed panels ->
 * coloured images -> layout -> canvases.
 *
 * The grid is laid out for the width of the element the view is rendered
 * into, and again whenever that width changes (a ResizeObserver; where there
 * is none, the window's resize event).  The control bar sits outside the
 * figure, so it never scrolls away; only a figure wider than a very narrow
 * container scrolls, inside its own box.
 *
 * After each layout the view reports its longest plot side in device pixels
 * (the `panel_pixels` trait): the kernel sends no more cells per panel side
 * than that, and sends more when a resize or a zoom makes room for them.
 *
 * The cells of every panel shown are kept by frame key, once per model
 * (`lib/frames.ts`), and the kernel told which keys the page holds: a
 * revisited panel comes as its key alone. A key the page lacks is asked for
 * (`missing`), and the last panels stay until the kernel sends them whole.
 *
 * Each panels update leaves the User Timing marks "headwidget:panels" (the
 * update arrives) and "headwidget:drawn" (every canvas is drawn) for
 * profiling in the browser.
 */

import { type Chart, parseCharts } from "../lib/charts";
import { packedColormap } from "../lib/colormap";
import { FrameCache, fillPanels } from "../lib/frames";
import { computeLayout, plotPixels } from "../lib/layout";
import { type Panel, parsePanels } from "../lib/panels";
import { type KernelMessageType, pageMessage } from "../lib/protocol";
import type { Measure } from "../lib/text";
import { ChartStrip } from "./charts";
import type { ColorScale } from "./colorbar";
import { Controls } from "./controls";
import { h, makeMeasure } from "./dom";
import { downloadCanvas, EXPORT_SCALE, renderFigure } from "./export_png";
import { Grid, type GridContent } from "./grid";
import { Messages } from "./messages";
import { commit, getNumber, getString, type Model, onChanges } from "./model";
import { buildImage, type Image, recolorImage } from "./panel_canvas";
import { injectStyle } from "./style";

/** Width used before the element is attached and has a size. */
const FALLBACK_WIDTH = 960;
/** Height kept free of a plot for the controls, colorbar and panel titles (largest plot side). */
const VIEWPORT_RESERVE = 160;
/** Window height used where the window reports none. */
const FALLBACK_HEIGHT = 900;

/** A User Timing mark, where the browser has them; only the latest of each name is kept. */
function mark(name: string): void {
  if (typeof performance === "undefined" || typeof performance.mark !== "function") return;
  performance.clearMarks?.(name);
  performance.mark(name);
}

/** Views per model, so that only one of them answers an export request. */
const viewsByModel = new WeakMap<Model, View[]>();
/** The frame cells kept per model (its views share them: one page, one cache). */
const framesByModel = new WeakMap<Model, FrameCache>();
/** Models whose kept frames the kernel is to be told of (once, after the frame is drawn). */
const framesToReport = new WeakSet<Model>();
/**
 * How long after new frames are kept the kernel is told their keys: the message (and the kernel's
 * busy and idle status it brings back) then does not compete with drawing them, and a quick run of
 * slider steps is one message.
 */
export const FRAMES_REPORT_DELAY_MS = 100;

function reportFrames(model: Model, frames: FrameCache): void {
  if (framesToReport.has(model)) return;
  framesToReport.add(model);
  setTimeout(() => {
    framesToReport.delete(model);
    model.send(pageMessage("frames", { keys: frames.keys() }));
  }, FRAMES_REPORT_DELAY_MS);
}

/** Models whose drawn panels the kernel is to be told of (once the frame that shows them is done). */
const drawnToReport = new WeakSet<Model>();

/**
 * Tell the kernel which panels are on screen once the frame that shows them is done (the next
 * animation frame, then a task after it): the kernel computes ahead only then, so that its work does
 * not compete with the page's drawing. Steps drawn within one frame are one message, of the last.
 */
function reportDrawn(model: Model, win: Window | null, keys: () => string[]): void {
  if (drawnToReport.has(model)) return;
  drawnToReport.add(model);
  const send = () => {
    drawnToReport.delete(model);
    model.send(pageMessage("drawn", { keys: keys() }));
  };
  const afterFrame = () => setTimeout(send, 0);
  if (win && typeof win.requestAnimationFrame === "function") win.requestAnimationFrame(afterFrame);
  else afterFrame();
}

function framesOf(model: Model): FrameCache {
  let frames = framesByModel.get(model);
  if (frames === undefined) {
    frames = new FrameCache();
    framesByModel.set(model, frames);
  }
  return frames;
}

export class View {
  readonly root: HTMLDivElement;
  readonly controls: Controls;
  readonly messages: Messages;
  readonly grid: Grid;
  /** The charts above the heatmaps (hidden when there are none). */
  readonly charts: ChartStrip;
  /** Panel titles, subtitles and notes as text for screen readers. */
  readonly textList: HTMLUListElement;
  private readonly doc: Document;
  private readonly measure: Measure;
  private panels: Panel[] = [];
  private images: (Image | null)[] = [];
  private problems: string[] = [];
  private chartList: Chart[] = [];
  private chartProblems: string[] = [];
  private controlProblems: string[] = [];
  private textKey = "";
  /** The width measured by the resize observer (0: not measured yet, read the element). */
  private observedWidth = 0;
  private lastWidth = 0;
  private lastDpr = 1;
  /** The longest plot side this view drew, in device pixels (see reportPixels). */
  private pixels = 0;
  /** The box the figure scrolls in when it is wider than the container. */
  readonly figure: HTMLDivElement;
  private readonly cleanup: (() => void)[] = [];

  constructor(
    private readonly model: Model,
    private readonly el: HTMLElement,
  ) {
    this.doc = el.ownerDocument;
    const doc = this.doc;
    this.measure = makeMeasure(doc);
    this.root = h(doc, "div", { className: "hw-root" });
    injectStyle(doc, this.root);
    this.messages = new Messages(doc, model);
    this.controls = new Controls(
      doc,
      model,
      () => this.download(),
      (problems) => {
        this.controlProblems = problems;
        this.showProblems();
      },
    );
    this.grid = new Grid(doc, (p, row, col) =>
      model.send(pageMessage("click", { panel: p.id, row, col })),
    );
    this.charts = new ChartStrip(doc, (c, series, point) =>
      model.send(pageMessage("chart_click", { chart: c.id, series, point })),
    );
    this.textList = h(doc, "ul", { className: "hw-sr" });
    this.figure = h(doc, "div", { className: "hw-figure" }, [this.charts.root, this.grid.root]);
    this.root.append(
      this.messages.heading,
      this.controls.el,
      this.messages.error,
      this.messages.status,
      this.figure,
      this.textList,
    );
    el.appendChild(this.root);

    this.cleanup.push(
      onChanges(model, ["panels"], () => this.onPanels()),
      onChanges(model, ["charts"], () => this.onCharts()),
      onChanges(model, ["vmin", "vmax", "colormap"], () => this.onScale()),
      onChanges(model, ["colorbar_label"], () => this.drawColorbar()),
      onChanges(model, ["columns"], () => this.relayout()),
      onChanges(model, ["view"], () => this.syncView()),
    );
    const onMsg = (msg: unknown) => this.onCustom(msg);
    model.on("msg:custom", onMsg);
    this.cleanup.push(() => model.off("msg:custom", onMsg));
    this.observeSize();

    const views = viewsByModel.get(model) ?? [];
    views.push(this);
    viewsByModel.set(model, views);

    this.syncView();
    this.readCharts();
    this.onPanels();
  }

  private syncView(): void {
    this.root.dataset.view = getString(this.model, "view");
  }

  colorScale(): ColorScale {
    return {
      vmin: getNumber(this.model, "vmin", 0),
      vmax: getNumber(this.model, "vmax", 1),
      colormap: getString(this.model, "colormap", "diverging"),
      label: getString(this.model, "colorbar_label"),
    };
  }

  private onPanels(): void {
    mark("headwidget:panels");
    const frames = framesOf(this.model);
    const filled = fillPanels(this.model.get("panels"), frames);
    if (filled.missing.length > 0) {
      // Sent as keys this page does not hold: the kernel sends them whole; the last panels stay.
      this.model.send(pageMessage("missing", { keys: filled.missing }));
      return;
    }
    if (filled.added) reportFrames(this.model, frames);
    const parsed = parsePanels(filled.panels);
    this.panels = parsed.panels;
    this.problems = parsed.problems;
    const s = this.colorScale();
    const cmap = packedColormap(s.colormap);
    // The image canvas of the panel in the same place is reused when the shape is the same.
    const old = this.images;
    this.images = this.panels.map((p, i) =>
      buildImage(this.doc, p, s.vmin, s.vmax, cmap, old[i] ?? null),
    );
    this.panels.forEach((p, i) => {
      if (this.images[i] === null && (p.rows > 16384 || p.cols > 16384)) {
        this.problems.push(
          `panel "${p.id}": ${p.rows}×${p.cols} is too large to draw; downsample it`,
        );
      }
    });
    this.showProblems();
    const texts = this.panels.map((p) =>
      [p.title, p.subtitle, p.note].filter((t) => t).join(" — "),
    );
    const textKey = JSON.stringify([this.panels.map((p) => p.id), texts]);
    if (textKey !== this.textKey) {
      this.textKey = textKey;
      this.textList.replaceChildren(
        ...this.panels.map((p, i) =>
          h(this.doc, "li", { text: texts[i], attrs: { "data-panel-id": p.id } }),
        ),
      );
    }
    this.relayout();
    mark("headwidget:drawn");
    reportDrawn(this.model, this.doc.defaultView, () => this.panels.map((p) => p.key));
  }

  private readCharts(): void {
    const parsed = parseCharts(this.model.get("charts"));
    this.chartList = parsed.charts;
    this.chartProblems = parsed.problems;
  }

  private onCharts(): void {
    this.readCharts();
    this.showProblems();
    this.relayout();
  }

  private showProblems(): void {
    this.messages.setLocalProblems([
      ...this.controlProblems,
      ...this.problems,
      ...this.chartProblems,
    ]);
  }

  private onScale(): void {
    const s = this.colorScale();
    const cmap = packedColormap(s.colormap);
    this.panels.forEach((p, i) => {
      const img = this.images[i];
      if (img) recolorImage(img, p, s.vmin, s.vmax, cmap);
    });
    this.grid.redraw();
    this.drawColorbar();
  }

  private availableWidth(): number {
    return this.observedWidth || this.root.clientWidth || this.el.clientWidth || FALLBACK_WIDTH;
  }

  /** The largest plot side: what fits in the window's height beside the controls and titles. */
  private maxSide(): number {
    const height = this.doc.defaultView?.innerHeight || FALLBACK_HEIGHT;
    return height - VIEWPORT_RESERVE;
  }

  private dpr(): number {
    return this.doc.defaultView?.devicePixelRatio || 1;
  }

  private content(): GridContent {
    const layout = computeLayout(
      this.panels,
      this.availableWidth(),
      getNumber(this.model, "columns"),
      this.measure,
      { maxSide: this.maxSide() },
    );
    return { layout, panels: this.panels, images: this.images };
  }

  /** Recompute the layout and redraw everything. */
  relayout(): void {
    this.lastWidth = this.availableWidth();
    this.lastDpr = this.dpr();
    const content = this.content();
    this.grid.setContent(content, this.lastDpr);
    this.reportPixels(plotPixels(content.layout, this.lastDpr));
    // A view of charts alone (no heatmap) shows no colorbar.
    this.grid.root.hidden = this.panels.length === 0 && this.chartList.length > 0;
    this.charts.setCharts(this.chartList, this.lastWidth, this.measure, this.lastDpr);
    this.drawColorbar();
  }

  /**
   * Tell the kernel how many cells a panel side can show (only when that changed): the largest of
   * the model's views, so that two views of one widget of different sizes agree on one number.
   */
  private reportPixels(pixels: number): void {
    this.pixels = pixels;
    const views = viewsByModel.get(this.model) ?? [this];
    const wanted = Math.max(...views.map((v) => v.pixels));
    if (wanted > 0 && wanted !== getNumber(this.model, "panel_pixels")) {
      commit(this.model, { panel_pixels: wanted });
    }
  }

  private drawColorbar(): void {
    this.grid.drawColorbar(this.colorScale(), this.measure);
  }

  /** Lay out again when the available width or the device pixel ratio (zoom) changes. */
  private onResize(width?: number): void {
    if (width !== undefined) this.observedWidth = Math.floor(width);
    if (this.availableWidth() === this.lastWidth && this.dpr() === this.lastDpr) return;
    this.relayout();
  }

  private observeSize(): void {
    const win = this.doc.defaultView;
    const RO = win?.ResizeObserver;
    if (RO) {
      // The root is a block in the element's content box: its width is the width to fill.
      const ro = new RO((entries) => {
        const entry = entries[entries.length - 1];
        this.onResize(entry ? entry.contentRect.width : undefined);
      });
      ro.observe(this.root);
      this.cleanup.push(() => ro.disconnect());
    } else if (win) {
      const onWindow = () => this.onResize();
      win.addEventListener("resize", onWindow);
      this.cleanup.push(() => win.removeEventListener("resize", onWindow));
    }
  }

  /** The whole figure as a PNG data URL at 2× CSS size, or null without canvas support. */
  exportDataUrl(scale = EXPORT_SCALE): string | null {
    const canvas = renderFigure(
      this.doc,
      this.grid.current,
      this.colorScale(),
      this.measure,
      scale,
      this.charts.current,
    );
    return canvas ? canvas.toDataURL("image/png") : null;
  }

  download(): void {
    const canvas = renderFigure(
      this.doc,
      this.grid.current,
      this.colorScale(),
      this.measure,
      EXPORT_SCALE,
      this.charts.current,
    );
    if (canvas) downloadCanvas(this.doc, canvas);
    else
      this.messages.setLocalProblems([
        ...this.problems,
        "export: this browser cannot draw to a canvas",
      ]);
  }

  private onCustom(msg: unknown): void {
    const exportPng: KernelMessageType = "export_png";
    if (!msg || typeof msg !== "object" || (msg as { type?: unknown }).type !== exportPng) return;
    // Several views of one model all receive the message; the oldest live one answers.
    if (viewsByModel.get(this.model)?.[0] !== this) return;
    try {
      const url = this.exportDataUrl();
      this.model.send(
        pageMessage("png", { data_url: url || null, error: url ? null : "canvas unavailable" }),
      );
    } catch (e) {
      const error = e instanceof Error ? e.message : String(e);
      this.model.send(pageMessage("png", { data_url: null, error }));
    }
  }

  destroy(): void {
    for (const f of this.cleanup.splice(0)) f();
    const views = viewsByModel.get(this.model);
    if (views) {
      const i = views.indexOf(this);
      if (i >= 0) views.splice(i, 1);
    }
    this.controls.destroy();
    this.messages.destroy();
    this.grid.destroy();
    this.charts.destroy();
    this.root.remove();
  }
}
