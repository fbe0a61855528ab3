/**
 * The control bar's description as Python sends it (the `controls` trait):
 * one entry per control, naming the trait it sets and the traits it reads.
 * Pure: parsing, the traits to listen to, and the texts beside sliders.
 *
 * - slider: `trait` in 0 .. `count` - 1, with the `text` trait beside it;
 * - window: a window [`trait`, `trait` + `width`) inside 0 .. `total`;
 * - toggles / select: one entry of the `options` list; checklist: a sub-list.
 */

export const CONTROL_TYPES = ["slider", "window", "toggles", "select", "checklist"] as const;
export type ControlType = (typeof CONTROL_TYPES)[number];

export interface ControlSpec {
  trait: string;
  type: ControlType;
  label: string;
  count: string;
  text: string;
  width: string;
  total: string;
  options: string;
}

const REFERENCES = ["count", "text", "width", "total", "options"] as const;

/** The references each type cannot do without. */
const REQUIRED: Record<ControlType, readonly (typeof REFERENCES)[number][]> = {
  slider: ["count"],
  window: ["width", "total"],
  toggles: ["options"],
  select: ["options"],
  checklist: ["options"],
};

function text(value: unknown): string {
  return typeof value === "string" ? value : "";
}

/** The well-formed entries of a `controls` value, in order; anything else is left out. */
export function parseControls(value: unknown): ControlSpec[] {
  if (!Array.isArray(value)) return [];
  const specs: ControlSpec[] = [];
  for (const entry of value) {
    if (!entry || typeof entry !== "object") continue;
    const e = entry as Record<string, unknown>;
    const type = text(e.type) as ControlType;
    if (!CONTROL_TYPES.includes(type) || !text(e.trait)) continue;
    const spec: ControlSpec = {
      trait: text(e.trait),
      type,
      label: text(e.label),
      count: text(e.count),
      text: text(e.text),
      width: text(e.width),
      total: text(e.total),
      options: text(e.options),
    };
    if (REQUIRED[type].every((k) => spec[k] !== "")) specs.push(spec);
  }
  return specs;
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
