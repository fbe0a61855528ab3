/**
 * Charts: validation of the `charts` trait, axis scales and ticks (linear
 * or log10), the layout of one chart, and hit-testing of its points.
 * Pure functions; `ui/chart_canvas.ts` draws what `layoutChart` computes.
 *
 * A value that is null, not finite, or <= 0 on a log axis is not drawn: a
 * point is skipped, a line is broken there.
 */

import { formatTick } from "./format";
import { FONTS, NOTE_LINE_H, PAD, type Rect, SUBTITLE_H, TITLE_H } from "./layout";
import { fitText, type Measure, wrapText } from "./text";
import { niceStep } from "./ticks";

export type SeriesStyle = "points" | "line" | "points+line";

export interface ChartSeries {
  name: string;
  x: (number | null)[];
  y: (number | null)[];
  labels: string[];
  style: SeriesStyle;
  color: string;
  dashed: boolean;
}

export interface Chart {
  id: string;
  title: string;
  subtitle: string;
  note: string;
  x_label: string;
  y_label: string;
  x_log: boolean;
  y_log: boolean;
  y_reference: number | null;
  /** Explicit x tick positions (empty: chosen from the range). */
  x_ticks: number[];
  /** The text of each explicit x tick (empty: the values, written out). */
  x_tick_labels: string[];
  /** The x-axis' ends before padding (null: the data's); charts over the same steps share it. */
  x_range: [number, number] | null;
  /** Whether each point's name is written beside it (false: lines that the legend names). */
  label_points: boolean;
  /** What a click on a point does (drawn after the note; empty where a click does nothing). */
  hint: string;
  series: ChartSeries[];
}

export interface ChartsResult {
  charts: Chart[];
  problems: string[];
}

/** Colours by series order (where a series names none): the colour-blind-safe Okabe–Ito set. */
export const PALETTE = [
  "#0072b2",
  "#d55e00",
  "#009e73",
  "#cc79a7",
  "#e69f00",
  "#56b4e9",
  "#000000",
];

type Raw = Record<string, unknown>;

function numbers(raw: Raw, key: string, where: string): (number | null)[] {
  const v = raw[key];
  if (!Array.isArray(v)) throw new Error(`${where}: "${key}" must be a list`);
  return v.map((x) => (typeof x === "number" && Number.isFinite(x) ? x : null));
}

function parseSeries(input: unknown, where: string): ChartSeries {
  if (input === null || typeof input !== "object") throw new Error(`${where} is not an object`);
  const raw = input as Raw;
  const x = numbers(raw, "x", where);
  const y = numbers(raw, "y", where);
  const labels = Array.isArray(raw.labels) ? raw.labels.map((l) => String(l ?? "")) : [];
  if (y.length !== x.length || labels.length !== x.length) {
    throw new Error(
      `${where}: x, y and labels have ${x.length}, ${y.length} and ${labels.length} entries`,
    );
  }
  const style = String(raw.style ?? "points");
  if (style !== "points" && style !== "line" && style !== "points+line") {
    throw new Error(`${where}: unknown style ${JSON.stringify(style)}`);
  }
  return {
    name: String(raw.name ?? ""),
    x,
    y,
    labels,
    style,
    color: typeof raw.color === "string" ? raw.color : "",
    dashed: raw.dashed === true,
  };
}

