// @vitest-environment jsdom
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import {
  Controls,
  type EntryControl,
  type OptionsControl,
  SliderControl,
  WindowControl,
} from "../../js/ui/controls";
import { type Checklist, type Choice, SLIDER_DEBOUNCE_MS } from "../../js/ui/inputs";
import { FakeModel } from "./helpers/fake_model";

const fire = (e: Element, type: string) => e.dispatchEvent(new Event(type, { bubbles: true }));

/** The bar of a view with every kind of control (what Python sends in `controls`). */
const CONTROLS = [
  { trait: "layer", type: "slider", label: "Layer", count: "num_layers", text: "layer_label" },
  {
    trait: "channel_start",
    type: "window",
    label: "Channels",
    width: "channel_width",
    total: "num_channels",
  },
  { trait: "kind", type: "toggles", label: "Kind", options: "kinds_available" },
  { trait: "metric", type: "select", label: "Metric", options: "metrics_available" },
  { trait: "alignment", type: "select", label: "Alignment", options: "alignments_available" },
  { trait: "mechanisms", type: "checklist", label: "Mechanisms", options: "mechanisms_available" },
  { trait: "add_mechanism", type: "entry", label: "Add mechanism" },
];

function bar(state: Record<string, unknown> = {}) {
  const fm = new FakeModel({
    controls: CONTROLS,
    layer: 3,
    num_layers: 30,
    layer_label: "layer 3 of 0–29",
    channel_start: 0,
    channel_width: 64,
    num_channels: 128,
    kind: "key",
    kinds_available: ["key", "value", "key_post"],
    metric: "mean",
    metrics_available: ["mean", "max"],
    alignment: "",
    alignments_available: [],
    mechanisms: [],
    mechanisms_available: [],
    add_mechanism: "",
    ...state,
  });
  let exports = 0;
  const c = new Controls(document, fm.asModel(), () => exports++);
  document.body.replaceChildren(c.el); // checkboxes fire change only when connected
  return { fm, c, exports: () => exports };
}

/** The full bar, with each control's inputs at hand. */
function setup(state: Record<string, unknown> = {}) {
  const { fm, c, exports } = bar(state);
  const layer = (c.control("layer") as SliderControl).slider;
  const channels = c.control("channel_start") as WindowControl;
  const kind = c.control("kind") as OptionsControl;
  const metric = (c.control("metric") as OptionsControl).input as Choice;
  const alignment = (c.control("alignment") as OptionsControl).input as Choice;
  const mechanisms = (c.control("mechanisms") as OptionsControl).input as Checklist;
  return { fm, c, layer, channels, kind, metric, alignment, mechanisms, exports };
}

