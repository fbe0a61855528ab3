// @vitest-environment jsdom
import { describe, expect, it } from "vitest";
import { COLORBAR_H, cellRect, computeLayout, figureSize } from "../../js/lib/layout";
import { type Panel, parsePanels } from "../../js/lib/panels";
import { approxMeasure } from "../../js/lib/text";
import { Grid } from "../../js/ui/grid";
import { f32View, rawPanel } from "./helpers/fake_model";

function setup() {
  const { panels } = parsePanels([
    rawPanel({
      id: "a",
      title: "first",
      rows: 2,
      cols: 3,
      data: f32View([0, 0.25, NaN, 1, -1, 0.5]),
    }),
    rawPanel({
      id: "b",
      title: "<img src=x onerror=alert(1)>",
      rows: 2,
      cols: 2,
      row_labels: ["q0", "q1"],
      col_offset: 100,
      col_step: 4,
      data: f32View([1, 2, 3, 4]),
    }),
  ]);
  const layout = computeLayout(panels, 2000, 0, approxMeasure);
  const clicks: [string, number, number][] = [];
  const grid = new Grid(document, (p: Panel, r, c) => clicks.push([p.id, r, c]));
  document.body.replaceChildren(grid.root);
  grid.setContent({ layout, panels, images: panels.map(() => null) }, 1);
  /** Grid coordinates of the centre of a cell (jsdom rects are at 0, 0). */
  const centre = (i: number, row: number, col: number) => {
    const b = layout.boxes[i];
    const r = cellRect(b, row, col);
    return { clientX: b.x + r.x + r.w / 2, clientY: b.y + r.y + r.h / 2 };
  };
  const move = (pt: { clientX: number; clientY: number }) =>
    grid.panelsEl.dispatchEvent(new MouseEvent("mousemove", { ...pt, bubbles: true }));
  const hover = () => JSON.parse(grid.root.dataset.hover ?? "null");
  return { grid, layout, clicks, centre, move, hover };
}

