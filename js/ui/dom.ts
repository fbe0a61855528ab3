/**
 * Small DOM helpers.  All text goes through textContent; nothing here ever
 * parses HTML.
 */

import { approxMeasure, type Measure } from "../lib/text";

export interface ElementOptions {
  className?: string;
  text?: string;
  attrs?: Record<string, string>;
}

/**
 * Form controls that own their keys. JupyterLab binds notebook shortcuts (ArrowRight moves the cell
 * cursor) on any focused element it does not consider editable, range inputs included; this
 * attribute makes it leave the key to the control.
 */
const OWNS_KEYS = new Set(["input", "select", "button", "textarea"]);

export function h<K extends keyof HTMLElementTagNameMap>(
  doc: Document,
  tag: K,
  opts: ElementOptions = {},
  children: Node[] = [],
): HTMLElementTagNameMap[K] {
  const e = doc.createElement(tag);
  if (OWNS_KEYS.has(tag)) e.setAttribute("data-lm-suppress-shortcuts", "true");
  if (opts.className) e.className = opts.className;
  if (opts.text !== undefined) e.textContent = opts.text;
  for (const [k, v] of Object.entries(opts.attrs ?? {})) e.setAttribute(k, v);
  for (const c of children) e.appendChild(c);
  return e;
}

/** Set text content, touching the DOM only when it changes. */
export function setText(e: Element, text: string): void {
  if (e.textContent !== text) e.textContent = text;
}

export function setHidden(e: HTMLElement, hidden: boolean): void {
  if (e.hidden !== hidden) e.hidden = hidden;
}

/** 2D context or null (jsdom has no canvas). */
export function context2d(canvas: HTMLCanvasElement): CanvasRenderingContext2D | null {
  try {
    return canvas.getContext("2d");
  } catch {
    return null;
  }
}

/** Canvas text measurement when a canvas exists, else an estimate. */
export function makeMeasure(doc: Document): Measure {
  const ctx = context2d(doc.createElement("canvas"));
  if (!ctx) return approxMeasure;
  const cache = new Map<string, number>();
  return (text, f) => {
    const key = `${f}\u0000${text}`;
    let w = cache.get(key);
    if (w === undefined) {
      ctx.font = f;
      w = ctx.measureText(text).width;
      if (cache.size > 5000) cache.clear();
      cache.set(key, w);
    }
    return w;
  };
}

/**
 * Size a canvas to CSS size (w, h) at the given device pixel ratio; true when its pixel size
 * changed (which clears it).
 */
export function sizeCanvas(c: HTMLCanvasElement, w: number, h: number, dpr: number): boolean {
  const pw = Math.max(1, Math.round(w * dpr));
  const ph = Math.max(1, Math.round(h * dpr));
  const resized = c.width !== pw || c.height !== ph;
  if (c.width !== pw) c.width = pw;
  if (c.height !== ph) c.height = ph;
  const sw = `${w}px`;
  const sh = `${h}px`;
  if (c.style.width !== sw) c.style.width = sw;
  if (c.style.height !== sh) c.style.height = sh;
  return resized;
}

/**
 * Size a canvas to hold at least CSS size (w, h) at the given device pixel ratio, one canvas pixel
 * per device pixel, growing only: a smaller size keeps the pixels it has (the caller draws within
 * (w, h), and the element that holds the canvas clips the rest), so that a relayout back and forth
 * (columns, a window resized) allocates no pixels. A new device pixel ratio sizes it anew. True when
 * its pixel size changed (which clears it).
 */
export function growCanvas(c: HTMLCanvasElement, w: number, h: number, dpr: number): boolean {
  const same = c.dataset.dpr === String(dpr);
  const pw = Math.max(1, Math.round(w * dpr), same ? c.width : 0);
  const ph = Math.max(1, Math.round(h * dpr), same ? c.height : 0);
  c.dataset.dpr = String(dpr);
  return sizeCanvas(c, pw / dpr, ph / dpr, dpr);
}
