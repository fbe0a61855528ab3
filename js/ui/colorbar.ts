/**
 * The shared colorbar: a strip of COLORBAR_H CSS px above the grid with the
 * label, the 256-entry gradient, value ticks and a swatch for undefined
 * (NaN) cells.  Drawn on its own canvas on screen and into the export.
 */

import { colormapStops, cssColor, NAN_COLOR } from "../lib/colormap";
import { formatTick } from "../lib/format";
import { COLORBAR_W, FONTS, type Rect } from "../lib/layout";
import { fitText, type Measure } from "../lib/text";
import { valueTicks } from "../lib/ticks";
import { MUTED_COLOR, TEXT_COLOR } from "./panel_canvas";

export interface ColorScale {
  vmin: number;
  vmax: number;
  colormap: string;
  label: string;
}

export const NAN_LABEL = "undefined";

export interface ColorbarGeometry {
  labelX: number;
  labelY: number; // baseline
  bar: Rect;
  tickLen: number;
  nanSwatch: Rect;
  nanLabelX: number;
}

export const GEOMETRY: ColorbarGeometry = {
  labelX: 16,
  labelY: 14,
  bar: { x: 16, y: 20, w: 256, h: 12 },
  tickLen: 4,
  nanSwatch: { x: 16 + 256 + 24, y: 20, w: 12, h: 12 },
  nanLabelX: 16 + 256 + 24 + 17,
};

/** x of value v on the bar, or null when v lies outside [vmin, vmax]. */
export function tickX(v: number, s: ColorScale, g = GEOMETRY): number | null {
  if (!(s.vmax > s.vmin) || v < s.vmin || v > s.vmax) return null;
  return g.bar.x + ((v - s.vmin) / (s.vmax - s.vmin)) * g.bar.w;
}

export function drawColorbar(
  ctx: CanvasRenderingContext2D,
  width: number,
  height: number,
  s: ColorScale,
  measure: Measure,
  g = GEOMETRY,
): void {
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, width, height);
  ctx.textAlign = "left";
  ctx.textBaseline = "alphabetic";
  ctx.fillStyle = TEXT_COLOR;
  ctx.font = FONTS.subtitle;
  ctx.fillText(
    fitText(s.label, Math.max(COLORBAR_W, width) - 2 * g.labelX, FONTS.subtitle, measure),
    g.labelX,
    g.labelY,
  );

  const stops = colormapStops(s.colormap);
  const { bar } = g;
  const step = bar.w / stops.length;
  stops.forEach((c, i) => {
    ctx.fillStyle = cssColor(c);
    // Overlap each stop by a pixel fraction to avoid hairline seams.
    ctx.fillRect(bar.x + i * step, bar.y, step + 0.5, bar.h);
  });
  ctx.strokeStyle = "#444";
  ctx.lineWidth = 1;
  ctx.strokeRect(bar.x - 0.5, bar.y - 0.5, bar.w + 1, bar.h + 1);

  ctx.fillStyle = TEXT_COLOR;
  ctx.font = FONTS.tick;
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  ctx.beginPath();
  const values = s.vmax > s.vmin ? valueTicks(s.vmin, s.vmax, 5) : [];
  for (const v of values) {
    const x = tickX(v, s, g);
    if (x === null) continue;
    ctx.moveTo(x, bar.y + bar.h + 0.5);
    ctx.lineTo(x, bar.y + bar.h + g.tickLen);
    ctx.fillText(formatTick(v), x, bar.y + bar.h + g.tickLen + 2);
  }
  ctx.stroke();
  if (!(s.vmax > s.vmin)) {
    ctx.textAlign = "left";
    ctx.fillText(
      `all values shown as the middle colour (vmin = vmax = ${formatTick(s.vmin)})`,
      bar.x,
      bar.y + bar.h + 6,
    );
  }

  const sw = g.nanSwatch;
  ctx.fillStyle = cssColor(NAN_COLOR);
  ctx.fillRect(sw.x, sw.y, sw.w, sw.h);
  ctx.strokeRect(sw.x - 0.5, sw.y - 0.5, sw.w + 1, sw.h + 1);
  ctx.fillStyle = MUTED_COLOR;
  ctx.textAlign = "left";
  ctx.textBaseline = "middle";
  ctx.fillText(NAN_LABEL, g.nanLabelX, sw.y + sw.h / 2);
}
