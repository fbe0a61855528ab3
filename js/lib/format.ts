/**
 * Number and label formatting shared by the tooltip, ticks and colorbar.
 */

/** Hover value: 4 significant digits; NaN -> "undefined". */
export function formatValue(v: number): string {
  if (Number.isNaN(v)) return "undefined";
  if (v === Infinity) return "inf";
  if (v === -Infinity) return "-inf";
  if (v === 0) return "0.000"; // also -0
  return v.toPrecision(4);
}

/** Compact number for colorbar ticks: up to 4 significant digits, no trailing zeros. */
export function formatTick(v: number): string {
  if (!Number.isFinite(v)) return formatValue(v);
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e5 || a < 1e-4) {
    return v
      .toExponential(2)
      .replace(/\.?0+e/, "e")
      .replace("e+", "e");
  }
  return String(Number(v.toPrecision(4)));
}

/**
 * Original index range of displayed cell i on an axis with the given offset
 * and step: "17" when step is 1, "256–259" for a block of 4.
 */
export function indexLabel(offset: number, step: number, i: number): string {
  const start = offset + i * step;
  return step > 1 ? `${start}–${start + step - 1}` : String(start);
}

/** Label of displayed cell i: the explicit label if given, else its index range. */
export function axisLabel(
  labels: readonly string[] | null,
  offset: number,
  step: number,
  i: number,
): string {
  if (labels && i >= 0 && i < labels.length) return labels[i];
  return indexLabel(offset, step, i);
}

export interface HoverInfo {
  panel: string;
  row: number;
  col: number;
  value: number | null;
}

/** JSON written to the grid root's data-hover attribute (NaN/inf -> null). */
export function hoverJson(panel: string, row: number, col: number, value: number): string {
  const info: HoverInfo = { panel, row, col, value: Number.isFinite(value) ? value : null };
  return JSON.stringify(info);
}
