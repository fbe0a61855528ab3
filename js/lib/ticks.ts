/**
 * Tick selection for matrix axes and the colorbar.
 *
 * Axis positions are in cell units from the start of the plot: cell i spans
 * [i, i + 1), so a tick at the centre of cell i has pos = i + 0.5.
 */

import { fitText, fontSize, type Measure } from "./text";

export interface Tick {
  pos: number;
  label: string;
}

export interface AxisSpec {
  n: number;
  labels: readonly string[] | null;
  offset: number;
  step: number;
}

export type Orientation = "row" | "col";

/**
 * Widest tick label drawn for explicit labels (longer ones get an ellipsis): a row holds a
 * spec such as "kv:int2/g128" or "mixed 11,424 B" whole.
 */
export const MAX_LABEL_PX: Record<Orientation, number> = { row: 144, col: 56 };

/** Gap between neighbouring column labels, in px. */
const COL_LABEL_GAP = 8;

/** Smallest 1, 2 or 5 × 10^k that is >= x (x > 0). */
export function niceStep(x: number): number {
  if (!(x > 0) || !Number.isFinite(x)) return 1;
  const p = 10 ** Math.floor(Math.log10(x));
  for (const m of [1, 2, 5, 10]) {
    const s = m * p;
    if (s >= x * (1 - 1e-12)) return s;
  }
  return 10 * p;
}

/** Minimum distance between ticks so that their labels do not collide. */
function minSpacing(orient: Orientation, widest: number, f: string): number {
  return orient === "row" ? fontSize(f) + 3 : widest + COL_LABEL_GAP;
}

/**
 * Ticks for numeric indices: displayed cell i stands for original indices
 * offset + i*step ... offset + (i+1)*step - 1.  Ticks sit at round original
 * indices (multiples of 1, 2, 5 × 10^k) at least `minSpacing` px apart.
 */
export function indexTicks(
  axis: AxisSpec,
  lengthPx: number,
  orient: Orientation,
  measure: Measure,
  f: string,
): Tick[] {
  const { n, offset, step } = axis;
  if (n < 1 || lengthPx <= 0) return [];
  const first = offset;
  const last = offset + n * step - 1;
  const widest = Math.max(measure(String(first), f), measure(String(last), f));
  const pxPerIndex = lengthPx / (n * step);
  // Round spacing in original indices, never finer than one displayed cell.
  const d = Math.max(1, niceStep(Math.max(minSpacing(orient, widest, f) / pxPerIndex, step)));
  const ticks: Tick[] = [];
  for (let idx = Math.ceil(first / d) * d; idx <= last; idx += d) {
    ticks.push({ pos: (idx - offset + 0.5) / step, label: String(idx) });
  }
  if (ticks.length === 0) ticks.push({ pos: 0.5, label: String(first) });
  return ticks;
}

/**
 * Ticks for explicit labels: every k-th cell (k = 1, 2, 5, 10, ...) so that
 * labels, cut to MAX_LABEL_PX, do not overlap.
 */
export function labelTicks(
  labels: readonly string[],
  lengthPx: number,
  orient: Orientation,
  measure: Measure,
  f: string,
): Tick[] {
  const n = labels.length;
  if (n < 1 || lengthPx <= 0) return [];
  const maxPx = MAX_LABEL_PX[orient];
  const shown = labels.map((l) => fitText(l, maxPx, f, measure));
  const widest = Math.max(...shown.map((l) => measure(l, f)));
  const cellPx = lengthPx / n;
  const k = Math.max(1, niceStep(minSpacing(orient, widest, f) / cellPx));
  const ticks: Tick[] = [];
  for (let i = 0; i < n; i += k) ticks.push({ pos: i + 0.5, label: shown[i] });
  return ticks;
}

export function axisTicks(
  axis: AxisSpec,
  lengthPx: number,
  orient: Orientation,
  measure: Measure,
  f: string,
): Tick[] {
  return axis.labels
    ? labelTicks(axis.labels, lengthPx, orient, measure, f)
    : indexTicks(axis, lengthPx, orient, measure, f);
}

/** Round tick values inside [vmin, vmax] for the colorbar, about maxCount of them. */
export function valueTicks(vmin: number, vmax: number, maxCount = 5): number[] {
  if (!Number.isFinite(vmin) || !Number.isFinite(vmax)) return [];
  if (!(vmax > vmin)) return [vmin];
  const d = niceStep((vmax - vmin) / Math.max(1, maxCount));
  const out: number[] = [];
  const eps = d * 1e-9;
  for (let k = Math.ceil((vmin - eps) / d); k * d <= vmax + eps; k++) {
    const v = Number((k * d).toPrecision(12));
    out.push(Object.is(v, -0) ? 0 : v);
  }
  return out;
}
