import { describe, expect, it } from "vitest";
import {
  type Axis,
  cropPanel,
  fieldProblems,
  keyedValue,
  missingState,
  OFFLINE_RULES,
  type PageData,
  pageProblems,
  stateKey,
  unpackUpper,
  windowSubtitle,
} from "../../js/lib/offline";
import { CONTROL_TYPES } from "../../js/lib/protocol";
import { OfflineModel } from "../../js/offline";

const layer: Axis = { trait: "layer", type: "slider", label: "Layer", values: [1, 2] };
const kind: Axis = { trait: "kind", type: "toggles", label: "Kind", values: ["key", "key_post"] };
const specs: Axis = {
  trait: "mechanisms",
  type: "checklist",
  label: "Mechanisms",
  options: ["mha", "mqa", "gqa:2"],
};

describe("stateKey", () => {
  it("writes what Python's state_key writes", () => {
    // export/_source.py: state_key([3, "key_post", ["mha", "mqa"]]) == '[3,"key_post",["mha","mqa"]]'
    const state: Record<string, unknown> = {
      layer: 3,
      kind: "key_post",
      mechanisms: ["mha", "mqa"],
    };
    expect(stateKey([layer, kind, specs], (t) => state[t])).toBe('[3,"key_post",["mha","mqa"]]');
    expect(stateKey([], () => 0)).toBe("[]");
    expect(JSON.stringify(["é\u001b"])).toBe('["é\\u001b"]'); // as json.dumps(ensure_ascii=False)
  });

  it("lists a checklist's choice in the order of its options", () => {
    expect(keyedValue(specs, ["gqa:2", "mha"])).toEqual(["mha", "gqa:2"]);
    expect(keyedValue(specs, ["typed"])).toEqual(["typed"]);
    expect(keyedValue(specs, "not a list")).toEqual([]);
    expect(keyedValue(kind, "key")).toBe("key");
  });
});

describe("the page's rules and fields", () => {
  it("has rules for every control type of the protocol", () => {
    expect(Object.keys(OFFLINE_RULES)).toEqual(Object.keys(CONTROL_TYPES));
  });
  it("names a missing, an unknown and a mistyped field", () => {
    const fields = { a: "number", b: "list|null", c: "string?" } as const;
    expect(fieldProblems({ a: 1, b: null }, fields, "x")).toEqual([]);
    expect(fieldProblems({ b: 2, c: "", d: 0 }, fields, "x")).toEqual([
      "x: no a",
      "x: b is a number, not a list|null",
      "x: unknown field d",
    ]);
    expect(fieldProblems([], fields, "x")).toEqual(["x: expected an object, got list"]);
  });
});

describe("missingState", () => {
  const page = {
    axes: [layer, kind],
    frames: { '[1,"key"]': {} as never },
    errors: { '[2,"key"]': "layer 2 was not captured" },
  };
  it("gives the view's own error for a state it could not show", () => {
    const state: Record<string, unknown> = { layer: 2, kind: "key" };
    expect(missingState(page, '[2,"key"]', (t) => state[t], { layer: "layer_label" }).error).toBe(
      "layer 2 was not captured",
    );
  });
  it("names a slider position the file leaves out, and how to add it", () => {
    const state: Record<string, unknown> = { layer: 0, kind: "key" };
    const missing = missingState(page, '[0,"key"]', (t) => state[t], { layer: "layer_label" });
    expect(missing.error).toBe(
      "layer 0 is not in this file (it holds layers 1, 2); export it with save(view, path, layers=[...])",
    );
    expect(missing.traits).toEqual({ layer_label: "layer 0 (not in this file)" });
  });
  it("says a combination was left out by the budget", () => {
    const state: Record<string, unknown> = { layer: 1, kind: "key_post" };
    const missing = missingState(page, '[1,"key_post"]', (t) => state[t], {});
    expect(missing.error).toContain("this combination is not in this file: it holds 1 states");
    expect(missing.error).toContain("max_states");
  });
});

describe("cropping a window", () => {
  const n = 4;
  const bits = new Uint16Array(n * n).map((_, i) => i); // cell (r, c) holds 4r + c
  const panel = {
    rows: n,
    cols: n,
    dtype: "float16",
    blob: 0,
    packed: "",
    subtitle: "channels 0–3 · Pearson over 9 tokens",
    window_subtitle: "channels {first}–{last} · Pearson over 9 tokens",
    row_offset: 0,
    col_offset: 0,
    data: new DataView(bits.buffer),
  };
  it("cuts the window's cells, offsets and subtitle", () => {
    const cut = cropPanel(panel, 1, 2);
    expect([cut.rows, cut.cols, cut.row_offset, cut.col_offset]).toEqual([2, 2, 1, 1]);
    expect(Array.from(new Uint16Array(cut.data.buffer))).toEqual([5, 6, 9, 10]);
    expect(cut.subtitle).toBe("channels 1–2 · Pearson over 9 tokens");
  });
  it("clamps a window that runs past the panel", () => {
    const cut = cropPanel(panel, 3, 10);
    expect([cut.rows, cut.row_offset]).toEqual([1, 3]);
    expect(Array.from(new Uint16Array(cut.data.buffer))).toEqual([15]);
    expect(cropPanel(panel, -4, 0).rows).toBe(1);
  });
  it("keeps a subtitle that names no window", () => {
    expect(windowSubtitle({ subtitle: "plain", window_subtitle: "" }, 0, 3)).toBe("plain");
  });
  it("unpacks an upper triangle into the symmetric matrix", () => {
    const upper = new Uint16Array([1, 2, 3, 4, 5, 6]); // 3×3: (0,0) (0,1) (0,2) (1,1) (1,2) (2,2)
    expect(Array.from(unpackUpper(upper, 3))).toEqual([1, 2, 3, 2, 4, 5, 3, 5, 6]);
  });
});

