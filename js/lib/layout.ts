/**
 * Geometry of the panel grid (CSS px) and hit-testing.  Pure: text widths
 * come from an injected Measure.
 *
 * A panel box, top to bottom: title, optional subtitle, the plot with row
 * tick labels on its left and column tick labels below, then the note.
 *
 * Panels fill the available width.  A grid row holds `columns` panels (all
 * of them when `columns` is 0) and always starts a new line; when a row's
 * panels do not fit side by side with plots of at least their `fitSide` (
 * PLOT_MIN_FIT px, or FIT_CELL px a cell for a matrix of few cells) it wraps
 * onto as many lines as needed, like text.  Each plot then grows into
 * its column: up to GROW_CELL px per cell, never below PLOT_BASE when there
 * is room for it, never above `maxSide` (the caller passes what the screen
 * shows, so that a plot fits in view).
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

export const PLOT_BASE = 320; // plot side of a small matrix when there is room
export const PLOT_MIN_FIT = 220; // panels wrap onto a new line rather than shrink below this
export const FIT_CELL = 5; // ... or below this many px a cell, for a matrix of fewer than 44 cells a side
export const FIT_SMALL = 140; // ... and never below this
export const PLOT_FLOOR = 64; // smallest plot, in a container narrower than one panel
export const GROW_CELL = 16; // a plot grows beyond PLOT_BASE up to this many px per cell
export const PLOT_MIN_SIDE = 96; // a very thin matrix is stretched up to this
export const MAX_STRETCH_CELL = 24; // ... but cells are not stretched beyond this
export const MIN_GROUP_PX = 4; // head boundaries closer than this are not drawn
export const PAD = 6;
export const TITLE_H = 16;
export const SUBTITLE_H = 14;
export const HEADER_GAP = 4;
export const TICK_LEN = 3;
export const TICK_GAP = 2;
export const COL_LABEL_H = 13;
export const NOTE_LINE_H = 13;
export const MIN_INNER_W = 150;
/** The room an axis title takes: a line of tick-sized text. */
export const AXIS_TITLE_H = 14;
/** Most lines a panel's subtitle and its note wrap to (cut short of that only past it). */
export const SUBTITLE_LINES = 6;
export const NOTE_LINES = 10;
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
> &
  Partial<
    Pick<
      PanelSpec,
      | "row_group"
      | "col_group"
      | "hint"
      | "axis_titles"
      | "row_axis"
      | "col_axis"
      | "mark_row"
      | "mark_col"
    >
  >;

export interface PanelBox extends Rect {
  rows: number;
  cols: number;
  plot: Rect; // relative to the box
  title: string; // fitted to the box
  subtitleLines: string[]; // wrapped to the box, at most two
  /** Whether the title or the subtitle lost words to the box's width (hover shows them whole). */
  headerCut: boolean;
  titleY: number; // baselines, relative to the box
  subtitleY: number;
  rowTicks: Tick[];
  colTicks: Tick[];
  /** Head boundaries in cell units from the plot's top / left edge (0 < pos < rows / cols). */
  rowEdges: number[];
  colEdges: number[];
  noteLines: string[];
  noteY: number; // baseline of the first note line
  /** The axes' titles (empty: none): the rows' drawn rotated left of their labels, the columns'
   * under their labels, both centred on the plot. */
  rowTitle: string;
  colTitle: string;
  /** The displayed row / column outlined (the selected layer); -1: none. */
  markRow: number;
  markCol: number;
}

export interface GridLayout {
  width: number;
  height: number;
  /** Panels per line (the widest line). */
  columns: number;
  boxes: PanelBox[];
}

export interface LayoutOptions {
  /** Largest plot side (e.g. what fits in the window's height); at least PLOT_BASE is allowed. */
  maxSide?: number;
}

/** Plot size with square cells and longest side `side`; thin matrices stretched a little. */
export function plotSize(rows: number, cols: number, side = PLOT_BASE): { w: number; h: number } {
  const s = Math.min(side / rows, side / cols);
  const stretch = (n: number) =>
    Math.round(Math.max(n * s, Math.min(PLOT_MIN_SIDE, n * MAX_STRETCH_CELL, side)));
  return { w: stretch(cols), h: stretch(rows) };
}

/** Longest plot side a panel asks for when space is no limit. */
export function wantedSide(rows: number, cols: number): number {
  return Math.max(PLOT_BASE, Math.max(rows, cols) * GROW_CELL);
}

