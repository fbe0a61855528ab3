/**
 * The protocol between the kernel and the front end, written down once: the
 * twin of `python/headwidget/core/protocol.py` (same names, same order;
 * `tests/export/test_protocol.py` runs both and compares them, and decodes a panel
 * the kernel encoded).  See the Python module for what each table holds.
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
  window_subtitle: "string",
} as const;

/** One entry of the `charts` trait. */
export const CHART_FIELDS = {
  id: "string",
  title: "string",
  subtitle: "string",
  note: "string",
  x_label: "string",
  y_label: "string",
  x_log: "boolean",
  y_log: "boolean",
  y_reference: "number|null",
  x_ticks: "list",
  series: "list",
} as const;

export type PageMessageType = keyof typeof PAGE_MESSAGES;
export type KernelMessageType = keyof typeof KERNEL_MESSAGES;

/** A message from the page: its `type` and the fields the protocol lists for it. */
export function pageMessage<T extends PageMessageType>(
  type: T,
  fields: Record<(typeof PAGE_MESSAGES)[T][number], unknown>,
): Record<string, unknown> {
  return { type, ...fields };
}