/** Validate the raw `charts` trait; a malformed chart is reported and left out. */
export function parseCharts(input: unknown): ChartsResult {
  const charts: Chart[] = [];
  const problems: string[] = [];
  if (input === undefined || input === null) return { charts, problems };
  if (!Array.isArray(input)) return { charts, problems: ["charts: expected a list"] };
  input.forEach((c, i) => {
    try {
      if (c === null || typeof c !== "object") throw new Error(`chart ${i} is not an object`);
      const raw = c as Raw;
      const id = String(raw.id ?? `chart-${i}`);
      if (!Array.isArray(raw.series)) throw new Error(`chart "${id}": "series" must be a list`);
      const ref = raw.y_reference;
      const ticks = Array.isArray(raw.x_ticks) ? raw.x_ticks : [];
      const tickLabels = Array.isArray(raw.x_tick_labels) ? raw.x_tick_labels : [];
      if (tickLabels.length && tickLabels.length !== ticks.length) {
        throw new Error(
          `chart "${id}": ${tickLabels.length} x_tick_labels for ${ticks.length} x_ticks`,
        );
      }
      const kept = ticks
        .map((v, i) => ({ v, label: tickLabels.length ? String(tickLabels[i] ?? "") : null }))
        .filter(
          (t): t is { v: number; label: string | null } =>
            typeof t.v === "number" && Number.isFinite(t.v),
        );
      const range = raw.x_range;
      charts.push({
        id,
        title: String(raw.title ?? ""),
        subtitle: String(raw.subtitle ?? ""),
        note: String(raw.note ?? ""),
        x_label: String(raw.x_label ?? ""),
        y_label: String(raw.y_label ?? ""),
        x_log: raw.x_log === true,
        y_log: raw.y_log === true,
        y_reference: typeof ref === "number" && Number.isFinite(ref) ? ref : null,
        x_ticks: kept.map((t) => t.v),
        x_tick_labels: tickLabels.length ? kept.map((t) => t.label ?? "") : [],
        x_range:
          Array.isArray(range) &&
          range.length === 2 &&
          range.every((v) => typeof v === "number" && Number.isFinite(v)) &&
          (range[0] as number) <= (range[1] as number)
            ? [range[0] as number, range[1] as number]
            : null,
        label_points: raw.label_points !== false,
        hint: String(raw.hint ?? ""),
        series: raw.series.map((s, k) => parseSeries(s, `chart "${id}" series ${k}`)),
      });
    } catch (e) {
      problems.push(e instanceof Error ? e.message : String(e));
    }
  });
  return { charts, problems };
}

/** Whether v is drawn on an axis (finite, and > 0 on a log axis). */
export function drawable(v: number | null, log: boolean): v is number {
  return v !== null && Number.isFinite(v) && (!log || v > 0);
}

export interface Axis {
  lo: number;
  hi: number;
  log: boolean;
}

/** The axis range over the drawable values (padded by 5 %, or to a decade on a log axis). */
export function axisRange(values: (number | null)[], log: boolean, include: number[] = []): Axis {
  const vs = [...values, ...include].filter((v): v is number => drawable(v, log));
  if (vs.length === 0) return log ? { lo: 1, hi: 10, log } : { lo: 0, hi: 1, log };
  let lo = Math.min(...vs);
  let hi = Math.max(...vs);
  if (log) {
    lo = Math.log10(lo);
    hi = Math.log10(hi);
    const pad = Math.max(0.05 * (hi - lo), 0.1);
    return { lo: 10 ** (lo - pad), hi: 10 ** (hi + pad), log };
  }
  if (hi === lo) {
    const d = Math.abs(lo) > 0 ? Math.abs(lo) * 0.1 : 1;
    return { lo: lo - d, hi: hi + d, log };
  }
  const pad = 0.05 * (hi - lo);
  return { lo: lo - pad, hi: hi + pad, log };
}

/** Position of v along an axis of the given pixel length, from its low end (0..length). */
export function axisPos(a: Axis, v: number, length: number): number {
  const t = a.log
    ? (Math.log10(v) - Math.log10(a.lo)) / (Math.log10(a.hi) - Math.log10(a.lo))
    : (v - a.lo) / (a.hi - a.lo);
  return t * length;
}

/** Fewest ticks a log axis shows: over a narrow range its powers of ten and 2×, 5× are too few. */
export const MIN_LOG_TICKS = 3;

function linearTicks(lo: number, hi: number, maxCount: number): number[] {
  const d = niceStep((hi - lo) / Math.max(1, maxCount));
  const out: number[] = [];
  for (let k = Math.ceil(lo / d); k * d <= hi + d * 1e-9; k++) {
    const v = Number((k * d).toPrecision(12));
    out.push(Object.is(v, -0) ? 0 : v);
  }
  return out;
}

