/**
 * Validation of the `panels` trait: turns the loosely typed dicts sent by
 * Python into fully populated `Panel` records with decoded values.
 *
 * A malformed panel does not stop the others: it is reported in `problems`
 * and left out of `panels`.
 */

import {
  type Dtype,
  isDtype,
  type WireValues,
  wireToFloat32,
  wireValue,
  wireValues,
} from "./decode";

export interface PanelSpec {
  id: string;
  title: string;
  subtitle: string;
  rows: number;
  cols: number;
  row_labels: string[] | null;
  col_labels: string[] | null;
  row_offset: number;
  col_offset: number;
  row_step: number;
  col_step: number;
  /** Channels per head along each axis (0: the axis has no heads); lines and tooltips use it. */
  row_group: number;
  col_group: number;
  /** What the axes hold, for the tooltip ("K": `K h1·d36 × h2·d22 = …`); may be empty. */
  axis_prefix: string;
  /** What a row / a column stands for, as the tooltip names it ("variant", "layer"; may be empty). */
  row_axis: string;
  col_axis: string;
  dtype: Dtype;
  note: string;
  /** What a click on the panel does (drawn after the note; empty where a click does nothing). */
  hint: string;
  /** The displayed row / column outlined (the selected layer); -1: none. */
  mark_row: number;
  mark_col: number;
  /** Whether `row_axis` and `col_axis` are drawn as the axes' titles. */
  axis_titles: boolean;
  /** What names the cells (equal keys, equal cells; "" where the sender gives none). */
  key: string;
}

export interface Panel extends PanelSpec {
  /** The values as sent (float16 bit patterns or float32), row-major; shares the message's memory. */
  readonly raw: WireValues;
  /** rows * cols values as float32, row-major; NaN = undefined (float16 is decoded on first use). */
  readonly values: Float32Array;
}

export interface PanelsResult {
  panels: Panel[];
  problems: string[];
}

type Raw = Record<string, unknown>;

function str(raw: Raw, key: string, fallback = ""): string {
  const v = raw[key];
  return v === undefined || v === null ? fallback : String(v);
}

function int(raw: Raw, key: string, fallback: number): number {
  const v = raw[key];
  if (v === undefined || v === null) return fallback;
  const n = Number(v);
  if (!Number.isFinite(n) || !Number.isInteger(n)) {
    throw new Error(`"${key}" must be an integer, got ${JSON.stringify(v)}`);
  }
  return n;
}

function labels(raw: Raw, key: string, count: number): string[] | null {
  const v = raw[key];
  if (v === undefined || v === null) return null;
  if (!Array.isArray(v)) throw new Error(`"${key}" must be a list or null`);
  if (v.length !== count) {
    throw new Error(`"${key}" has ${v.length} entries for ${count} cells`);
  }
  return v.map((x) => (x === null || x === undefined ? "" : String(x)));
}

/** Validate one raw panel dict; throws an Error describing the first fault. */
export function parsePanel(input: unknown, index: number): Panel {
  if (input === null || typeof input !== "object" || Array.isArray(input)) {
    throw new Error("not a dict");
  }
  const r = input as Raw;
  const rows = int(r, "rows", -1);
  const cols = int(r, "cols", -1);
  if (rows < 1 || cols < 1) throw new Error(`rows and cols must be >= 1 (got ${rows}×${cols})`);
  const dtype = r.dtype ?? "float32";
  if (!isDtype(dtype)) throw new Error(`unknown dtype ${JSON.stringify(dtype)}`);
  const spec: PanelSpec = {
    id: str(r, "id", String(index)),
    title: str(r, "title"),
    subtitle: str(r, "subtitle"),
    rows,
    cols,
    row_labels: labels(r, "row_labels", rows),
    col_labels: labels(r, "col_labels", cols),
    row_offset: int(r, "row_offset", 0),
    col_offset: int(r, "col_offset", 0),
    row_step: int(r, "row_step", 1),
    col_step: int(r, "col_step", 1),
    row_group: int(r, "row_group", 0),
    col_group: int(r, "col_group", 0),
    axis_prefix: str(r, "axis_prefix"),
    row_axis: str(r, "row_axis"),
    col_axis: str(r, "col_axis"),
    dtype,
    note: str(r, "note"),
    hint: str(r, "hint"),
    mark_row: int(r, "mark_row", -1),
    mark_col: int(r, "mark_col", -1),
    axis_titles: r.axis_titles === true,
    key: str(r, "key"),
  };
  if (spec.row_step < 1 || spec.col_step < 1) throw new Error("row_step and col_step must be >= 1");
  if (spec.row_group < 0 || spec.col_group < 0) {
    throw new Error("row_group and col_group must be >= 0");
  }
  const raw = wireValues(dtype, r.data, rows * cols);
  let decoded: Float32Array | null = null;
  return {
    ...spec,
    raw,
    get values(): Float32Array {
      decoded ??= wireToFloat32(raw);
      return decoded;
    },
  };
}

/** Validate the whole `panels` trait. */
export function parsePanels(raw: unknown): PanelsResult {
  const out: PanelsResult = { panels: [], problems: [] };
  if (raw === undefined || raw === null) return out;
  if (!Array.isArray(raw)) {
    out.problems.push("panels: expected a list");
    return out;
  }
  raw.forEach((p, i) => {
    try {
      out.panels.push(parsePanel(p, i));
    } catch (e) {
      const r = p as Raw | null;
      const name = r && typeof r === "object" && "id" in r ? ` "${String(r.id)}"` : "";
      out.problems.push(`panel ${i}${name}: ${e instanceof Error ? e.message : String(e)}`);
    }
  });
  return out;
}

/** Value of cell (row, col), NaN outside the matrix. */
export function cellValue(p: Panel, row: number, col: number): number {
  if (row < 0 || col < 0 || row >= p.rows || col >= p.cols) return NaN;
  return wireValue(p.raw, row * p.cols + col);
}
