// @vitest-environment jsdom
import { describe, expect, it } from "vitest";
import {
  axisPos,
  axisRange,
  type Chart,
  chartTicks,
  formatChartTick,
  layoutChart,
  layoutCharts,
  MAX_LABELLED_POINTS,
  nearestPoint,
  parseCharts,
  pointLabels,
} from "../../js/lib/charts";
import { approxMeasure } from "../../js/lib/text";
import { ChartStrip } from "../../js/ui/charts";

function chart(extra: Partial<Chart> = {}): Chart {
  const parsed = parseCharts([
    {
      id: "tradeoff",
      title: "KV bytes against damage",
      x_label: "bytes",
      y_label: "ΔNLL",
      x_log: true,
      series: [
        {
          name: "variants",
          x: [46080, 15360, 3840],
          y: [0, 6.66, 0.17],
          labels: ["model", "mqa\nΔNLL +6.66", "mla:128"],
          style: "points",
        },
        { name: "front", x: [3840, 46080], y: [0.17, 0], labels: ["", ""], style: "line" },
      ],
      ...extra,
    },
  ]);
  expect(parsed.problems).toEqual([]);
  return parsed.charts[0];
}

describe("parseCharts", () => {
  it("reads charts, turning null and non-finite values into gaps", () => {
    const { charts } = parseCharts([
      {
        id: "c",
        series: [{ name: "s", x: [1, null, 3], y: [1, 2, "x"], labels: ["a", "b", "c"] }],
      },
    ]);
    expect(charts[0].series[0].x).toEqual([1, null, 3]);
    expect(charts[0].series[0].y).toEqual([1, 2, null]);
    expect(charts[0].series[0].style).toBe("points");
  });

  it("reports a malformed chart and keeps the others", () => {
    const { charts, problems } = parseCharts([
      { id: "bad", series: [{ name: "s", x: [1, 2], y: [1], labels: ["a", "b"] }] },
      { id: "good", series: [] },
      { id: "style", series: [{ name: "s", x: [], y: [], labels: [], style: "bars" }] },
    ]);
    expect(charts.map((c) => c.id)).toEqual(["good"]);
    expect(problems[0]).toContain('chart "bad" series 0: x, y and labels have 2, 1 and 2 entries');
    expect(problems[1]).toContain('unknown style "bars"');
    expect(parseCharts(undefined)).toEqual({ charts: [], problems: [] });
  });
});

describe("axes", () => {
  it("pads a linear range by 5 % and a log range in decades", () => {
    expect(axisRange([0, 10], false)).toEqual({ lo: -0.5, hi: 10.5, log: false });
    const a = axisRange([10, 1000, -5, null], true);
    expect(Math.log10(a.lo)).toBeCloseTo(0.9, 12);
    expect(Math.log10(a.hi)).toBeCloseTo(3.1, 12);
    expect(axisRange([2, 2], false)).toEqual({ lo: 1.8, hi: 2.2, log: false });
  });

  it("places values linearly or by their logarithm", () => {
    expect(axisPos({ lo: 0, hi: 10, log: false }, 2.5, 200)).toBeCloseTo(50, 12);
    expect(axisPos({ lo: 10, hi: 1000, log: true }, 100, 200)).toBeCloseTo(100, 12);
  });

  it("ticks at 1-2-5 steps, or powers of ten on a long log axis", () => {
    expect(chartTicks({ lo: -0.5, hi: 10.5, log: false }, 5)).toEqual([0, 5, 10]);
    expect(chartTicks({ lo: 3000, hi: 60000, log: true })).toEqual([5000, 10000, 20000, 50000]);
    expect(chartTicks({ lo: 800, hi: 2e6, log: true })).toEqual([1000, 10000, 100000, 1000000]);
    // under a decade, 200 and 500 alone would be too few: evenly stepped values, on the log scale
    expect(chartTicks({ lo: 150, hi: 900, log: true })).toEqual([200, 400, 600, 800]);
    expect(chartTicks({ lo: 3000, hi: 8000, log: true })).toEqual([4000, 6000, 8000]);
    // a decade and a half: 100 and 1,000 alone are too few, so 2× and 5× join them
    expect(chartTicks({ lo: 31.8, hi: 1133, log: true }, 5)).toEqual([50, 100, 200, 500, 1000]);
    expect(chartTicks({ lo: 0.011, hi: 0.019, log: true })).toEqual([0.012, 0.014, 0.016, 0.018]);
    expect(chartTicks({ lo: 0, hi: 1, log: false }, 4)).toEqual([0, 0.5, 1]);
    expect(formatChartTick(15360)).toBe("15,360");
    expect(formatChartTick(0.25)).toBe("0.25");
  });
});