/**
 * Tick values inside the axis: 1-2-5 steps, or powers of ten (and 2×, 5× for a short log axis).
 * A log axis never shows fewer than MIN_LOG_TICKS where more can be had: it adds the 2× and 5×
 * values, and over a narrow range, where even those are too few, it takes evenly stepped 1-2-5
 * values instead (placed on the log scale).
 */
export function chartTicks(a: Axis, maxCount = 6): number[] {
  if (!a.log) return linearTicks(a.lo, a.hi, maxCount);
  const decades = Math.log10(a.hi) - Math.log10(a.lo);
  let ticks = logTicks(a, maxCount, decades < 1.5 ? [1, 2, 5] : [1]);
  if (ticks.length < MIN_LOG_TICKS) ticks = logTicks(a, maxCount, [1, 2, 5]);
  if (ticks.length >= MIN_LOG_TICKS) return ticks;
  const even = linearTicks(a.lo, a.hi, Math.min(maxCount, 4)).filter((v) => v > 0);
  return even.length > ticks.length ? even : ticks;
}

function logTicks(a: Axis, maxCount: number, mults: readonly number[]): number[] {
  const lo = Math.floor(Math.log10(a.lo));
  const hi = Math.ceil(Math.log10(a.hi));
  const out: number[] = [];
  const every = Math.max(1, Math.ceil((hi - lo) / maxCount));
  for (let e = lo; e <= hi; e++) {
    if ((e - lo) % every !== 0) continue;
    for (const m of mults) {
      const v = Number((m * 10 ** e).toPrecision(12));
      if (v >= a.lo * (1 - 1e-9) && v <= a.hi * (1 + 1e-9)) out.push(v);
    }
  }
  return out;
}

/** Tick label: thousands with separators ("15,360"), else the colorbar's compact format. */
export function formatChartTick(v: number): string {
  if (Number.isInteger(v) && Math.abs(v) >= 1000 && Math.abs(v) < 1e9) {
    return v.toLocaleString("en-US");
  }
  return formatTick(v);
}

export interface ChartPoint {
  series: number;
  index: number;
  x: number; // px, relative to the chart box
  y: number;
}

export interface ChartBox extends Rect {
  plot: Rect; // relative to the box
  title: string;
  subtitleLines: string[];
  noteLines: string[];
  /** Baseline of the first note line, relative to the box. */
  noteY: number;
  xAxis: Axis;
  yAxis: Axis;
  xTicks: { pos: number; label: string }[]; // pos: px from the plot's left
  yTicks: { pos: number; label: string }[]; // pos: px from the plot's top
  points: ChartPoint[];
  /** Line segments per series, each a list of connected points (broken where a value is missing). */
  lines: { series: number; path: [number, number][] }[];
  /** y of the reference line in px from the plot's top, or null. */
  reference: number | null;
  /** Where the legend's entries go (relative to the box), one per named series. */
  legend: { series: number; x: number; y: number }[];
  /** Names printed beside the points (see pointLabels): text baseline at (x, y), left-aligned. */
  labels: PointLabel[];
}

export interface PointLabel {
  series: number;
  index: number;
  text: string;
  x: number;
  y: number;
}

/** Points of one chart beyond which none is named on the chart (as the matplotlib export). */
export const MAX_LABELLED_POINTS = 16;
const LABEL_H = 10;
const LABEL_GAP = 4;

function overlaps(a: Rect, b: Rect): boolean {
  return a.x < b.x + b.w && b.x < a.x + a.w && a.y < b.y + b.h && b.y < a.y + a.h;
}

/**
 * Names beside the points of a chart with at most MAX_LABELLED_POINTS points in series that are not
 * plain lines: the first line of each point's hover text (a variant's spec), to the upper right of
 * the point, else the lower right, upper left or lower left; a name that fits nowhere inside the plot
 * without covering another name or another point is left out (its hover still gives it).
 */