describe("Grid", () => {
  it("places one wrapper per panel with its plot rectangle", () => {
    const { grid, layout } = setup();
    const wraps = [...grid.panelsEl.querySelectorAll<HTMLElement>(".hw-panel")];
    expect(wraps.map((w) => w.dataset.panelId)).toEqual(["a", "b"]);
    expect(JSON.parse(wraps[1].dataset.plotRect!)).toEqual(layout.boxes[1].plot);
    expect(wraps[1].style.left).toBe(`${layout.boxes[1].x}px`);
    expect(wraps[0].querySelectorAll("canvas")).toHaveLength(2);
    const size = figureSize(layout);
    expect(grid.root.style.width).toBe(`${size.w}px`);
    expect(grid.root.style.height).toBe(`${layout.height + COLORBAR_H}px`);
  });

  it("shows tooltip and data-hover for the cell under the mouse", () => {
    const { grid, move, centre, hover } = setup();
    move(centre(0, 0, 1));
    expect(hover()).toEqual({ panel: "a", row: 0, col: 1, value: 0.25 });
    expect(grid.tooltip.visible).toBe(true);
    expect(grid.tooltip.text).toBe("first\nrow: 0\ncol: 1\nvalue: 0.2500");
    move(centre(0, 0, 2));
    expect(grid.tooltip.text.split("\n")[3]).toBe("value: undefined");
    expect(hover().value).toBeNull();
  });

  it("prints numbers in the cells of a small panel, on its overlay, and none in a large one", () => {
    const small = new Array(9).fill(0.5);
    const { panels } = parsePanels([
      rawPanel({ id: "s", rows: 3, cols: 3, data: f32View(small) }),
      rawPanel({ id: "l", rows: 64, cols: 64, data: f32View(new Array(64 * 64).fill(0.5)) }),
    ]);
    const grid = new Grid(document, () => {});
    document.body.replaceChildren(grid.root);
    const layout = computeLayout(panels, 2000, 0, approxMeasure);
    grid.setContent({ layout, panels, images: [null, null] }, 1);
    const counts = () =>
      [...grid.root.querySelectorAll<HTMLCanvasElement>(".hw-overlay")].map(
        (c) => c.dataset.cellLabels,
      );
    grid.drawColorbar({ vmin: 0, vmax: 1, colormap: "magma", label: "" }, approxMeasure);
    expect(counts()).toEqual(["9", "0"]);
    expect(grid.current.labels?.[0].map((l) => l.text)).toEqual(new Array(9).fill("0.50"));
  });

  it("names the axes and the value as the panel and the colour scale do", () => {
    const { panels } = parsePanels([
      rawPanel({
        id: "damage",
        title: "ΔNLL, one layer converted",
        rows: 1,
        cols: 2,
        row_labels: ["mqa"],
        col_offset: 3,
        row_axis: "variant",
        col_axis: "layer",
        data: f32View([0.5, -0.25]),
      }),
    ]);
    const grid = new Grid(document, () => {});
    document.body.replaceChildren(grid.root);
    const layout = computeLayout(panels, 800, 0, approxMeasure);
    grid.setContent({ layout, panels, images: [null] }, 1);
    grid.drawColorbar(
      { vmin: -1, vmax: 1, colormap: "diverging", label: "ΔNLL (nats)" },
      approxMeasure,
    );
    const b = layout.boxes[0];
    const r = cellRect(b, 0, 1);
    const at = { clientX: b.x + r.x + r.w / 2, clientY: b.y + r.y + r.h / 2, bubbles: true };
    grid.panelsEl.dispatchEvent(new MouseEvent("mousemove", at));
    expect(grid.tooltip.text).toBe(
      "ΔNLL, one layer converted\nvariant: mqa\nlayer: 4\nΔNLL (nats): -0.2500",
    );
  });

  it("uses labels and index ranges, and renders the title as text", () => {
    const { grid, move, centre } = setup();
    move(centre(1, 1, 1));
    expect(grid.tooltip.text).toBe(
      "<img src=x onerror=alert(1)>\nrow: q1\ncol: 104–107\nvalue: 4.000",
    );
    expect(document.querySelector("img")).toBeNull();
  });

  it("hides the tooltip outside plots but keeps the last hover", () => {
    const { grid, move, centre, hover } = setup();
    move(centre(0, 1, 0));
    move({ clientX: 1, clientY: 1 });
    expect(grid.tooltip.visible).toBe(false);
    expect(hover()).toEqual({ panel: "a", row: 1, col: 0, value: 1 });
  });

  it("shows a title and subtitle cut to the panel's width whole when the header is hovered", () => {
    const subtitle = Array.from({ length: 80 }, (_, i) => `part${i}`).join(" · ");
    const { panels } = parsePanels([
      rawPanel({
        id: "m",
        title: "mla:128",
        subtitle,
        rows: 2,
        cols: 2,
        data: f32View([1, 0, 0, 1]),
      }),
    ]);
    const layout = computeLayout(panels, 2000, 0, approxMeasure);
    const grid = new Grid(document, () => {});
    document.body.replaceChildren(grid.root);
    grid.setContent({ layout, panels, images: [null] }, 1);
    const b = layout.boxes[0];
    expect(b.headerCut).toBe(true);
    const at = { clientX: b.x + 20, clientY: b.y + b.subtitleY, bubbles: true };
    grid.panelsEl.dispatchEvent(new MouseEvent("mousemove", at));
    expect(grid.tooltip.visible).toBe(true);
    expect(grid.tooltip.text).toBe(`mla:128\n${subtitle}`);
    expect(grid.root.dataset.hover).toBeUndefined(); // no cell hovered
  });

  it("reports clicks on cells only", () => {
    const { grid, clicks, centre } = setup();
    grid.panelsEl.dispatchEvent(new MouseEvent("click", { ...centre(1, 0, 1), bubbles: true }));
    grid.panelsEl.dispatchEvent(new MouseEvent("click", { clientX: 1, clientY: 1, bubbles: true }));
    expect(clicks).toEqual([["b", 0, 1]]);
  });

  it("moves the inspected cell with the keyboard", () => {
    const { grid, clicks, hover } = setup();
    const key = (k: string) =>
      grid.panelsEl.dispatchEvent(new KeyboardEvent("keydown", { key: k, bubbles: true }));
    key("ArrowRight");
    expect(hover()).toMatchObject({ panel: "a", row: 0, col: 1 });
    key("ArrowDown");
    key("ArrowDown"); // clamped at the last row
    key("ArrowRight");
    key("ArrowRight");
    expect(hover()).toMatchObject({ panel: "a", row: 1, col: 2 });
    expect(grid.live.textContent).toBe("first, row: 1, col: 2, value: 0.5000");
    key("PageDown");
    expect(hover()).toMatchObject({ panel: "b", row: 1, col: 1 });
    key("Enter");
    expect(clicks).toEqual([["b", 1, 1]]);
    key("Escape");
    expect(grid.tooltip.visible).toBe(false);
  });

  it("refreshes the tooltip when the panels change under it", () => {
    const { grid, move, centre, hover, layout } = setup();
    move(centre(0, 1, 2));
    expect(grid.tooltip.text.split("\n")[3]).toBe("value: 0.5000");
    // A metric change: same panels, new values.
    const { panels } = parsePanels([
      rawPanel({
        id: "a",
        title: "first · max",
        rows: 2,
        cols: 3,
        data: f32View([0, 0, 0, 0, 0, 0.75]),
      }),
      rawPanel({ id: "b", title: "b", rows: 2, cols: 2, data: f32View([1, 2, 3, 4]) }),
    ]);
    grid.setContent({ layout, panels, images: panels.map(() => null) }, 1);
    expect(grid.tooltip.visible).toBe(true);
    expect(grid.tooltip.text).toBe("first · max\nrow: 1\ncol: 2\nvalue: 0.7500");
    expect(hover()).toEqual({ panel: "a", row: 1, col: 2, value: 0.75 });
    // Panels gone from under the pointer: the tooltip goes too.
    grid.setContent(
      { layout: computeLayout([], 100, 0, approxMeasure), panels: [], images: [] },
      1,
    );
    expect(grid.tooltip.visible).toBe(false);
  });

  it("names cells by head when the panel has heads", () => {
    const { panels } = parsePanels([
      rawPanel({
        id: "k",
        title: "Keys",
        rows: 8,
        cols: 4,
        row_offset: 60,
        col_offset: 60,
        row_group: 64,
        col_group: 64,
        axis_prefix: "K",
        data: f32View(Array.from({ length: 32 }, (_, i) => i / 32)),
      }),
    ]);
    const layout = computeLayout(panels, 2000, 0, approxMeasure);
    const grid = new Grid(document, () => {});
    document.body.replaceChildren(grid.root);
    grid.setContent({ layout, panels, images: [null] }, 1);
    const b = layout.boxes[0];
    const r = cellRect(b, 1, 2);
    grid.panelsEl.dispatchEvent(
      new MouseEvent("mousemove", {
        clientX: b.x + r.x + r.w / 2,
        clientY: b.y + r.y + r.h / 2,
        bubbles: true,
      }),
    );
    expect(grid.tooltip.text).toBe("Keys\nK h0·d61 × h0·d62 = 0.1875\nindex 61 × 62");
    expect(b.rowEdges).toEqual([4]); // rows are channels 60..67: head 1 starts at 64
    expect(b.colEdges).toEqual([]); // columns are channels 60..63: no boundary inside
  });

  it("removes wrappers when panels go away", () => {
    const { grid } = setup();
    grid.setContent(
      { layout: computeLayout([], 100, 0, approxMeasure), panels: [], images: [] },
      1,
    );
    expect(grid.panelsEl.querySelectorAll(".hw-panel")).toHaveLength(0);
    grid.destroy();
    expect(grid.root.isConnected).toBe(false);
  });
});
