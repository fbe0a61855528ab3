import { describe, expect, it } from "vitest";
import { approxMeasure, breakWord, fitText, font, fontSize, wrapText } from "../../js/lib/text";

const f = font(10);

describe("text helpers", () => {
  it("builds and parses font strings", () => {
    expect(font(12, "600")).toMatch(/^normal 600 12px /);
    expect(fontSize(font(11))).toBe(11);
    expect(fontSize("bold serif")).toBe(10);
    expect(approxMeasure("abcd", f)).toBeCloseTo(24);
  });

  it("fits text with an ellipsis", () => {
    expect(fitText("short", 100, f, approxMeasure)).toBe("short");
    const cut = fitText("a very long title indeed", 60, f, approxMeasure);
    expect(cut.endsWith("…")).toBe(true);
    expect(approxMeasure(cut, f)).toBeLessThanOrEqual(60);
    expect(
      approxMeasure(`${fitText("a very long title indeed", 60, f, approxMeasure)}x`, f),
    ).toBeGreaterThan(60);
    expect(fitText("abc", 2, f, approxMeasure)).toBe("");
  });

  it("wraps words into lines that fit", () => {
    const lines = wrapText("downsampled 4096→1024: mean of 4×4 blocks", 100, f, approxMeasure);
    expect(lines.join(" ")).toBe("downsampled 4096→1024: mean of 4×4 blocks");
    for (const l of lines) expect(approxMeasure(l, f)).toBeLessThanOrEqual(100);
    expect(lines.length).toBeGreaterThan(1);
  });

  it("cuts words longer than a line and limits the line count", () => {
    const lines = wrapText(`${"x".repeat(50)} tail`, 60, f, approxMeasure);
    expect(lines[0].endsWith("…")).toBe(true);
    expect(lines[1]).toBe("tail");
    const many = wrapText("word ".repeat(100), 60, f, approxMeasure, 3);
    expect(many).toHaveLength(3);
    expect(many[2].endsWith("…")).toBe(true);
  });
});

describe("a word longer than a line", () => {
  const f = font(10);
  it("is broken after its commas and semicolons (a long spec), never cut", () => {
    const spec = "kv:int4@0,2-5,7,9-12,14;kv:int8@1,6,8,13,15-29";
    const lines = wrapText(`mixed 59,068.8 B = ${spec}`, 120, f, approxMeasure, 10);
    expect(lines.join("").replace(/\s/g, "")).toBe(`mixed59,068.8B=${spec}`);
    expect(lines.every((l) => approxMeasure(l, f) <= 120)).toBe(true);
    expect(lines.some((l) => l.includes("…"))).toBe(false);
    expect(breakWord(spec, 120, f, approxMeasure).join("")).toBe(spec);
  });
});
