// @vitest-environment jsdom
import { describe, expect, it } from "vitest";
import { layoutCharts, parseCharts } from "../../js/lib/charts";
import { COLORBAR_H, computeLayout, figureSize } from "../../js/lib/layout";
import { parsePanels } from "../../js/lib/panels";
import { approxMeasure } from "../../js/lib/text";
import { EXPORT_SCALE, exportScale, MAX_CANVAS_SIDE, renderFigure } from "../../js/ui/export_png";
import { f32View, rawPanel } from "./helpers/fake_model";
import { recorder, texts } from "./helpers/recorder";

const scale = { vmin: -1, vmax: 1, colormap: "diverging", label: "L" };

function content() {
  const { panels } = parsePanels([
    rawPanel({
      id: "a",
      title: "A",
      note: "note A",
      rows: 2,
      cols: 2,
      data: f32View([1, 2, 3, 4]),
    }),
    rawPanel({ id: "b", title: "B", rows: 2, cols: 2, data: f32View([1, 2, 3, 4]) }),
    rawPanel({ id: "c", title: "C", rows: 2, cols: 2, data: f32View([1, 2, 3, 4]) }),
  ]);
  const layout = computeLayout(panels, 10000, 2, approxMeasure);
  const images = panels.map((p) => ({ image: p.id }) as unknown as HTMLCanvasElement);
  return { layout, panels, images };
}

/** A document whose canvases record drawing calls. */
function fakeDoc() {
  const rec = recorder();
  const canvas = { width: 0, height: 0, getContext: () => rec.ctx };
  const doc = { createElement: () => canvas } as unknown as Document;
  return { doc, canvas, rec };
}

describe("export", () => {
  it("uses 2× unless the canvas would be too large", () => {
    expect(exportScale(800, 600)).toBe(EXPORT_SCALE);
    expect(exportScale(800, 20000)).toBeCloseTo(MAX_CANVAS_SIDE / 20000);
    const k = exportScale(8000, 8000);
    expect(8000 * k).toBeLessThanOrEqual(MAX_CANVAS_SIDE);
    expect(8000 * 8000 * k * k).toBeLessThanOrEqual(16384 * 16384 * 0.25 + 1);
  });

  it("draws the colorbar and every panel at 2× into one canvas", () => {
    const c = content();
    const { doc, canvas, rec } = fakeDoc();
    expect(renderFigure(doc, c, scale, approxMeasure)).toBe(canvas);
    const size = figureSize(c.layout);
    expect([canvas.width, canvas.height]).toEqual([2 * size.w, 2 * size.h]);
    const transforms = rec.calls.filter((x) => x.name === "setTransform").map((x) => x.args);
    expect(transforms).toEqual([
      [2, 0, 0, 2, 0, 0],
      ...c.layout.boxes.map((b) => [2, 0, 0, 2, 2 * b.x, 2 * (COLORBAR_H + b.y)]),
    ]);
    const t = texts(rec.calls);
    for (const s of ["L", "A", "B", "C", "note A", "undefined"]) expect(t).toContain(s);
    expect(rec.calls.filter((x) => x.name === "drawImage").map((x) => x.args[0])).toEqual(c.images);
  });

  it("draws the charts above the colorbar and panels, or alone without panels", () => {
    const { charts } = parseCharts([
      {
        id: "t",
        title: "trade-off",
        x_label: "bytes",
        y_label: "ΔNLL",
        series: [{ name: "variants", x: [1, 2], y: [0, 1], labels: ["model", "mqa"] }],
      },
    ]);
    const placed = { charts, ...layoutCharts(charts, 800, approxMeasure) };
    const c = content();
    const { doc, canvas, rec } = fakeDoc();
    renderFigure(doc, c, scale, approxMeasure, 2, placed);
    const size = figureSize(c.layout);
    const top = placed.h + 8;
    expect(canvas.height).toBe(2 * (top + size.h));
    const transforms = rec.calls.filter((x) => x.name === "setTransform").map((x) => x.args);
    expect(transforms.slice(0, 3)).toEqual([
      [2, 0, 0, 2, 0, 0],
      [2, 0, 0, 2, 0, 0], // the chart at (0, 0)
      [2, 0, 0, 2, 0, 2 * top], // the colorbar below it
    ]);
    expect(texts(rec.calls)).toContain("trade-off");
    const alone = fakeDoc();
    const empty = { ...c, layout: { ...c.layout, boxes: [] }, panels: [], images: [] };
    renderFigure(alone.doc, empty, scale, approxMeasure, 2, placed);
    expect(alone.canvas.height).toBe(2 * placed.h);
    expect(texts(alone.rec.calls)).not.toContain("L"); // no colorbar
  });

  it("returns null without canvas support", () => {
    expect(renderFigure(document, content(), scale, approxMeasure)).toBeNull();
  });
});
