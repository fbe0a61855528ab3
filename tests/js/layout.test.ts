import { describe, expect, it } from "vitest";
import {
  COLORBAR_H,
  COLORBAR_W,
  cellEdge,
  cellIndex,
  cellRect,
  computeLayout,
  FIT_CELL,
  FIT_SMALL,
  figureSize,
  fitPanel,
  fitSide,
  GRID_GAP,
  GROW_CELL,
  groupEdges,
  headerAt,
  hitTest,
  type LayoutPanel,
  layoutPanel,
  MIN_GROUP_PX,
  MIN_INNER_W,
  PAD,
  PLOT_BASE,
  PLOT_FLOOR,
  PLOT_MIN_FIT,
  plotPixels,
  plotSize,
  rowLength,
  SUBTITLE_H,
  SUBTITLE_LINES,
  wantedSide,
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

  it("wraps a long subtitle to a second line instead of cutting its end", () => {
    const words =
      "768 B/token KV (bf16) · eff. rank 7.70 · err K 0.000 V 0.000 (data-aware over 2048 tokens)";
    const one = layoutPanel(spec(10, 10, { subtitle: "short" }), approxMeasure);
    const two = layoutPanel(spec(10, 10, { subtitle: words }), approxMeasure);
    expect(one.subtitleLines).toEqual(["short"]);
    expect(two.subtitleLines).toHaveLength(2);
    expect(two.subtitleLines.join(" ")).toBe(words);
    expect(two.plot.y - one.plot.y).toBe(SUBTITLE_H);
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
  // 44 cells a side: they wrap rather than shrink below PLOT_MIN_FIT (fitSide)
  const five = Array.from({ length: 5 }, () => spec(44, 44));
  const boxW = layoutPanel(spec(44, 44), approxMeasure).w;

  it("wraps by the available width", () => {
    const l = computeLayout(five, 2 * boxW + GRID_GAP, 0, approxMeasure);
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

  it("puts `columns` panels in a grid row and starts every grid row on a new line", () => {
    const wide = computeLayout(five, 100000, 2, approxMeasure);
    expect(wide.columns).toBe(2);
    expect(wide.boxes.map((b) => b.x === 0)).toEqual([true, false, true, false, true]);
    expect(computeLayout(five, 100000, 9, approxMeasure).columns).toBe(5);
    expect([rowLength(0, 0), rowLength(5, 0), rowLength(5, 3), rowLength(5, 9)]).toEqual([
      0, 5, 3, 5,
    ]);
  });

  it("wraps a grid row that does not fit, keeping the next row on its own line", () => {
    // Keys over values, five layers: columns = 5, ten panels, in a 968 px cell.
    const ten = Array.from({ length: 10 }, () => spec(1024, 1024));
    const l = computeLayout(ten, 968, 5, approxMeasure);
    expect(l.columns).toBe(3);
    expect(l.width).toBeLessThanOrEqual(968);
    const lines = [...new Set(l.boxes.map((b) => b.y))];
    expect(lines).toHaveLength(4); // K0 K1 K2 / K3 K4 / V0 V1 V2 / V3 V4
    expect(l.boxes.map((b) => lines.indexOf(b.y))).toEqual([0, 0, 0, 1, 1, 2, 2, 2, 3, 3]);
    expect(l.boxes[5].x).toBe(0);
    for (const b of l.boxes) expect(b.plot.w).toBeGreaterThanOrEqual(PLOT_MIN_FIT);
  });

  it("keeps a layer matrix and two head panels on one line of a notebook cell", () => {
    // LayerSimilarityView of SmolLM2: a 30 × 30 matrix and two 3 × 3 head panels, keys over values.
    const titles = [
      "Keys · linear CKA",
      "Key heads · L8 × L9 · before",
      "Key heads · L8 × L9 · after",
    ];
    const row = (kind: string) =>
      [spec(30, 30), spec(3, 3), spec(3, 3)].map((p, i) => ({
        ...p,
        title: titles[i].replace("Key", kind),
        subtitle: i === 0 ? "layer × layer, 30 cross layers" : "per-token cosine",
      }));
    const six = [...row("Key"), ...row("Value")];
    for (const width of [610, 730]) {
      const l = computeLayout(six, width, 3, approxMeasure);
      expect(l.columns).toBe(3);
      expect(l.width).toBeLessThanOrEqual(width);
      expect(new Set(l.boxes.map((b) => b.y)).size).toBe(2);
      expect(l.boxes[0].plot.w).toBeGreaterThanOrEqual(fitSide(30, 30));
      expect(l.boxes[0].plot.w / 30).toBeGreaterThanOrEqual(FIT_CELL);
    }
    expect(fitSide(30, 30)).toBe(30 * FIT_CELL); // above FIT_SMALL
    expect(fitSide(3, 3)).toBe(FIT_SMALL);
    // a matrix of many cells keeps PLOT_MIN_FIT: three 192-channel panels wrap at 730 px
    expect(fitSide(192, 192)).toBe(PLOT_MIN_FIT);
    const channels = [spec(192, 192), spec(192, 192), spec(192, 192)];
    expect(computeLayout(channels, 730, 3, approxMeasure).columns).toBe(2);
    // and at 420 px the layer row wraps too rather than squeeze the matrix below FIT_CELL a cell
    const narrow = computeLayout(six, 420, 3, approxMeasure);
    expect(narrow.columns).toBeLessThan(3);
    expect(narrow.boxes[0].plot.w).toBeGreaterThanOrEqual(fitSide(30, 30));
  });

  it("grows a large matrix into the width, up to maxSide", () => {
    const one = [spec(192, 192)];
    const unlimited = computeLayout(one, 100000, 0, approxMeasure, { maxSide: 5000 });
    expect(unlimited.boxes[0].plot.w).toBe(192 * GROW_CELL);
    const fitWide = computeLayout(one, 1400, 0, approxMeasure);
    expect(fitWide.width).toBeLessThanOrEqual(1400);
    expect(fitWide.boxes[0].plot.w).toBeGreaterThan(1300);
    expect(fitWide.boxes[0].plot.w / 192).toBeGreaterThanOrEqual(3);
    const capped = computeLayout(one, 1400, 0, approxMeasure, { maxSide: 700 });
    expect(capped.boxes[0].plot).toMatchObject({ w: 700, h: 700 });
    // a cap below PLOT_BASE is raised to it
    expect(computeLayout(one, 1400, 0, approxMeasure, { maxSide: 10 }).boxes[0].plot.w).toBe(
      PLOT_BASE,
    );
  });

  it("gives a small matrix its usual size when there is room, and shrinks it when not", () => {
    expect(wantedSide(9, 9)).toBe(PLOT_BASE);
    expect(computeLayout([spec(9, 9)], 1400, 0, approxMeasure).boxes[0].plot.w).toBe(PLOT_BASE);
    const narrow = computeLayout([spec(9, 9)], 250, 0, approxMeasure);
    expect(narrow.width).toBeLessThanOrEqual(250);
    expect(narrow.boxes[0].plot.w).toBeLessThan(PLOT_BASE);
    // narrower than any panel: the smallest plot, wider than the container
    const tiny = computeLayout([spec(9, 9)], 40, 0, approxMeasure);
    expect(tiny.boxes[0].plot.w).toBe(PLOT_FLOOR);
  });

  it("fits a box into a width in a few passes", () => {
    for (const width of [180, 250, 333, 517, 968]) {
      const { side, box } = fitPanel(spec(1024, 1024), approxMeasure, width, 5000);
      expect(box.w).toBeLessThanOrEqual(width);
      expect(layoutPanel(spec(1024, 1024), approxMeasure, side + 2).w).toBeGreaterThan(width);
    }
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

describe("groupEdges", () => {
  it("puts a boundary at every multiple of the head size inside the axis", () => {
    expect(groupEdges(192, 0, 1, 64, 600)).toEqual([64, 128]);
    expect(groupEdges(100, 30, 1, 64, 600)).toEqual([34, 98]); // window 30..129
    expect(groupEdges(64, 64, 1, 64, 600)).toEqual([]); // one whole head
  });

  it("follows downsampled cells, between cells when a block straddles a boundary", () => {
    expect(groupEdges(1024, 0, 4, 128, 800)).toEqual(
      Array.from({ length: 31 }, (_, i) => (i + 1) * 32),
    );
    expect(groupEdges(10, 0, 3, 8, 600)).toEqual([8 / 3, 16 / 3, 8]); // channels 0..29
  });

  it("draws nothing without heads or when boundaries would crowd", () => {
    expect(groupEdges(192, 0, 1, 0, 600)).toEqual([]);
    expect(groupEdges(1024, 0, 1, 2, 800)).toEqual([]); // 1.6 px apart
    expect(groupEdges(1024, 0, 1, 8, 1024 * (MIN_GROUP_PX / 8))).toHaveLength(127);
  });

  it("is computed into each box", () => {
    const b = layoutPanel(spec(12, 8, { row_group: 4, col_group: 4 }), approxMeasure);
    expect(b.rowEdges).toEqual([4, 8]);
    expect(b.colEdges).toEqual([4]);
    expect(layoutPanel(spec(12, 8), approxMeasure).rowEdges).toEqual([]);
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

describe("plotPixels", () => {
  it("is the longest plot side of the layout in device pixels, rounded up", () => {
    const layout = computeLayout([spec(4, 4), spec(8, 2)], 900, 0, approxMeasure);
    const side = Math.max(...layout.boxes.flatMap((b) => [b.plot.w, b.plot.h]));
    expect(plotPixels(layout, 1)).toBe(Math.ceil(side));
    expect(plotPixels(layout, 1.5)).toBe(Math.ceil(side * 1.5));
    expect(plotPixels(layout, 2)).toBe(Math.ceil(side * 2));
  });

  it("is 0 without panels, and counts a nonsense ratio as 1", () => {
    expect(plotPixels(computeLayout([], 900, 0, approxMeasure), 2)).toBe(0);
    const layout = computeLayout([spec(3, 3)], 900, 0, approxMeasure);
    expect(plotPixels(layout, 0)).toBe(plotPixels(layout, 1));
    expect(plotPixels(layout, Number.NaN)).toBe(plotPixels(layout, 1));
  });
});

describe("a cut header", () => {
  const long = Array.from({ length: 60 }, (_, i) => `word${i}`).join(" ");
  it("is flagged when the subtitle loses words, and found by the pointer above the plot", () => {
    const l = computeLayout(
      [spec(4, 4, { subtitle: long }), spec(4, 4, { subtitle: "short" })],
      2000,
      2,
      approxMeasure,
    );
    const [cut, whole] = l.boxes;
    expect(cut.subtitleLines.length).toBe(SUBTITLE_LINES);
    expect(cut.headerCut).toBe(true);
    expect(whole.headerCut).toBe(false);
    expect(headerAt(l, cut.x + 5, cut.y + cut.subtitleY)).toBe(0);
    expect(headerAt(l, whole.x + 5, whole.y + 3)).toBe(1);
    expect(headerAt(l, cut.x + cut.plot.x + 2, cut.y + cut.plot.y + 2)).toBeNull(); // the plot itself
  });
  it("is never a mechanism's subtitle: three lines of bytes, rank and errors are kept whole", () => {
    const subtitle =
      "KV 15,360 B/token over 30 layers (fp32; 512 this layer); 7,680 B/token in bf16 · " +
      "eff. rank 4.99 · err K 0.000 V 0.704 (data-aware over 4096 tokens)";
    const box = computeLayout([spec(9, 9, { subtitle })], 400, 1, approxMeasure).boxes[0];
    expect(box.subtitleLines.length).toBeGreaterThan(2);
    expect(box.subtitleLines.join(" ")).toBe(subtitle);
    expect(box.headerCut).toBe(false);
  });
  it("is flagged when the title is cut", () => {
    const l = computeLayout([spec(4, 4, { title: long })], 2000, 1, approxMeasure);
    expect(l.boxes[0].headerCut).toBe(true);
  });
});
