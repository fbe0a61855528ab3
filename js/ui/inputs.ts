/**
 * Generic keyboard-operable inputs built on native elements: a debounced
 * range slider, a number field, a select, a group of toggle buttons and a
 * checkbox list.  Each has `set(...)` to follow the model and calls back on
 * user action.  A slider's read-out never shrinks (it keeps the width of its
 * longest text), so the controls after it do not move while it changes.
 */

import { h, setHidden, setText } from "./dom";

/**
 * A slider commits its first change at once, then holds further commits for this long and sends
 * only the latest value at the end, so a held arrow key does not flood the kernel.
 */
export const SLIDER_DEBOUNCE_MS = 150;

function sameList(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((x, i) => x === b[i]);
}

/** Track length of a slider: one px per position at least, between these bounds (CSS px). */
export const TRACK_MIN_PX = 160;
export const TRACK_MAX_PX = 320;
/** Room a range input's thumb takes from its track, in px. */
const THUMB_PX = 16;

export class Slider {
  readonly el: HTMLLabelElement;
  readonly input: HTMLInputElement;
  readonly output: HTMLOutputElement;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private dirty = false;
  private reserved = 0;

  constructor(
    doc: Document,
    label: string,
    trait: string,
    private readonly onCommit: (v: number) => void,
    private readonly onPreview: (v: number) => void = () => {},
    private readonly debounceMs = SLIDER_DEBOUNCE_MS,
  ) {
    this.input = h(doc, "input", { attrs: { type: "range", step: "1", "data-trait": trait } });
    this.output = h(doc, "output", { attrs: { "aria-live": "polite" } });
    this.el = h(doc, "label", { className: "hw-control" }, [
      h(doc, "span", { className: "hw-label", text: label }),
      this.input,
      this.output,
    ]);
    // Preview while dragging; commit when the value settles (`change`), throttled.
    this.input.addEventListener("input", () => this.onPreview(this.value));
    this.input.addEventListener("change", () => this.changed());
  }

  get value(): number {
    return Number(this.input.value);
  }

  /** A user change not yet committed (held back by the throttle). */
  get pending(): boolean {
    return this.dirty;
  }

  private changed(): void {
    if (this.timer === null) {
      this.commit();
    } else {
      this.dirty = true;
    }
  }

  private commit(): void {
    this.dirty = false;
    this.onCommit(this.value);
    this.timer = setTimeout(() => {
      this.timer = null;
      if (this.dirty) this.commit();
    }, this.debounceMs);
  }

  /** Commit a pending change now. */
  flush(): void {
    if (this.timer !== null) clearTimeout(this.timer);
    this.timer = null;
    if (this.dirty) {
      this.dirty = false;
      this.onCommit(this.value);
    }
  }

  /**
   * Follow the model; the value is left alone while a user change is pending.  Positions are
   * min, min + step, ... up to max; the track is long enough for a pointer to reach each of up
   * to TRACK_MAX_PX positions.
   */
  set(min: number, max: number, value: number, step = 1): void {
    const hi = Math.max(min, max);
    const k = Math.max(1, Math.floor(step));
    // Step before the bounds and the value, so that the value is sanitised on the final grid.
    if (this.input.step !== String(k)) this.input.step = String(k);
    if (this.input.min !== String(min)) this.input.min = String(min);
    if (this.input.max !== String(hi)) this.input.max = String(hi);
    const positions = Math.floor((hi - min) / k) + 1;
    const track = Math.min(TRACK_MAX_PX, Math.max(TRACK_MIN_PX, positions + THUMB_PX));
    const width = `${track}px`;
    if (this.input.style.width !== width) this.input.style.width = width;
    if (!this.pending) {
      const v = String(Math.min(hi, Math.max(min, Math.round(value))));
      if (this.input.value !== v) this.input.value = v;
    }
  }

  /** The read-out text; the read-out keeps room for the longest text it has shown. */
  setOutput(text: string): void {
    setText(this.output, text);
    this.reserve(text);
  }

  /** Keep room in the read-out for `text` (in `ch` of its tabular digits). */
  reserve(text: string): void {
    const n = [...text].length;
    if (n <= this.reserved) return;
    this.reserved = n;
    this.output.style.minWidth = `${n}ch`;
  }

  destroy(): void {
    this.flush();
  }
}

/** A number field for exact values (Enter or leaving the field commits); stepped like a slider. */
export class NumberField {
  readonly input: HTMLInputElement;

  constructor(
    doc: Document,
    label: string,
    trait: string,
    private readonly onCommit: (v: number) => void,
  ) {
    this.input = h(doc, "input", {
      className: "hw-number",
      attrs: { type: "number", step: "1", "aria-label": label, "data-number": trait },
    });
    this.input.addEventListener("change", () => {
      const v = Number(this.input.value);
      if (this.input.value.trim() !== "" && Number.isFinite(v)) this.onCommit(Math.round(v));
    });
  }

  get value(): number {
    return Number(this.input.value);
  }

  /** Follow the model, unless the user is typing in the field. */
  set(min: number, max: number, value: number, step = 1): void {
    const attrs: [string, string][] = [
      ["min", String(min)],
      ["max", String(Math.max(min, max))],
      ["step", String(Math.max(1, Math.floor(step)))],
    ];
    for (const [k, v] of attrs) if (this.input.getAttribute(k) !== v) this.input.setAttribute(k, v);
    const typing = this.input.ownerDocument.activeElement === this.input;
    if (!typing && this.input.value !== String(value)) this.input.value = String(value);
  }
}

