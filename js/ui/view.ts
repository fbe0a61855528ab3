/**
 * One rendered view of the model: wires traits to the controls, messages,
 * panel grid and export.  Data flows one way: traits -> parsed panels ->
 * coloured images -> layout -> canvases.
 */

import { packedColormap } from "../lib/colormap";
import { computeLayout } from "../lib/layout";
import { type Panel, parsePanels } from "../lib/panels";
import type { Measure } from "../lib/text";
import type { ColorScale } from "./colorbar";
import { Controls } from "./controls";
import { h, makeMeasure } from "./dom";
import { downloadCanvas, EXPORT_SCALE, renderFigure } from "./export_png";
import { Grid, type GridContent } from "./grid";
import { Messages } from "./messages";
import { getNumber, getString, type Model, onChanges } from "./model";
import { buildImage, type Image, recolorImage } from "./panel_canvas";
import { injectStyle } from "./style";

/** Width used before the element is attached and has a size. */
const FALLBACK_WIDTH = 960;

/** Views per model, so that only one of them answers an export request. */
const viewsByModel = new WeakMap<Model, View[]>();

export class View {
  readonly root: HTMLDivElement;
  readonly controls: Controls;
  readonly messages: Messages;
  readonly grid: Grid;
  /** Panel titles, subtitles and notes as text for screen readers. */
  readonly textList: HTMLUListElement;
  private readonly doc: Document;
  private readonly measure: Measure;
  private panels: Panel[] = [];
  private images: (Image | null)[] = [];
  private problems: string[] = [];
  private lastWidth = 0;
  private lastDpr = 1;
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
    this.controls = new Controls(doc, model, () => this.download());
    this.messages = new Messages(doc, model);
    this.grid = new Grid(doc, (p, row, col) =>
      model.send({ type: "click", panel: p.id, row, col }),
    );
    this.textList = h(doc, "ul", { className: "hw-sr" });
    this.root.append(
      this.controls.el,
      this.messages.error,
      this.messages.status,
      this.grid.root,
      this.textList,
    );
    el.appendChild(this.root);

    this.cleanup.push(
      onChanges(model, ["panels"], () => this.onPanels()),
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
    const parsed = parsePanels(this.model.get("panels"));
    this.panels = parsed.panels;
    this.problems = parsed.problems;
    const s = this.colorScale();
    const cmap = packedColormap(s.colormap);
    this.images = this.panels.map((p) => buildImage(this.doc, p, s.vmin, s.vmax, cmap));
    this.panels.forEach((p, i) => {
      if (this.images[i] === null && (p.rows > 16384 || p.cols > 16384)) {
        this.problems.push(
          `panel "${p.id}": ${p.rows}×${p.cols} is too large to draw; downsample it`,
        );
      }
    });
    this.messages.setLocalProblems(this.problems);
    this.textList.replaceChildren(
      ...this.panels.map((p) =>
        h(this.doc, "li", {
          text: [p.title, p.subtitle, p.note].filter((t) => t).join(" — "),
          attrs: { "data-panel-id": p.id },
        }),
      ),
    );
    this.relayout();
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
    return this.el.clientWidth || this.root.clientWidth || FALLBACK_WIDTH;
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
    );
    return { layout, panels: this.panels, images: this.images };
  }

  /** Recompute the layout and redraw everything. */
  relayout(): void {
    this.lastWidth = this.availableWidth();
    this.lastDpr = this.dpr();
    this.grid.setContent(this.content(), this.lastDpr);
    this.drawColorbar();
  }

  private drawColorbar(): void {
    this.grid.drawColorbar(this.colorScale(), this.measure);
  }

  private observeSize(): void {
    const RO = this.doc.defaultView?.ResizeObserver;
    if (!RO) return;
    const ro = new RO(() => {
      const w = this.availableWidth();
      if (w === this.lastWidth && this.dpr() === this.lastDpr) return;
      this.lastWidth = w;
      // Redraw only when the wrap changes or the device pixel ratio does (zoom).
      const next = this.content();
      if (next.layout.columns !== this.grid.layout.columns || this.dpr() !== this.lastDpr) {
        this.lastDpr = this.dpr();
        this.grid.setContent(next, this.lastDpr);
        this.drawColorbar();
      }
    });
    ro.observe(this.el);
    this.cleanup.push(() => ro.disconnect());
  }

  /** The whole figure as a PNG data URL at 2× CSS size, or null without canvas support. */
  exportDataUrl(scale = EXPORT_SCALE): string | null {
    const canvas = renderFigure(
      this.doc,
      this.grid.current,
      this.colorScale(),
      this.measure,
      scale,
    );
    return canvas ? canvas.toDataURL("image/png") : null;
  }

  download(): void {
    const canvas = renderFigure(this.doc, this.grid.current, this.colorScale(), this.measure);
    if (canvas) downloadCanvas(this.doc, canvas);
    else
      this.messages.setLocalProblems([
        ...this.problems,
        "export: this browser cannot draw to a canvas",
      ]);
  }

  private onCustom(msg: unknown): void {
    if (!msg || typeof msg !== "object" || (msg as { type?: unknown }).type !== "export_png")
      return;
    // Several views of one model all receive the message; the oldest live one answers.
    if (viewsByModel.get(this.model)?.[0] !== this) return;
    try {
      const url = this.exportDataUrl();
      this.model.send(
        url
          ? { type: "png", data_url: url }
          : { type: "png", data_url: null, error: "canvas unavailable" },
      );
    } catch (e) {
      this.model.send({
        type: "png",
        data_url: null,
        error: e instanceof Error ? e.message : String(e),
      });
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
    this.root.remove();
  }
}
