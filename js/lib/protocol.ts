/**
 * The protocol between the kernel and the front end, written down once: the
 * twin of `python/headwidget/core/protocol.py` (same names, same order;
 * `tests/export/test_protocol.py` runs both and compares them, decodes a panel
 * the kernel encoded and reads a saved page's JSON against the page tables).
 * See the Python module for what each table holds.
 */

/** What the kernel sets and the page draws, with its JSON type. */
export const KERNEL_TRAITS = {
  panels: "list",
  charts: "list",
  vmin: "number",
  vmax: "number",
  colormap: "string",
  colorbar_label: "string",
  columns: "number",
  view: "string",
  controls: "list",
  error: "string",
  status: "string",
  heading: "string",
} as const;

/** What the page sets and the kernel reads. */
export const PAGE_TRAITS = { panel_pixels: "number" } as const;

/** Custom messages from the page, by `type`, with their fields. */
export const PAGE_MESSAGES = {
  click: ["panel", "row", "col"],
  chart_click: ["chart", "series", "point"],
  png: ["data_url", "error"],
  frames: ["keys"],
  missing: ["keys"],
  drawn: ["keys"],
} as const;

/** Custom messages from the kernel, by `type`. */
export const KERNEL_MESSAGES = { export_png: [] } as const;

/** One entry of the `panels` trait; `data` is the matrix's raw bytes. */
export const PANEL_FIELDS = {
  id: "string",
  title: "string",
  subtitle: "string",
  rows: "number",
  cols: "number",
  row_labels: "list|null",
  col_labels: "list|null",
  row_offset: "number",
  col_offset: "number",
  row_step: "number",
  col_step: "number",
  row_group: "number",
  col_group: "number",
  axis_prefix: "string",
  row_axis: "string",
  col_axis: "string",
  dtype: "string",
  data: "bytes",
  key: "string",
  note: "string",
  hint: "string",
  window_subtitle: "string",
  mark_row: "number",
  mark_col: "number",
  axis_titles: "boolean",
} as const;

/** One entry of the `charts` trait. */
export const CHART_FIELDS = {
  id: "string",
  title: "string",
  subtitle: "string",
  note: "string",
  hint: "string",
  x_label: "string",
  y_label: "string",
  x_log: "boolean",
  y_log: "boolean",
  y_reference: "number|null",
  x_ticks: "list",
  x_tick_labels: "list",
  x_range: "list",
  label_points: "boolean",
  series: "list",
} as const;

/** One series of a chart. */
export const SERIES_FIELDS = {
  name: "string",
  x: "list",
  y: "list",
  labels: "list",
  style: "string",
  color: "string",
  dashed: "boolean",
} as const;

/** Each kind of control, with the fields it cannot do without. */
export const CONTROL_TYPES = {
  slider: ["count"],
  window: ["width", "total"],
  toggles: ["options"],
  select: ["options"],
  checklist: ["options"],
  entry: [],
} as const;

/** One entry of the `controls` trait (a type ending in `?`: the field may be left out). */
export const CONTROL_FIELDS = {
  trait: "string",
  type: "string",
  label: "string",
  count: "string?",
  text: "string?",
  width: "string?",
  total: "string?",
  options: "string?",
  step: "string?",
  positions: "string?",
  labels: "object?",
  play: "boolean?",
} as const;

/** A saved page's JSON (`export/_html.py`, read by `js/offline.ts`). */
export const PAGE_FIELDS = {
  state: "object",
  axes: "list",
  frames: "object",
  errors: "object",
  blobs: "list",
  series: "list",
  bundle: "string",
} as const;

/** One control a saved page holds frames for. */
export const AXIS_FIELDS = {
  trait: "string",
  type: "string",
  label: "string",
  values: "list?",
  options: "list?",
} as const;

/** One state's grid on a saved page. */
export const FRAME_FIELDS = {
  vmin: "number",
  vmax: "number",
  colormap: "string",
  colorbar_label: "string",
  columns: "number",
  traits: "object",
  panels: "list",
  charts: "list",
  window: "boolean?",
} as const;

const { data: _data, key: _key, ...storedPanelFields } = PANEL_FIELDS;

/** A panel on a saved page: its matrix by index in `blobs`. */
export const STORED_PANEL_FIELDS = {
  ...storedPanelFields,
  blob: "number",
  packed: "string",
} as const;

export type ControlType = keyof typeof CONTROL_TYPES;
export type PageMessageType = keyof typeof PAGE_MESSAGES;
export type KernelMessageType = keyof typeof KERNEL_MESSAGES;

/** A message from the page: its `type` and the fields the protocol lists for it. */
export function pageMessage<T extends PageMessageType>(
  type: T,
  fields: Record<(typeof PAGE_MESSAGES)[T][number], unknown>,
): Record<string, unknown> {
  return { type, ...fields };
}
