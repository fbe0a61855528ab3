// @vitest-environment jsdom
import { describe, expect, it } from "vitest";
import { approxMeasure, font } from "../../js/lib/text";
import {
  context2d,
  growCanvas,
  h,
  makeMeasure,
  setHidden,
  setText,
  sizeCanvas,
} from "../../js/ui/dom";

describe("dom helpers", () => {
  it("sets text literally, never as markup", () => {
    const e = h(document, "div", {
      className: "c",
      text: "<img src=x onerror=alert(1)>",
      attrs: { "data-x": "1" },
    });
    expect(e.querySelector("img")).toBeNull();
    expect(e.textContent).toBe("<img src=x onerror=alert(1)>");
    expect(e.className).toBe("c");
    expect(e.dataset.x).toBe("1");
    setText(e, "<b>x</b>");
    expect(e.children).toHaveLength(0);
    expect(e.textContent).toBe("<b>x</b>");
  });

  it("marks form controls so JupyterLab leaves their keys to them", () => {
    for (const tag of ["input", "select", "button", "textarea"] as const) {
      expect(h(document, tag).getAttribute("data-lm-suppress-shortcuts")).toBe("true");
    }
    expect(h(document, "div").hasAttribute("data-lm-suppress-shortcuts")).toBe(false);
  });

  it("nests children and toggles hidden", () => {
    const e = h(document, "div", {}, [
      h(document, "span", { text: "a" }),
      document.createTextNode("b"),
    ]);
    expect(e.textContent).toBe("ab");
    setHidden(e, true);
    expect(e.hidden).toBe(true);
  });

  it("copes with a missing canvas", () => {
    const c = document.createElement("canvas");
    expect(context2d(c)).toBeNull();
    const m = makeMeasure(document);
    expect(m("abc", font(10))).toBe(approxMeasure("abc", font(10)));
  });

  it("sizes canvases in device pixels", () => {
    const c = document.createElement("canvas");
    sizeCanvas(c, 100, 50, 2);
    expect([c.width, c.height, c.style.width, c.style.height]).toEqual([200, 100, "100px", "50px"]);
    sizeCanvas(c, 0, 0, 1);
    expect([c.width, c.height]).toEqual([1, 1]);
  });

  it("grows canvases only, one canvas pixel per device pixel, and sizes them anew at a new ratio", () => {
    const c = document.createElement("canvas");
    expect(growCanvas(c, 100, 50, 2)).toBe(true);
    expect([c.width, c.height, c.style.width, c.style.height]).toEqual([200, 100, "100px", "50px"]);
    expect(growCanvas(c, 60, 80, 2)).toBe(true); // taller: grows, keeps its width
    expect([c.width, c.height, c.style.width, c.style.height]).toEqual([200, 160, "100px", "80px"]);
    expect(growCanvas(c, 40, 20, 2)).toBe(false); // smaller: kept as it is
    expect([c.width, c.height]).toEqual([200, 160]);
    expect(growCanvas(c, 40, 20, 1)).toBe(true); // another ratio: sized for the panel alone
    expect([c.width, c.height, c.style.width, c.style.height]).toEqual([40, 20, "40px", "20px"]);
  });
});
