import { describe, expect, it } from "vitest";
import {
  CELL_FONT,
  CELL_TEXT_PAD,
  cellFormat,
  cellLabels,
  cellText,
  luminance,
  MAX_LABELLED_CELLS,
  MIN_CELL_H,
} from "../../js/lib/cells";
import { valueToColor } from "../../js/lib/colormap";
import { layoutPanel } from "../../js/lib/layout";
import { approxMeasure } from "../../js/lib/text";

function box(rows: number, cols: number, side: number) {
  return layoutPanel(
    {
      rows,
      cols,
      title: "t",
      subtitle: "",
      note: "",
      row_labels: null,
      col_labels: null,
      row_offset: 0,
      col_offset: 0,
      row_step: 1,
      col_step: 1,
    },
    approxMeasure,
    side,
  );
}

const scale = { vmin: 0, vmax: 1, colormap: "magma" };

describe("cellText", () => {
  it("prints two decimals in a panel of values up to 1, nothing for NaN", () => {
    expect([0.934, -0.4149, 0, -0.001, 1].map(cellText)).toEqual([
      "0.93",
      "−0.41",
      "0.00",
      "0.00",
      "1.00",
    ]);
    expect([Number.NaN, Infinity, -Infinity].map(cellText)).toEqual(["", "∞", "−∞"]);
  });

  it("gives the panel's largest value two significant digits at least", () => {
    const small = cellFormat(0.0028); // a damage map of ΔNLL in thousandths
    expect([-0.0028, 0.00012, 0, -0.00001].map(small)).toEqual([
      "−0.0028",
      "0.0001",
      "0.0000",
      "0.0000",
    ]);
    expect(cellFormat(0.04)(0.0312)).toBe("0.031");
    expect(cellFormat(3.5)(3.456)).toBe("3.46");
    expect([12.345, -1234.5].map(cellFormat(1234.5))).toEqual(["12.3", "−1.23e+3"]);
    expect(cellFormat(3e-6)(-2.84e-6)).toBe("−2.8e-6"); // decimals would print zeros
    expect(cellFormat(0)(0)).toBe("0.00");
  });
});

describe("luminance", () => {
  it("is 0 for black, 1 for white, and weights green most", () => {
    expect(luminance([0, 0, 0])).toBe(0);
    expect(luminance([255, 255, 255])).toBeCloseTo(1, 12);
    expect(luminance([0, 255, 0])).toBeGreaterThan(luminance([255, 0, 0]));
    expect(luminance([255, 0, 0])).toBeGreaterThan(luminance([0, 0, 255]));
  });
});

describe("cellLabels", () => {
  const values = [0.1, 0.95, Number.NaN, 0.5, 0.02, 0.75, 1, 0.3, 0.6];
  const at = (r: number, c: number) => values[r * 3 + c];

  it("labels every cell of a small panel at its centre, white on dark colours", () => {
    const b = box(3, 3, 300);
    const labels = cellLabels(b, at, scale, approxMeasure);
    expect(labels.map((l) => l.text)).toEqual([
      "0.10",
      "0.95",
      "0.50",
      "0.02",
      "0.75",
      "1.00",
      "0.30",
      "0.60",
    ]); // the NaN cell has none
    const first = labels[0];
    expect(first.x).toBeCloseTo(b.plot.x + b.plot.w / 6, 9);
    expect(first.y).toBeCloseTo(b.plot.y + b.plot.h / 6, 9);
    for (const l of labels) {
      const dark = luminance(valueToColor(at(l.row, l.col), 0, 1, "magma")) < 0.4;
      expect(l.light).toBe(dark);
    }
    expect(labels.find((l) => l.text === "0.02")?.light).toBe(true); // magma's near-black end
    expect(labels.find((l) => l.text === "1.00")?.light).toBe(false); // its pale end
  });

  it("labels no cell when one number does not fit, or the panel has too many cells", () => {
    const width = approxMeasure("0.95", CELL_FONT) + CELL_TEXT_PAD;
    expect(cellLabels(box(3, 3, Math.floor(3 * width) - 3), at, scale, approxMeasure)).toEqual([]);
    expect(cellLabels(box(3, 3, Math.ceil(3 * width) + 3), at, scale, approxMeasure)).toHaveLength(
      8,
    );
    const wide = [1234.5, ...values.slice(1)];
    const narrow = box(3, 3, 3 * (width + 2));
    expect(cellLabels(narrow, (r, c) => wide[r * 3 + c], scale, approxMeasure)).toEqual([]);
    expect(cellLabels(box(3, 3, 3 * MIN_CELL_H - 3), at, scale, approxMeasure)).toEqual([]);
    const n = Math.floor(Math.sqrt(MAX_LABELLED_CELLS)) + 1;
    expect(cellLabels(box(n, n, 100_000), () => 0.5, scale, approxMeasure)).toEqual([]);
  });
});
