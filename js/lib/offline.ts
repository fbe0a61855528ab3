/**
 * What a saved page knows in place of a kernel (pure: no DOM, no model).
 *
 * The page's JSON (`export/_html.py:page_data`) holds a frame per state its
 * controls reach, keyed by `stateKey`: the JSON array of the values of the
 * traits in `axes`, in order, as Python's `state_key` writes it.  A control
 * that moves looks its new state up; nothing here computes or rewrites a
 * panel's text.  The one exception to a lookup is the channel window: a frame
 * marked `window` holds whole square matrices, and `cropPanel` cuts out the
 * window the user picked, naming it by the panel's own `window_subtitle`.
 */

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
  window?: boolean;
  [trait: string]: unknown;
}

export interface PageData {
  state: Record<string, unknown>;
  axes: Axis[];
  frames: Record<string, Frame>;
  errors: Record<string, string>;
  blobs: string[];
  bundle: string;
}

/** A trait's value as a key holds it: a checklist's choice in the order of its options. */
export function keyedValue(axis: Axis, value: unknown): unknown {
  if (axis.type !== "checklist") return value;
  const options = axis.options ?? [];
  const chosen = Array.isArray(value) ? value.map((v) => String(v)) : [];
  const rank = (v: string) => {
    const i = options.indexOf(v);
    return i < 0 ? options.length : i;
  };
  return [...chosen].sort((a, b) => rank(a) - rank(b));
}

/** The key of the state `get` reads, as Python's `state_key` writes it. */
export function stateKey(axes: readonly Axis[], get: (trait: string) => unknown): string {
  return JSON.stringify(axes.map((axis) => keyedValue(axis, get(axis.trait))));
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
    if (axis.type !== "slider") continue;
    const value = get(axis.trait);
    const what = axis.label.toLowerCase();
    const held = axis.values ?? [];
    const text = textTraits[axis.trait];
    const traits: Record<string, string> = text
      ? { [text]: `${what} ${value} (not in this file)` }
      : {};
    if (!held.includes(value as never)) {
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
