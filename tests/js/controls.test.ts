// @vitest-environment jsdom
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Controls, channelText } from "../../js/ui/controls";
import { SLIDER_DEBOUNCE_MS } from "../../js/ui/inputs";
import { FakeModel } from "./helpers/fake_model";

const fire = (e: Element, type: string) => e.dispatchEvent(new Event(type, { bubbles: true }));

function setup(state: Record<string, unknown> = {}) {
  const fm = new FakeModel({
    layer: 3,
    num_layers: 30,
    layer_label: "layer 3 of 30",
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
    ...state,
  });
  let exports = 0;
  const c = new Controls(document, fm.asModel(), () => exports++);
  document.body.replaceChildren(c.el); // checkboxes fire change only when connected
  return { fm, c, exports: () => exports };
}

describe("Controls", () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it("shows the model state", () => {
    const { c } = setup();
    expect(c.layer.input.value).toBe("3");
    expect(c.layer.input.max).toBe("29");
    expect(c.layer.output.textContent).toBe("layer 3 of 30");
    expect(c.channelWidth.input.value).toBe("64");
    expect(c.channelStart.input.max).toBe("64");
    expect(c.channelWidth.output.textContent).toBe("channels 0–63 of 128");
    expect(c.metric.select.value).toBe("mean");
    expect(c.alignment.el.hidden).toBe(true);
    expect(c.mechanisms.el.hidden).toBe(true);
  });

  it("follows trait changes from Python", () => {
    const { fm, c } = setup();
    fm.set("layer", 7);
    fm.set("layer_label", "layer 7 of 30");
    expect(c.layer.input.value).toBe("7");
    expect(c.layer.output.textContent).toBe("layer 7 of 30");
    fm.set("num_channels", 0);
    expect(c.channels.hidden).toBe(true);
    fm.set("alignments_available", ["rope", "none"]);
    fm.set("alignment", "none");
    expect(c.alignment.el.hidden).toBe(false);
    expect(c.alignment.select.value).toBe("none");
    fm.set("num_layers", 0);
    expect(c.layer.el.hidden).toBe(true);
  });

  it("commits the layer slider after change with save_changes", () => {
    const { fm, c } = setup();
    c.layer.input.value = "4";
    fire(c.layer.input, "input");
    expect(c.layer.output.textContent).toBe("layer 4…");
    fire(c.layer.input, "change");
    expect(fm.state.layer).toBe(4);
    expect(fm.saves).toHaveLength(1);
    vi.advanceTimersByTime(SLIDER_DEBOUNCE_MS);
    expect(fm.saves).toHaveLength(1);
  });

  it("keeps the channel window inside when the width grows", () => {
    const { fm, c } = setup({ channel_start: 60, channel_width: 32 });
    c.channelWidth.input.value = "100";
    fire(c.channelWidth.input, "change");
    vi.advanceTimersByTime(SLIDER_DEBOUNCE_MS);
    expect(fm.state.channel_width).toBe(100);
    expect(fm.state.channel_start).toBe(28);
    expect(fm.saves).toHaveLength(1);
    expect(c.channelStart.input.max).toBe("28");
  });

  it("commits kind, metric and mechanisms", () => {
    const { fm, c } = setup({ mechanisms_available: ["copy", "induction"] });
    (c.kind.el.querySelector('[data-value="value"]') as HTMLButtonElement).click();
    expect(fm.state.kind).toBe("value");
    c.metric.select.value = "max";
    fire(c.metric.select, "change");
    expect(fm.state.metric).toBe("max");
    (c.mechanisms.el.querySelectorAll("input")[1] as HTMLInputElement).click();
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

  it("describes the channel window", () => {
    expect(channelText(64, 64, 128)).toBe("channels 64–127 of 128");
    expect(channelText(120, 64, 128)).toBe("channels 120–127 of 128");
  });
});
