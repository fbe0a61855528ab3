/**
 * The charts above the heatmaps: one canvas per chart, placed by
 * `layoutCharts`.  Hovering near a point shows its label in the tooltip
 * and rings it; a click on a point sends it to the kernel.  The strip's
 * `data-hover` holds the hovered point as JSON, for tests and tools.
 */

import { type Chart, type ChartBox, layoutCharts, nearestPoint } from "../lib/charts";
import type { Measure } from "../lib/text";
import { drawChart } from "./chart_canvas";
import { context2d, h, sizeCanvas } from "./dom";
import { Tooltip } from "./tooltip";

export type ChartClick = (chart: Chart, series: number, point: number) => void;

export interface ChartContent {
  charts: Chart[];
  boxes: ChartBox[];
  w: number;
  h: number;
}

export class ChartStrip {
  readonly root: HTMLDivElement;
  readonly tooltip: Tooltip;
  private canvases: HTMLCanvasElement[] = [];
  private content: ChartContent = { charts: [], boxes: [], w: 0, h: 0 };
  private hovered: { chart: number; series: number; index: number } | null = null;
  private dpr = 1;
  private readonly cleanup: (() => void)[] = [];

  constructor(
    private readonly doc: Document,
    private readonly onClick: ChartClick,
  ) {
    this.tooltip = new Tooltip(doc);
    this.root = h(doc, "div", { className: "hw-charts", attrs: { role: "img" } }, [
      this.tooltip.el,
    ]);
    this.root.hidden = true;
    const listen = (type: string, fn: (e: Event) => void) => {
      this.root.addEventListener(type, fn);
      this.cleanup.push(() => this.root.removeEventListener(type, fn));
    };
    listen("mousemove", (e) => this.onMouse(e as MouseEvent));
    listen("mouseleave", () => this.leave());
    listen("click", (e) => this.onMouseClick(e as MouseEvent));
  }

  /** What is on screen now (the export draws exactly this). */
  get current(): ChartContent {
    return this.content;
  }

  /** Lay the charts out for `width` px and draw them. */
  setCharts(charts: Chart[], width: number, measure: Measure, dpr: number): void {
    const placed = layoutCharts(charts, width, measure);
    this.content = { charts, ...placed };
    this.dpr = dpr;
    this.root.hidden = charts.length === 0;
    this.root.style.width = `${placed.w}px`;
    this.root.style.height = `${placed.h}px`;
    this.root.setAttribute("aria-label", charts.map((c) => `${c.title}. ${c.subtitle}`).join(" "));
    while (this.canvases.length > charts.length) this.canvases.pop()?.remove();
    while (this.canvases.length < charts.length) {
      const canvas = h(this.doc, "canvas", { className: "hw-chart" });
      this.root.appendChild(canvas);
      this.canvases.push(canvas);
    }
    if (charts.length) this.root.appendChild(this.tooltip.el);
    else this.tooltip.el.remove();
    this.hovered = null;
    this.tooltip.hide();
    this.content.boxes.forEach((b, i) => {
      const c = this.canvases[i];
      c.style.left = `${b.x}px`;
      c.style.top = `${b.y}px`;
      c.dataset.chartId = charts[i].id;
      c.dataset.plotRect = JSON.stringify(b.plot);
      // Where each point is drawn (CSS px in the canvas), so that tools and tests can find it.
      c.dataset.points = JSON.stringify(
        b.points.map((p) => [
          p.series,
          p.index,
          Math.round(p.x * 10) / 10,
          Math.round(p.y * 10) / 10,
        ]),
      );
      sizeCanvas(c, b.w, b.h, dpr);
      this.draw(i);
    });
  }

  private draw(i: number): void {
    const ctx = context2d(this.canvases[i]);
    if (!ctx) return;
    ctx.setTransform(this.dpr, 0, 0, this.dpr, 0, 0);
    const hv = this.hovered && this.hovered.chart === i ? this.hovered : null;
    drawChart(ctx, this.content.boxes[i], this.content.charts[i], hv);
  }

  /** The chart and point under (x, y), strip coordinates. */
  private hit(x: number, y: number): { chart: number; series: number; index: number } | null {
    for (let i = 0; i < this.content.boxes.length; i++) {
      const b = this.content.boxes[i];
      if (x < b.x || y < b.y || x > b.x + b.w || y > b.y + b.h) continue;
      const p = nearestPoint(b, x - b.x, y - b.y);
      if (p) return { chart: i, series: p.series, index: p.index };
    }
    return null;
  }

  private point(e: MouseEvent): [number, number] {
    const r = this.root.getBoundingClientRect();
    return [e.clientX - r.left, e.clientY - r.top];
  }

  /** Show the tooltip of a point ((x, y): where the pointer is, strip coordinates). */
  inspect(hit: { chart: number; series: number; index: number }, x: number, y: number): void {
    const prev = this.hovered;
    this.hovered = hit;
    if (prev && prev.chart !== hit.chart) this.draw(prev.chart);
    this.draw(hit.chart);
    const chart = this.content.charts[hit.chart];
    const s = chart.series[hit.series];
    const [title, ...lines] = (s.labels[hit.index] || s.name).split("\n");
    this.tooltip.show(
      { title, row: "", col: "", value: 0, lines },
      x,
      y,
      this.content.w,
      this.content.h,
    );
    this.root.dataset.hover = JSON.stringify({
      chart: chart.id,
      series: s.name,
      point: hit.index,
      x: s.x[hit.index],
      y: s.y[hit.index],
    });
  }

  private onMouse(e: MouseEvent): void {
    const [x, y] = this.point(e);
    const hit = this.hit(x, y);
    if (hit) this.inspect(hit, x, y);
    else this.leave();
  }

  private onMouseClick(e: MouseEvent): void {
    const hit = this.hit(...this.point(e));
    if (hit) this.onClick(this.content.charts[hit.chart], hit.series, hit.index);
  }

  leave(): void {
    this.tooltip.hide();
    const prev = this.hovered;
    this.hovered = null;
    if (prev) this.draw(prev.chart);
  }

  destroy(): void {
    for (const f of this.cleanup.splice(0)) f();
    this.root.remove();
  }
}
