import { describe, expect, it } from "vitest";
import {
  COLORBAR_H,
  COLORBAR_W,
  cellEdge,
  cellIndex,
  cellRect,
  columnCount,
  computeLayout,
  figureSize,
  GRID_GAP,
  hitTest,
  type LayoutPanel,
  layoutPanel,
  MIN_INNER_W,
  PAD,
  plotSize,
} from "../../js/lib/layout";
import { approxMeasure } from "../../js/lib/text";

function spec(rows: number, cols: number, extra: Partial<LayoutPanel> = {}): LayoutPanel {
  return {
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
    ...extra,
  };
}

describe("plotSize", () => {
  it("uses square cells filling 320 px for square matrices", () => {
    expect(plotSize(32, 32)).toEqual({ w: 320, h: 320 });
    expect(plotSize(1024, 1024)).toEqual({ w: 320, h: 320 });
    expect(plotSize(3, 3)).toEqual({ w: 320, h: 320 });
  });

  it("keeps square cells for moderately oblong matrices", () => {
    expect(plotSize(16, 32)).toEqual({ w: 320, h: 160 });
    expect(plotSize(32, 12)).toEqual({ w: 120, h: 320 });
  });

  it("stretches very thin matrices to a readable height", () => {
    expect(plotSize(8, 1024)).toEqual({ w: 320, h: 96 });
    expect(plotSize(1, 1024)).toEqual({ w: 320, h: 24 });
    expect(plotSize(32, 8)).toEqual({ w: 96, h: 320 });
  });
});

describe("layoutPanel", () => {
  it("stacks title, plot, column labels and note", () => {
    const a = layoutPanel(spec(10, 10), approxMeasure);
    const b = layoutPanel(spec(10, 10, { subtitle: "s", note: "a note" }), approxMeasure);
    expect(b.plot.y - a.plot.y).toBe(14);
    expect(b.noteLines).toEqual(["a note"]);
    expect(b.h - a.h).toBe(14 + 13);
    expect(a.plot.x).toBeGreaterThan(PAD + approxMeasure("9", "10px x"));
    expect(a.w).toBeGreaterThanOrEqual(a.plot.x + a.plot.w);
    expect(a.w).toBeGreaterThanOrEqual(2 * PAD + MIN_INNER_W);
  });

  it("fits the title to the box", () => {
    const b = layoutPanel(spec(4, 4, { title: "x".repeat(200) }), approxMeasure);
    expect(b.title.endsWith("…")).toBe(true);
    expect(b.title.length).toBeLessThan(200);
  });

  it("makes room on the left for row labels", () => {
    const short = layoutPanel(spec(4, 4), approxMeasure);
    const long = layoutPanel(
      spec(4, 4, { row_labels: ["alpha", "beta", "gamma", "delta"] }),
      approxMeasure,
    );
    expect(long.plot.x - short.plot.x).toBeCloseTo(
      Math.ceil(approxMeasure("gamma", "10px")) - Math.ceil(approxMeasure("3", "10px")),
      5,
    );
  });
});

