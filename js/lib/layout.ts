/**
 * Geometry of the panel grid (CSS px) and hit-testing.  Pure: text widths
 * come from an injected Measure.
 *
 * A panel box, top to bottom: title, optional subtitle, the plot with row
 * tick labels on its left and column tick labels below, then the note.
 * Boxes are placed row-major in a grid whose column count is `columns`, or
 * as many as fit in the available width when `columns` is 0.
 */

import type { PanelSpec } from "./panels";
import { fitText, font, type Measure, wrapText } from "./text";
import { axisTicks, type Tick } from "./ticks";

export interface Rect {
  x: number;
  y: number;
  w: number;
  h: number;
}

export const FONTS = {
  title: font(12, "600"),
  subtitle: font(11),
  tick: font(10),
  note: font(10, "400", "italic"),
};

export const PLOT_MAX = 320; // largest plot side
export const PLOT_MIN_SIDE = 96; // a very thin matrix is stretched up to this
export const MAX_STRETCH_CELL = 24; // ... but cells are not stretched beyond this
export const PAD = 6;
export const TITLE_H = 16;
export const SUBTITLE_H = 14;
export const HEADER_GAP = 4;
export const TICK_LEN = 3;
export const TICK_GAP = 2;
export const COL_LABEL_H = 13;
export const NOTE_LINE_H = 13;
export const MIN_INNER_W = 150;
export const GRID_GAP = 12;

export type LayoutPanel = Pick<
  PanelSpec,
  | "rows"
  | "cols"
  | "title"
  | "subtitle"
  | "note"
  | "row_labels"
  | "col_labels"
  | "row_offset"
  | "col_offset"
  | "row_step"
  | "col_step"
>;

export interface PanelBox extends Rect {
  rows: number;
  cols: number;
  plot: Rect; // relative to the box
  title: string; // fitted to the box
  subtitle: string;
  titleY: number; // baselines, relative to the box
  subtitleY: number;
  rowTicks: Tick[];
  colTicks: Tick[];
  noteLines: string[];
  noteY: number; // baseline of the first note line
}

export interface GridLayout {
  width: number;
  height: number;
  columns: number;
  boxes: PanelBox[];
}

/** Plot size: square cells fitting PLOT_MAX, thin matrices stretched a little. */
export function plotSize(rows: number, cols: number): { w: number; h: number } {
  const s = Math.min(PLOT_MAX / rows, PLOT_MAX / cols);
  const side = (n: number) =>
    Math.round(Math.max(n * s, Math.min(PLOT_MIN_SIDE, n * MAX_STRETCH_CELL, PLOT_MAX)));
  return { w: side(cols), h: side(rows) };
}

/** Layout of one box at the origin. */
export function layoutPanel(p: LayoutPanel, measure: Measure): PanelBox {
  const { w: pw, h: ph } = plotSize(p.rows, p.cols);
  const rowAxis = { n: p.rows, labels: p.row_labels, offset: p.row_offset, step: p.row_step };
  const colAxis = { n: p.cols, labels: p.col_labels, offset: p.col_offset, step: p.col_step };
  const rowTicks = axisTicks(rowAxis, ph, "row", measure, FONTS.tick);
  const colTicks = axisTicks(colAxis, pw, "col", measure, FONTS.tick);
  const rowLabelW = Math.max(0, ...rowTicks.map((t) => measure(t.label, FONTS.tick)));
  const left = Math.ceil(rowLabelW) + TICK_LEN + TICK_GAP;
  let right = 0;
  for (const t of colTicks) {
    const overhang = measure(t.label, FONTS.tick) / 2 - (pw - (t.pos * pw) / p.cols);
    right = Math.max(right, Math.ceil(overhang));
  }
  const inner = Math.max(MIN_INNER_W, left + pw + right);
  let y = PAD;
  const titleY = y + 12;
  y += TITLE_H;
  const subtitleY = y + 11;
  if (p.subtitle) y += SUBTITLE_H;
  y += HEADER_GAP;
  const plot: Rect = { x: PAD + left, y, w: pw, h: ph };
  y += ph + TICK_LEN + TICK_GAP + COL_LABEL_H;
  const noteLines = p.note ? wrapText(p.note, inner, FONTS.note, measure) : [];
  const noteY = y + 10;
  y += noteLines.length * NOTE_LINE_H + PAD;
  return {
    x: 0,
    y: 0,
    w: PAD + inner + PAD,
    h: y,
    rows: p.rows,
    cols: p.cols,
    plot,
    title: fitText(p.title, inner, FONTS.title, measure),
    subtitle: fitText(p.subtitle, inner, FONTS.subtitle, measure),
    titleY,
    subtitleY,
    rowTicks,
    colTicks,
    noteLines,
    noteY,
  };
}

