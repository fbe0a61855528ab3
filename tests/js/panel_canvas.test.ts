// @vitest-environment jsdom
import { describe, expect, it } from "vitest";
import { packedColormap } from "../../js/lib/colormap";
import { cellRect, FONTS, layoutPanel } from "../../js/lib/layout";
import { parsePanel } from "../../js/lib/panels";
import { approxMeasure } from "../../js/lib/text";
import { buildImage, drawCrosshair, drawPanel } from "../../js/ui/panel_canvas";
import { f32View, rawPanel } from "./helpers/fake_model";
import { recorder, texts } from "./helpers/recorder";

const panel = parsePanel(
  rawPanel({
    id: "a",
    title: "Title",
    subtitle: "Sub",
    note: "a note",
    rows: 2,
    cols: 2,
    data: f32View([1, 2, 3, 4]),
  }),
  0,
);
const box = layoutPanel(panel, approxMeasure);

describe("drawPanel", () => {
  it("draws texts, the scaled image without smoothing, and ticks", () => {
    const { ctx, calls } = recorder();
    const image = { fake: "image" } as unknown as HTMLCanvasElement;
    drawPanel(ctx, box, image);
    expect(texts(calls)).toEqual(["Title", "Sub", "0", "1", "0", "1", "a note"]);
    const title = calls.find((c) => c.name === "fillText" && c.args[0] === "Title")!;
    expect(title.font).toBe(FONTS.title);
    const draw = calls.find((c) => c.name === "drawImage")!;
    expect(draw.args).toEqual([image, box.plot.x, box.plot.y, box.plot.w, box.plot.h]);
    const smoothing = calls.filter((c) => c.name === "set:imageSmoothingEnabled");
    expect(smoothing.map((c) => c.args[0])).toEqual([false]);
    expect(calls.findIndex((c) => c.name === "set:imageSmoothingEnabled")).toBeLessThan(
      calls.indexOf(draw),
    );
  });

  it("draws a placeholder without an image", () => {
    const { ctx, calls } = recorder();
    drawPanel(ctx, box, null);
    expect(calls.some((c) => c.name === "drawImage")).toBe(false);
    expect(calls.some((c) => c.name === "fillRect" && c.args[0] === box.plot.x)).toBe(true);
  });

  it("outlines the hovered cell", () => {
    const { ctx, calls } = recorder();
    drawCrosshair(ctx, box, 1, 0);
    const r = cellRect(box, 1, 0);
    const outline = calls.find((c) => c.name === "strokeRect")!;
    const [x, y, w, h] = outline.args;
    expect(x + w / 2).toBeCloseTo(r.x + r.w / 2);
    expect(y + h / 2).toBeCloseTo(r.y + r.h / 2);
    expect(w).toBeGreaterThanOrEqual(r.w);
  });

  it("returns no image where the browser has no canvas", () => {
    expect(buildImage(document, panel, 0, 1, packedColormap("magma"))).toBeNull();
  });
});

describe("what a view marks on a panel", () => {
  const marked = parsePanel(
    rawPanel({
      id: "damage",
      title: "ΔNLL, one layer converted",
      note: "layer 1: mqa +0.3",
      hint: "a click on a cell selects its layer",
      rows: 2,
      cols: 3,
      row_axis: "variant",
      col_axis: "layer",
      axis_titles: true,
      mark_col: 1,
      data: f32View([1, 2, 3, 4, 5, 6]),
    }),
    0,
  );
  const markedBox = layoutPanel(marked, approxMeasure);

  it("titles the axes, outlines the selected layer's column and says what a click does", () => {
    const { ctx, calls } = recorder();
    drawPanel(ctx, markedBox, null);
    const drawn = texts(calls);
    expect(drawn).toContain("variant");
    expect(drawn).toContain("layer");
    expect(markedBox.noteLines.join(" ")).toBe(
      "layer 1: mqa +0.3 · a click on a cell selects its layer",
    );
    const column = cellRect(markedBox, 0, 1);
    const outlines = calls.filter((c) => c.name === "strokeRect" && c.args[0] === column.x);
    expect(outlines.map((c) => c.args.slice(1))).toEqual([
      [markedBox.plot.y, column.w, markedBox.plot.h],
    ]);
    // the same panel without the fields: no titles, no outline, the note alone
    const plain = layoutPanel(
      { ...marked, axis_titles: false, mark_col: -1, hint: "" },
      approxMeasure,
    );
    const bare = recorder();
    drawPanel(bare.ctx, plain, null);
    expect(texts(bare.calls)).not.toContain("variant");
    expect(bare.calls.filter((c) => c.name === "strokeRect").length).toBe(1); // the frame
    expect(plain.noteLines).toEqual(["layer 1: mqa +0.3"]);
    expect(markedBox.plot.x).toBeGreaterThan(plain.plot.x); // room for the rows' title
  });
});
