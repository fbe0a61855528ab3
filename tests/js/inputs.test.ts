// @vitest-environment jsdom
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { Checklist, Choice, SLIDER_DEBOUNCE_MS, Slider, Toggles } from "../../js/ui/inputs";

const fire = (e: Element, type: string) => e.dispatchEvent(new Event(type, { bubbles: true }));

describe("Slider", () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it("previews on input, commits the first change at once and throttles the rest", () => {
    const commits: number[] = [];
    const previews: number[] = [];
    const s = new Slider(
      document,
      "Layer",
      "layer",
      (v) => commits.push(v),
      (v) => previews.push(v),
    );
    s.set(0, 9, 2);
    expect(s.input.value).toBe("2");
    expect(s.input.type).toBe("range");
    s.input.value = "3";
    fire(s.input, "input");
    s.input.value = "4";
    fire(s.input, "input");
    expect(previews).toEqual([3, 4]);
    expect(commits).toEqual([]);
    fire(s.input, "change");
    expect(commits).toEqual([4]);
    s.input.value = "5";
    fire(s.input, "change");
    s.input.value = "6";
    fire(s.input, "change");
    vi.advanceTimersByTime(SLIDER_DEBOUNCE_MS - 1);
    expect(commits).toEqual([4]);
    vi.advanceTimersByTime(1);
    expect(commits).toEqual([4, 6]);
    vi.advanceTimersByTime(1000);
    expect(commits).toEqual([4, 6]);
    s.input.value = "2";
    fire(s.input, "change");
    expect(commits).toEqual([4, 6, 2]);
  });

  it("does not overwrite a pending user value, then follows the model again", () => {
    const commits: number[] = [];
    const s = new Slider(document, "x", "x", (v) => commits.push(v));
    s.set(0, 9, 2);
    s.input.value = "6";
    fire(s.input, "change"); // committed at once
    s.input.value = "7";
    fire(s.input, "change"); // held back by the throttle: pending
    s.set(0, 9, 6);
    expect(s.input.value).toBe("7");
    vi.runAllTimers();
    expect(commits).toEqual([6, 7]);
    s.set(0, 9, 1);
    expect(s.input.value).toBe("1");
  });

  it("clamps the model value into range and flushes on destroy", () => {
    const commits: number[] = [];
    const s = new Slider(document, "x", "x", (v) => commits.push(v));
    s.set(0, 4, 10);
    expect(s.input.value).toBe("4");
    expect([s.input.min, s.input.max]).toEqual(["0", "4"]);
    s.input.value = "1";
    fire(s.input, "change");
    s.input.value = "3";
    fire(s.input, "change");
    s.destroy();
    expect(commits).toEqual([1, 3]);
  });
});

describe("Choice", () => {
  it("lists options, selects the value and reports picks", () => {
    const picks: string[] = [];
    const c = new Choice(document, "Metric", "metric", (v) => picks.push(v));
    c.set([], "");
    expect(c.el.hidden).toBe(true);
    c.set(["mean", "<b>max</b>"], "mean");
    expect(c.el.hidden).toBe(false);
    expect([...c.select.options].map((o) => o.textContent)).toEqual(["mean", "<b>max</b>"]);
    expect(c.select.querySelector("b")).toBeNull();
    expect(c.select.value).toBe("mean");
    c.select.value = "<b>max</b>";
    fire(c.select, "change");
    expect(picks).toEqual(["<b>max</b>"]);
    c.set(["mean", "<b>max</b>"], "unknown");
    expect(c.select.selectedIndex).toBe(-1);
  });
});

describe("Toggles", () => {
  it("marks the current choice pressed and reports clicks", () => {
    const picks: string[] = [];
    const t = new Toggles(document, "Kind", "kind", (v) => picks.push(v));
    t.set(["key", "value"], "value");
    const buttons = [...t.el.querySelectorAll("button")];
    expect(buttons.map((b) => b.getAttribute("aria-pressed"))).toEqual(["false", "true"]);
    buttons[0].click();
    expect(picks).toEqual(["key"]);
    t.set(["key", "value"], "key");
    expect(buttons.map((b) => b.getAttribute("aria-pressed"))).toEqual(["true", "false"]);
    t.set([], "");
    expect(t.el.hidden).toBe(true);
  });

  it("shows each option as its label and reports the option itself", () => {
    const picks: string[] = [];
    const labels = { key: "keys, pre-RoPE", key_post: "keys, post-RoPE" };
    const t = new Toggles(document, "Kind", "kind", (v) => picks.push(v), labels);
    t.set(["key", "key_post", "constructor"], "key_post");
    const buttons = [...t.el.querySelectorAll("button")];
    expect(buttons.map((b) => b.textContent)).toEqual([
      "keys, pre-RoPE",
      "keys, post-RoPE",
      "constructor", // an option without a label shows as itself, whatever its name
    ]);
    expect(buttons.map((b) => b.dataset.value)).toEqual(["key", "key_post", "constructor"]);
    buttons[1].click();
    expect(picks).toEqual(["key_post"]);
  });
});

describe("labelled options", () => {
  it("reach a select's entries and a checklist's boxes", () => {
    const labels = { nll: "ΔNLL" };
    const choice = new Choice(document, "Damage", "measure", () => {}, labels);
    choice.set(["nll", "kl"], "kl");
    const entries = [...choice.select.querySelectorAll("option")];
    expect(entries.map((o) => [o.value, o.textContent])).toEqual([
      ["nll", "ΔNLL"],
      ["kl", "kl"],
    ]);
    const list = new Checklist(document, "Damage", "measures", () => {}, labels);
    list.set(["nll", "kl"], ["nll"]);
    expect([...list.el.querySelectorAll("label")].map((l) => l.textContent)).toEqual([
      " ΔNLL",
      " kl",
    ]);
    expect([...list.el.querySelectorAll("input")].map((b) => b.value)).toEqual(["nll", "kl"]);
  });
});

describe("Checklist", () => {
  it("checks selected options and reports them in list order", () => {
    const picks: string[][] = [];
    const c = new Checklist(document, "Mechanisms", "mechanisms", (v) => picks.push(v));
    document.body.appendChild(c.el); // checkboxes fire change only when connected
    c.set(["a", "b", "c"], ["c"]);
    const boxes = [...c.el.querySelectorAll("input")];
    expect(boxes.map((b) => b.checked)).toEqual([false, false, true]);
    boxes[0].click();
    expect(picks).toEqual([["a", "c"]]);
    c.set(["a", "b"], ["b"]);
    expect([...c.el.querySelectorAll("input")].map((b) => b.checked)).toEqual([false, true]);
    c.el.remove();
  });
});