describe("Controls", () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it("an entry sets its trait to the submitted text (Enter or Add) and clears the field", () => {
    const { fm, c } = setup();
    const entry = (c.control("add_mechanism") as EntryControl).entry;
    entry.input.value = "  gqa:2 ";
    entry.input.dispatchEvent(new KeyboardEvent("keydown", { key: "Enter", bubbles: true }));
    expect(fm.get("add_mechanism")).toBe("gqa:2");
    expect(entry.input.value).toBe("");
    entry.input.value = "lrkv:16";
    entry.button.click();
    expect(fm.get("add_mechanism")).toBe("lrkv:16");
    entry.input.value = "   ";
    entry.button.click(); // nothing to add
    expect(fm.get("add_mechanism")).toBe("lrkv:16");
  });

  it("builds one control per entry of the description, in order, then the export button", () => {
    const { c } = setup();
    expect(c.all.map((x) => x.spec.trait)).toEqual([
      "layer",
      "channel_start",
      "kind",
      "metric",
      "alignment",
      "mechanisms",
      "add_mechanism",
    ]);
    expect(c.el.lastElementChild).toBe(c.exportButton);
    expect(c.exportButton.parentElement).toBe(c.el);
    expect(c.list.contains(c.control("layer")!.el)).toBe(true);
    expect(c.list.contains(c.exportButton)).toBe(false);
    expect(c.control("layer")).toBeInstanceOf(SliderControl);
    expect(c.control("channel_start")).toBeInstanceOf(WindowControl);
    expect(c.control("pinned")).toBeUndefined();
  });

  it("shows the model state", () => {
    const { layer, channels, metric, alignment, mechanisms } = setup();
    expect(layer.input.value).toBe("3");
    expect(layer.input.max).toBe("29");
    expect(layer.output.textContent).toBe("layer 3 of 0–29");
    expect(channels.width.input.value).toBe("64");
    expect(channels.start.input.max).toBe("64");
    expect(channels.width.output.textContent).toBe("channels 0–63 of 128");
    expect(metric.select.value).toBe("mean");
    expect(alignment.el.hidden).toBe(true);
    expect(mechanisms.el.hidden).toBe(true);
  });

  it("follows trait changes from Python", () => {
    const { fm, layer, channels, alignment, c } = setup();
    fm.set("layer", 7);
    fm.set("layer_label", "layer 7 of 0–29");
    expect(layer.input.value).toBe("7");
    expect(layer.output.textContent).toBe("layer 7 of 0–29");
    fm.set("num_channels", 0);
    expect(channels.el.hidden).toBe(true);
    fm.set("alignments_available", ["rope", "none"]);
    fm.set("alignment", "none");
    expect(alignment.el.hidden).toBe(false);
    expect(alignment.select.value).toBe("none");
    fm.set("num_layers", 0);
    expect(c.control("layer")!.el.hidden).toBe(true);
  });

  it("commits the layer slider after change with save_changes", () => {
    const { fm, layer } = setup();
    layer.input.value = "4";
    fire(layer.input, "input");
    expect(layer.output.textContent).toBe("layer 4…");
    fire(layer.input, "change");
    expect(fm.state.layer).toBe(4);
    expect(fm.saves).toHaveLength(1);
    vi.advanceTimersByTime(SLIDER_DEBOUNCE_MS);
    expect(fm.saves).toHaveLength(1);
  });

  it("a slider with positions stops at those alone and says them as they are", () => {
    const positions = [8, 9, 10, 12];
    const { fm, c } = bar({
      controls: [{ ...CONTROLS[0], positions: "layer_positions" }],
      layer: 10,
      layer_positions: positions,
      layer_label: "layer 10 of 8, 9, 10, 12",
    });
    const layer = (c.control("layer") as SliderControl).slider;
    expect([layer.input.min, layer.input.max, layer.input.value]).toEqual(["0", "3", "2"]);
    layer.input.value = "3";
    fire(layer.input, "input");
    expect(layer.output.textContent).toBe("layer 12…");
    fire(layer.input, "change");
    expect(fm.state.layer).toBe(12);
    fm.set("layer", 8); // from Python
    expect(layer.input.value).toBe("0");
    fm.set("layer", 3); // a value it lacks (the kernel refuses it): the thumb at the nearest
    expect(layer.input.value).toBe("0");
    fm.set("layer_positions", [1, 2, 3]);
    expect([layer.input.max, layer.input.value]).toEqual(["2", "2"]);
  });

  it("keeps the channel window inside when the width grows", () => {
    const { fm, channels } = setup({ channel_start: 60, channel_width: 32 });
    channels.width.input.value = "100";
    fire(channels.width.input, "change");
    vi.advanceTimersByTime(SLIDER_DEBOUNCE_MS);
    expect(fm.state.channel_width).toBe(100);
    expect(fm.state.channel_start).toBe(28);
    expect(fm.saves).toHaveLength(1);
    expect(channels.start.input.max).toBe("28");
  });

  it("snaps start and width to the step when the step trait is above 1", () => {
    const snapped = CONTROLS.map((c) => (c.type === "window" ? { ...c, step: "channel_step" } : c));
    const { fm, channels } = setup({
      controls: snapped,
      channel_step: 64,
      num_channels: 192,
      channel_start: 0,
      channel_width: 64,
    });
    expect([channels.width.input.step, channels.width.input.min]).toEqual(["64", "64"]);
    expect(channels.start.input.step).toBe("64");
    channels.widthField.input.value = "100"; // typed: the nearest multiple
    fire(channels.widthField.input, "change");
    expect(fm.state.channel_width).toBe(128);
    channels.startField.input.value = "70";
    fire(channels.startField.input, "change");
    expect(fm.state.channel_start).toBe(64);
    expect(channels.width.output.textContent).toBe("channels 64–191 of 192");
    fm.set("channel_step", 1); // snapping off: exact values
    channels.widthField.input.value = "63";
    fire(channels.widthField.input, "change");
    expect(fm.state.channel_width).toBe(63);
    expect(channels.width.input.step).toBe("1");
  });

  it("reaches an exact width by typing it, pulling the start back inside", () => {
    const { fm, channels } = setup({ num_channels: 192, channel_start: 150, channel_width: 32 });
    channels.widthField.input.value = "64";
    fire(channels.widthField.input, "change");
    expect(fm.state.channel_width).toBe(64);
    expect(fm.state.channel_start).toBe(128);
    expect(channels.widthField.input.value).toBe("64");
    expect(channels.width.input.value).toBe("64");
    channels.widthField.input.value = "";
    fire(channels.widthField.input, "change"); // an empty field commits nothing
    expect(fm.state.channel_width).toBe(64);
  });

  it("gives a slider a pixel per position, within bounds", () => {
    const { channels, layer } = setup({ num_channels: 192 });
    expect(channels.width.input.style.width).toBe(`${192 + 16}px`);
    expect(layer.input.style.width).toBe("160px");
    const big = setup({ num_channels: 4096 }).channels;
    expect(big.width.input.style.width).toBe("320px");
  });

  it("keeps room in read-outs for their longest text", () => {
    const { fm, channels, layer } = setup({ num_channels: 4096, channel_width: 8 });
    const room = channels.width.output.style.minWidth;
    expect(room).toBe(`${"channels 8888–8888 of 8888…".length}ch`);
    fm.set("channel_start", 4000);
    expect(channels.width.output.style.minWidth).toBe(room);
    fm.set("layer_label", "layer 3 of 0–29 (a much longer description of the layer)");
    const grown = layer.output.style.minWidth;
    fm.set("layer_label", "layer 3");
    expect(layer.output.style.minWidth).toBe(grown); // never shrinks
  });

  it("commits kind, metric and mechanisms", () => {
    const { fm, kind, metric, mechanisms } = setup({ mechanisms_available: ["copy", "induction"] });
    (kind.el.querySelector('[data-value="value"]') as HTMLButtonElement).click();
    expect(fm.state.kind).toBe("value");
    metric.select.value = "max";
    fire(metric.select, "change");
    expect(fm.state.metric).toBe("max");
    (mechanisms.el.querySelectorAll("input")[1] as HTMLInputElement).click();
    expect(fm.state.mechanisms).toEqual(["induction"]);
    expect(fm.saves).toHaveLength(3);
  });

  it("runs the export callback and unbinds on destroy", () => {
    const { fm, c, exports } = setup();
    c.exportButton.click();
    expect(exports()).toBe(1);
    c.destroy();
    expect(fm.listenerCount()).toBe(0);
  });

  it("shows only the export button without a description, and rebuilds when it changes", () => {
    const { fm, c } = bar({ controls: [] });
    expect([...c.list.children]).toEqual([]);
    expect([...c.el.children]).toEqual([c.list, c.exportButton]);
    fm.set("controls", [CONTROLS[0]]);
    expect(c.all.map((x) => x.spec.trait)).toEqual(["layer"]);
    expect(c.el.querySelector<HTMLInputElement>('input[data-trait="layer"]')!.value).toBe("3");
    const before = c.control("layer");
    fm.set("controls", [{ ...CONTROLS[0] }]); // an equal description keeps the controls
    expect(c.control("layer")).toBe(before);
    fm.set("controls", []);
    expect([...c.list.children]).toEqual([]);
    expect(c.el.lastElementChild).toBe(c.exportButton);
    c.destroy();
    expect(fm.listenerCount()).toBe(0);
  });

  it("labels a slider without a text trait from its own label and value", () => {
    const { c } = bar({
      controls: [{ trait: "head", type: "slider", label: "Head", count: "num_heads" }],
      head: 2,
      num_heads: 9,
    });
    const head = (c.control("head") as SliderControl).slider;
    expect(head.output.textContent).toBe("head 2 of 9");
    expect(head.el.querySelector(".hw-label")!.textContent).toBe("Head");
  });

  it("renders a hostile label as text", () => {
    const xss = "<img src=x onerror=alert(1)>";
    const { c } = bar({
      controls: [{ trait: "metric", type: "select", label: xss, options: "metrics_available" }],
    });
    expect(c.el.querySelector("img")).toBeNull();
    expect(c.el.querySelector(".hw-label")!.textContent).toBe(xss);
  });
});
