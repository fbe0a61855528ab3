/**
 * The figure on screen: colorbar canvas on top, then one heatmap canvas
 * plus one overlay canvas per panel, absolutely placed from the layout.
 * Hover, click and keyboard inspection all go through layout hit-testing;
 * there is no DOM element per cell.  The crosshair lives on the overlay, so
 * hovering never redraws a heatmap, and so do the numbers printed in the
 * cells of a small panel (lib/cells), which take the colour scale's colours.
 * A panel's canvases only grow (its element clips them), so a relayout to
 * smaller panels and back allocates no pixels, and an overlay with nothing
 * on it is left alone.
 */

import { type CellLabel, cellLabels, type LabelScale } from "../lib/cells";
import { axisLabel, groupedCell, hoverJson, namesHeads } from "../lib/format";
import {
  COLORBAR_H,
  cellRect,
  figureSize,
  type GridLayout,
  type Hit,
  headerAt,
  hitTest,
} from "../lib/layout";
import { cellValue, type Panel } from "../lib/panels";
import type { Measure } from "../lib/text";
import { type ColorScale, drawColorbar } from "./colorbar";
import { context2d, growCanvas, h, setText, sizeCanvas } from "./dom";
import { drawCellLabels, drawCrosshair, drawPanel, type Image } from "./panel_canvas";
import { Tooltip } from "./tooltip";

interface PanelView {
  wrap: HTMLDivElement;
  heat: HTMLCanvasElement;
  overlay: HTMLCanvasElement;
  /** Whether the overlay holds a crosshair (an empty overlay is left alone: nothing to redraw). */
  marked: boolean;
  /** Whether the overlay's cell numbers are out of date (new panels or colours). */
  stale: boolean;
  /**
   * Whether the overlay holds no pixels (new, resized, or cleared with nothing drawn): such an overlay
   * is not touched until something is drawn on it, so a relayout allocates no pixels for it.
   */
  blank: boolean;
}

export interface GridContent {
  layout: GridLayout;
  panels: Panel[];
  images: (Image | null)[];
  /** The numbers printed in each panel's cells (filled by the grid; empty: none). */
  labels?: CellLabel[][];
}

export type ClickHandler = (panel: Panel, row: number, col: number) => void;

export class Grid {
  /** Figure root (colorbar + panels); carries data-hover. Its size is the export size. */
  readonly root: HTMLDivElement;
  readonly colorbar: HTMLCanvasElement;
  readonly panelsEl: HTMLDivElement;
  readonly tooltip: Tooltip;
  /** Screen-reader announcement of the inspected cell. */
  readonly live: HTMLDivElement;
  private content: GridContent = {
    layout: { width: 0, height: 0, columns: 0, boxes: [] },
    panels: [],
    images: [],
  };
  private views: PanelView[] = [];
  private hovered: Hit | null = null;
  /** What the colour scale calls the values ("Pearson correlation"), for the tooltip. */
  private valueName = "";
  /** Where the tooltip of the hovered cell points (grid coordinates), to refresh it. */
  private hoverPoint: [number, number] | null = null;
  private dpr = 1;
  /** The colour scale and text measure the cell numbers were made with (null: none yet). */
  private scale: LabelScale | null = null;
  private measure: Measure | null = null;
  private readonly cleanup: (() => void)[] = [];

  constructor(
    private readonly doc: Document,
    private readonly onClick: ClickHandler,
  ) {
    this.colorbar = h(doc, "canvas", {
      className: "hw-colorbar",
      attrs: { "aria-hidden": "true" },
    });
    this.tooltip = new Tooltip(doc);
    this.panelsEl = h(doc, "div", {
      className: "hw-panels",
      attrs: {
        tabindex: "0",
        role: "application",
        "aria-roledescription": "heatmap grid",
        "aria-label":
          "Heatmaps. Arrow keys move between cells, Page Up and Page Down between panels, Enter selects.",
      },
    });
    this.live = h(doc, "div", { className: "hw-sr", attrs: { "aria-live": "polite" } });
    this.root = h(doc, "div", { className: "hw-grid" }, [this.colorbar, this.panelsEl, this.live]);
    this.panelsEl.appendChild(this.tooltip.el);
    this.listen(this.panelsEl, "mousemove", (e) => this.onMouse(e as MouseEvent));
    this.listen(this.panelsEl, "mouseleave", () => this.leave());
    this.listen(this.panelsEl, "click", (e) => this.onMouseClick(e as MouseEvent));
    this.listen(this.panelsEl, "keydown", (e) => this.onKey(e as KeyboardEvent));
    this.listen(this.panelsEl, "blur", () => this.leave());
  }

  private listen(t: EventTarget, type: string, fn: (e: Event) => void): void {
    t.addEventListener(type, fn);
    this.cleanup.push(() => t.removeEventListener(type, fn));
  }