export function pointLabels(
  chart: Chart,
  points: readonly ChartPoint[],
  plot: Rect,
  measure: Measure,
): PointLabel[] {
  if (!chart.label_points || points.length === 0 || points.length > MAX_LABELLED_POINTS) return [];
  const taken: Rect[] = points.map((p) => ({ x: p.x - 3, y: p.y - 3, w: 6, h: 6 }));
  const out: PointLabel[] = [];
  points.forEach((p, k) => {
    const text = (chart.series[p.series]?.labels[p.index] ?? "").split("\n", 1)[0];
    if (!text) return;
    const w = measure(text, FONTS.tick);
    const spots: Rect[] = [
      { x: p.x + LABEL_GAP, y: p.y - LABEL_GAP - LABEL_H, w, h: LABEL_H },
      { x: p.x + LABEL_GAP, y: p.y + LABEL_GAP, w, h: LABEL_H },
      { x: p.x - LABEL_GAP - w, y: p.y - LABEL_GAP - LABEL_H, w, h: LABEL_H },
      { x: p.x - LABEL_GAP - w, y: p.y + LABEL_GAP, w, h: LABEL_H },
    ];
    const inside = (r: Rect) =>
      r.x >= plot.x &&
      r.y >= plot.y &&
      r.x + r.w <= plot.x + plot.w &&
      r.y + r.h <= plot.y + plot.h;
    const spot = spots.find((r) => inside(r) && !taken.some((t, j) => j !== k && overlaps(r, t)));
    if (!spot) return;
    taken.push(spot);
    out.push({ series: p.series, index: p.index, text, x: spot.x, y: spot.y + LABEL_H - 1 });
  });
  return out;
}

export const CHART_W = 480;
export const CHART_MIN_W = 300;
export const CHART_PLOT_H = 240;
const AXIS_LABEL_H = 14;
const LEFT_MARGIN = 58;
const LEGEND_LINE_H = 15;
const LEGEND_SWATCH = 18;