/** What an option is shown as: option → text (options not in it show as themselves). */
export type OptionLabels = Readonly<Record<string, string>>;

/** The text of option `o`: its label when `labels` has one of its own, else `o`. */
export function optionText(labels: OptionLabels, o: string): string {
  return Object.hasOwn(labels, o) ? labels[o] : o;
}

export class Choice {
  readonly el: HTMLLabelElement;
  readonly select: HTMLSelectElement;
  private options: string[] = [];

  constructor(
    doc: Document,
    label: string,
    trait: string,
    onPick: (v: string) => void,
    private readonly labels: OptionLabels = {},
  ) {
    this.select = h(doc, "select", { attrs: { "data-trait": trait } });
    this.el = h(doc, "label", { className: "hw-control" }, [
      h(doc, "span", { className: "hw-label", text: label }),
      this.select,
    ]);
    this.select.addEventListener("change", () => onPick(this.select.value));
  }

  /** Show `options` with `value` selected; hidden when there are no options. */
  set(options: string[], value: string): void {
    setHidden(this.el, options.length === 0);
    if (!sameList(options, this.options)) {
      this.options = options.slice();
      this.select.replaceChildren(
        ...options.map((o) =>
          h(this.select.ownerDocument, "option", {
            text: optionText(this.labels, o),
            attrs: { value: o },
          }),
        ),
      );
    }
    const i = options.indexOf(value);
    if (this.select.selectedIndex !== i) this.select.selectedIndex = i;
  }
}

export class Toggles {
  readonly el: HTMLDivElement;
  private readonly group: HTMLDivElement;
  private options: string[] = [];
  private buttons: HTMLButtonElement[] = [];

  constructor(
    doc: Document,
    label: string,
    private readonly trait: string,
    private readonly onPick: (v: string) => void,
    private readonly labels: OptionLabels = {},
  ) {
    this.group = h(doc, "div", {
      className: "hw-toggles",
      attrs: { role: "group", "aria-label": label },
    });
    this.el = h(doc, "div", { className: "hw-control" }, [
      h(doc, "span", { className: "hw-label", text: label }),
      this.group,
    ]);
  }

  set(options: string[], value: string): void {
    setHidden(this.el, options.length === 0);
    if (!sameList(options, this.options)) {
      this.options = options.slice();
      this.buttons = options.map((o) => {
        const b = h(this.group.ownerDocument, "button", {
          text: optionText(this.labels, o),
          attrs: { type: "button", "data-trait": this.trait, "data-value": o },
        });
        b.addEventListener("click", () => this.onPick(o));
        return b;
      });
      this.group.replaceChildren(...this.buttons);
    }
    this.buttons.forEach((b, i) => {
      b.setAttribute("aria-pressed", String(options[i] === value));
    });
  }
}

export class Checklist {
  readonly el: HTMLFieldSetElement;
  private options: string[] = [];
  private boxes: HTMLInputElement[] = [];

  constructor(
    doc: Document,
    label: string,
    private readonly trait: string,
    private readonly onPick: (v: string[]) => void,
    private readonly labels: OptionLabels = {},
  ) {
    this.el = h(doc, "fieldset", { className: "hw-control hw-checklist" }, [
      h(doc, "legend", { text: label }),
    ]);
  }

  set(options: string[], selected: readonly string[]): void {
    setHidden(this.el, options.length === 0);
    if (!sameList(options, this.options)) {
      this.options = options.slice();
      for (const l of this.el.querySelectorAll("label")) l.remove();
      const doc = this.el.ownerDocument;
      this.boxes = options.map((o) => {
        const box = h(doc, "input", {
          attrs: { type: "checkbox", "data-trait": this.trait, value: o },
        });
        box.addEventListener("change", () => this.onPick(this.checked()));
        const text = doc.createTextNode(` ${optionText(this.labels, o)}`);
        this.el.appendChild(h(doc, "label", {}, [box, text]));
        return box;
      });
    }
    this.boxes.forEach((b, i) => {
      const on = selected.includes(options[i]);
      if (b.checked !== on) b.checked = on;
    });
  }

  /** Checked options, in the order of the options list. */
  checked(): string[] {
    return this.options.filter((_, i) => this.boxes[i].checked);
  }
}

/** A text field and a button: Enter or the button submits the trimmed text, then clears the field. */
export class Entry {
  readonly el: HTMLDivElement;
  readonly input: HTMLInputElement;
  readonly button: HTMLButtonElement;

  constructor(doc: Document, label: string, trait: string, onSubmit: (v: string) => void) {
    this.input = h(doc, "input", {
      className: "hw-entry",
      attrs: { type: "text", "data-trait": trait, "aria-label": label, spellcheck: "false" },
    });
    this.button = h(doc, "button", { text: "Add", attrs: { type: "button" } });
    this.el = h(doc, "div", { className: "hw-control" }, [
      h(doc, "span", { className: "hw-label", text: label }),
      this.input,
      this.button,
    ]);
    const submit = () => {
      const v = this.input.value.trim();
      if (!v) return;
      this.input.value = "";
      onSubmit(v);
    };
    this.input.addEventListener("keydown", (e) => {
      if (e.key === "Enter") {
        e.preventDefault();
        submit();
      }
    });
    this.button.addEventListener("click", submit);
  }
}
