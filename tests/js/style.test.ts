// @vitest-environment jsdom
import { describe, expect, it } from "vitest";
import { CSS, injectStyle } from "../../js/ui/style";

describe("style", () => {
  it("loads nothing from the network and scopes every rule", () => {
    expect(CSS).not.toMatch(/url\(|@import|@font-face|https?:/);
    const selectors = CSS.replace(/\{[^}]*\}/g, "\n")
      .split("\n")
      .flatMap((s) => s.split(","))
      .map((s) => s.trim())
      .filter((s) => s.length > 0);
    expect(selectors.length).toBeGreaterThan(10);
    for (const s of selectors) expect(s).toMatch(/^\.hw-/);
  });

  it("injects one style element", () => {
    const div = document.createElement("div");
    const s = injectStyle(document, div);
    expect(div.querySelectorAll("style")).toHaveLength(1);
    expect(s.textContent).toBe(CSS);
  });
});