describe("computeLayout", () => {
  const five = Array.from({ length: 5 }, () => spec(16, 16));
  const boxW = layoutPanel(spec(16, 16), approxMeasure).w;

  it("wraps by the available width", () => {
    const l = computeLayout(five, 2 * boxW + GRID_GAP + 5, 0, approxMeasure);
    expect(l.columns).toBe(2);
    expect(l.boxes.map((b) => [b.x, b.y])).toEqual([
      [0, 0],
      [boxW + GRID_GAP, 0],
      [0, l.boxes[0].h + GRID_GAP],
      [boxW + GRID_GAP, l.boxes[0].h + GRID_GAP],
      [0, 2 * (l.boxes[0].h + GRID_GAP)],
    ]);
    expect(l.width).toBe(2 * boxW + GRID_GAP);
    expect(l.height).toBe(3 * l.boxes[0].h + 2 * GRID_GAP);
  });

  it("puts at least one panel per row and at most all in one row", () => {
    expect(computeLayout(five, 10, 0, approxMeasure).columns).toBe(1);
    expect(computeLayout(five, 100000, 0, approxMeasure).columns).toBe(5);
  });

  it("obeys a columns override regardless of width", () => {
    expect(computeLayout(five, 10, 3, approxMeasure).columns).toBe(3);
    expect(computeLayout(five, 100000, 2, approxMeasure).columns).toBe(2);
    expect(computeLayout(five, 10, 9, approxMeasure).columns).toBe(5);
    expect(columnCount(0, 100, 1000, 0)).toBe(0);
  });

  it("sizes grid rows by their tallest panel", () => {
    const l = computeLayout(
      [spec(4, 4, { note: "n" }), spec(4, 4), spec(4, 4)],
      100000,
      2,
      approxMeasure,
    );
    expect(l.boxes[2].y).toBe(l.boxes[0].h + GRID_GAP);
  });

  it("is empty without panels", () => {
    const l = computeLayout([], 500, 0, approxMeasure);
    expect(l).toEqual({ width: 0, height: 0, columns: 0, boxes: [] });
    expect(figureSize(l)).toEqual({ w: COLORBAR_W, h: COLORBAR_H });
  });
});

describe("hit-testing", () => {
  const l = computeLayout([spec(3, 7), spec(5, 5)], 100000, 0, approxMeasure);
  const [a, b] = l.boxes;
  const ax = a.x + a.plot.x;
  const ay = a.y + a.plot.y;

  it("maps exact cell borders to the cell that starts there", () => {
    for (let k = 0; k < 7; k++) {
      const x = cellEdge(ax, a.plot.w, 7, k);
      expect(hitTest(l, x, ay)).toEqual({ index: 0, row: 0, col: k });
    }
    for (let k = 0; k < 3; k++) {
      expect(hitTest(l, ax, cellEdge(ay, a.plot.h, 3, k))?.row).toBe(k);
    }
  });

  it("treats the far edges as outside and the pixel before them as the last cell", () => {
    expect(hitTest(l, ax + a.plot.w, ay)).toBeNull();
    expect(hitTest(l, ax, ay + a.plot.h)).toBeNull();
    expect(hitTest(l, ax + a.plot.w - 1e-9, ay + a.plot.h - 1e-9)).toEqual({
      index: 0,
      row: 2,
      col: 6,
    });
    expect(hitTest(l, ax - 1e-9, ay)).toBeNull();
    expect(hitTest(l, ax, ay - 1e-9)).toBeNull();
  });

  it("finds cells in later panels and nothing in titles, gaps or beyond", () => {
    const bx = b.x + b.plot.x;
    const by = b.y + b.plot.y;
    expect(hitTest(l, bx + (3.5 * b.plot.w) / 5, by + (1.2 * b.plot.h) / 5)).toEqual({
      index: 1,
      row: 1,
      col: 3,
    });
    expect(hitTest(l, a.x + 2, a.y + 2)).toBeNull(); // title
    expect(hitTest(l, a.x + a.w + GRID_GAP / 2, ay + 1)).toBeNull(); // gap
    expect(hitTest(l, -1, -1)).toBeNull();
    expect(hitTest(l, l.width + 10, 5)).toBeNull();
  });

  it("agrees with cellRect", () => {
    const r = cellRect(a, 2, 4);
    expect(hitTest(l, a.x + r.x, a.y + r.y)).toEqual({ index: 0, row: 2, col: 4 });
    expect(hitTest(l, a.x + r.x + r.w - 1e-9, a.y + r.y + r.h - 1e-9)).toEqual({
      index: 0,
      row: 2,
      col: 4,
    });
    expect(r.w).toBeCloseTo(a.plot.w / 7);
  });

  it("handles cell edges that are not representable exactly", () => {
    // 320 px split in 3: edges at 106.666… and 213.333…
    for (let k = 0; k < 3; k++) expect(cellIndex(cellEdge(0.1, 320, 3, k), 0.1, 320, 3)).toBe(k);
    expect(cellIndex(cellEdge(0.1, 320, 3, 1) - 1e-9, 0.1, 320, 3)).toBe(0);
    expect(cellIndex(NaN, 0, 10, 2)).toBe(-1);
  });
});
