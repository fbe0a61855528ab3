// @vitest-environment jsdom
import { describe, expect, it } from "vitest";
import widget from "../../js/widget";
import { FakeModel } from "./helpers/fake_model";

describe("widget entry", () => {
  it("renders into el and returns a cleanup that removes everything", () => {
    const fm = new FakeModel({ panels: [], vmin: 0, vmax: 1, colormap: "magma" });
    const el = document.createElement("div");
    const cleanup = widget.render({ model: fm.asModel(), el });
    expect(el.querySelector(".hw-root")).not.toBeNull();
    expect(fm.listenerCount()).toBeGreaterThan(0);
    cleanup();
    expect(el.children).toHaveLength(0);
    expect(fm.listenerCount()).toBe(0);
  });
});