/** Lay out one chart in a box `width` px wide (CHART_W when there is room). */
export function layoutChart(chart: Chart, width: number, measure: Measure): ChartBox {
  const w = Math.max(CHART_MIN_W, Math.min(width, CHART_W));
  const inner = w - 2 * PAD;
  let y = PAD + TITLE_H;
  const subtitleLines = chart.subtitle
    ? wrapText(chart.subtitle, inner, FONTS.subtitle, measure, 3)
    : [];
  y += subtitleLines.length * SUBTITLE_H + 6;
  const named = chart.series.map((s, i) => ({ s, i })).filter(({ s }) => s.name);
  // The legend sits above the plot, wrapped to the box width, so it never covers a point.
  const legend: { series: number; x: number; y: number }[] = [];
  let lx = PAD;
  for (const { s, i } of named) {
    const ew = LEGEND_SWATCH + 4 + measure(s.name, FONTS.tick) + 14;
    if (lx > PAD && lx + ew > w - PAD) {
      lx = PAD;
      y += LEGEND_LINE_H;
    }
    legend.push({ series: i, x: lx, y: y + 10 });
    lx += ew;
  }
  if (legend.length) y += LEGEND_LINE_H + 4;
  const plot: Rect = { x: LEFT_MARGIN, y, w: w - LEFT_MARGIN - PAD - 4, h: CHART_PLOT_H };
  y += plot.h + 4 + 13 + AXIS_LABEL_H + 4;
  const noteY = y + 10;
  const note = [chart.note, chart.hint].filter((t) => t).join(" · ");
  const noteLines = note ? wrapText(note, inner, FONTS.note, measure, 4) : [];
  y += noteLines.length * NOTE_LINE_H + PAD;

  const xs = chart.x_range ?? chart.series.flatMap((s) => s.x);
  const ys = chart.series.flatMap((s) => s.y);
  const xAxis = axisRange(xs, chart.x_log);
  const yAxis = axisRange(ys, chart.y_log, chart.y_reference === null ? [] : [chart.y_reference]);
  const px = (v: number) => plot.x + axisPos(xAxis, v, plot.w);
  const py = (v: number) => plot.y + plot.h - axisPos(yAxis, v, plot.h);
  const tickText = (v: number, i: number) =>
    chart.x_tick_labels.length ? chart.x_tick_labels[i] : formatChartTick(v);
  const xTicks = chart.x_ticks.length
    ? chart.x_ticks
        .map((v, i) => ({ v, label: tickText(v, i) }))
        .filter(({ v }) => drawable(v, chart.x_log) && v >= xAxis.lo && v <= xAxis.hi)
        .map(({ v, label }) => ({ pos: axisPos(xAxis, v, plot.w), label }))
    : chartTicks(xAxis, Math.max(2, Math.floor(plot.w / 80))).map((v) => ({
        pos: axisPos(xAxis, v, plot.w),
        label: formatChartTick(v),
      }));
  const yTicks = chartTicks(yAxis, 5).map((v) => ({
    pos: plot.h - axisPos(yAxis, v, plot.h),
    label: formatChartTick(v),
  }));
  const points: ChartPoint[] = [];
  const lines: { series: number; path: [number, number][] }[] = [];
  chart.series.forEach((s, si) => {
    let path: [number, number][] = [];
    s.x.forEach((xv, i) => {
      const yv = s.y[i];
      if (drawable(xv, chart.x_log) && drawable(yv, chart.y_log)) {
        const p: [number, number] = [px(xv), py(yv)];
        if (s.style !== "line") points.push({ series: si, index: i, x: p[0], y: p[1] });
        path.push(p);
      } else if (path.length) {
        lines.push({ series: si, path });
        path = [];
      }
    });
    if (path.length) lines.push({ series: si, path });
  });
  const drawnLines = lines.filter((l) => chart.series[l.series].style !== "points");
  const reference =
    chart.y_reference !== null && drawable(chart.y_reference, chart.y_log)
      ? py(chart.y_reference) - plot.y
      : null;
  return {
    x: 0,
    y: 0,
    w,
    h: y,
    plot,
    title: fitText(chart.title, inner, FONTS.title, measure),
    subtitleLines,
    noteLines,
    noteY,
    xAxis,
    yAxis,
    xTicks,
    yTicks,
    points,
    lines: drawnLines,
    reference,
    legend,
    labels: pointLabels(chart, points, plot, measure),
  };
}

/** Baseline of the title, relative to the box. */
export const CHART_TITLE_Y = PAD + 12;
/** Baseline of the first subtitle line, relative to the box. */
export const CHART_SUBTITLE_Y = PAD + TITLE_H + 11;

/** Charts placed left to right, wrapping to `width`; returns each box placed and the total size. */
export function layoutCharts(
  charts: Chart[],
  width: number,
  measure: Measure,
  gap = 16,
): { boxes: ChartBox[]; w: number; h: number } {
  const boxes: ChartBox[] = [];
  let x = 0;
  let y = 0;
  let rowH = 0;
  let maxW = 0;
  for (const c of charts) {
    const b = layoutChart(c, width, measure);
    if (x > 0 && x + b.w > width) {
      x = 0;
      y += rowH + gap;
      rowH = 0;
    }
    b.x = x;
    b.y = y;
    x += b.w + gap;
    rowH = Math.max(rowH, b.h);
    maxW = Math.max(maxW, b.x + b.w);
    boxes.push(b);
  }
  return { boxes, w: maxW, h: boxes.length ? y + rowH : 0 };
}

/** The point nearest (x, y) in box coordinates within `radius` px, or null. */
export function nearestPoint(box: ChartBox, x: number, y: number, radius = 10): ChartPoint | null {
  let best: ChartPoint | null = null;
  let bestD = radius * radius;
  for (const p of box.points) {
    const d = (p.x - x) ** 2 + (p.y - y) ** 2;
    if (d <= bestD) {
      best = p;
      bestD = d;
    }
  }
  return best;
}

/** The colour of series i of a chart. */
export function seriesColor(chart: Chart, i: number): string {
  return chart.series[i]?.color || PALETTE[i % PALETTE.length];
}
