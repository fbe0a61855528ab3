/**
 * Canvas drawing of one chart laid out by `lib/charts.ts`: title,
 * subtitle, legend, frame, ticks, axis labels, reference line, lines and
 * points, note.  Works in CSS px with the box origin at (0, 0); the caller
 * sets the transform (device pixel ratio on screen, 2× for export).
 */

import {
  CHART_SUBTITLE_Y,
  CHART_TITLE_Y,
  type Chart,
  type ChartBox,
  seriesColor,
} from "../lib/charts";
import { FONTS, NOTE_LINE_H, PAD, SUBTITLE_H } from "../lib/layout";
import { FRAME_COLOR, MUTED_COLOR, TEXT_COLOR } from "./panel_canvas";

const POINT_R = 4;
const GRID_COLOR = "#e6e6e6";

function marker(ctx: CanvasRenderingContext2D, x: number, y: number, r: number): void {
  ctx.beginPath();
  ctx.arc(x, y, r, 0, 2 * Math.PI);
  ctx.fill();
  ctx.stroke();
}

/** Draw the chart; `highlight` (series, index) is drawn larger, with a ring. */
export function drawChart(
  ctx: CanvasRenderingContext2D,
  box: ChartBox,
  chart: Chart,
  highlight: { series: number; index: number } | null = null,
): void {
  ctx.clearRect(0, 0, box.w, box.h);
  ctx.fillStyle = "#fff";
  ctx.fillRect(0, 0, box.w, box.h);
  ctx.textBaseline = "alphabetic";
  ctx.textAlign = "left";
  ctx.fillStyle = TEXT_COLOR;
  ctx.font = FONTS.title;
  ctx.fillText(box.title, PAD, CHART_TITLE_Y);
  ctx.fillStyle = MUTED_COLOR;
  ctx.font = FONTS.subtitle;
  box.subtitleLines.forEach((line, i) => {
    ctx.fillText(line, PAD, CHART_SUBTITLE_Y + i * SUBTITLE_H);
  });

  ctx.font = FONTS.tick;
  for (const entry of box.legend) {
    const s = chart.series[entry.series];
    const color = seriesColor(chart, entry.series);
    ctx.strokeStyle = color;
    ctx.fillStyle = color;
    ctx.lineWidth = 1.5;
    ctx.setLineDash(s.dashed ? [4, 3] : []);
    if (s.style !== "points") {
      ctx.beginPath();
      ctx.moveTo(entry.x, entry.y - 4);
      ctx.lineTo(entry.x + 18, entry.y - 4);
      ctx.stroke();
    }
    ctx.setLineDash([]);
    if (s.style !== "line") {
      ctx.strokeStyle = "#fff";
      marker(ctx, entry.x + 9, entry.y - 4, POINT_R - 0.5);
    }
    ctx.fillStyle = TEXT_COLOR;
    ctx.fillText(s.name, entry.x + 22, entry.y);
  }

  const p = box.plot;
  ctx.strokeStyle = GRID_COLOR;
  ctx.lineWidth = 1;
  for (const t of box.yTicks) {
    ctx.beginPath();
    ctx.moveTo(p.x, p.y + t.pos + 0.5);
    ctx.lineTo(p.x + p.w, p.y + t.pos + 0.5);
    ctx.stroke();
  }
  for (const t of box.xTicks) {
    ctx.beginPath();
    ctx.moveTo(p.x + t.pos + 0.5, p.y);
    ctx.lineTo(p.x + t.pos + 0.5, p.y + p.h);
    ctx.stroke();
  }
  if (box.reference !== null) {
    ctx.strokeStyle = MUTED_COLOR;
    ctx.setLineDash([2, 3]);
    ctx.beginPath();
    ctx.moveTo(p.x, p.y + box.reference + 0.5);
    ctx.lineTo(p.x + p.w, p.y + box.reference + 0.5);
    ctx.stroke();
    ctx.setLineDash([]);
  }
  ctx.strokeStyle = FRAME_COLOR;
  ctx.strokeRect(p.x + 0.5, p.y + 0.5, p.w, p.h);

  ctx.fillStyle = TEXT_COLOR;
  ctx.font = FONTS.tick;
  ctx.textAlign = "center";
  ctx.textBaseline = "top";
  for (const t of box.xTicks) ctx.fillText(t.label, p.x + t.pos, p.y + p.h + 4);
  ctx.textAlign = "right";
  ctx.textBaseline = "middle";
  for (const t of box.yTicks) ctx.fillText(t.label, p.x - 4, p.y + t.pos);
  ctx.textAlign = "center";
  ctx.textBaseline = "alphabetic";
  ctx.fillText(chart.x_label, p.x + p.w / 2, p.y + p.h + 30);
  ctx.save();
  ctx.translate(12, p.y + p.h / 2);
  ctx.rotate(-Math.PI / 2);
  ctx.fillText(chart.y_label, 0, 0);
  ctx.restore();
  ctx.textAlign = "left";

  ctx.save();
  ctx.beginPath();
  ctx.rect(p.x, p.y, p.w + 1, p.h + 1);
  ctx.clip();
  ctx.lineWidth = 1.5;
  for (const line of box.lines) {
    const s = chart.series[line.series];
    ctx.strokeStyle = seriesColor(chart, line.series);
    ctx.setLineDash(s.dashed ? [4, 3] : []);
    ctx.beginPath();
    line.path.forEach(([x, y], i) => {
      if (i === 0) ctx.moveTo(x, y);
      else ctx.lineTo(x, y);
    });
    ctx.stroke();
  }
  ctx.setLineDash([]);
  ctx.lineWidth = 1;
  ctx.strokeStyle = "#fff";
  for (const pt of box.points) {
    ctx.fillStyle = seriesColor(chart, pt.series);
    marker(ctx, pt.x, pt.y, POINT_R);
  }
  ctx.fillStyle = TEXT_COLOR;
  ctx.font = FONTS.tick;
  ctx.textAlign = "left";
  ctx.textBaseline = "alphabetic";
  for (const label of box.labels) ctx.fillText(label.text, label.x, label.y);
  if (highlight) {
    const pt = box.points.find((q) => q.series === highlight.series && q.index === highlight.index);
    if (pt) {
      ctx.fillStyle = seriesColor(chart, pt.series);
      ctx.strokeStyle = TEXT_COLOR;
      ctx.lineWidth = 1.5;
      marker(ctx, pt.x, pt.y, POINT_R + 2);
    }
  }
  ctx.restore();

  if (box.noteLines.length) {
    ctx.fillStyle = MUTED_COLOR;
    ctx.font = FONTS.note;
    box.noteLines.forEach((line, i) => {
      ctx.fillText(line, PAD, box.noteY + i * NOTE_LINE_H);
    });
  }
}