describe("point labels", () => {
  const inside = (l: { x: number; y: number }, p: { x: number; y: number; w: number; h: number }) =>
    l.x >= p.x && l.y <= p.y + p.h && l.y - 10 >= p.y;

  it("name each point by the first line of its hover text, inside the plot, none over another", () => {
    const b = layoutChart(chart(), 600, approxMeasure);
    expect(b.labels.map((l) => l.text).sort()).toEqual(["mla:128", "model", "mqa"]);
    for (const l of b.labels) {
      expect(inside(l, b.plot)).toBe(true);
      const w = approxMeasure(l.text, "10px sans-serif");
      expect(l.x + w).toBeLessThanOrEqual(b.plot.x + b.plot.w + 1e-9);
    }
    const rects = b.labels.map((l) => ({
      x: l.x,
      y: l.y - 9,
      w: approxMeasure(l.text, "10px x"),
      h: 10,
    }));
    rects.forEach((r, i) => {
      rects.forEach((q, j) => {
        if (i < j) {
          const apart =
            r.x + r.w <= q.x || q.x + q.w <= r.x || r.y + r.h <= q.y || q.y + q.h <= r.y;
          expect(apart).toBe(true);
        }
      });
    });
  });

  it("leaves out a name with no room, and names nothing on a crowded chart", () => {
    const c = chart();
    const plot = { x: 0, y: 0, w: 100, h: 100 };
    const point = (index: number, x: number, y: number) => ({ series: 0, index, x, y });
    // two points at one place: the second name takes the next spot, a third finds none after four
    const same = [0, 1, 2, 0, 1].map((i) => point(i, 50, 50));
    const placed = pointLabels(c, same, plot, () => 20);
    expect(placed.length).toBe(4);
    const many = Array.from({ length: MAX_LABELLED_POINTS + 1 }, (_, i) => point(0, i, i));
    expect(pointLabels(c, many, plot, () => 5)).toEqual([]);
  });
});

describe("layoutChart", () => {
  it("puts each point where its values are, with y growing upwards", () => {
    const c = chart();
    const b = layoutChart(c, 600, approxMeasure);
    expect(b.w).toBe(480);
    const model = b.points.find((p) => p.series === 0 && p.index === 0)!;
    const mqa = b.points.find((p) => p.series === 0 && p.index === 1)!;
    expect(mqa.y).toBeLessThan(model.y); // more damage is higher
    expect(mqa.x).toBeLessThan(model.x); // fewer bytes is further left
    const expectX = b.plot.x + axisPos(b.xAxis, 15360, b.plot.w);
    expect(mqa.x).toBeCloseTo(expectX, 9);
    // the line series draws no markers, but its path
    expect(b.points.filter((p) => p.series === 1)).toEqual([]);
    expect(b.lines).toHaveLength(1);
    expect(b.lines[0].path).toHaveLength(2);
  });

  it("breaks a line at a missing value and drops values <= 0 on a log axis", () => {
    const { charts } = parseCharts([
      {
        id: "c",
        y_log: true,
        series: [
          { name: "s", x: [1, 2, 3, 4], y: [1, 0, 3, 4], labels: ["", "", "", ""], style: "line" },
        ],
      },
    ]);
    const b = layoutChart(charts[0], 480, approxMeasure);
    expect(b.lines.map((l) => l.path.length)).toEqual([1, 2]);
  });

  it("puts explicit x ticks where the chart asks", () => {
    const { charts } = parseCharts([
      {
        id: "c",
        x_log: true,
        x_ticks: [1, 2, 4, 8, 64],
        series: [{ name: "s", x: [1, 2, 4, 8], y: [1, 2, 3, 4], labels: ["", "", "", ""] }],
      },
    ]);
    const b = layoutChart(charts[0], 480, approxMeasure);
    expect(b.xTicks.map((t) => t.label)).toEqual(["1", "2", "4", "8"]); // 64 is off the axis
    const gaps = b.xTicks.slice(1).map((t, i) => t.pos - b.xTicks[i].pos);
    expect(gaps[1]).toBeCloseTo(gaps[0], 9); // evenly spaced on a log axis
  });

  it("finds the nearest point within the radius only", () => {
    const b = layoutChart(chart(), 480, approxMeasure);
    const mqa = b.points.find((p) => p.index === 1)!;
    expect(nearestPoint(b, mqa.x + 3, mqa.y - 3)).toEqual(mqa);
    expect(nearestPoint(b, mqa.x + 40, mqa.y + 40)).toBeNull();
  });

  it("wraps charts onto a new row when they do not fit side by side", () => {
    const c = chart();
    expect(layoutCharts([c, c], 1200, approxMeasure).boxes.map((b) => b.y)).toEqual([0, 0]);
    const narrow = layoutCharts([c, c], 700, approxMeasure);
    expect(narrow.boxes[1].y).toBeGreaterThan(0);
    expect(narrow.boxes[1].x).toBe(0);
  });
});