/** Number of grid columns: `columns` if > 0, else as many as fit (at least 1). */
export function columnCount(n: number, colW: number, available: number, columns: number): number {
  if (n === 0) return 0;
  if (columns > 0) return Math.min(Math.floor(columns), n);
  const fit = Math.floor((available + GRID_GAP) / (colW + GRID_GAP));
  return Math.max(1, Math.min(fit, n));
}

export function computeLayout(
  panels: readonly LayoutPanel[],
  availableWidth: number,
  columns: number,
  measure: Measure,
): GridLayout {
  const boxes = panels.map((p) => layoutPanel(p, measure));
  const colW = Math.max(0, ...boxes.map((b) => b.w));
  const ncols = columnCount(boxes.length, colW, availableWidth, columns);
  let top = 0;
  let height = 0;
  for (let start = 0; start < boxes.length; start += ncols) {
    const row = boxes.slice(start, start + ncols);
    row.forEach((b, c) => {
      b.x = c * (colW + GRID_GAP);
      b.y = top;
    });
    const rowH = Math.max(...row.map((b) => b.h));
    height = top + rowH;
    top = height + GRID_GAP;
  }
  const width = ncols > 0 ? ncols * colW + (ncols - 1) * GRID_GAP : 0;
  return { width, height, columns: ncols, boxes };
}

/** Position of the k-th cell edge (k = 0..n) along a plot side starting at `start`. */
export function cellEdge(start: number, length: number, n: number, k: number): number {
  return start + (k * length) / n;
}

/** Index of the cell containing coordinate v (start <= v < start + length), else -1. */
export function cellIndex(v: number, start: number, length: number, n: number): number {
  if (!(v >= start && v < start + length)) return -1;
  let k = Math.min(n - 1, Math.max(0, Math.floor(((v - start) * n) / length)));
  // Snap to the same edges the drawing uses, whatever the rounding above did.
  while (k < n - 1 && cellEdge(start, length, n, k + 1) <= v) k++;
  while (k > 0 && cellEdge(start, length, n, k) > v) k--;
  return k;
}

export interface Hit {
  index: number; // panel index
  row: number;
  col: number;
}

/** The cell under grid point (x, y), or null outside every plot. */
export function hitTest(layout: GridLayout, x: number, y: number): Hit | null {
  for (let index = 0; index < layout.boxes.length; index++) {
    const b = layout.boxes[index];
    const px = b.x + b.plot.x;
    const py = b.y + b.plot.y;
    const col = cellIndex(x, px, b.plot.w, b.cols);
    const row = cellIndex(y, py, b.plot.h, b.rows);
    if (row >= 0 && col >= 0) return { index, row, col };
  }
  return null;
}

/** Rectangle of cell (row, col) of a box, relative to the box. */
export function cellRect(b: PanelBox, row: number, col: number): Rect {
  const x0 = cellEdge(b.plot.x, b.plot.w, b.cols, col);
  const x1 = cellEdge(b.plot.x, b.plot.w, b.cols, col + 1);
  const y0 = cellEdge(b.plot.y, b.plot.h, b.rows, row);
  const y1 = cellEdge(b.plot.y, b.plot.h, b.rows, row + 1);
  return { x: x0, y: y0, w: x1 - x0, h: y1 - y0 };
}

/** Height of the colorbar strip above the grid, and its minimum width. */
export const COLORBAR_H = 52;
export const COLORBAR_W = 380;

/** Size of the whole figure (colorbar strip + grid), which is also the export size in CSS px. */
export function figureSize(grid: GridLayout): { w: number; h: number } {
  return { w: Math.max(grid.width, COLORBAR_W), h: COLORBAR_H + grid.height };
}
