/**
 * The control bar's description as Python sends it (the `controls` trait):
 * one entry per control, naming the trait it sets and the traits it reads.
 * Pure: parsing, the traits to listen to, and the texts beside sliders.
 *
 * - slider: `trait` in 0 .. `count` - 1, with the `text` trait beside it; with a `positions`
 *   trait (a list of numbers, not empty), only those values, in its order (see `sliderStops`);
 *   with `play`, a play/pause button that moves it one position at a time to the last (see
 *   `playNext`);
 * - window: a window [`trait`, `trait` + `width`) inside 0 .. `total`; with a `step` trait
 *   holding more than 1 (e.g. a head's channels), start and width snap to its multiples;
 * - toggles / select: one entry of the `options` list; checklist: a sub-list; each option shown
 *   as its text in `labels` (an object), if it has one;
 * - entry: a text field whose submitted text is set on `trait` (e.g. a spec to add).
 */

import { CONTROL_TYPES, type ControlType } from "./protocol";

export type { ControlType };

export interface ControlSpec {
  trait: string;
  type: ControlType;
  label: string;
  count: string;
  text: string;
  width: string;
  total: string;
  options: string;
  step: string;
  /** A slider's trait listing the values it stops at ("": every one of 0 .. count - 1). */
  positions: string;
  /** What an option is shown as: option → text. */
  labels: Record<string, string>;
  /** A slider with a play/pause button: true, else absent (every other type: absent). */
  play?: true;
}

const REFERENCES = ["count", "text", "width", "total", "options", "step", "positions"] as const;

/** Whether `type` is a control type this page knows (`protocol.ts`: CONTROL_TYPES). */
export function isControlType(type: unknown): type is ControlType {
  return typeof type === "string" && Object.hasOwn(CONTROL_TYPES, type);
}

function text(value: unknown): string {
  return typeof value === "string" ? value : "";
}

/** The string entries of a plain object (anything else: none). */
function stringMap(value: unknown): Record<string, string> {
  const out: Record<string, string> = Object.create(null);
  if (!value || typeof value !== "object" || Array.isArray(value)) return out;
  for (const [k, v] of Object.entries(value)) if (typeof v === "string") out[k] = v;
  return out;
}

export interface ParsedControls {
  specs: ControlSpec[];
  /** Why an entry is not in `specs`: a control of an unknown type, or one that lacks a field. */
  problems: string[];
}

/** The well-formed entries of a `controls` value, in order, and what is wrong with the others. */
export function parseControls(value: unknown): ParsedControls {
  const specs: ControlSpec[] = [];
  const problems: string[] = [];
  for (const entry of Array.isArray(value) ? value : []) {
    const e = (entry && typeof entry === "object" ? entry : {}) as Record<string, unknown>;
    const type = e.type;
    const name = text(e.trait) ? `"${text(e.trait)}"` : "without a trait";
    if (!isControlType(type)) {
      const known = Object.keys(CONTROL_TYPES).join(", ");
      problems.push(
        `control ${name}: unknown control type ${JSON.stringify(type)} (this page knows ${known})`,
      );
      continue;
    }
    const spec: ControlSpec = {
      trait: text(e.trait),
      type,
      label: text(e.label),
      count: text(e.count),
      text: text(e.text),
      width: text(e.width),
      total: text(e.total),
      options: text(e.options),
      step: text(e.step),
      positions: text(e.positions),
      labels: stringMap(e.labels),
    };
    if (type === "slider" && e.play === true) spec.play = true;
    const missing = [
      ...(text(e.trait) ? [] : ["trait"]),
      ...CONTROL_TYPES[type].filter((k) => spec[k] === ""),
    ];
    if (missing.length > 0) problems.push(`${type} control ${name} lacks ${missing.join(", ")}`);
    else specs.push(spec);
  }
  return { specs, problems };
}

/** Every trait the controls set or read, once each: what the bar listens to. */
export function controlTraits(specs: readonly ControlSpec[]): string[] {
  const names = new Set<string>();
  for (const s of specs) {
    names.add(s.trait);
    for (const k of REFERENCES) if (s[k]) names.add(s[k]);
  }
  return [...names];
}

/** "channels 64–127 of 128": a window of `noun` (lower case) clamped to the total. */
export function windowText(noun: string, start: number, width: number, total: number): string {
  const end = Math.min(total, start + width) - 1;
  return `${noun} ${start}–${end} of ${total}`;
}

/** The longest text windowText gives for `total` items: what a read-out must leave room for. */
export function longestWindowText(noun: string, total: number): string {
  const d = "8".repeat(String(Math.max(0, total)).length);
  return `${noun} ${d}–${d} of ${d}`;
}

/** Snap step: a positive integer; anything else (0, 1, missing) means no snapping. */
export function snapStep(step: number): number {
  return Number.isFinite(step) && step > 1 ? Math.floor(step) : 1;
}

/**
 * A window [start, start + width) of `total` items on the grid of `step`: width a multiple of
 * step (at least step, at most total), start a multiple of step, the window inside the total.
 * With step 1 this only clamps.
 *
 *     snapWindow(70, 60, 192, 64) -> { start: 64, width: 64 }
 */
export function snapWindow(
  start: number,
  width: number,
  total: number,
  step: number,
): { start: number; width: number } {
  const k = snapStep(step);
  const most = Math.max(0, total);
  let w = Math.round(width / k) * k;
  w = Math.min(Math.max(w, Math.min(k, most)), most);
  if (w < 1) w = Math.min(1, most);
  const last = Math.max(0, most - w);
  let s = Math.round(start / k) * k;
  s = Math.min(Math.max(s, 0), last);
  if (s % k !== 0) s = Math.floor(s / k) * k; // the end of a total that is not a multiple
  return { start: s, width: w };
}

/**
 * The values a slider stops at, in order: its `positions` when they are a non-empty list of
 * numbers, else 0 .. `count` - 1.  The range input runs over their indices.
 *
 *     sliderStops(3, []) -> [0, 1, 2];  sliderStops(30, [8, 9, 10]) -> [8, 9, 10]
 */
export function sliderStops(count: number, positions: unknown): number[] {
  if (Array.isArray(positions) && positions.length > 0) {
    const numbers = positions.map(Number);
    if (numbers.every(Number.isFinite)) return numbers;
  }
  return Array.from({ length: Math.max(0, Math.floor(count)) }, (_, i) => i);
}

/**
 * The index of `value` among `stops`; a value that is not one of them: the nearest (the first
 * of two as near), so the thumb stays on the track.
 *
 *     stopIndex([8, 9, 12], 12) -> 2;  stopIndex([8, 9, 12], 3) -> 0
 */
export function stopIndex(stops: readonly number[], value: number): number {
  let best = 0;
  for (let i = 1; i < stops.length; i++) {
    if (Math.abs(stops[i] - value) < Math.abs(stops[best] - value)) best = i;
  }
  return best;
}

/**
 * The position play moves a slider of `count` positions to from `value`: the next one, or null at
 * the last (play stops there).  Pressing play at the last position starts again from the first
 * (`playStart`).
 *
 *     playNext(3, 5) -> 4;  playNext(4, 5) -> null
 */
export function playNext(value: number, count: number): number | null {
  const v = Number.isFinite(value) ? Math.max(0, Math.floor(value)) : 0;
  return v + 1 < count ? v + 1 : null;
}

/** Where play starts from `value`: there, or at the first position when `value` is the last. */
export function playStart(value: number, count: number): number {
  return playNext(value, count) === null ? 0 : value;
}
