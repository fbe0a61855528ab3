import { describe, expect, it } from "vitest";
import { colormapStops, cssColor, NAN_COLOR } from "../../js/lib/colormap";
import { approxMeasure } from "../../js/lib/text";
import { drawColorbar, GEOMETRY, NAN_LABEL, tickX } from "../../js/ui/colorbar";
import { recorder, texts } from "./helpers/recorder";

const scale = { vmin: -1, vmax: 1, colormap: "diverging", label: "cosine similarity" };

describe("colorbar", () => {
  it("places values along the bar", () => {
    expect(tickX(-1, scale)).toBe(GEOMETRY.bar.x);
    expect(tickX(1, scale)).toBe(GEOMETRY.bar.x + GEOMETRY.bar.w);
    expect(tickX(0, scale)).toBe(GEOMETRY.bar.x + GEOMETRY.bar.w / 2);
    expect(tickX(2, scale)).toBeNull();
  });

  it("draws label, all 256 colours in order, ticks and the undefined swatch", () => {
    const { ctx, calls } = recorder();
    drawColorbar(ctx, 400, 52, scale, approxMeasure);
    expect(texts(calls)).toEqual(["cosine similarity", "-1", "-0.5", "0", "0.5", "1", NAN_LABEL]);
    const bar = calls.filter(
      (c) => c.name === "fillRect" && c.args[1] === GEOMETRY.bar.y && c.args[3] === GEOMETRY.bar.h,
    );
    const stops = colormapStops("diverging");
    expect(bar.slice(0, 256).map((c) => c.fillStyle)).toEqual(stops.map(cssColor));
    const swatch = calls.find((c) => c.name === "fillRect" && c.args[0] === GEOMETRY.nanSwatch.x)!;
    expect(swatch.fillStyle).toBe(cssColor(NAN_COLOR));
  });

  it("uses the selected colormap", () => {
    const { ctx, calls } = recorder();
    drawColorbar(ctx, 400, 52, { ...scale, colormap: "magma", vmin: 0 }, approxMeasure);
    const first = calls.find((c) => c.name === "fillRect" && c.args[0] === GEOMETRY.bar.x)!;
    expect(first.fillStyle).toBe(cssColor(colormapStops("magma")[0]));
  });

  it("explains a degenerate scale", () => {
    const { ctx, calls } = recorder();
    drawColorbar(ctx, 400, 52, { ...scale, vmin: 0.5, vmax: 0.5 }, approxMeasure);
    expect(texts(calls).some((t) => t.includes("vmin = vmax = 0.5"))).toBe(true);
  });
});
