/**
 * Typed access to the anywidget model.  Traits may be missing (older Python
 * side) or of the wrong type; getters fall back instead of throwing.
 */

import type { AnyModel } from "@anywidget/types";

export type Model = AnyModel;
// biome-ignore lint/suspicious/noExplicitAny: anywidget hands handlers untyped arguments
export type Handler = (...args: any[]) => void;

export function getNumber(model: Model, key: string, fallback = 0): number {
  const v = model.get(key);
  const n = typeof v === "number" ? v : Number(v);
  return v === null || v === undefined || Number.isNaN(n) ? fallback : n;
}

export function getString(model: Model, key: string, fallback = ""): string {
  const v = model.get(key);
  return v === null || v === undefined ? fallback : String(v);
}

export function getStringList(model: Model, key: string): string[] {
  const v = model.get(key);
  return Array.isArray(v) ? v.map((x) => String(x)) : [];
}

/** Set traits and send them to the kernel in one message. */
export function commit(model: Model, values: Record<string, unknown>): void {
  for (const [k, v] of Object.entries(values)) model.set(k, v);
  model.save_changes();
}

/**
 * Listen to `change:<key>` for every key; returns a function that removes
 * exactly these listeners (other views of the same model keep theirs).
 */
export function onChanges(model: Model, keys: readonly string[], cb: () => void): () => void {
  const handler: Handler = () => cb();
  for (const k of keys) model.on(`change:${k}`, handler);
  return () => {
    for (const k of keys) model.off(`change:${k}`, handler);
  };
}
