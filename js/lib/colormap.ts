/**
 * Colour scales.  The tables live in python/headwidget/colormaps.json, the
 * single source shared with Python: 256 [r, g, b] entries per colormap plus
 * `nan_color` for undefined cells.
 *
 * Value -> entry rule (Python must reproduce it exactly):
 *
 *     t = (v - vmin) / (vmax - vmin)     computed in float64;
 *                                         if not (vmax > vmin): t = 0.5
 *     t = min(max(t, 0), 1)               (+inf -> 1, -inf -> 0)
 *     index = Math.round(t * 255)         round half up; numpy: floor(t*255 + 0.5)
 *     NaN -> nan_color
 *
 * So with vmin=-1, vmax=1: -1 -> 0, 1 -> 255, 0 -> 128.  In "diverging",
 * entry 128 is exactly white [255, 255, 255] and entry 127 is white-ish
 * (the last step of the blue half).  "magma" is matplotlib's magma table.
 */

import tables from "../../python/headwidget/colormaps.json";
import { halfLookup, type WireValues } from "./decode";

export type RGB = readonly [number, number, number];

export const COLORMAP_NAMES = ["diverging", "magma"] as const;
export type ColormapName = (typeof COLORMAP_NAMES)[number];

export const DEFAULT_COLORMAP: ColormapName = "diverging";

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

export function isColormapName(x: unknown): x is ColormapName {
  return typeof x === "string" && (COLORMAP_NAMES as readonly string[]).includes(x);
}

/** The 256 entries of a colormap; unknown names fall back to "diverging". */
export function colormapStops(name: string): readonly RGB[] {
  const key = isColormapName(name) ? name : DEFAULT_COLORMAP;
  return tables[key].stops as unknown as RGB[];
}

export const NAN_COLOR: RGB = tables.nan_color as unknown as RGB;

/** Table index for value v; -1 for NaN. */
export function valueToIndex(v: number, vmin: number, vmax: number): number {
  if (Number.isNaN(v)) return -1;
  let t = vmax > vmin ? (v - vmin) / (vmax - vmin) : 0.5;
  if (Number.isNaN(t)) t = 0.5; // only when vmin/vmax are infinite
  if (t < 0) t = 0;
  else if (t > 1) t = 1;
  return Math.round(t * 255);
}

export function valueToColor(v: number, vmin: number, vmax: number, name: string): RGB {
  const i = valueToIndex(v, vmin, vmax);
  return i < 0 ? NAN_COLOR : colormapStops(name)[i];
}

/** Pack an opaque colour the way a Uint32Array view of ImageData reads it. */
export function packRGBA(c: RGB): number {
  const [r, g, b] = c;
  return LITTLE_ENDIAN
    ? ((255 << 24) | (b << 16) | (g << 8) | r) >>> 0
    : ((r << 24) | (g << 16) | (b << 8) | 255) >>> 0;
}

export interface PackedColormap {
  name: ColormapName;
  lut: Uint32Array; // 256 packed colours
  nan: number; // packed nan colour
}

const packedCache = new Map<string, PackedColormap>();

export function packedColormap(name: string): PackedColormap {
  const key = isColormapName(name) ? name : DEFAULT_COLORMAP;
  let p = packedCache.get(key);
  if (!p) {
    const lut = new Uint32Array(256);
    colormapStops(key).forEach((c, i) => {
      lut[i] = packRGBA(c);
    });
    p = { name: key, lut, nan: packRGBA(NAN_COLOR) };
    packedCache.set(key, p);
  }
  return p;
}

/**
 * Colour every value into `out` (a Uint32Array view over ImageData pixels).
 * Same rule as valueToIndex, inlined for speed.
 */
export function colorize(
  values: Float32Array,
  vmin: number,
  vmax: number,
  cmap: PackedColormap,
  out: Uint32Array,
): void {
  const { lut, nan } = cmap;
  const n = Math.min(values.length, out.length);
  const span = vmax - vmin;
  if (!(vmax > vmin) || !Number.isFinite(span)) {
    for (let i = 0; i < n; i++) {
      const k = valueToIndex(values[i], vmin, vmax);
      out[i] = k < 0 ? nan : lut[k];
    }
    return;
  }
  for (let i = 0; i < n; i++) {
    const v = values[i];
    if (Number.isNaN(v)) {
      out[i] = nan; // NaN
      continue;
    }
    let t = (v - vmin) / span;
    if (t < 0) t = 0;
    else if (t > 1) t = 1;
    out[i] = lut[Math.round(t * 255)];
  }
}

/** Scales whose float16 colour tables are kept (a few views on one page, each with its own). */
const HALF_TABLES_KEPT = 4;
const halfTables = new Map<string, Uint32Array>();

/**
 * The packed colour of every float16 bit pattern under one scale (65536 entries, 256 KiB),
 * by the rule of valueToIndex.  The tables of the last few scales are kept, so colouring many
 * panels, or many frames, with one scale builds its table once.
 */
export function halfColorTable(vmin: number, vmax: number, cmap: PackedColormap): Uint32Array {
  const key = `${cmap.name}|${vmin}|${vmax}`;
  let table = halfTables.get(key);
  if (table) {
    halfTables.delete(key); // most recently used last
  } else {
    table = new Uint32Array(65536);
    colorize(halfLookup(), vmin, vmax, cmap, table);
    if (halfTables.size >= HALF_TABLES_KEPT) {
      const oldest = halfTables.keys().next().value;
      if (oldest !== undefined) halfTables.delete(oldest);
    }
  }
  halfTables.set(key, table);
  return table;
}

/**
 * Colour wire values into `out`: float16 patterns through halfColorTable (one table read per
 * cell), float32 values through colorize.  Both follow valueToIndex exactly.
 */
export function colorizeWire(
  raw: WireValues,
  vmin: number,
  vmax: number,
  cmap: PackedColormap,
  out: Uint32Array,
): void {
  if (!(raw instanceof Uint16Array)) {
    colorize(raw, vmin, vmax, cmap, out);
    return;
  }
  const table = halfColorTable(vmin, vmax, cmap);
  const n = Math.min(raw.length, out.length);
  for (let i = 0; i < n; i++) out[i] = table[raw[i]];
}

/** CSS colour string for an RGB triple. */
export function cssColor(c: RGB): string {
  return `rgb(${c[0]}, ${c[1]}, ${c[2]})`;
}
