import { describe, expect, it } from "vitest";
import {
  colorize,
  colorizeWire,
  colormapStops,
  halfColorTable,
  NAN_COLOR,
  packedColormap,
  packRGBA,
  valueToColor,
  valueToIndex,
} from "../../js/lib/colormap";
import { halfToFloat } from "../../js/lib/decode";
import tables from "../../python/headwidget/colormaps.json";

describe("colormaps.json", () => {
  it.each(["diverging", "magma"] as const)("%s has 256 integer RGB entries", (name) => {
    const stops = tables[name].stops;
    expect(stops).toHaveLength(256);
    for (const c of stops) {
      expect(c).toHaveLength(3);
      for (const x of c) expect(Number.isInteger(x) && x >= 0 && x <= 255).toBe(true);
    }
  });

  it("diverging goes blue -> exactly white at 128 -> red", () => {
    const s = colormapStops("diverging");
    expect(s[0]).toEqual([5, 48, 97]);
    expect(s[255]).toEqual([103, 0, 31]);
    expect(s[128]).toEqual([255, 255, 255]);
    expect(Math.min(...s[127])).toBeGreaterThanOrEqual(250);
    expect(s[0][2]).toBeGreaterThan(s[0][0]); // blue end
    expect(s[255][0]).toBeGreaterThan(s[255][2]); // red end
  });

  it("magma has matplotlib's endpoints and rises in brightness", () => {
    const s = colormapStops("magma");
    expect(s[0]).toEqual([0, 0, 4]);
    expect(s[255]).toEqual([252, 253, 191]);
    const lum = (c: readonly number[]) => 0.2126 * c[0] + 0.7152 * c[1] + 0.0722 * c[2];
    for (let i = 8; i < 256; i += 8) expect(lum(s[i])).toBeGreaterThan(lum(s[i - 8]));
  });

  it("nan colour differs from every colormap entry", () => {
    for (const name of ["diverging", "magma"]) {
      for (const c of colormapStops(name)) {
        const d = Math.max(...c.map((x, k) => Math.abs(x - NAN_COLOR[k])));
        expect(d).toBeGreaterThanOrEqual(60);
      }
    }
  });

  it("unknown names fall back to diverging", () => {
    expect(colormapStops("nope")).toBe(colormapStops("diverging"));
  });
});

describe("valueToIndex", () => {
  it("maps the ends and the middle of [-1, 1]", () => {
    expect(valueToIndex(-1, -1, 1)).toBe(0);
    expect(valueToIndex(1, -1, 1)).toBe(255);
    expect(valueToIndex(0, -1, 1)).toBe(128);
    expect(valueToColor(0, -1, 1, "diverging")).toEqual([255, 255, 255]);
  });

  it("clamps, rounds half up, and handles NaN, infinities and a degenerate scale", () => {
    expect(valueToIndex(-5, -1, 1)).toBe(0);
    expect(valueToIndex(5, -1, 1)).toBe(255);
    expect(valueToIndex(Infinity, 0, 1)).toBe(255);
    expect(valueToIndex(-Infinity, 0, 1)).toBe(0);
    expect(valueToIndex(0.5 / 255, 0, 1)).toBe(1); // t*255 = 0.5 -> 1
    expect(valueToIndex(0.49 / 255, 0, 1)).toBe(0);
    expect(valueToIndex(NaN, 0, 1)).toBe(-1);
    expect(valueToIndex(3, 2, 2)).toBe(128);
    expect(valueToIndex(3, 2, 1)).toBe(128);
    expect(valueToColor(NaN, 0, 1, "magma")).toEqual(NAN_COLOR);
  });
});

describe("colorize", () => {
  const bytesOf = (u32: Uint32Array, i: number) => [...new Uint8Array(u32.buffer, i * 4, 4)];

  it("packs colours in ImageData byte order", () => {
    const u = new Uint32Array([packRGBA([1, 2, 3])]);
    expect(bytesOf(u, 0)).toEqual([1, 2, 3, 255]);
  });

  it("agrees with valueToColor for every kind of value", () => {
    const values = [-2, -1, -0.5, -1e-9, 0, 1e-9, 0.25, 0.999, 1, 3, NaN, Infinity, -Infinity];
    for (let i = 0; i < 200; i++) values.push(Math.sin(i * 12.9898) * 1.3);
    const f = Float32Array.from(values);
    for (const [name, lo, hi] of [
      ["diverging", -1, 1],
      ["magma", 0, 1],
      ["magma", 0.3, 0.3],
    ] as const) {
      const out = new Uint32Array(f.length);
      colorize(f, lo, hi, packedColormap(name), out);
      f.forEach((v, i) => {
        expect(bytesOf(out, i)).toEqual([...valueToColor(v, lo, hi, name), 255]);
      });
    }
  });
});

describe("float16 colouring", () => {
  it("colours every half-precision pattern like colorize does its value", () => {
    const halves = new Uint16Array(65536).map((_, i) => i);
    const values = new Float32Array(65536).map((_, i) => halfToFloat(i));
    for (const [name, lo, hi] of [
      ["diverging", -1, 1],
      ["magma", 0, 1],
      ["magma", 0.3, 0.3],
      ["diverging", -0.177, 0.52],
    ] as const) {
      const cmap = packedColormap(name);
      const want = new Uint32Array(65536);
      colorize(values, lo, hi, cmap, want);
      const got = new Uint32Array(65536);
      colorizeWire(halves, lo, hi, cmap, got);
      const first = got.findIndex((c, i) => c !== want[i]);
      expect(first, `${name} [${lo}, ${hi}]: first differing pattern`).toBe(-1);
    }
  });

  it("keeps the tables of recent scales", () => {
    const d = packedColormap("diverging");
    const a = halfColorTable(-1, 1, d);
    const b = halfColorTable(0, 1, packedColormap("magma"));
    expect(halfColorTable(-1, 1, d)).toBe(a);
    expect(halfColorTable(0, 1, packedColormap("magma"))).toBe(b);
    expect(halfColorTable(-0.5, 1, d)).not.toBe(a);
  });
});
