/**
 * Canvas drawing of one panel.  The matrix is coloured once per data or
 * scale change into a native-resolution canvas (one pixel per cell); every
 * redraw then scales that image with smoothing off.  A new matrix of the
 * same shape is coloured into the canvas and pixel buffer it replaces, so a
 * slider step allocates nothing.  Text is drawn with fillText, so titles
 * and labels are never parsed as markup.
 *
 * drawPanel works in CSS px with the box origin at (0, 0); the caller sets
 * the transform (device pixel ratio on screen, 2× for export).
 */

import { CELL_FONT, type CellLabel } from "../lib/cells";
import { colorizeWire, type PackedColormap } from "../lib/colormap";
import {
  COL_LABEL_H,
  cellRect,
  FONTS,
  NOTE_LINE_H,
  PAD,
  type PanelBox,
  type Rect,
  SUBTITLE_H,
  TICK_GAP,
  TICK_LEN,
} from "../lib/layout";
import type { Panel } from "../lib/panels";
import { context2d } from "./dom";

export const TEXT_COLOR = "#1f1f1f";
export const MUTED_COLOR = "#5f5f5f";
export const FRAME_COLOR = "#444";
/** Head boundaries: a thin translucent dark line, so the cells stay readable through it. */
export const GROUP_LINE_COLOR = "rgba(0, 0, 0, 0.4)";

/** Largest matrix side a canvas can hold in all major browsers. */
export const MAX_IMAGE_SIDE = 16384;

export type Image = HTMLCanvasElement;

/** The pixel buffer of each image canvas, kept for the next colouring of the same shape. */
const pixelBuffers = new WeakMap<HTMLCanvasElement, ImageData>();

/** Colour the panel's cells into its image canvas (of the panel's shape); false without a canvas. */
function paint(
  image: Image,
  panel: Panel,
  vmin: number,
  vmax: number,
  cmap: PackedColormap,
): boolean {
  const ctx = context2d(image);
  if (!ctx) return false;
  let img = pixelBuffers.get(image);
  if (!img || img.width !== panel.cols || img.height !== panel.rows) {
    img = ctx.createImageData(panel.cols, panel.rows);
    pixelBuffers.set(image, img);
  }
  colorizeWire(panel.raw, vmin, vmax, cmap, new Uint32Array(img.data.buffer));
  ctx.putImageData(img, 0, 0);
  return true;
}

/**
 * Colour a panel into a cols×rows canvas: `reuse` when it has that shape (its pixels are
 * replaced), else a new one; null without canvas support or for a matrix too large to draw.
 */
export function buildImage(
  doc: Document,
  panel: Panel,
  vmin: number,
  vmax: number,
  cmap: PackedColormap,
  reuse: Image | null = null,
): Image | null {
  if (panel.rows > MAX_IMAGE_SIDE || panel.cols > MAX_IMAGE_SIDE) return null;
  let c = reuse;
  if (!c || c.width !== panel.cols || c.height !== panel.rows) {
    c = doc.createElement("canvas");
    c.width = panel.cols;
    c.height = panel.rows;
  }
  return paint(c, panel, vmin, vmax, cmap) ? c : null;
}

/** Re-colour an existing image in place (same dimensions). */
export function recolorImage(
  image: Image,
  panel: Panel,
  vmin: number,
  vmax: number,
  cmap: PackedColormap,
): void {
  paint(image, panel, vmin, vmax, cmap);
}

/**
 * Head boundaries over the plot: one line of about one CSS px per boundary, on whole device
 * pixels (read from the transform the caller set) so that it stays sharp.
 */
export function drawGroupLines(ctx: CanvasRenderingContext2D, box: PanelBox): void {
  if (box.rowEdges.length === 0 && box.colEdges.length === 0) return;
  const { plot } = box;
  const k = ctx.getTransform().a || 1; // device px per CSS px
  const lineDev = Math.max(1, Math.round(k));
  const lw = lineDev / k;
  const snap = (v: number) => (Math.round(v * k) - Math.floor(lineDev / 2)) / k;
  ctx.fillStyle = GROUP_LINE_COLOR;
  for (const e of box.colEdges) {
    ctx.fillRect(snap(plot.x + (e * plot.w) / box.cols), plot.y, lw, plot.h);
  }
  for (const e of box.rowEdges) {
    ctx.fillRect(plot.x, snap(plot.y + (e * plot.h) / box.rows), plot.w, lw);
  }
}