  get layout(): GridLayout {
    return this.content.layout;
  }

  /** What is on screen now (the export draws exactly this). */
  get current(): GridContent {
    return this.content;
  }

  /** Replace layout, panels and images; positions canvases and redraws everything. */
  setContent(content: GridContent, dpr: number): void {
    this.content = content;
    this.dpr = dpr;
    const { layout } = content;
    const size = figureSize(layout);
    this.root.style.width = `${size.w}px`;
    this.root.style.height = `${size.h}px`;
    this.panelsEl.style.width = `${layout.width}px`;
    this.panelsEl.style.height = `${layout.height}px`;
    while (this.views.length > layout.boxes.length) this.views.pop()?.wrap.remove();
    while (this.views.length < layout.boxes.length) {
      const heat = h(this.doc, "canvas", { className: "hw-heatmap" });
      const overlay = h(this.doc, "canvas", { className: "hw-overlay" });
      const wrap = h(this.doc, "div", { className: "hw-panel" }, [heat, overlay]);
      this.panelsEl.insertBefore(wrap, this.tooltip.el);
      this.views.push({ wrap, heat, overlay, marked: false, stale: true, blank: true });
    }
    layout.boxes.forEach((b, i) => {
      const v = this.views[i];
      const p = content.panels[i];
      v.wrap.style.left = `${b.x}px`;
      v.wrap.style.top = `${b.y}px`;
      v.wrap.style.width = `${b.w}px`;
      v.wrap.style.height = `${b.h}px`;
      v.wrap.dataset.panelId = p.id;
      v.wrap.dataset.plotRect = JSON.stringify(b.plot);
      growCanvas(v.heat, b.w, b.h, dpr);
      if (growCanvas(v.overlay, b.w, b.h, dpr)) {
        v.marked = false; // resizing cleared it
        v.blank = true;
      }
    });
    this.updateLabels();
    this.redraw();
    this.refreshHover();
  }

  /**
   * After new content: the tooltip shows the cell now under the point it showed (new value,
   * new panel), or nothing when no cell is there any more.
   */
  private refreshHover(): void {
    const point = this.hoverPoint;
    const hit = point && this.tooltip.visible ? hitTest(this.content.layout, ...point) : null;
    if (point && hit) {
      this.hovered = null; // redraw the crosshair even when the cell index is unchanged
      this.inspect(hit, point[0], point[1], false);
    } else {
      this.hovered = null;
      this.hoverPoint = null;
      this.tooltip.hide();
      this.drawOverlays();
    }
  }

  /** Redraw every heatmap canvas from the cached images. */
  redraw(): void {
    this.content.layout.boxes.forEach((b, i) => {
      const heat = this.views[i].heat;
      const ctx = context2d(heat);
      if (!ctx) return;
      ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
      // (a canvas larger than the panel, from a larger layout before: what lies outside is cleared)
      const [w, h] = [heat.width / this.dpr, heat.height / this.dpr];
      if (w > b.w) ctx.clearRect(b.w, 0, w - b.w, h);
      if (h > b.h) ctx.clearRect(0, b.h, b.w, h - b.h);
      drawPanel(ctx, b, this.content.images[i] ?? null);
    });
  }

  /** The numbers to print in each panel's cells under the current colour scale; overlays redrawn. */
  private updateLabels(): void {
    const { scale, measure } = this;
    const { boxes } = this.content.layout;
    this.content.labels = boxes.map((b, i) => {
      const p = this.content.panels[i];
      return scale && measure && p
        ? cellLabels(b, (r, c) => cellValue(p, r, c), scale, measure)
        : [];
    });
    for (const v of this.views) v.stale = true;
  }

  drawColorbar(scale: ColorScale, measure: Measure): void {
    this.valueName = scale.label; // the tooltip names a cell's value as the colour scale does
    const changed =
      this.measure !== measure ||
      !this.scale ||
      this.scale.vmin !== scale.vmin ||
      this.scale.vmax !== scale.vmax ||
      this.scale.colormap !== scale.colormap;
    if (changed) {
      this.scale = { vmin: scale.vmin, vmax: scale.vmax, colormap: scale.colormap };
      this.measure = measure;
      this.updateLabels();
      this.drawOverlays();
    }
    const w = figureSize(this.content.layout).w;
    const hgt = COLORBAR_H;
    sizeCanvas(this.colorbar, w, hgt, this.dpr);
    const ctx = context2d(this.colorbar);
    if (!ctx) return;
    ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
    drawColorbar(ctx, w, hgt, scale, measure);
  }

