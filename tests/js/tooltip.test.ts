// @vitest-environment jsdom
import { describe, expect, it } from "vitest";
import { place, Tooltip } from "../../js/ui/tooltip";

describe("Tooltip", () => {
  it("shows title, row, column and value", () => {
    const t = new Tooltip(document);
    expect(t.visible).toBe(false);
    t.show({ title: "head 3", row: "tok5", col: "12", value: 0.123456 }, 10, 20, 500);
    expect(t.visible).toBe(true);
    expect(t.text).toBe("head 3\nrow: tok5\ncol: 12\nvalue: 0.1235");
    expect(t.el.style.left).toBe("24px");
    expect(t.el.style.top).toBe("34px");
    t.hide();
    expect(t.visible).toBe(false);
  });

  it("flips left and above near the far edges when there is room", () => {
    const t = new Tooltip(document);
    Object.defineProperty(t.el, "offsetWidth", { value: 100 });
    Object.defineProperty(t.el, "offsetHeight", { value: 60 });
    t.show({ title: "a", row: "0", col: "0", value: 1 }, 300, 200, 350, 240);
    expect([t.el.style.left, t.el.style.top]).toEqual(["186px", "126px"]);
  });

  it("stays inside its container where neither side of the pointer has room", () => {
    const t = new Tooltip(document);
    Object.defineProperty(t.el, "offsetWidth", { value: 100 });
    Object.defineProperty(t.el, "offsetHeight", { value: 60 });
    // 100 px wide at x = 50 of 120: not after the pointer (ends at 164), not before it (starts
    // at −64): moved left until it ends at the container's edge, and up likewise.
    t.show({ title: "a", row: "0", col: "0", value: 1 }, 50, 30, 120, 80);
    expect([t.el.style.left, t.el.style.top]).toEqual(["20px", "20px"]);
    expect(t.el.style.maxWidth).toBe("120px"); // never wider than the container: a long line wraps
    expect(place(50, 300, 120)).toBe(0); // wider than the container: from its start
  });

  it("says undefined for NaN", () => {
    const t = new Tooltip(document);
    t.show({ title: "x", row: "0", col: "0", value: NaN }, 0, 0, 100);
    expect(t.text.split("\n")[3]).toBe("value: undefined");
  });

  it("renders markup in any field as literal text", () => {
    const t = new Tooltip(document);
    document.body.appendChild(t.el);
    const evil = "<img src=x onerror=alert(1)>";
    t.show({ title: evil, row: evil, col: "<script>x</script>", value: 1 }, 0, 0, 100);
    expect(t.el.querySelector("img, script")).toBeNull();
    expect(document.querySelector("img")).toBeNull();
    expect(t.text).toContain(evil);
    expect(t.text).toContain("col: <script>x</script>");
    t.el.remove();
  });
});

describe("Tooltip for heads", () => {
  it("shows the cell by head with its value, then the indices", () => {
    const t = new Tooltip(document);
    const cell = "K h1·d36 × h2·d22 = 0.2310";
    t.show({ title: "Keys · layer 3", row: "100", col: "150", value: 0.231, cell }, 0, 0, 500);
    expect(t.text).toBe(`Keys · layer 3\n${cell}\nindex 100 × 150`);
    expect(t.el.querySelector(".hw-tt-cell")!.textContent).toBe(cell);
    expect(t.el.querySelector(".hw-tt-value")).toBeNull();
    // back to the plain format: every line and its class return
    t.show({ title: "x", row: "1", col: "2", value: 1 }, 0, 0, 500);
    expect(t.text).toBe("x\nrow: 1\ncol: 2\nvalue: 1.000");
    expect(t.el.querySelector(".hw-tt-value")!.textContent).toBe("value: 1.000");
    expect(t.el.querySelector(".hw-tt-cell")).toBeNull();
  });
});