/**
 * The smallest plot side a panel keeps before its row wraps: PLOT_MIN_FIT,
 * or FIT_CELL px a cell (at least FIT_SMALL) for a small matrix, whose
 * cells stay legible smaller (a 30-layer matrix and two 3-head panels share
 * a 730 px notebook cell on one line).
 */
export function fitSide(rows: number, cols: number): number {
  return Math.min(PLOT_MIN_FIT, Math.max(FIT_SMALL, Math.max(rows, cols) * FIT_CELL));
}

/**
 * Head boundaries of an axis in cell units: original index c (a multiple of `group`) lies
 * at (c - offset) / step.  Empty without heads, or when neighbours would be closer than
 * MIN_GROUP_PX on a side of `lengthPx`.
 */
export function groupEdges(
  n: number,
  offset: number,
  step: number,
  group: number,
  lengthPx: number,
): number[] {
  if (!(group > 0) || n < 1 || (lengthPx * group) / (n * step) < MIN_GROUP_PX) return [];
  const out: number[] = [];
  const end = offset + n * step;
  for (let c = (Math.floor(offset / group) + 1) * group; c < end; c += group) {
    out.push((c - offset) / step);
  }
  return out;
}

/** Layout of one box at the origin, its plot's longest side `side`. */
export function layoutPanel(p: LayoutPanel, measure: Measure, side = PLOT_BASE): PanelBox {
  const { w: pw, h: ph } = plotSize(p.rows, p.cols, side);
  const rowAxis = { n: p.rows, labels: p.row_labels, offset: p.row_offset, step: p.row_step };
  const colAxis = { n: p.cols, labels: p.col_labels, offset: p.col_offset, step: p.col_step };
  const rowTicks = axisTicks(rowAxis, ph, "row", measure, FONTS.tick);
  const colTicks = axisTicks(colAxis, pw, "col", measure, FONTS.tick);
  const rowTitle = p.axis_titles ? (p.row_axis ?? "") : "";
  const colTitle = p.axis_titles ? (p.col_axis ?? "") : "";
  const rowLabelW = Math.max(0, ...rowTicks.map((t) => measure(t.label, FONTS.tick)));
  const left = Math.ceil(rowLabelW) + TICK_LEN + TICK_GAP + (rowTitle ? AXIS_TITLE_H : 0);
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
  // A long subtitle (a mechanism's bytes, rank and errors with their basis) wraps onto more lines
  // rather than losing its end.
  const subtitleLines = p.subtitle
    ? wrapText(p.subtitle, inner, FONTS.subtitle, measure, SUBTITLE_LINES)
    : [];
  y += subtitleLines.length * SUBTITLE_H;
  y += HEADER_GAP;
  const plot: Rect = { x: PAD + left, y, w: pw, h: ph };
  y += ph + TICK_LEN + TICK_GAP + COL_LABEL_H + (colTitle ? AXIS_TITLE_H : 0);
  const note = [p.note, p.hint ?? ""].filter((t) => t).join(" · ");
  const noteLines = note ? wrapText(note, inner, FONTS.note, measure, NOTE_LINES) : [];
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
    subtitleLines,
    headerCut:
      fitText(p.title, inner, FONTS.title, measure) !== p.title ||
      !sameWords(subtitleLines, p.subtitle),
    titleY,
    subtitleY,
    rowTicks,
    colTicks,
    rowEdges: groupEdges(p.rows, p.row_offset, p.row_step, p.row_group ?? 0, ph),
    colEdges: groupEdges(p.cols, p.col_offset, p.col_step, p.col_group ?? 0, pw),
    noteLines,
    noteY,
    rowTitle,
    colTitle,
    markRow: p.mark_row ?? -1,
    markCol: p.mark_col ?? -1,
  };
}

/**
 * The largest plot side (at most `limit`, at least PLOT_FLOOR) whose box fits in `width`,
 * with that box.  Tick labels hardly change with the side, so shrinking the plot by the
 * overflow settles in a pass or two.
 */