  /** Cell numbers and the crosshair on the overlays; only overlays that change are touched. */
  private drawOverlays(): void {
    this.views.forEach((v, i) => {
      const hit = this.hovered && this.hovered.index === i ? this.hovered : null;
      if (!hit && !v.marked && !v.stale) return;
      const labels = this.content.labels?.[i] ?? [];
      v.overlay.dataset.cellLabels = String(labels.length);
      v.stale = false;
      if (!hit && labels.length === 0 && v.blank) return;
      const ctx = context2d(v.overlay);
      if (!ctx) return;
      ctx.setTransform(1, 0, 0, 1, 0, 0);
      ctx.clearRect(0, 0, v.overlay.width, v.overlay.height);
      ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
      drawCellLabels(ctx, labels);
      v.marked = hit !== null;
      v.blank = !hit && labels.length === 0;
      if (hit) drawCrosshair(ctx, this.content.layout.boxes[i], hit.row, hit.col);
    });
  }

  private point(e: MouseEvent): [number, number] {
    const r = this.panelsEl.getBoundingClientRect();
    return [e.clientX - r.left, e.clientY - r.top];
  }

  private onMouse(e: MouseEvent): void {
    const [x, y] = this.point(e);
    const hit = hitTest(this.content.layout, x, y);
    if (hit) {
      this.inspect(hit, x, y, false);
      return;
    }
    this.leave();
    const header = headerAt(this.content.layout, x, y);
    const box = header === null ? null : this.content.layout.boxes[header];
    const p = header === null ? null : this.content.panels[header];
    if (box?.headerCut && p) {
      // A title or subtitle cut to the panel's width: the whole text, where it was cut.
      const lines = p.subtitle ? [p.subtitle] : [];
      const content = { title: p.title, row: "", col: "", value: Number.NaN, lines };
      this.tooltip.show(content, x, y, this.content.layout.width, this.content.layout.height);
    }
  }

  private onMouseClick(e: MouseEvent): void {
    const [x, y] = this.point(e);
    const hit = hitTest(this.content.layout, x, y);
    if (hit) this.onClick(this.content.panels[hit.index], hit.row, hit.col);
  }

  /** Show crosshair, tooltip and data-hover for a cell; (x, y) is where the tooltip goes. */
  inspect(hit: Hit, x: number, y: number, announce: boolean): void {
    const p = this.content.panels[hit.index];
    if (!p) return;
    const prev = this.hovered;
    this.hovered = hit;
    if (!prev || prev.index !== hit.index || prev.row !== hit.row || prev.col !== hit.col) {
      this.drawOverlays();
    }
    this.hoverPoint = [x, y];
    const value = cellValue(p, hit.row, hit.col);
    const content = {
      title: p.title,
      row: axisLabel(p.row_labels, p.row_offset, p.row_step, hit.row),
      col: axisLabel(p.col_labels, p.col_offset, p.col_step, hit.col),
      value,
      rowName: p.row_axis,
      colName: p.col_axis,
      valueName: this.valueName,
      cell: namesHeads(p) ? groupedCell(p, hit.row, hit.col, value) : undefined,
    };
    this.tooltip.show(content, x, y, this.content.layout.width, this.content.layout.height);
    this.root.dataset.hover = hoverJson(p.id, hit.row, hit.col, value);
    if (announce) setText(this.live, Tooltip.lines(content).join(", "));
  }

  /** Hide tooltip and crosshair (data-hover keeps the last cell). */
  leave(): void {
    this.tooltip.hide();
    this.hoverPoint = null;
    if (this.hovered) {
      this.hovered = null;
      this.drawOverlays();
    }
  }

  private onKey(e: KeyboardEvent): void {
    const boxes = this.content.layout.boxes;
    if (boxes.length === 0) return;
    const cur = this.hovered ?? { index: 0, row: 0, col: 0 };
    let { index, row, col } = cur;
    const b = () => boxes[index];
    switch (e.key) {
      case "ArrowLeft":
        col -= 1;
        break;
      case "ArrowRight":
        col += 1;
        break;
      case "ArrowUp":
        row -= 1;
        break;
      case "ArrowDown":
        row += 1;
        break;
      case "PageDown":
        index = Math.min(boxes.length - 1, index + 1);
        break;
      case "PageUp":
        index = Math.max(0, index - 1);
        break;
      case "Enter":
      case " ":
        if (this.hovered) this.onClick(this.content.panels[index], row, col);
        e.preventDefault();
        return;
      case "Escape":
        this.leave();
        return;
      default:
        return;
    }
    e.preventDefault();
    row = Math.max(0, Math.min(b().rows - 1, row));
    col = Math.max(0, Math.min(b().cols - 1, col));
    const hit = { index, row, col };
    const r = cellRect(b(), row, col);
    this.inspect(hit, b().x + r.x + r.w / 2, b().y + r.y + r.h / 2, true);
  }

  destroy(): void {
    for (const f of this.cleanup.splice(0)) f();
    this.root.remove();
  }
}