describe("OfflineModel", () => {
  const blob = (values: number[]) =>
    btoa(String.fromCharCode(...new Uint8Array(new Uint16Array(values).buffer)));
  const frame = (title: string, blobIndex: number) => ({
    vmin: -1,
    vmax: 1,
    colormap: "diverging",
    colorbar_label: "r",
    columns: 1,
    charts: [{ ...chart, series: [0] }],
    traits: { layer_label: `${title} read-out` },
    panels: [
      {
        id: title,
        title,
        subtitle: "",
        rows: 1,
        cols: 1,
        row_labels: null,
        col_labels: null,
        row_offset: 0,
        col_offset: 0,
        row_step: 1,
        col_step: 1,
        row_group: 0,
        col_group: 0,
        axis_prefix: "",
        row_axis: "",
        col_axis: "",
        dtype: "float16",
        note: "",
        hint: "",
        window_subtitle: "",
        mark_row: -1,
        mark_col: -1,
        axis_titles: false,
        blob: blobIndex,
        packed: "",
      },
    ],
  });
  const chart = {
    id: "trend",
    title: "Trend",
    subtitle: "",
    note: "",
    x_label: "x",
    y_label: "y",
    x_log: false,
    y_log: false,
    y_reference: null,
    x_ticks: [],
    x_tick_labels: [],
    x_range: [],
    label_points: true,
    hint: "",
  };
  const series = {
    name: "s",
    x: [0],
    y: [1],
    labels: ["a"],
    style: "line",
    color: "",
    dashed: false,
  };
  const page: PageData = {
    state: {
      controls: [
        {
          trait: "layer",
          type: "slider",
          label: "Layer",
          count: "num_layers",
          text: "layer_label",
        },
        { trait: "kind", type: "toggles", label: "Kind", options: "kinds_available" },
      ],
      layer: 0,
      kind: "key",
      num_layers: 3,
      kinds_available: ["key", "value"],
      panels: [],
    },
    axes: [
      { ...layer, values: [0, 1] },
      { ...kind, values: ["key", "value"] },
    ],
    frames: {
      '[0,"key"]': frame("k0", 0),
      '[1,"key"]': frame("k1", 1),
      '[0,"value"]': frame("v0", 0),
    },
    errors: {},
    blobs: [blob([0x3c00]), blob([0xbc00])],
    series: [series],
    bundle: "",
  };

  it("draws a frame's charts with the series the page holds once", () => {
    expect(pageProblems(page)).toEqual([]);
    const model = new OfflineModel(page);
    expect(model.get("charts")).toEqual([{ ...chart, series: [series] }]);
  });

  it("says what is wrong with a page it cannot read, on every state: never a silent drop", () => {
    const dial = {
      ...page,
      axes: [...page.axes, { trait: "knob", type: "dial", label: "Knob", values: [1] }],
    };
    const model = new OfflineModel(dial);
    expect(String(model.get("error")).split("\n")).toContain(
      'axis 2 ("knob"): unknown control type "dial"',
    );
    const broken = { ...page, series: [], frames: { '[0,"key"]': { ...frame("k0", 5) } } };
    expect(pageProblems(broken)).toEqual([
      'frame [0,"key"], panel 0: no blob 5',
      'frame [0,"key"], chart 0: no series 0',
    ]);
    const { axes: _axes, ...noAxes } = page;
    expect(pageProblems(noAxes)).toEqual(["page: no axes"]);
  });

  it("shows the saved state, then each state a control commits", () => {
    const model = new OfflineModel(page);
    const changed: string[] = [];
    model.on("change:panels", () => changed.push("panels"));
    expect((model.get("panels") as { id: string }[])[0].id).toBe("k0");
    expect(model.get("layer_label")).toBe("k0 read-out");
    model.set("layer", 1);
    model.save_changes();
    const panels = model.get("panels") as { id: string; data: DataView }[];
    expect(panels[0].id).toBe("k1");
    expect(panels[0].data.getUint16(0, true)).toBe(0xbc00);
    expect(model.get("layer_label")).toBe("k1 read-out");
    expect(changed).toEqual(["panels"]);
    model.set("layer", 0);
    model.set("kind", "value");
    model.save_changes();
    expect((model.get("panels") as { id: string }[])[0].id).toBe("v0");
    expect(model.get("error")).toBe("");
  });

  it("says why a state is missing and keeps the last panels", () => {
    const model = new OfflineModel(page);
    model.set("layer", 2);
    model.save_changes();
    expect(model.get("error")).toContain("layer 2 is not in this file (it holds layers 0, 1)");
    expect(model.get("layer_label")).toBe("layer 2 (not in this file)");
    expect((model.get("panels") as { id: string }[])[0].id).toBe("k0");
    model.send({ type: "click" });
    expect(model.sent).toEqual([{ type: "click" }]);
  });
});
