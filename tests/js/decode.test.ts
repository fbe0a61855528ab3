import { describe, expect, it } from "vitest";
import {
  asBytes,
  decodeValues,
  halfToFloat,
  isDtype,
  wireToFloat32,
  wireValue,
  wireValues,
} from "../../js/lib/decode";

/** Independent half -> float reference: rebuild the float32 bit pattern. */
function halfRef(h: number): number {
  const sign = (h >> 15) & 1;
  let exp = (h >> 10) & 0x1f;
  let frac = h & 0x3ff;
  let bits: number;
  if (exp === 0x1f) bits = (sign << 31) | (0xff << 23) | (frac << 13);
  else if (exp === 0 && frac === 0) bits = sign << 31;
  else {
    if (exp === 0) {
      // normalise the subnormal
      exp = 1;
      while ((frac & 0x400) === 0) {
        frac <<= 1;
        exp--;
      }
      frac &= 0x3ff;
    }
    bits = (sign << 31) | ((exp - 15 + 127) << 23) | (frac << 13);
  }
  const dv = new DataView(new ArrayBuffer(4));
  dv.setUint32(0, bits >>> 0);
  return dv.getFloat32(0);
}

function viewAt(bytes: number[], pad: number): DataView {
  const buf = new ArrayBuffer(pad + bytes.length + 5);
  new Uint8Array(buf, pad).set(bytes);
  return new DataView(buf, pad, bytes.length);
}

function f32Bytes(values: number[]): number[] {
  const dv = new DataView(new ArrayBuffer(values.length * 4));
  values.forEach((v, i) => {
    dv.setFloat32(i * 4, v, true);
  });
  return [...new Uint8Array(dv.buffer)];
}

function u16Bytes(values: number[]): number[] {
  const dv = new DataView(new ArrayBuffer(values.length * 2));
  values.forEach((v, i) => {
    dv.setUint16(i * 2, v, true);
  });
  return [...new Uint8Array(dv.buffer)];
}

const same = (a: ArrayLike<number>, b: ArrayLike<number>) =>
  expect(Array.from(a).map((x) => (Object.is(x, -0) ? "-0" : x))).toEqual(
    Array.from(b).map((x) => (Object.is(x, -0) ? "-0" : x)),
  );

describe("float32", () => {
  const values = [
    0,
    -0,
    1.5,
    -2.25,
    NaN,
    Infinity,
    -Infinity,
    1.401298464324817e-45,
    3.4028234663852886e38,
    0.1,
  ];
  const expected = values.map((v) => Math.fround(v));

  it.each([0, 1, 2, 3, 4, 7])("round-trips from a DataView at byte offset %i", (pad) => {
    same(decodeValues("float32", viewAt(f32Bytes(values), pad), values.length), expected);
  });

  it("accepts ArrayBuffer and Uint8Array", () => {
    const bytes = f32Bytes(values);
    same(decodeValues("float32", new Uint8Array(bytes).buffer, values.length), expected);
    same(decodeValues("float32", new Uint8Array(bytes), values.length), expected);
  });

  it("copies: later writes to the source do not change the result", () => {
    const dv = viewAt(f32Bytes([1, 2]), 4);
    const out = decodeValues("float32", dv, 2);
    dv.setFloat32(0, 99, true);
    same(out, [1, 2]);
  });

  it("ignores trailing bytes and rejects short buffers", () => {
    same(decodeValues("float32", viewAt(f32Bytes([1, 2, 3]), 1), 2), [1, 2]);
    expect(() => decodeValues("float32", viewAt(f32Bytes([1]), 1), 2)).toThrow(/4 bytes.*needs 8/);
  });
});

describe("float16", () => {
  it("decodes every bit pattern like the reference", () => {
    const bad: string[] = [];
    for (let h = 0; h < 65536; h++) {
      const got = halfToFloat(h);
      const want = halfRef(h);
      if (!Object.is(got, want)) bad.push(`0x${h.toString(16)}: ${got} vs ${want}`);
    }
    expect(bad).toEqual([]);
  });

  it("decodes the special values", () => {
    expect(halfToFloat(0x3c00)).toBe(1);
    expect(halfToFloat(0xc000)).toBe(-2);
    expect(halfToFloat(0x7bff)).toBe(65504);
    expect(halfToFloat(0x0001)).toBe(2 ** -24); // smallest subnormal
    expect(halfToFloat(0x03ff)).toBe(1023 * 2 ** -24); // largest subnormal
    expect(halfToFloat(0x0400)).toBe(2 ** -14); // smallest normal
    expect(halfToFloat(0x7c00)).toBe(Infinity);
    expect(halfToFloat(0xfc00)).toBe(-Infinity);
    expect(halfToFloat(0x7e00)).toBeNaN();
    expect(Object.is(halfToFloat(0x8000), -0)).toBe(true);
  });

  it.each([0, 1, 2, 3])("decodes a buffer at byte offset %i", (pad) => {
    const bits = [0x3c00, 0x0001, 0x83ff, 0x7c00, 0xfc00, 0x7e01, 0x8000, 0x3555];
    const out = decodeValues("float16", viewAt(u16Bytes(bits), pad), bits.length);
    same(
      out,
      bits.map((b) => Math.fround(halfRef(b))),
    );
  });
});

describe("wireValues", () => {
  it.each([0, 1, 2, 3, 4])(
    "views float32 data at byte offset %i, copying only when misaligned",
    (pad) => {
      const dv = viewAt(f32Bytes([1.5, -2, NaN]), pad);
      const raw = wireValues("float32", dv, 3);
      expect(raw).toBeInstanceOf(Float32Array);
      expect(raw.buffer === dv.buffer).toBe(pad % 4 === 0);
      same(raw as Float32Array, [1.5, -2, NaN]);
      expect(wireToFloat32(raw)).toBe(raw);
      expect([wireValue(raw, 1), wireValue(raw, 3), wireValue(raw, -1)]).toEqual([-2, NaN, NaN]);
    },
  );

  it.each([0, 1, 2])("keeps float16 bit patterns at byte offset %i", (pad) => {
    const bits = [0x3c00, 0x0001, 0x7e01, 0xc000];
    const raw = wireValues("float16", viewAt(u16Bytes(bits), pad), bits.length);
    expect(Array.from(raw)).toEqual(bits);
    expect(wireValue(raw, 3)).toBe(-2);
    same(
      wireToFloat32(raw),
      bits.map((b) => Math.fround(halfRef(b))),
    );
  });

  it("rejects short buffers like decodeValues", () => {
    expect(() => wireValues("float16", viewAt(u16Bytes([1]), 1), 2)).toThrow(/2 bytes.*needs 4/);
  });
});

describe("dtypes", () => {
  it("are exactly what Python sends", () => {
    expect(isDtype("float16")).toBe(true);
    expect(isDtype("float32")).toBe(true);
    expect(isDtype("uint8")).toBe(false);
  });
});

describe("asBytes", () => {
  it("refuses values that are not binary", () => {
    expect(() => asBytes([1, 2])).toThrow(/got a list/);
    expect(() => asBytes(null)).toThrow(/got null/);
    expect(() => decodeValues("float32", "abc", 1)).toThrow(/binary buffer/);
  });

  it("views the exact bytes of a DataView", () => {
    const dv = viewAt([9, 8, 7], 5);
    expect([...asBytes(dv)]).toEqual([9, 8, 7]);
  });
});
