import { describe, expect, it } from "vitest";
import { approxMeasure, font } from "../../js/lib/text";
import {
  axisTicks,
  indexTicks,
  labelTicks,
  MAX_LABEL_PX,
  niceStep,
  valueTicks,
} from "../../js/lib/ticks";

const f = font(10);
const m = approxMeasure;

describe("niceStep", () => {
  it.each([
    [1, 1],
    [1.2, 2],
    [3, 5],
    [7, 10],
    [0.03, 0.05],
    [250, 500],
    [0, 1],
  ])("%s -> %s", (x, s) => expect(niceStep(x)).toBeCloseTo(s, 12));
});

describe("indexTicks", () => {
  it("labels every cell of a small matrix", () => {
    const t = indexTicks({ n: 8, labels: null, offset: 0, step: 1 }, 320, "col", m, f);
    expect(t.map((x) => x.label)).toEqual(["0", "1", "2", "3", "4", "5", "6", "7"]);
    expect(t.map((x) => x.pos)).toEqual([0.5, 1.5, 2.5, 3.5, 4.5, 5.5, 6.5, 7.5]);
  });

  it("uses round original indices spaced for their labels", () => {
    const t = indexTicks({ n: 1024, labels: null, offset: 0, step: 4 }, 320, "col", m, f);
    const idx = t.map((x) => Number(x.label));
    const d = idx[1] - idx[0];
    expect([500, 1000]).toContain(d);
    idx.forEach((v, i) => {
      expect(v).toBe(i * d);
    });
    // original index 500 is in displayed cell 125 (500/4)
    expect(t[1].pos).toBeCloseTo((d + 0.5) / 4);
    const px = (t[1].pos - t[0].pos) * (320 / 1024);
    expect(px).toBeGreaterThanOrEqual(m("4095", f) + 8);
  });

  it("starts at the first round index after the offset", () => {
    const t = indexTicks({ n: 30, labels: null, offset: 13, step: 1 }, 150, "row", m, f); // 5 px per row
    expect(t[0].label).toBe("15");
    expect(t[0].pos).toBe(2.5);
    expect(Number(t[1].label) - Number(t[0].label)).toBe(5);
  });

  it("never spaces ticks closer than one displayed cell", () => {
    const t = indexTicks({ n: 4, labels: null, offset: 0, step: 16 }, 320, "col", m, f);
    expect(t.map((x) => x.label)).toEqual(["0", "20", "40", "60"]);
  });

  it("always gives at least one tick", () => {
    const t = indexTicks({ n: 1, labels: null, offset: 7, step: 1 }, 3, "col", m, f);
    expect(t).toEqual([{ pos: 0.5, label: "7" }]);
    expect(indexTicks({ n: 0, labels: null, offset: 0, step: 1 }, 100, "col", m, f)).toEqual([]);
  });
});

describe("labelTicks", () => {
  it("shows every label when there is room, every k-th otherwise", () => {
    const labels = Array.from({ length: 32 }, (_, i) => `H${i}`);
    expect(labelTicks(labels.slice(0, 4), 320, "col", m, f).map((t) => t.label)).toEqual([
      "H0",
      "H1",
      "H2",
      "H3",
    ]);
    const rows = labelTicks(labels, 96, "row", m, f);
    // 3 px per row, rows need 13 px -> every 5th
    expect(rows.map((t) => t.label)).toEqual(["H0", "H5", "H10", "H15", "H20", "H25", "H30"]);
    expect(rows[1].pos).toBe(5.5);
  });

  it("cuts long labels to the maximum width", () => {
    const t = labelTicks(["a_really_long_token_string_here"], 320, "row", m, f);
    expect(t[0].label.endsWith("…")).toBe(true);
    expect(m(t[0].label, f)).toBeLessThanOrEqual(MAX_LABEL_PX.row);
    // a variant spec or a mixed spec's short name stays whole
    expect(
      labelTicks(["kv:int2/g128", "mixed 11,424 B"], 320, "row", m, f).map((t) => t.label),
    ).toEqual(["kv:int2/g128", "mixed 11,424 B"]);
  });

  it("is chosen by axisTicks when labels exist", () => {
    expect(
      axisTicks({ n: 2, labels: ["x", "y"], offset: 0, step: 1 }, 100, "col", m, f)[1].label,
    ).toBe("y");
    expect(axisTicks({ n: 2, labels: null, offset: 5, step: 1 }, 100, "col", m, f)[1].label).toBe(
      "6",
    );
  });
});

describe("valueTicks", () => {
  it("gives round values inside the range", () => {
    expect(valueTicks(-1, 1)).toEqual([-1, -0.5, 0, 0.5, 1]);
    expect(valueTicks(0, 1)).toEqual([0, 0.2, 0.4, 0.6, 0.8, 1]);
    expect(valueTicks(0, 0.37)).toEqual([0, 0.1, 0.2, 0.3]);
    expect(valueTicks(-0.3, 0.3)).toEqual([-0.2, 0, 0.2]);
  });

  it("handles degenerate ranges", () => {
    expect(valueTicks(2, 2)).toEqual([2]);
    expect(valueTicks(NaN, 1)).toEqual([]);
  });
});
