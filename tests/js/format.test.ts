import { describe, expect, it } from "vitest";
import {
  axisLabel,
  formatTick,
  formatValue,
  groupedCell,
  groupLabel,
  hoverJson,
  indexLabel,
  namesHeads,
} from "../../js/lib/format";

describe("formatValue", () => {
  it.each([
    [0.25, "0.2500"],
    [-0.123456, "-0.1235"],
    [1, "1.000"],
    [123456, "1.235e+5"],
    [0.000123456, "0.0001235"],
    [0, "0.000"],
    [-0, "0.000"],
    [NaN, "undefined"],
    [Infinity, "inf"],
    [-Infinity, "-inf"],
  ])("%s -> %s", (v, s) => expect(formatValue(v)).toBe(s));
});

describe("formatTick", () => {
  it.each([
    [0, "0"],
    [-1, "-1"],
    [0.5, "0.5"],
    [-0.25, "-0.25"],
    [0.30000000000000004, "0.3"],
    [1234, "1234"],
    [200000, "2e5"],
    [0.00005, "5e-5"],
    [0.0000123, "1.23e-5"],
  ])("%s -> %s", (v, s) => expect(formatTick(v)).toBe(s));
});

describe("labels", () => {
  it("numbers cells by offset and step", () => {
    expect(indexLabel(0, 1, 5)).toBe("5");
    expect(indexLabel(10, 1, 5)).toBe("15");
    expect(indexLabel(0, 4, 64)).toBe("256–259");
    expect(indexLabel(8, 2, 1)).toBe("10–11");
  });

  it("prefers explicit labels", () => {
    expect(axisLabel(["a", "b"], 0, 1, 1)).toBe("b");
    expect(axisLabel(null, 3, 1, 1)).toBe("4");
    expect(axisLabel(["a"], 0, 1, 3)).toBe("3");
  });

  it("writes hover JSON with null for non-finite values", () => {
    expect(JSON.parse(hoverJson("p1", 2, 3, 0.5))).toEqual({
      panel: "p1",
      row: 2,
      col: 3,
      value: 0.5,
    });
    expect(JSON.parse(hoverJson("p1", 0, 0, NaN)).value).toBeNull();
  });
});

describe("groupLabel", () => {
  it.each([
    [0, 1, 64, 100, "h1·d36"],
    [0, 1, 64, 0, "h0·d0"],
    [128, 1, 64, 5, "h2·d5"],
    [0, 4, 64, 9, "h0·d36–39"],
    [0, 128, 64, 1, "h2–3"],
    [0, 64, 64, 3, "h3"],
    [0, 6, 64, 10, "h0·d60–h1·d1"],
  ])("offset %i step %i head %i, cell %i -> %s", (offset, step, group, i, want) => {
    expect(groupLabel(offset, step, group, i)).toBe(want);
  });
});

describe("groupedCell", () => {
  const axes = {
    row_labels: null,
    col_labels: null,
    row_offset: 0,
    col_offset: 0,
    row_step: 1,
    col_step: 1,
    row_group: 64,
    col_group: 64,
    axis_prefix: "K",
  };

  it("names both indices by head and dimension", () => {
    expect(namesHeads(axes)).toBe(true);
    expect(groupedCell(axes, 100, 150, 0.231)).toBe("K h1·d36 × h2·d22 = 0.2310");
    expect(groupedCell({ ...axes, axis_prefix: "" }, 0, 1, NaN)).toBe("h0·d0 × h0·d1 = undefined");
  });

  it("gives ranges for downsampled cells and indices for an axis without heads", () => {
    const blocks = { ...axes, row_step: 4, col_step: 4, row_offset: 64, col_offset: 64 };
    expect(groupedCell(blocks, 0, 10, -0.5)).toBe("K h1·d0–3 × h1·d40–43 = -0.5000");
    const rowsOnly = { ...axes, col_group: 0 };
    expect(groupedCell(rowsOnly, 65, 7, 1)).toBe("K h1·d1 × 7 = 1.000");
  });

  it("leaves panels without heads, or with explicit labels, to the plain tooltip", () => {
    expect(namesHeads({ ...axes, row_group: 0, col_group: 0 })).toBe(false);
    expect(namesHeads({ ...axes, row_labels: ["a"], col_labels: ["b"] })).toBe(false);
  });
});
