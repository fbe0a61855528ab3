/**
 * The control bar, built from the `controls` trait (see lib/control_spec.ts)
 * and bound two-way to model traits: the UI follows every trait change (so
 * Python and saved state drive it) and user actions set the trait and call
 * save_changes.  Nothing here knows a particular view.  Visibility follows
 * the traits a control reads: a slider when its count is at least 1, a window
 * when its total is above 0, toggles / select / checklist when their options
 * are non-empty.  The Export PNG button has a slot of its own at the end of
 * the bar: the controls wrap beside it, and it stays where it is whatever
 * their read-outs say.
 */

import {
  type ControlSpec,
  type ControlType,
  controlTraits,
  longestWindowText,
  parseControls,
  playNext,
  playStart,
  sliderStops,
  snapStep,
  snapWindow,
  stopIndex,
  windowText,
} from "../lib/control_spec";
import { h } from "./dom";
import { Checklist, Choice, Entry, NumberField, Slider, Toggles } from "./inputs";
import { commit, getNumber, getString, getStringList, type Model, onChanges } from "./model";

/** One control of the bar: its element, following the model on `sync`. */
export interface BoundControl {
  readonly spec: ControlSpec;
  readonly el: HTMLElement;
  sync(): void;
  destroy(): void;
}

/** How long play shows each position of a slider before it moves to the next, in ms. */
export const PLAY_INTERVAL_MS = 800;

export class SliderControl implements BoundControl {
  readonly slider: Slider;
  /** The play/pause button of a slider that plays (`play` in its description); null otherwise. */
  readonly playButton: HTMLButtonElement | null = null;
  private readonly noun: string;
  private timer: ReturnType<typeof setInterval> | null = null;

  constructor(
    doc: Document,
    private readonly model: Model,
    readonly spec: ControlSpec,
  ) {
    this.noun = spec.label.toLowerCase();
    this.slider = new Slider(
      doc,
      spec.label,
      spec.trait,
      (i) => commit(model, { [spec.trait]: this.stopAt(i) }),
      (i) => this.slider.setOutput(`${this.noun} ${this.stopAt(i)}…`),
    );
    if (spec.play) {
      this.playButton = h(doc, "button", {
        className: "hw-play",
        attrs: { type: "button", "data-play": spec.trait },
      });
      this.playButton.addEventListener("click", () => (this.playing ? this.pause() : this.play()));
      this.slider.el.append(this.playButton); // after the range input: the label still names it
      this.showPlaying();
    }
  }

  /** Whether play is moving the slider now. */
  get playing(): boolean {
    return this.timer !== null;
  }

  /** The values the slider stops at (its positions, else 0 .. count - 1). */
  private stops(): number[] {
    const positions = this.spec.positions ? this.model.get(this.spec.positions) : null;
    return sliderStops(getNumber(this.model, this.spec.count), positions);
  }

  /** The value at index `i` of the range input. */
  private stopAt(i: number): number {
    const stops = this.stops();
    return stops[Math.min(Math.max(0, i), stops.length - 1)] ?? i;
  }

  /** Where the trait's value is on the range input. */
  private index(): number {
    return stopIndex(this.stops(), getNumber(this.model, this.spec.trait));
  }

  /** Move the slider one position every PLAY_INTERVAL_MS until the last (from the first when it
   * is at the last already). */
  play(): void {
    if (this.playing) return;
    const count = this.stops().length;
    const at = this.index();
    if (count < 2) return;
    const start = this.stopAt(playStart(at, count));
    if (start !== getNumber(this.model, this.spec.trait))
      commit(this.model, { [this.spec.trait]: start });
    this.timer = setInterval(() => this.tick(), PLAY_INTERVAL_MS);
    this.showPlaying();
  }

  pause(): void {
    if (this.timer !== null) clearInterval(this.timer);
    this.timer = null;
    this.showPlaying();
  }

  private tick(): void {
    const count = this.stops().length;
    const next = playNext(this.index(), count);
    if (next !== null) commit(this.model, { [this.spec.trait]: this.stopAt(next) });
    if (next === null || playNext(next, count) === null) this.pause(); // the last: nothing more
  }

  private showPlaying(): void {
    const b = this.playButton;
    if (b === null) return;
    const label = `${this.playing ? "Pause" : "Play"} ${this.noun}`;
    b.textContent = this.playing ? "❚❚" : "▶";
    b.setAttribute("aria-label", label);
    b.setAttribute("aria-pressed", String(this.playing));
    b.title = label;
  }