export function fitPanel(
  p: LayoutPanel,
  measure: Measure,
  width: number,
  limit: number,
): { side: number; box: PanelBox } {
  let side = Math.max(PLOT_FLOOR, Math.floor(limit));
  let box = layoutPanel(p, measure, side);
  for (let pass = 0; pass < 6 && box.w > width && side > PLOT_FLOOR; pass++) {
    const target = box.plot.w - (box.w - width); // the plot width that would fit
    const next = target > 0 ? Math.floor((side * target) / box.plot.w) : PLOT_FLOOR;
    side = Math.max(PLOT_FLOOR, Math.min(side - 1, next));
    box = layoutPanel(p, measure, side);
  }
  return { side, box };
}

/** Panels per grid row: `columns` when > 0 (at most n), else all of them. */
export function rowLength(n: number, columns: number): number {
  if (n === 0) return 0;
  return columns > 0 ? Math.min(Math.floor(columns), n) : n;
}

/** Width of one of k columns sharing `available` px with GRID_GAP between them. */
export function columnWidth(available: number, k: number): number {
  return Math.floor((available - (k - 1) * GRID_GAP) / k);
}

export function computeLayout(
  panels: readonly LayoutPanel[],
  availableWidth: number,
  columns: number,
  measure: Measure,
  options: LayoutOptions = {},
): GridLayout {
  const n = panels.length;
  if (n === 0) return { width: 0, height: 0, columns: 0, boxes: [] };
  const maxSide = Math.max(PLOT_BASE, options.maxSide ?? Infinity);
  const perRow = rowLength(n, columns);
  const limits = panels.map((p) => Math.min(wantedSide(p.rows, p.cols), maxSide));
  // The most panels per line whose plots all keep their fitSide (or what they ask for).
  const least = panels.map((p, i) => Math.min(fitSide(p.rows, p.cols), limits[i]));
  let k = perRow;
  let fitted = panels.map((p, i) =>
    fitPanel(p, measure, columnWidth(availableWidth, k), limits[i]),
  );
  while (k > 1 && fitted.some((f, i) => f.side < least[i])) {
    k--;
    const colW = columnWidth(availableWidth, k);
    fitted = panels.map((p, i) => fitPanel(p, measure, colW, limits[i]));
  }
  const boxes = fitted.map((f) => f.box);
  const colW = Math.max(0, ...boxes.map((b) => b.w));
  let top = 0;
  let height = 0;
  for (let rowStart = 0; rowStart < n; rowStart += perRow) {
    const rowEnd = Math.min(n, rowStart + perRow);
    for (let start = rowStart; start < rowEnd; start += k) {
      const line = boxes.slice(start, Math.min(rowEnd, start + k));
      line.forEach((b, c) => {
        b.x = c * (colW + GRID_GAP);
        b.y = top;
      });
      height = top + Math.max(...line.map((b) => b.h));
      top = height + GRID_GAP;
    }
  }
  return { width: k * colW + (k - 1) * GRID_GAP, height, columns: k, boxes };
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
/** Whether wrapped lines hold every word of `text` as it is (nothing cut or elided). */
function sameWords(lines: readonly string[], text: string): boolean {
  const words = (t: string) => t.split(/\s+/).filter((w) => w.length > 0);
  return words(lines.join(" ")).join(" ") === words(text).join(" ");
}

/**
 * The box whose title and subtitle lie at (x, y) (grid coordinates), or null:
 * the header above a plot, where hovering shows a cut title or subtitle whole.
 */
export function headerAt(layout: GridLayout, x: number, y: number): number | null {
  for (let index = 0; index < layout.boxes.length; index++) {
    const b = layout.boxes[index];
    if (x >= b.x && x < b.x + b.w && y >= b.y && y < b.y + b.plot.y) return index;
  }
  return null;
}

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

/**
 * The longest plot side of a layout in device pixels (0 without panels): what the page tells the
 * kernel, which then sends no more cells per panel side than that.
 */
export function plotPixels(layout: GridLayout, dpr: number): number {
  let side = 0;
  for (const b of layout.boxes) side = Math.max(side, b.plot.w, b.plot.h);
  return side > 0 ? Math.ceil(side * (dpr > 0 ? dpr : 1)) : 0;
}

/** Height of the colorbar strip above the grid, and its minimum width. */
export const COLORBAR_H = 52;
export const COLORBAR_W = 380;

/** Size of the whole figure (colorbar strip + grid), which is also the export size in CSS px. */
export function figureSize(grid: GridLayout): { w: number; h: number } {
  return { w: Math.max(grid.width, COLORBAR_W), h: COLORBAR_H + grid.height };
}
