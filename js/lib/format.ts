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

/**
 * Head and dimension of the original indices under displayed cell i, on an axis whose heads
 * hold `group` indices each: "h1·d36" for one index, "h1·d36–39" for a block inside one head,
 * "h2" / "h2–3" for blocks of whole heads, "h0·d62–h1·d3" for a block across a boundary.
 */
export function groupLabel(offset: number, step: number, group: number, i: number): string {
  const first = offset + i * step;
  const last = first + step - 1;
  const head = (c: number) => Math.floor(c / group);
  const dim = (c: number) => c - head(c) * group;
  const [h0, d0, h1, d1] = [head(first), dim(first), head(last), dim(last)];
  if (first === last) return `h${h0}·d${d0}`;
  if (d0 === 0 && d1 === group - 1) return h0 === h1 ? `h${h0}` : `h${h0}–${h1}`;
  if (h0 === h1) return `h${h0}·d${d0}–${d1}`;
  return `h${h0}·d${d0}–h${h1}·d${d1}`;
}

/** The axes and scale of a panel that name a cell: what groupedCell and axisLabel read. */
export interface CellAxes {
  row_labels: readonly string[] | null;
  col_labels: readonly string[] | null;
  row_offset: number;
  col_offset: number;
  row_step: number;
  col_step: number;
  row_group: number;
  col_group: number;
  axis_prefix: string;
}

/** Whether a panel names its cells by head (either axis has heads and no explicit labels). */
export function namesHeads(p: CellAxes): boolean {
  return (p.row_group > 0 && !p.row_labels) || (p.col_group > 0 && !p.col_labels);
}

/** "K h1·d36 × h2·d22 = 0.2310": a cell named by head and dimension, with its value. */
export function groupedCell(p: CellAxes, row: number, col: number, value: number): string {
  const name = (
    labels: readonly string[] | null,
    offset: number,
    step: number,
    group: number,
    i: number,
  ) =>
    group > 0 && !labels ? groupLabel(offset, step, group, i) : axisLabel(labels, offset, step, i);
  const r = name(p.row_labels, p.row_offset, p.row_step, p.row_group, row);
  const c = name(p.col_labels, p.col_offset, p.col_step, p.col_group, col);
  const prefix = p.axis_prefix ? `${p.axis_prefix} ` : "";
  return `${prefix}${r} × ${c} = ${formatValue(value)}`;
}