  get el(): HTMLElement {
    return this.slider.el;
  }

  sync(): void {
    const stops = this.stops();
    const count = stops.length;
    const value = getNumber(this.model, this.spec.trait);
    this.el.hidden = count < 1;
    this.slider.set(0, count - 1, stopIndex(stops, value));
    const text = this.spec.text ? getString(this.model, this.spec.text) : "";
    const d = "8".repeat(String(Math.max(count, ...stops.map((s) => s + 1))).length);
    this.slider.reserve(`${this.noun} ${d} of ${d}`);
    this.slider.setOutput(text || `${this.noun} ${value} of ${count}`);
    if (this.playButton !== null) this.playButton.disabled = count < 2;
    if (count < 2) this.pause();
  }

  destroy(): void {
    this.pause();
    this.slider.destroy();
  }
}

/**
 * A window [start, start + width) of `total` items: a start slider and a width slider, each
 * with a number field for exact values.  With a `step` trait above 1 both snap to its
 * multiples (a head's channels, say).
 */
export class WindowControl implements BoundControl {
  readonly el: HTMLDivElement;
  readonly start: Slider;
  readonly width: Slider;
  readonly startField: NumberField;
  readonly widthField: NumberField;
  private readonly noun: string;

  constructor(
    doc: Document,
    private readonly model: Model,
    readonly spec: ControlSpec,
  ) {
    this.noun = spec.label.toLowerCase();
    this.start = new Slider(
      doc,
      `${spec.label} from`,
      spec.trait,
      (v) => this.commitStart(v),
      (v) => this.preview(v, this.width.value),
    );
    this.width = new Slider(
      doc,
      "width",
      spec.width,
      (w) => this.commitWidth(w),
      (w) => this.preview(this.start.value, w),
    );
    this.startField = new NumberField(doc, `${spec.label} from`, spec.trait, (v) =>
      this.commitStart(v),
    );
    this.widthField = new NumberField(doc, `${spec.label} width`, spec.width, (w) =>
      this.commitWidth(w),
    );
    this.start.output.hidden = true;
    this.start.el.insertBefore(this.startField.input, this.start.output);
    this.width.el.insertBefore(this.widthField.input, this.width.output);
    this.el = h(doc, "div", { className: "hw-control hw-window" }, [this.start.el, this.width.el]);
  }

  private total(): number {
    return getNumber(this.model, this.spec.total);
  }

  /** The snap step (1: none). */
  step(): number {
    return this.spec.step ? snapStep(getNumber(this.model, this.spec.step, 1)) : 1;
  }

  private preview(start: number, width: number): void {
    const total = this.total();
    const w = snapWindow(start, width, total, this.step());
    this.width.setOutput(`${windowText(this.noun, w.start, w.width, total)}…`);
  }

  /** Commit a window, snapped and kept inside the total; only the traits that change are sent. */
  private commitWindow(start: number, width: number): void {
    const w = snapWindow(start, width, this.total(), this.step());
    const values: Record<string, unknown> = {};
    if (w.width !== getNumber(this.model, this.spec.width)) values[this.spec.width] = w.width;
    if (w.start !== getNumber(this.model, this.spec.trait)) values[this.spec.trait] = w.start;
    if (Object.keys(values).length > 0) commit(this.model, values);
    else this.sync(); // nothing to send: show the model's window again
  }

  private commitStart(start: number): void {
    this.commitWindow(start, getNumber(this.model, this.spec.width, this.total()));
  }

  /** Commit a new width, pulling the start back so that the window stays inside. */
  private commitWidth(width: number): void {
    this.commitWindow(getNumber(this.model, this.spec.trait), width);
  }

  sync(): void {
    const total = this.total();
    const width = getNumber(this.model, this.spec.width, total);
    const start = getNumber(this.model, this.spec.trait);
    const k = this.step();
    this.el.hidden = total <= 0;
    const least = Math.min(k, total) || Math.min(1, total);
    this.width.set(least, total, width, k);
    this.widthField.set(least, total, width, k);
    const last = Math.max(0, total - Math.max(width, least));
    this.start.set(0, last, start, k);
    this.startField.set(0, last, start, k);
    this.width.reserve(`${longestWindowText(this.noun, total)}…`);
    this.width.setOutput(windowText(this.noun, start, width, total));
  }

  destroy(): void {
    this.start.destroy();
    this.width.destroy();
  }
}

