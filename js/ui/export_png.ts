/**
 * PNG export of the whole figure (colorbar strip + every panel with titles,
 * ticks and notes), re-drawn into an offscreen canvas at 2× the CSS size
 * rather than screenshotting the DOM.
 */

import { COLORBAR_H, figureSize } from "../lib/layout";
import type { Measure } from "../lib/text";
import { drawChart } from "./chart_canvas";
import type { ChartContent } from "./charts";
import { type ColorScale, drawColorbar } from "./colorbar";
import { context2d } from "./dom";
import type { GridContent } from "./grid";
import { drawCellLabels, drawPanel } from "./panel_canvas";

export const EXPORT_SCALE = 2;
export const EXPORT_FILENAME = "headwidget.png";
/** Canvas limits that hold in Chrome, Firefox and Safari. */
export const MAX_CANVAS_SIDE = 16384;
export const MAX_CANVAS_AREA = 16384 * 16384 * 0.25;

/** Scale for a w×h CSS px figure: `wanted`, reduced only if the canvas would be too large. */
export function exportScale(w: number, h: number, wanted = EXPORT_SCALE): number {
  if (w <= 0 || h <= 0) return wanted;
  const bySide = Math.min(MAX_CANVAS_SIDE / w, MAX_CANVAS_SIDE / h);
  const byArea = Math.sqrt(MAX_CANVAS_AREA / (w * h));
  return Math.min(wanted, bySide, byArea);
}

/** Gap between the charts and the heatmaps below them, in CSS px. */
const CHARTS_GAP = 8;

/** Draw the figure (charts, then colorbar and panels) into a new canvas; null without canvas support. */
export function renderFigure(
  doc: Document,
  content: GridContent,
  scale: ColorScale,
  measure: Measure,
  wanted = EXPORT_SCALE,
  charts: ChartContent | null = null,
): HTMLCanvasElement | null {
  const heat = content.layout.boxes.length > 0 || !charts || charts.charts.length === 0;
  const grid = heat ? figureSize(content.layout) : { w: 0, h: 0 };
  const top = charts?.charts.length ? charts.h + (heat ? CHARTS_GAP : 0) : 0;
  const size = { w: Math.max(grid.w, charts ? charts.w : 0), h: top + grid.h };
  const k = exportScale(size.w, size.h, wanted);
  const canvas = doc.createElement("canvas");
  canvas.width = Math.round(size.w * k);
  canvas.height = Math.round(size.h * k);
  const ctx = context2d(canvas);
  if (!ctx) return null;
  ctx.setTransform(k, 0, 0, k, 0, 0);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, size.w, size.h);
  charts?.boxes.forEach((b, i) => {
    ctx.setTransform(k, 0, 0, k, k * b.x, k * b.y);
    drawChart(ctx, b, charts.charts[i]);
  });
  if (!heat) return canvas;
  if (top > 0) ctx.setTransform(k, 0, 0, k, 0, k * top);
  drawColorbar(ctx, grid.w, COLORBAR_H, scale, measure);
  content.layout.boxes.forEach((b, i) => {
    ctx.setTransform(k, 0, 0, k, k * b.x, k * (top + COLORBAR_H + b.y));
    drawPanel(ctx, b, content.images[i] ?? null);
    drawCellLabels(ctx, content.labels?.[i] ?? []);
  });
  return canvas;
}

/** Start a browser download of the canvas as headwidget.png. */
export function downloadCanvas(doc: Document, canvas: HTMLCanvasElement): void {
  const save = (href: string, revoke: boolean) => {
    const a = doc.createElement("a");
    a.href = href;
    a.download = EXPORT_FILENAME;
    a.style.display = "none";
    doc.body.appendChild(a);
    a.click();
    a.remove();
    if (revoke) setTimeout(() => URL.revokeObjectURL(href), 30_000);
  };
  if (typeof canvas.toBlob === "function" && typeof URL.createObjectURL === "function") {
    canvas.toBlob((blob) => {
      if (blob) save(URL.createObjectURL(blob), true);
      else save(canvas.toDataURL("image/png"), false);
    }, "image/png");
  } else {
    save(canvas.toDataURL("image/png"), false);
  }
}
