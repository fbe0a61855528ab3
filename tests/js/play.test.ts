// @vitest-environment jsdom
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { parseControls, playNext, playStart } from "../../js/lib/control_spec";
import { Controls, PLAY_INTERVAL_MS, type SliderControl } from "../../js/ui/controls";
import { FakeModel } from "./helpers/fake_model";

/** A timeline view's bar: a step slider that plays, and a layer slider that does not. */
const CONTROLS = [
  {
    trait: "step",
    type: "slider",
    label: "Step",
    count: "num_steps",
    text: "step_label",
    play: true,
  },
  { trait: "layer", type: "slider", label: "Layer", count: "num_layers", text: "layer_label" },
];

function bar(state: Record<string, unknown> = {}) {
  const fm = new FakeModel({
    controls: CONTROLS,
    step: 0,
    num_steps: 4,
    step_label: "",
    layer: 0,
    num_layers: 2,
    layer_label: "",
    ...state,
  });
  const c = new Controls(document, fm.asModel(), () => {});
  document.body.replaceChildren(c.el);
  const step = c.control("step") as SliderControl;
  return { fm, c, step, button: step.playButton! };
}

describe("play", () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it("reads play from a slider's description only", () => {
    const { specs } = parseControls([
      ...CONTROLS,
      { trait: "kind", type: "toggles", label: "Kind", options: "kinds", play: true },
      { trait: "head", type: "slider", label: "Head", count: "num_heads", play: "yes" },
    ]);
    expect(specs.map((s) => [s.trait, s.play === true])).toEqual([
      ["step", true],
      ["layer", false],
      ["kind", false],
      ["head", false],
    ]);
  });

  it("moves to the next position, stops at the last and starts over from there", () => {
    expect([playNext(0, 4), playNext(2, 4), playNext(3, 4), playNext(0, 1)]).toEqual([
      1,
      3,
      null,
      null,
    ]);
    expect([playStart(1, 4), playStart(3, 4), playStart(0, 1)]).toEqual([1, 0, 0]);
  });

  it("gives only the playing slider a button, after its range input", () => {
    const { c, step, button } = bar();
    expect((c.control("layer") as SliderControl).playButton).toBeNull();
    expect(button.getAttribute("data-play")).toBe("step");
    expect(button.getAttribute("aria-label")).toBe("Play step");
    expect(step.slider.el.contains(button)).toBe(true);
    expect(
      step.slider.input.compareDocumentPosition(button) & Node.DOCUMENT_POSITION_FOLLOWING,
    ).toBeTruthy();
  });

  it("steps through every position once, committing each, then pauses", () => {
    const { fm, step, button } = bar();
    button.click();
    expect(step.playing).toBe(true);
    expect(button.getAttribute("aria-pressed")).toBe("true");
    expect(button.getAttribute("aria-label")).toBe("Pause step");
    const seen: unknown[] = [];
    for (let i = 0; i < 5; i++) {
      vi.advanceTimersByTime(PLAY_INTERVAL_MS);
      seen.push(fm.get("step"));
    }
    expect(seen).toEqual([1, 2, 3, 3, 3]);
    expect(fm.saves.map((s) => s.step)).toEqual([1, 2, 3]);
    expect(step.playing).toBe(false);
    expect(step.slider.input.value).toBe("3");
    expect(fm.get("layer")).toBe(0); // the other slider is left alone
  });

  it("pauses on a second click, and resumes from where it is", () => {
    const { fm, step, button } = bar({ step: 1 });
    button.click();
    vi.advanceTimersByTime(PLAY_INTERVAL_MS);
    button.click();
    expect(step.playing).toBe(false);
    vi.advanceTimersByTime(5 * PLAY_INTERVAL_MS);
    expect(fm.get("step")).toBe(2);
    button.click();
    vi.advanceTimersByTime(PLAY_INTERVAL_MS);
    expect(fm.get("step")).toBe(3);
  });

  it("at the last position, play starts again from the first", () => {
    const { fm, button } = bar({ step: 3 });
    button.click();
    expect(fm.get("step")).toBe(0);
    vi.advanceTimersByTime(PLAY_INTERVAL_MS);
    expect(fm.get("step")).toBe(1);
  });

  it("has nothing to play with one position, and stops when the bar is destroyed", () => {
    const one = bar({ num_steps: 1 });
    expect(one.button.disabled).toBe(true);
    one.button.click();
    expect(one.step.playing).toBe(false);
    const { fm, c, step, button } = bar();
    button.click();
    c.destroy();
    expect(step.playing).toBe(false);
    vi.advanceTimersByTime(3 * PLAY_INTERVAL_MS);
    expect(fm.get("step")).toBe(0);
  });
});
