/**
 * Decoding of the binary matrix buffers sent by Python.
 *
 * Buffers hold `rows * cols` little-endian values in row-major order:
 *   - "float32": IEEE 754 single precision
 *   - "float16": IEEE 754 half precision
 *
 * In the notebook a buffer arrives as a DataView whose byteOffset may be
 * anything (including offsets that are not a multiple of the element size);
 * typed-array views need aligned offsets, so unaligned data is copied first.
 *
 * wireValues keeps the values as sent (float16 bit patterns, float32
 * numbers) in a view of the message's memory, so that a panel costs no copy
 * and no decode until a value is read; decodeValues gives an independent
 * float32 copy.
 */

export type Dtype = "float32" | "float16";

export const DTYPES: readonly Dtype[] = ["float32", "float16"];

export const BYTES_PER_VALUE: Record<Dtype, number> = {
  float32: 4,
  float16: 2,
};

export type BinaryLike = ArrayBuffer | ArrayBufferView;

const LITTLE_ENDIAN = new Uint8Array(new Uint16Array([1]).buffer)[0] === 1;

export function isDtype(x: unknown): x is Dtype {
  return typeof x === "string" && (DTYPES as readonly string[]).includes(x);
}

/** The bytes of a buffer-like value (no copy). */
export function asBytes(data: unknown): Uint8Array {
  if (data instanceof ArrayBuffer) return new Uint8Array(data);
  if (ArrayBuffer.isView(data)) {
    return new Uint8Array(data.buffer as ArrayBuffer, data.byteOffset, data.byteLength);
  }
  throw new TypeError(`expected a binary buffer, got ${describe(data)}`);
}

function describe(x: unknown): string {
  if (x === null) return "null";
  if (Array.isArray(x)) return "a list";
  return typeof x;
}

/** Convert one IEEE 754 half-precision bit pattern to a number. */
export function halfToFloat(h: number): number {
  const sign = h & 0x8000 ? -1 : 1;
  const exp = (h >> 10) & 0x1f;
  const frac = h & 0x3ff;
  if (exp === 0) return sign * frac * 2 ** -24; // zero and subnormals
  if (exp === 0x1f) return frac === 0 ? sign * Infinity : NaN;
  return sign * (1 + frac / 1024) * 2 ** (exp - 15);
}

let halfTable: Float32Array | null = null;

/** All 65536 half-precision values, built on first use (256 KiB). */
export function halfLookup(): Float32Array {
  if (halfTable === null) {
    halfTable = new Float32Array(65536);
    for (let h = 0; h < 65536; h++) halfTable[h] = halfToFloat(h);
  }
  return halfTable;
}

/** Bytes aligned to `align`, copying only when the view is misaligned. */
function aligned(bytes: Uint8Array, align: number): Uint8Array {
  if (bytes.byteOffset % align === 0) return bytes;
  return bytes.slice();
}

/** The bytes of the first `count` values of `data`; a buffer that is too short throws. */
function wireBytes(dtype: Dtype, data: unknown, count: number): Uint8Array {
  const all = asBytes(data);
  const need = count * BYTES_PER_VALUE[dtype];
  if (all.byteLength < need) {
    throw new RangeError(
      `buffer holds ${all.byteLength} bytes, ${dtype} data of ${count} values needs ${need}`,
    );
  }
  return all.subarray(0, need);
}

/**
 * Decode `count` values from `data`.  Extra trailing bytes are ignored; a
 * buffer that is too short throws, naming the sizes.
 */
export function decodeValues(dtype: Dtype, data: unknown, count: number): Float32Array {
  const width = BYTES_PER_VALUE[dtype];
  const bytes = wireBytes(dtype, data, count);
  const out = new Float32Array(count);
  if (!LITTLE_ENDIAN) return decodeWithDataView(dtype, bytes, out);
  const a = aligned(bytes, width);
  if (dtype === "float32") {
    out.set(new Float32Array(a.buffer, a.byteOffset, count));
    return out;
  }
  const halves = new Uint16Array(a.buffer, a.byteOffset, count);
  const table = halfLookup();
  for (let i = 0; i < count; i++) out[i] = table[halves[i]];
  return out;
}

function decodeWithDataView(dtype: Dtype, bytes: Uint8Array, out: Float32Array): Float32Array {
  const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  for (let i = 0; i < out.length; i++) {
    out[i] =
      dtype === "float32" ? view.getFloat32(i * 4, true) : halfToFloat(view.getUint16(i * 2, true));
  }
  return out;
}

/** The values of a buffer as sent: float16 bit patterns or float32 numbers. */
export type WireValues = Uint16Array | Float32Array;

/**
 * The first `count` values of `data` as a typed array over the same bytes (no copy), or over an
 * aligned copy when the view is misaligned or the host is big-endian.  Short buffers throw like
 * decodeValues.  The caller must not write to the result: it may share the message's memory.
 */
export function wireValues(dtype: Dtype, data: unknown, count: number): WireValues {
  const width = BYTES_PER_VALUE[dtype];
  const bytes = wireBytes(dtype, data, count);
  if (!LITTLE_ENDIAN) {
    if (dtype === "float32") return decodeWithDataView(dtype, bytes, new Float32Array(count));
    const view = new DataView(bytes.buffer, bytes.byteOffset, bytes.byteLength);
    const out = new Uint16Array(count);
    for (let i = 0; i < count; i++) out[i] = view.getUint16(i * 2, true);
    return out;
  }
  const a = aligned(bytes, width);
  return dtype === "float32"
    ? new Float32Array(a.buffer, a.byteOffset, count)
    : new Uint16Array(a.buffer, a.byteOffset, count);
}

/** Value i of wire values (float16 patterns are looked up, float32 read as they are). */
export function wireValue(raw: WireValues, i: number): number {
  if (i < 0 || i >= raw.length) return NaN;
  return raw instanceof Uint16Array ? halfLookup()[raw[i]] : raw[i];
}

/** All values as float32 numbers (a copy for float16, the same array for float32). */
export function wireToFloat32(raw: WireValues): Float32Array {
  if (raw instanceof Float32Array) return raw;
  const table = halfLookup();
  const out = new Float32Array(raw.length);
  for (let i = 0; i < raw.length; i++) out[i] = table[raw[i]];
  return out;
}
