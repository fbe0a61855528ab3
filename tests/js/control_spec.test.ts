import { describe, expect, it } from "vitest";
import { controlTraits, parseControls, windowText } from "../../js/lib/control_spec";

describe("parseControls", () => {
  it("reads well-formed entries in order and fills absent references with empty strings", () => {
    const specs = parseControls([
      { trait: "layer", type: "slider", label: "Layer", count: "num_layers", text: "layer_label" },
      { trait: "kind", type: "toggles", label: "Kind", options: "kinds_available" },
    ]);
    expect(specs).toEqual([
      {
        trait: "layer",
        type: "slider",
        label: "Layer",
        count: "num_layers",
        text: "layer_label",
        width: "",
        total: "",
        options: "",
      },
      {
        trait: "kind",
        type: "toggles",
        label: "Kind",
        count: "",
        text: "",
        width: "",
        total: "",
        options: "kinds_available",
      },
    ]);
  });

  it("leaves out unknown types, entries without a trait and entries missing what their type needs", () => {
    const specs = parseControls([
      { trait: "x", type: "dial", label: "X", count: "n" },
      { type: "slider", label: "no trait", count: "n" },
      { trait: "layer", type: "slider", label: "Layer" },
      { trait: "start", type: "window", label: "W", width: "w" },
      { trait: "metric", type: "select", label: "Metric" },
      null,
      "slider",
      { trait: "ok", type: "checklist", label: "Ok", options: "ok_available", count: 3 },
    ]);
    expect(specs.map((s) => s.trait)).toEqual(["ok"]);
    expect(specs[0].count).toBe(""); // a non-string reference is no reference
    expect(parseControls(undefined)).toEqual([]);
    expect(parseControls({ trait: "layer" })).toEqual([]);
  });
});

describe("controlTraits", () => {
  it("lists every trait set or read, once", () => {
    const specs = parseControls([
      { trait: "layer", type: "slider", label: "Layer", count: "num_layers", text: "layer_label" },
      { trait: "start", type: "window", label: "Channels", width: "width", total: "num_layers" },
    ]);
    expect(controlTraits(specs)).toEqual(["layer", "num_layers", "layer_label", "start", "width"]);
  });
});

describe("windowText", () => {
  it("describes the window, clamped to the total", () => {
    expect(windowText("channels", 64, 64, 128)).toBe("channels 64–127 of 128");
    expect(windowText("channels", 120, 64, 128)).toBe("channels 120–127 of 128");
  });
});