describe("ChartStrip", () => {
  it("names the hovered point in the tooltip and sends a click on it", () => {
    const clicks: [string, number, number][] = [];
    const strip = new ChartStrip(document, (c, s, i) => clicks.push([c.id, s, i]));
    document.body.appendChild(strip.root);
    const c = chart();
    strip.setCharts([c], 600, approxMeasure, 1);
    expect(strip.root.hidden).toBe(false);
    const b = strip.current.boxes[0];
    const mqa = b.points.find((p) => p.index === 1)!;
    strip.inspect({ chart: 0, series: 0, index: 1 }, mqa.x, mqa.y);
    expect(strip.tooltip.text).toBe("mqa\nΔNLL +6.66");
    expect(JSON.parse(strip.root.dataset.hover!)).toEqual({
      chart: "tradeoff",
      series: "variants",
      point: 1,
      x: 15360,
      y: 6.66,
    });
    strip.root.dispatchEvent(new MouseEvent("click", { clientX: mqa.x, clientY: mqa.y }));
    expect(clicks).toEqual([["tradeoff", 0, 1]]);
    strip.setCharts([], 600, approxMeasure, 1);
    expect(strip.root.hidden).toBe(true);
    strip.destroy();
  });
});

describe("what a chart is asked to show beside its points", () => {
  const raw = (extra: Record<string, unknown>) => {
    const parsed = parseCharts([
      {
        id: "c",
        title: "t",
        series: [
          {
            name: "s",
            x: [5, 250, 1000],
            y: [3, 2.5, 2],
            labels: ["a", "b", "c"],
            style: "points+line",
          },
        ],
        ...extra,
      },
    ]);
    expect(parsed.problems).toEqual([]);
    return parsed.charts[0];
  };

  it("gives charts over the same steps one axis: a step is at the same place in each", () => {
    const trend = parseCharts([
      {
        id: "trends",
        x_range: [0, 40],
        series: [
          { name: "m", x: [0, 20, 40], y: [0.1, 0.2, 0.3], labels: ["", "", ""], style: "line" },
          { name: "step 20", x: [20, 20], y: [0.1, 0.3], labels: ["", ""], style: "line" },
        ],
      },
    ]).charts[0];
    const loss = raw({
      x_range: [0, 40],
      series: [
        { name: "loss", x: [5, 20, 40], y: [3, 2.5, 2], labels: ["", "", ""], style: "line" },
        { name: "step 20", x: [20, 20], y: [2, 3], labels: ["", ""], style: "line" },
      ],
    });
    const a = layoutChart(trend, 480, approxMeasure);
    const b = layoutChart(loss, 480, approxMeasure);
    const marker = (box: typeof a) => box.lines.find((l) => l.series === 1)?.path[0][0];
    expect(marker(a)).toBeCloseTo(marker(b) as number, 6);
    expect(a.xAxis).toEqual(b.xAxis);
    // without the shared range, the loss chart's axis would start at its first logged step
    const alone = layoutChart({ ...loss, x_range: null }, 480, approxMeasure);
    expect(Math.abs((marker(alone) as number) - (marker(a) as number))).toBeGreaterThan(10);
  });

  it("writes its x ticks as given (the untrained point at 0), and names no point on request", () => {
    const c = raw({
      series: [
        {
          name: "s",
          x: [2.5, 250, 1000],
          y: [3, 2.5, 2],
          labels: ["a", "b", "c"],
          style: "points+line",
        },
      ],
      x_log: true,
      x_ticks: [2.5, 250, 1000],
      x_tick_labels: ["0", "250", "1,000"],
      label_points: false,
    });
    const box = layoutChart(c, 480, approxMeasure);
    expect(box.xTicks.map((t) => t.label)).toEqual(["0", "250", "1,000"]);
    expect(box.labels).toEqual([]); // the legend names the lines: nothing printed across them
    expect(layoutChart({ ...c, label_points: true }, 480, approxMeasure).labels.length).toBe(3);
    expect(
      parseCharts([{ id: "x", series: [], x_ticks: [1, 2], x_tick_labels: ["a"] }]).problems,
    ).toEqual(['chart "x": 1 x_tick_labels for 2 x_ticks']);
  });

  it("says what a click does after its note, where the sender says it", () => {
    const box = layoutChart(
      raw({ note: "layer 3: 0.25", hint: "a click on a point selects its layer" }),
      480,
      approxMeasure,
    );
    expect(box.noteLines.join(" ")).toBe("layer 3: 0.25 · a click on a point selects its layer");
    expect(layoutChart(raw({ note: "layer 3: 0.25" }), 480, approxMeasure).noteLines).toEqual([
      "layer 3: 0.25",
    ]);
  });
});
