import { describe, expect, it } from "vitest";
import { axisLabel, formatTick, formatValue, hoverJson, indexLabel } from "../../js/lib/format";

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
