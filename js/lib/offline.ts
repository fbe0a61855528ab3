/**
 * What a saved page knows in place of a kernel (pure: no DOM, no model).
 *
 * The page's JSON (`export/_html.py:page_data`; its fields are `protocol.ts`'s
 * page tables, checked by `pageProblems`) holds a frame per state its
 * controls reach, keyed by `stateKey`: the JSON array of the values of the
 * traits in `axes`, in order, as Python's `state_key` writes it.  How each
 * type of control is worked is `OFFLINE_RULES` (the twin of
 * `export/_axes.py:RULES`).  A control that moves looks its new state up;
 * nothing here computes or rewrites a panel's text.  The one exception to a
 * lookup is the channel window: a frame marked `window` holds whole square
 * matrices, and `cropPanel` cuts out the window the user picked, naming it by
 * the panel's own `window_subtitle`.  A panel's matrix and a chart's series
 * are held once per page (`blobs`, `series`) and named by index.
 */

import {
  AXIS_FIELDS,
  CHART_FIELDS,
  CONTROL_TYPES,
  type ControlType,
  FRAME_FIELDS,
  PAGE_FIELDS,
  SERIES_FIELDS,
  STORED_PANEL_FIELDS,
} from "./protocol";

/** One control the page holds frames for. */
export interface Axis {
  trait: string;
  type: string;
  label: string;
  /** The values held (a slider's positions, the options of toggles or a select). */
  values?: unknown[];
  /** A checklist's options, in the order its keys list them. */
  options?: string[];
}

/** A panel as the page stores it: its wire fields, the matrix by blob index. */
export interface StoredPanel {
  rows: number;
  cols: number;
  dtype: string;
  blob: number;
  packed: string;
  subtitle: string;
  window_subtitle?: string;
  row_offset: number;
  col_offset: number;
  [field: string]: unknown;
}

export interface Frame {
  panels: StoredPanel[];
  traits: Record<string, unknown>;
  /** Each chart with its series named by their index in the page's `series`. */
  charts: (Record<string, unknown> & { series: number[] })[];
  window?: boolean;
  [trait: string]: unknown;
}

export interface PageData {
  state: Record<string, unknown>;
  axes: Axis[];
  frames: Record<string, Frame>;
  errors: Record<string, string>;
  blobs: string[];
  series: Record<string, unknown>[];
  bundle: string;
}

/** How the page works one type of control: a value as a key holds it, and whether the file holds
 * a value (a slider's position may be left out: `layers=`). */
interface OfflineRule {
  keyed(axis: Axis, value: unknown): unknown;
  held(axis: Axis, value: unknown): boolean;
}

const asItIs: OfflineRule = { keyed: (_, value) => value, held: () => true };

/** The rules of each control type, the twin of `export/_axes.py:RULES` (a window and an entry
 * have no axis: the page crops the one, and the other needs Python). */
export const OFFLINE_RULES: Record<ControlType, OfflineRule> = {
  slider: { ...asItIs, held: (axis, value) => (axis.values ?? []).includes(value) },
  window: asItIs,
  toggles: asItIs,
  select: asItIs,
  checklist: {
    ...asItIs,
    keyed(axis, value) {
      // A checklist's choice in the order of its options.
      const options = axis.options ?? [];
      const chosen = Array.isArray(value) ? value.map((v) => String(v)) : [];
      const rank = (v: string) => {
        const i = options.indexOf(v);
        return i < 0 ? options.length : i;
      };
      return [...chosen].sort((a, b) => rank(a) - rank(b));
    },
  },
  entry: asItIs,
};

function rule(axis: Axis): OfflineRule {
  return Object.hasOwn(OFFLINE_RULES, axis.type) ? OFFLINE_RULES[axis.type as ControlType] : asItIs;
}

/** A trait's value as a key holds it (a checklist's choice in the order of its options). */
export function keyedValue(axis: Axis, value: unknown): unknown {
  return rule(axis).keyed(axis, value);
}

/** The key of the state `get` reads, as Python's `state_key` writes it. */
export function stateKey(axes: readonly Axis[], get: (trait: string) => unknown): string {
  return JSON.stringify(axes.map((axis) => keyedValue(axis, get(axis.trait))));
}

function jsonType(value: unknown): string {
  if (value === null) return "null";
  if (Array.isArray(value)) return "list";
  return typeof value === "object" ? "object" : typeof value;
}

/** What is wrong with `value` as an entry of a protocol table (`where` names it): a field missing,
 * one the table does not list, or one of another JSON type. */
export function fieldProblems(
  value: unknown,
  fields: Readonly<Record<string, string>>,
  where: string,
): string[] {
  if (jsonType(value) !== "object") return [`${where}: expected an object, got ${jsonType(value)}`];
  const entry = value as Record<string, unknown>;
  const problems: string[] = [];
  for (const [name, type] of Object.entries(fields)) {
    const optional = type.endsWith("?");
    if (!(name in entry)) {
      if (!optional) problems.push(`${where}: no ${name}`);
    } else if (!type.replace("?", "").split("|").includes(jsonType(entry[name]))) {
      problems.push(
        `${where}: ${name} is a ${jsonType(entry[name])}, not a ${type.replace("?", "")}`,
      );
    }
  }
  for (const name of Object.keys(entry)) {
    if (!(name in fields)) problems.push(`${where}: unknown field ${name}`);
  }
  return problems;
}

/** What is wrong with a saved page's JSON (`protocol.ts`'s page tables): an axis of a control type
 * this page does not know, a field missing or unknown, a matrix or series that is not there. */
