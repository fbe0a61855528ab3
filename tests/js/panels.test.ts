import { describe, expect, it } from "vitest";
import { cellValue, parsePanel, parsePanels } from "../../js/lib/panels";
import { f32View, rawPanel } from "./helpers/fake_model";

describe("parsePanel", () => {
  it("decodes values and keeps the fields", () => {
    const p = parsePanel(
      rawPanel({
        id: "a",
        title: "T",
        rows: 2,
        cols: 3,
        data: f32View([1, 2, 3, 4, 5, NaN], 1),
        note: "n",
      }),
      0,
    );
    expect(p.id).toBe("a");
    expect(p.title).toBe("T");
    expect(p.rows).toBe(2);
    expect(Array.from(p.values).slice(0, 5)).toEqual([1, 2, 3, 4, 5]);
    expect(cellValue(p, 1, 2)).toBeNaN();
    expect(cellValue(p, 1, 0)).toBe(4);
    expect(cellValue(p, 2, 0)).toBeNaN();
    expect(cellValue(p, 0, -1)).toBeNaN();
  });

  it("fills defaults for optional fields", () => {
    const p = parsePanel({ rows: 1, cols: 2, data: f32View([1, 2]) }, 4);
    expect(p).toMatchObject({
      id: "4",
      title: "",
      subtitle: "",
      row_labels: null,
      col_labels: null,
      row_offset: 0,
      col_step: 1,
      dtype: "float32",
      note: "",
    });
  });

  it("converts labels to strings and checks their count", () => {
    const p = parsePanel(
      rawPanel({ rows: 2, cols: 1, row_labels: ["a", 3], data: f32View([0, 0]) }),
      0,
    );
    expect(p.row_labels).toEqual(["a", "3"]);
    expect(() =>
      parsePanel(rawPanel({ rows: 2, cols: 1, row_labels: ["a"], data: f32View([0, 0]) }), 0),
    ).toThrow(/row_labels.*1 entries for 2/);
  });

  it("reads head sizes and the axis prefix, none by default", () => {
    const p = parsePanel(
      rawPanel({
        rows: 1,
        cols: 1,
        row_group: 64,
        col_group: 32,
        axis_prefix: "K",
        row_axis: "variant",
        col_axis: "layer",
        data: f32View([0]),
      }),
      0,
    );
    expect([p.row_group, p.col_group, p.axis_prefix]).toEqual([64, 32, "K"]);
    expect([p.row_axis, p.col_axis]).toEqual(["variant", "layer"]);
    const q = parsePanel({ rows: 1, cols: 1, data: f32View([0]) }, 0);
    expect([q.row_group, q.col_group, q.axis_prefix]).toEqual([0, 0, ""]);
    expect([q.row_axis, q.col_axis]).toEqual(["", ""]);
    expect(() => parsePanel(rawPanel({ row_group: -1, data: f32View([1]) }), 0)).toThrow(
      /row_group/,
    );
  });

  it("keeps float16 panels as sent and decodes values on first use", () => {
    const bits = new Uint16Array([0x3c00, 0xbc00, 0x7e00, 0x3800]); // 1, -1, NaN, 0.5
    const buf = new ArrayBuffer(2 * bits.length + 2);
    new Uint8Array(buf, 2).set(new Uint8Array(bits.buffer));
    const p = parsePanel(
      rawPanel({ rows: 2, cols: 2, dtype: "float16", data: new DataView(buf, 2, 8) }),
      0,
    );
    expect(p.raw).toBeInstanceOf(Uint16Array);
    expect(p.raw.buffer).toBe(buf); // aligned: a view of the message, no copy
    expect(cellValue(p, 0, 1)).toBe(-1);
    expect(cellValue(p, 1, 0)).toBeNaN();
    expect(Array.from(p.values)).toEqual([1, -1, NaN, 0.5]);
    expect(p.values).toBe(p.values); // decoded once
  });

  it("rejects bad shapes, dtypes and steps", () => {
    expect(() => parsePanel(rawPanel({ rows: 0, data: f32View([]) }), 0)).toThrow(/rows and cols/);
    expect(() => parsePanel(rawPanel({ rows: 1.5, data: f32View([1]) }), 0)).toThrow(/integer/);
    expect(() => parsePanel(rawPanel({ dtype: "int32", data: f32View([1]) }), 0)).toThrow(/dtype/);
    expect(() => parsePanel(rawPanel({ col_step: 0, data: f32View([1]) }), 0)).toThrow(/step/);
    expect(() => parsePanel("x", 0)).toThrow(/dict/);
  });
});

describe("parsePanels", () => {
  it("keeps good panels and reports bad ones", () => {
    const r = parsePanels([
      rawPanel({ id: "ok", data: f32View([1]) }),
      rawPanel({ id: "short", rows: 2, data: f32View([1]) }),
      rawPanel({ id: "ok2", data: f32View([2]) }),
    ]);
    expect(r.panels.map((p) => p.id)).toEqual(["ok", "ok2"]);
    expect(r.problems).toHaveLength(1);
    expect(r.problems[0]).toMatch(/^panel 1 "short": buffer holds 4 bytes/);
  });

  it("treats missing panels as none and non-lists as a problem", () => {
    expect(parsePanels(undefined)).toEqual({ panels: [], problems: [] });
    expect(parsePanels({}).problems).toEqual(["panels: expected a list"]);
  });
});