/** Toggles, a select or a checklist over the list in the `options` trait. */
export class OptionsControl implements BoundControl {
  readonly input: Toggles | Choice | Checklist;

  constructor(
    doc: Document,
    private readonly model: Model,
    readonly spec: ControlSpec,
  ) {
    const { label, trait } = spec;
    const pick = (v: unknown) => commit(model, { [trait]: v });
    const { labels } = spec;
    if (spec.type === "toggles") this.input = new Toggles(doc, label, trait, pick, labels);
    else if (spec.type === "select") this.input = new Choice(doc, label, trait, pick, labels);
    else this.input = new Checklist(doc, label, trait, pick, labels);
  }

  get el(): HTMLElement {
    return this.input.el;
  }

  sync(): void {
    const options = getStringList(this.model, this.spec.options);
    if (this.input instanceof Checklist) {
      this.input.set(options, getStringList(this.model, this.spec.trait));
    } else {
      this.input.set(options, getString(this.model, this.spec.trait));
    }
  }

  destroy(): void {}
}

/** A text field whose submitted text is set on the trait (the view reads and clears it). */
export class EntryControl implements BoundControl {
  readonly entry: Entry;

  constructor(
    doc: Document,
    model: Model,
    readonly spec: ControlSpec,
  ) {
    this.entry = new Entry(doc, spec.label, spec.trait, (v) => commit(model, { [spec.trait]: v }));
  }

  get el(): HTMLElement {
    return this.entry.el;
  }

  sync(): void {}

  destroy(): void {}
}

/** The control that shows each type (every type of `protocol.ts` has one: tsc says so). */
const CONTROL_CLASSES: Record<
  ControlType,
  new (
    doc: Document,
    model: Model,
    spec: ControlSpec,
  ) => BoundControl
> = {
  slider: SliderControl,
  window: WindowControl,
  toggles: OptionsControl,
  select: OptionsControl,
  checklist: OptionsControl,
  entry: EntryControl,
};

export function makeControl(doc: Document, model: Model, spec: ControlSpec): BoundControl {
  return new CONTROL_CLASSES[spec.type](doc, model, spec);
}

export class Controls {
  /** The bar: the controls (`list`, wrapping) and the export button's slot. */
  readonly el: HTMLDivElement;
  readonly list: HTMLDivElement;
  readonly exportButton: HTMLButtonElement;
  private bound: BoundControl[] = [];
  /** What the description holds that the bar cannot show (a control of an unknown type...). */
  problems: string[] = [];
  private described = "";
  private unbindTraits: () => void = () => {};
  private readonly unbindDescription: () => void;

  constructor(
    private readonly doc: Document,
    private readonly model: Model,
    onExport: () => void,
    private readonly onProblems: (problems: string[]) => void = () => {},
  ) {
    this.exportButton = h(doc, "button", {
      className: "hw-export",
      text: "Export PNG",
      attrs: { type: "button", title: "Save the figure as headwidget.png (2× resolution)" },
    });
    this.exportButton.addEventListener("click", onExport);
    this.list = h(doc, "div", { className: "hw-controls" });
    this.el = h(doc, "div", { className: "hw-bar" }, [this.list, this.exportButton]);
    this.unbindDescription = onChanges(model, ["controls"], () => this.build());
    this.build();
  }

  /** The controls in bar order. */
  get all(): readonly BoundControl[] {
    return this.bound;
  }

  /** The control that sets `trait`, if the bar has one. */
  control(trait: string): BoundControl | undefined {
    return this.bound.find((c) => c.spec.trait === trait);
  }

  /** (Re)build the bar when the description changes; an equal description keeps the controls. */
  private build(): void {
    const { specs, problems } = parseControls(this.model.get("controls"));
    const described = JSON.stringify([specs, problems]);
    if (described === this.described) return;
    this.described = described;
    this.problems = problems;
    this.onProblems(problems);
    this.unbindTraits();
    for (const c of this.bound) c.destroy();
    this.bound = specs.map((s) => makeControl(this.doc, this.model, s));
    this.list.replaceChildren(...this.bound.map((c) => c.el));
    this.unbindTraits = onChanges(this.model, controlTraits(specs), () => this.sync());
    this.sync();
  }

  /** Make every control show the model's current state. */
  sync(): void {
    for (const c of this.bound) c.sync();
  }

  destroy(): void {
    this.unbindDescription();
    this.unbindTraits();
    for (const c of this.bound) c.destroy();
    this.el.remove();
  }
}
