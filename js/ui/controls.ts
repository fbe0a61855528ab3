/**
 * The control bar, built from the `controls` trait (see lib/control_spec.ts)
 * and bound two-way to model traits: the UI follows every trait change (so
 * Python and saved state drive it) and user actions set the trait and call
 * save_changes.  Nothing here knows a particular view.  Visibility follows
 * the traits a control reads: a slider when its count is at least 1, a window
 * when its total is above 0, toggles / select / checklist when their options
 * are non-empty.  The Export PNG button is always last.
 */

import { type ControlSpec, controlTraits, parseControls, windowText } from "../lib/control_spec";
import { h } from "./dom";
import { Checklist, Choice, Slider, Toggles } from "./inputs";
import { commit, getNumber, getString, getStringList, type Model, onChanges } from "./model";

/** One control of the bar: its element, following the model on `sync`. */
export interface BoundControl {
  readonly spec: ControlSpec;
  readonly el: HTMLElement;
  sync(): void;
  destroy(): void;
}

export class SliderControl implements BoundControl {
  readonly slider: Slider;
  private readonly noun: string;

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
      (v) => commit(model, { [spec.trait]: v }),
      (v) => this.slider.setOutput(`${this.noun} ${v}…`),
    );
  }

  get el(): HTMLElement {
    return this.slider.el;
  }

  sync(): void {
    const count = getNumber(this.model, this.spec.count);
    const value = getNumber(this.model, this.spec.trait);
    this.el.hidden = count < 1;
    this.slider.set(0, count - 1, value);
    const text = this.spec.text ? getString(this.model, this.spec.text) : "";
    this.slider.setOutput(text || `${this.noun} ${value} of ${count}`);
  }

  destroy(): void {
    this.slider.destroy();
  }
}

/** A window [start, start + width) of `total` items: a start slider and a width slider. */
export class WindowControl implements BoundControl {
  readonly el: HTMLDivElement;
  readonly start: Slider;
  readonly width: Slider;
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
      (v) => commit(model, { [spec.trait]: v }),
      (v) => this.preview(v, this.width.value),
    );
    this.width = new Slider(
      doc,
      "width",
      spec.width,
      (w) => this.commitWidth(w),
      (w) => this.preview(this.start.value, w),
    );
    this.start.output.hidden = true;
    this.el = h(doc, "div", { className: "hw-control hw-window" }, [this.start.el, this.width.el]);
  }

  private total(): number {
    return getNumber(this.model, this.spec.total);
  }

  private preview(start: number, width: number): void {
    const total = this.total();
    const from = Math.min(start, Math.max(0, total - width));
    this.width.setOutput(`${windowText(this.noun, from, width, total)}…`);
  }

  /** Commit a new width, pulling the start back so that the window stays inside. */
  private commitWidth(width: number): void {
    const start = Math.min(this.start.value, Math.max(0, this.total() - width));
    const values: Record<string, unknown> = { [this.spec.width]: width };
    if (start !== getNumber(this.model, this.spec.trait)) values[this.spec.trait] = start;
    commit(this.model, values);
  }

  sync(): void {
    const total = this.total();
    const width = getNumber(this.model, this.spec.width, total);
    const start = getNumber(this.model, this.spec.trait);
    this.el.hidden = total <= 0;
    this.width.set(Math.min(1, total), total, width);
    this.start.set(0, Math.max(0, total - this.width.value), start);
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
    if (spec.type === "toggles") this.input = new Toggles(doc, label, trait, pick);
    else if (spec.type === "select") this.input = new Choice(doc, label, trait, pick);
    else this.input = new Checklist(doc, label, trait, pick);
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

export function makeControl(doc: Document, model: Model, spec: ControlSpec): BoundControl {
  if (spec.type === "slider") return new SliderControl(doc, model, spec);
  if (spec.type === "window") return new WindowControl(doc, model, spec);
  return new OptionsControl(doc, model, spec);
}

export class Controls {
  readonly el: HTMLDivElement;
  readonly exportButton: HTMLButtonElement;
  private bound: BoundControl[] = [];
  private described = "";
  private unbindTraits: () => void = () => {};
  private readonly unbindDescription: () => void;

  constructor(
    private readonly doc: Document,
    private readonly model: Model,
    onExport: () => void,
  ) {
    this.exportButton = h(doc, "button", {
      className: "hw-export",
      text: "Export PNG",
      attrs: { type: "button", title: "Save the figure as headwidget.png (2× resolution)" },
    });
    this.exportButton.addEventListener("click", onExport);
    this.el = h(doc, "div", { className: "hw-controls" }, [this.exportButton]);
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
    const specs = parseControls(this.model.get("controls"));
    const described = JSON.stringify(specs);
    if (described === this.described) return;
    this.described = described;
    this.unbindTraits();
    for (const c of this.bound) c.destroy();
    this.bound = specs.map((s) => makeControl(this.doc, this.model, s));
    this.el.replaceChildren(...this.bound.map((c) => c.el), this.exportButton);
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
