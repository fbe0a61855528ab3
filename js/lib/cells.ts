/**
 * Numbers printed in the cells of a small panel (a 3×3 head-similarity matrix, a damage map of a
 * few variants): which cells get one, the text, and whether it is light on a dark colour.  Pure:
 * text widths come from an injected Measure.
 *
 * A panel is labelled only when every cell has room for its number (MIN_CELL_H tall, the widest
 * text plus CELL_TEXT_PAD wide) and it has at most MAX_LABELLED_CELLS cells; otherwise none is, so
 * a panel never shows numbers in some cells and not in others.
 */

import { valueToColor } from "./colormap";
import type { PanelBox } from "./layout";
import { font, type Measure } from "./text";

export const CELL_FONT = font(10);
export const MAX_LABELLED_CELLS = 256;
export const MIN_CELL_H = 14;
export const CELL_TEXT_PAD = 6;
/** Relative luminance below which a cell's colour takes white text. */
export const DARK_LUMINANCE = 0.4;

export interface CellLabel {
  row: number;
  col: number;
  text: string;
  /** Centre of the cell, relative to the box (as the box's plot rectangle is). */
  x: number;
  y: number;
  /** The cell's colour is dark: white text. */
  light: boolean;
}

export interface LabelScale {
  vmin: number;
  vmax: number;
  colormap: string;
}

/**
 * How a panel prints its values, from the largest magnitude among them: two significant digits of
 * that one at least (two decimals for values up to 10, "−0.0028" where the largest is 0.0028),
 * three significant digits from 10 on, and an exponent below 0.0001 (where decimals would print zeros).
 */
export function cellFormat(largest: number): (v: number) => string {
  const m = Math.abs(largest);
  let digits: (v: number) => string;
  if (m >= 10) digits = (v) => v.toPrecision(3);
  else if (m > 0 && m < 1e-4) digits = (v) => (v === 0 ? "0" : v.toExponential(1));
  else {
    const decimals = m > 0 ? Math.max(2, 1 - Math.floor(Math.log10(m))) : 2;
    digits = (v) => v.toFixed(decimals);
  }
  return (v) => {
    if (!Number.isFinite(v)) return Number.isNaN(v) ? "" : v > 0 ? "∞" : "−∞";
    const text = digits(v);
    return /^-0\.?0*$/.test(text) ? text.slice(1) : text.replace("-", "−");
  };
}

/** A cell's value as printed in a panel whose largest magnitude is 1 (see cellFormat). */
export function cellText(v: number): string {
  return cellFormat(1)(v);
}

/** WCAG relative luminance of an sRGB colour (0 black … 1 white). */
export function luminance([r, g, b]: readonly [number, number, number]): number {
  const lin = (c: number) => {
    const s = c / 255;
    return s <= 0.04045 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4;
  };
  return 0.2126 * lin(r) + 0.7152 * lin(g) + 0.0722 * lin(b);
}

/**
 * The numbers to print in a panel's cells, or an empty list when they do not all fit.
 * `value(row, col)` reads the panel's values (as sent).
 */
export function cellLabels(
  box: PanelBox,
  value: (row: number, col: number) => number,
  scale: LabelScale,
  measure: Measure,
): CellLabel[] {
  const { rows, cols, plot } = box;
  if (rows * cols > MAX_LABELLED_CELLS) return [];
  const cellW = plot.w / cols;
  const cellH = plot.h / rows;
  if (cellH < MIN_CELL_H) return [];
  let largest = 0;
  for (let row = 0; row < rows; row++) {
    for (let col = 0; col < cols; col++) {
      const v = Math.abs(value(row, col));
      if (Number.isFinite(v) && v > largest) largest = v;
    }
  }
  const format = cellFormat(largest);
  const out: CellLabel[] = [];
  for (let row = 0; row < rows; row++) {
    for (let col = 0; col < cols; col++) {
      const v = value(row, col);
      const text = format(v);
      if (measure(text, CELL_FONT) + CELL_TEXT_PAD > cellW) return [];
      if (text === "") continue;
      const colour = valueToColor(v, scale.vmin, scale.vmax, scale.colormap);
      out.push({
        row,
        col,
        text,
        x: plot.x + (col + 0.5) * cellW,
        y: plot.y + (row + 0.5) * cellH,
        light: luminance(colour) < DARK_LUMINANCE,
      });
    }
  }
  return out;
}