export function pageProblems(page: unknown): string[] {
  const problems = fieldProblems(page, PAGE_FIELDS, "page");
  if (problems.length > 0) return problems;
  const p = page as PageData;
  p.axes.forEach((axis, i) => {
    problems.push(...fieldProblems(axis, AXIS_FIELDS, `axis ${i}`));
    if (!Object.hasOwn(CONTROL_TYPES, axis.type)) {
      problems.push(
        `axis ${i} ("${axis.trait}"): unknown control type ${JSON.stringify(axis.type)}`,
      );
    }
  });
  p.series.forEach((series, i) => {
    problems.push(...fieldProblems(series, SERIES_FIELDS, `series ${i}`));
  });
  for (const [key, frame] of Object.entries(p.frames)) {
    const where = `frame ${key}`;
    const found = fieldProblems(frame, FRAME_FIELDS, where);
    problems.push(...found);
    if (found.length > 0) continue;
    frame.panels.forEach((panel, i) => {
      problems.push(...fieldProblems(panel, STORED_PANEL_FIELDS, `${where}, panel ${i}`));
      if (!(panel.blob in p.blobs)) problems.push(`${where}, panel ${i}: no blob ${panel.blob}`);
    });
    frame.charts.forEach((chart, i) => {
      problems.push(...fieldProblems(chart, CHART_FIELDS, `${where}, chart ${i}`));
      for (const s of Array.isArray(chart.series) ? chart.series : []) {
        if (!(s in p.series)) problems.push(`${where}, chart ${i}: no series ${s}`);
      }
    });
  }
  return problems;
}

/** A frame's charts with their series (what the page shows). */
export function frameCharts(
  page: Pick<PageData, "series">,
  frame: Frame,
): Record<string, unknown>[] {
  return frame.charts.map((c) => ({
    ...c,
    series: (Array.isArray(c.series) ? c.series : []).map((i) => page.series[i]),
  }));
}

/** Why the page has no frame for a state, and the read-out of the slider that reached it. */
export interface Missing {
  error: string;
  /** Text traits to set (a slider's read-out saying its position is not in the file). */
  traits: Record<string, string>;
}

/**
 * Why `key` has no frame: the view's own error for it, else the slider
 * position the file leaves out (and how to add it), else the budget that left
 * this combination of options out.
 */
export function missingState(
  page: Pick<PageData, "axes" | "errors" | "frames">,
  key: string,
  get: (trait: string) => unknown,
  textTraits: Readonly<Record<string, string>>,
): Missing {
  const known = page.errors[key];
  if (known !== undefined) return { error: known, traits: {} };
  for (const axis of page.axes) {
    const value = get(axis.trait);
    const what = axis.label.toLowerCase();
    const held = axis.values ?? [];
    const text = textTraits[axis.trait];
    const traits: Record<string, string> = text
      ? { [text]: `${what} ${value} (not in this file)` }
      : {};
    if (!rule(axis).held(axis, value)) {
      return {
        error:
          `${what} ${value} is not in this file (it holds ${what}s ${held.join(", ")}); ` +
          `export it with save(view, path, ${axis.trait === "layer" ? "layers" : axis.trait}=[...])`,
        traits,
      };
    }
  }
  const held = Object.keys(page.frames).length;
  return {
    error:
      `this combination is not in this file: it holds ${held} states, nearest the saved one first; ` +
      "save the view with a larger max_states to hold it",
    traits: {},
  };
}

/** The subtitle of a panel cropped to indices first..last, from its own `window_subtitle`. */
export function windowSubtitle(
  panel: Pick<StoredPanel, "subtitle" | "window_subtitle">,
  first: number,
  last: number,
): string {
  const template = panel.window_subtitle ?? "";
  if (!template) return panel.subtitle;
  return template.split("{first}").join(String(first)).split("{last}").join(String(last));
}

/** Bytes of a square matrix, row-major, from its upper triangle (diagonal included). */
export function unpackUpper(
  upper: Uint16Array | Uint32Array,
  n: number,
): Uint16Array | Uint32Array {
  const full = upper instanceof Uint16Array ? new Uint16Array(n * n) : new Uint32Array(n * n);
  let k = 0;
  for (let r = 0; r < n; r++) {
    for (let c = r; c < n; c++) {
      full[r * n + c] = upper[k];
      full[c * n + r] = upper[k++];
    }
  }
  return full;
}

/**
 * A whole square panel cut to the window [start, start + width) (clamped to
 * the panel), with offsets and subtitle as the kernel would send them.
 */
export function cropPanel<P extends StoredPanel & { data: DataView }>(
  panel: P,
  start: number,
  width: number,
): P {
  const from = Math.max(0, Math.min(Math.trunc(start) || 0, panel.rows - 1));
  const n = Math.max(1, Math.min(Math.trunc(width) || 0, panel.rows - from));
  const size = panel.dtype === "float16" ? 2 : 4;
  const src = new Uint8Array(panel.data.buffer, panel.data.byteOffset, panel.data.byteLength);
  const out = new Uint8Array(n * n * size);
  for (let r = 0; r < n; r++) {
    const at = ((from + r) * panel.cols + from) * size;
    out.set(src.subarray(at, at + n * size), r * n * size);
  }
  return {
    ...panel,
    rows: n,
    cols: n,
    row_offset: from,
    col_offset: from,
    subtitle: windowSubtitle(panel, from, from + n - 1),
    data: new DataView(out.buffer),
  };
}
