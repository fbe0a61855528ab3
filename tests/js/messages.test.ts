// @vitest-environment jsdom
import { describe, expect, it } from "vitest";
import { Messages } from "../../js/ui/messages";
import { FakeModel } from "./helpers/fake_model";

describe("Messages", () => {
  it("shows the error trait as text and hides the box when empty", () => {
    const fm = new FakeModel({ error: "", status: "" });
    const m = new Messages(document, fm.asModel());
    expect(m.error.hidden).toBe(true);
    fm.set("error", "bad <img src=x onerror=alert(1)> thing");
    expect(m.error.hidden).toBe(false);
    expect(m.error.textContent).toBe("bad <img src=x onerror=alert(1)> thing");
    expect(m.error.querySelector("img")).toBeNull();
    expect(m.error.getAttribute("role")).toBe("alert");
    fm.set("error", "");
    expect(m.error.hidden).toBe(true);
  });

  it("adds problems found in the browser", () => {
    const fm = new FakeModel({ error: "from python" });
    const m = new Messages(document, fm.asModel());
    m.setLocalProblems(["panel 0: broken"]);
    expect(m.error.textContent).toBe("from python\npanel 0: broken");
    fm.set("error", "");
    expect(m.error.textContent).toBe("panel 0: broken");
    m.setLocalProblems([]);
    expect(m.error.hidden).toBe(true);
  });

  it("shows the heading trait as text, hidden when empty", () => {
    const fm = new FakeModel({ heading: "" });
    const m = new Messages(document, fm.asModel());
    expect(m.heading.hidden).toBe(true);
    fm.set("heading", "SmolLM2 · layer <b>3</b>");
    expect(m.heading.hidden).toBe(false);
    expect(m.heading.textContent).toBe("SmolLM2 · layer <b>3</b>");
    expect(m.heading.querySelector("b")).toBeNull();
  });

  it("follows the status trait and unbinds on destroy", () => {
    const fm = new FakeModel({ status: "computing…" });
    const m = new Messages(document, fm.asModel());
    expect(m.status.textContent).toBe("computing…");
    fm.set("status", "");
    expect(m.status.textContent).toBe("");
    m.destroy();
    expect(fm.listenerCount()).toBe(0);
  });
});