export function drawPanel(ctx: CanvasRenderingContext2D, box: PanelBox, image: Image | null): void {
  const { plot } = box;
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, box.w, box.h);

  ctx.textBaseline = "alphabetic";
  ctx.textAlign = "left";
  ctx.fillStyle = TEXT_COLOR;
  ctx.font = FONTS.title;
  ctx.fillText(box.title, PAD, box.titleY);
  ctx.fillStyle = MUTED_COLOR;
  ctx.font = FONTS.subtitle;
  box.subtitleLines.forEach((line, i) => {
    ctx.fillText(line, PAD, box.subtitleY + i * SUBTITLE_H);
  });

  if (image) {
    ctx.imageSmoothingEnabled = false;
    ctx.drawImage(image, plot.x, plot.y, plot.w, plot.h);
  } else {
    ctx.fillStyle = "#eee";
    ctx.fillRect(plot.x, plot.y, plot.w, plot.h);
  }
  drawGroupLines(ctx, box);
  ctx.strokeStyle = FRAME_COLOR;
  ctx.lineWidth = 1;
  ctx.strokeRect(plot.x - 0.5, plot.y - 0.5, plot.w + 1, plot.h + 1);
  drawMarks(ctx, box);

  ctx.fillStyle = TEXT_COLOR;
  ctx.font = FONTS.tick;
  ctx.beginPath();
  const cellH = plot.h / box.rows;
  const cellW = plot.w / box.cols;
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const t of box.rowTicks) {
    const y = plot.y + t.pos * cellH;
    ctx.moveTo(plot.x - 1 - TICK_LEN, y);
    ctx.lineTo(plot.x - 1, y);
    ctx.fillText(t.label, plot.x - 1 - TICK_LEN - TICK_GAP, y);
  }
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  const bottom = plot.y + plot.h + 1;
  for (const t of box.colTicks) {
    const x = plot.x + t.pos * cellW;
    ctx.moveTo(x, bottom);
    ctx.lineTo(x, bottom + TICK_LEN);
    ctx.fillText(t.label, x, bottom + TICK_LEN + TICK_GAP);
  }
  ctx.stroke();

  ctx.fillStyle = TEXT_COLOR;
  ctx.font = FONTS.tick;
  ctx.textAlign = "center";
  ctx.textBaseline = "alphabetic";
  if (box.colTitle) {
    ctx.fillText(
      box.colTitle,
      plot.x + plot.w / 2,
      bottom + TICK_LEN + TICK_GAP + COL_LABEL_H + 11,
    );
  }
  if (box.rowTitle) {
    ctx.save();
    ctx.translate(PAD + 10, plot.y + plot.h / 2);
    ctx.rotate(-Math.PI / 2);
    ctx.fillText(box.rowTitle, 0, 0);
    ctx.restore();
  }

  if (box.noteLines.length) {
    ctx.textAlign = "left";
    ctx.textBaseline = "alphabetic";
    ctx.fillStyle = MUTED_COLOR;
    ctx.font = FONTS.note;
    box.noteLines.forEach((line, i) => {
      ctx.fillText(line, PAD, box.noteY + i * NOTE_LINE_H);
    });
  }
}

/**
 * The panel's marked row and column (the selected layer): an outline across the plot, dark with a
 * white line inside, readable on any colour.
 */
export function drawMarks(ctx: CanvasRenderingContext2D, box: PanelBox): void {
  const { plot } = box;
  const marks: Rect[] = [];
  if (box.markRow >= 0 && box.markRow < box.rows) {
    const r = cellRect(box, box.markRow, 0);
    marks.push({ x: plot.x, y: r.y, w: plot.w, h: r.h });
  }
  if (box.markCol >= 0 && box.markCol < box.cols) {
    const r = cellRect(box, 0, box.markCol);
    marks.push({ x: r.x, y: plot.y, w: r.w, h: plot.h });
  }
  ctx.save();
  for (const m of marks) {
    ctx.lineWidth = 2;
    ctx.strokeStyle = "#000";
    ctx.strokeRect(m.x, m.y, m.w, m.h);
    ctx.lineWidth = 1;
    ctx.strokeStyle = "#fff";
    ctx.strokeRect(m.x + 1.5, m.y + 1.5, Math.max(0, m.w - 3), Math.max(0, m.h - 3));
  }
  ctx.restore();
}

/** The numbers of a small panel's cells (lib/cells), centred, white on dark colours. */
export function drawCellLabels(ctx: CanvasRenderingContext2D, labels: readonly CellLabel[]): void {
  if (labels.length === 0) return;
  ctx.save();
  ctx.font = CELL_FONT;
  ctx.textAlign = "center";
  ctx.textBaseline = "middle";
  for (const l of labels) {
    ctx.fillStyle = l.light ? "#fff" : TEXT_COLOR;
    ctx.fillText(l.text, l.x, l.y);
  }
  ctx.restore();
}

/** Crosshair over cell (row, col): guide lines across the plot and a cell outline. */
export function drawCrosshair(
  ctx: CanvasRenderingContext2D,
  box: PanelBox,
  row: number,
  col: number,
): void {
  const { plot } = box;
  const r = cellRect(box, row, col);
  const cx = r.x + r.w / 2;
  const cy = r.y + r.h / 2;
  ctx.save();
  ctx.lineWidth = 1;
  ctx.strokeStyle = "rgba(0, 0, 0, 0.45)";
  ctx.beginPath();
  ctx.moveTo(plot.x, cy);
  ctx.lineTo(plot.x + plot.w, cy);
  ctx.moveTo(cx, plot.y);
  ctx.lineTo(cx, plot.y + plot.h);
  ctx.stroke();
  // Outline at least 6 px wide so that sub-pixel cells stay visible.
  const w = Math.max(r.w, 6);
  const hh = Math.max(r.h, 6);
  const x = cx - w / 2;
  const y = cy - hh / 2;
  ctx.lineWidth = 2;
  ctx.strokeStyle = "#000";
  ctx.strokeRect(x, y, w, hh);
  ctx.lineWidth = 1;
  ctx.strokeStyle = "#fff";
  ctx.strokeRect(x + 1.5, y + 1.5, w - 3, hh - 3);
  ctx.restore();
}
