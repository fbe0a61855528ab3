import { describe, expect, it } from "vitest";
import {
  controlTraits,
  longestWindowText,
  parseControls,
  sliderStops,
  snapStep,
  snapWindow,
  stopIndex,
  windowText,
} from "../../js/lib/control_spec";
import { CONTROL_TYPES } from "../../js/lib/protocol";

describe("parseControls", () => {
  it("reads well-formed entries in order and fills absent references with empty strings", () => {
    const { specs, problems } = parseControls([
      { trait: "layer", type: "slider", label: "Layer", count: "num_layers", text: "layer_label" },
      { trait: "kind", type: "toggles", label: "Kind", options: "kinds_available" },
    ]);
    expect(problems).toEqual([]);
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
        step: "",
        positions: "",
        labels: {},
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
        step: "",
        positions: "",
        labels: {},
      },
    ]);
  });

  it("reads the option labels' string entries and nothing else", () => {
    const [spec] = parseControls([
      {
        trait: "kind",
        type: "toggles",
        label: "Kind",
        options: "kinds_available",
        labels: { key: "keys, pre-RoPE", key_post: "keys, post-RoPE", value: 3 },
      },
    ]).specs;
    expect(spec.labels).toEqual({ key: "keys, pre-RoPE", key_post: "keys, post-RoPE" });
    const [listed] = parseControls([
      { trait: "m", type: "select", label: "M", options: "ms", labels: ["a", "b"] },
    ]).specs;
    expect(listed.labels).toEqual({});
  });

  it("leaves out unknown types, entries without a trait and entries missing what their type needs, and says why", () => {
    const { specs, problems } = parseControls([
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
    const known = `this page knows ${Object.keys(CONTROL_TYPES).join(", ")}`;
    expect(problems).toEqual([
      `control "x": unknown control type "dial" (${known})`, // never dropped without a word
      "slider control without a trait lacks trait",
      'slider control "layer" lacks count',
      'window control "start" lacks total',
      'select control "metric" lacks options',
      `control without a trait: unknown control type undefined (${known})`,
      `control without a trait: unknown control type undefined (${known})`,
    ]);
    expect(parseControls(undefined)).toEqual({ specs: [], problems: [] });
    expect(parseControls({ trait: "layer" })).toEqual({ specs: [], problems: [] });
  });
});

describe("controlTraits", () => {
  it("lists every trait set or read, once", () => {
    const { specs } = parseControls([
      { trait: "layer", type: "slider", label: "Layer", count: "num_layers", text: "layer_label" },
      { trait: "start", type: "window", label: "Channels", width: "width", total: "num_layers" },
    ]);
    expect(controlTraits(specs)).toEqual(["layer", "num_layers", "layer_label", "start", "width"]);
  });

  it("includes a window's step trait", () => {
    const { specs } = parseControls([
      { trait: "start", type: "window", label: "C", width: "w", total: "n", step: "head" },
    ]);
    expect(specs[0].step).toBe("head");
    expect(controlTraits(specs)).toEqual(["start", "w", "n", "head"]);
  });
});

describe("a slider's positions", () => {
  it("are its positions trait when it lists numbers, else 0 .. count - 1", () => {
    const { specs } = parseControls([
      { trait: "paired", type: "slider", label: "P", count: "n", positions: "layer_positions" },
    ]);
    expect(specs[0].positions).toBe("layer_positions");
    expect(controlTraits(specs)).toEqual(["paired", "n", "layer_positions"]);
    expect(sliderStops(30, [8, 9, 10, 12])).toEqual([8, 9, 10, 12]);
    expect(sliderStops(3, [])).toEqual([0, 1, 2]);
    expect(sliderStops(2, null)).toEqual([0, 1]);
    expect(sliderStops(2, ["x"])).toEqual([0, 1]);
    expect(sliderStops(0, undefined)).toEqual([]);
  });

  it("place a value at its index, and one they lack at the nearest", () => {
    expect(stopIndex([8, 9, 12], 12)).toBe(2);
    expect(stopIndex([8, 9, 12], 3)).toBe(0);
    expect(stopIndex([8, 9, 12], 11)).toBe(2);
    expect(stopIndex([0, 1, 2], 1)).toBe(1);
  });
});

describe("snapWindow", () => {
  it("snaps start and width to multiples of the step, inside the total", () => {
    expect(snapWindow(70, 60, 192, 64)).toEqual({ start: 64, width: 64 });
    expect(snapWindow(0, 63, 192, 64)).toEqual({ start: 0, width: 64 });
    expect(snapWindow(150, 64, 192, 64)).toEqual({ start: 128, width: 64 });
    expect(snapWindow(10, 10, 192, 64)).toEqual({ start: 0, width: 64 }); // at least one step
    expect(snapWindow(64, 1000, 192, 64)).toEqual({ start: 0, width: 192 });
    expect(snapWindow(100, 130, 4096, 128)).toEqual({ start: 128, width: 128 });
  });

  it("only clamps without a step", () => {
    expect(snapWindow(63, 64, 192, 1)).toEqual({ start: 63, width: 64 });
    expect(snapWindow(60, 100, 128, 0)).toEqual({ start: 28, width: 100 });
    expect(snapWindow(-4, 0, 128, 1)).toEqual({ start: 0, width: 1 });
  });

  it("keeps a total that is not a multiple of the step reachable as a whole", () => {
    expect(snapWindow(0, 100, 100, 64)).toEqual({ start: 0, width: 100 });
    expect(snapWindow(50, 64, 100, 64)).toEqual({ start: 0, width: 64 });
  });

  it("reads the step", () => {
    expect([snapStep(64), snapStep(1), snapStep(0), snapStep(NaN), snapStep(2.7)]).toEqual([
      64, 1, 1, 1, 2,
    ]);
  });

  it("gives the longest read-out of a total", () => {
    expect(longestWindowText("channels", 192)).toBe("channels 888–888 of 888");
    expect(longestWindowText("channels", 192).length).toBeGreaterThanOrEqual(
      windowText("channels", 100, 92, 192).length,
    );
  });
});

describe("windowText", () => {
  it("describes the window, clamped to the total", () => {
    expect(windowText("channels", 64, 64, 128)).toBe("channels 64–127 of 128");
    expect(windowText("channels", 120, 64, 128)).toBe("channels 120–127 of 128");
  });
});
