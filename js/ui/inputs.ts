/**
 * Generic keyboard-operable inputs built on native elements: a debounced
 * range slider, a select, a group of toggle buttons and a checkbox list.
 * Each has `set(...)` to follow the model and calls back on user action.
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

export class Slider {
  readonly el: HTMLLabelElement;
  readonly input: HTMLInputElement;
  readonly output: HTMLOutputElement;
  private timer: ReturnType<typeof setTimeout> | null = null;
  private dirty = false;

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

  /** Follow the model; the value is left alone while a user change is pending. */
  set(min: number, max: number, value: number): void {
    const hi = Math.max(min, max);
    if (this.input.min !== String(min)) this.input.min = String(min);
    if (this.input.max !== String(hi)) this.input.max = String(hi);
    if (!this.pending) {
      const v = String(Math.min(hi, Math.max(min, Math.round(value))));
      if (this.input.value !== v) this.input.value = v;
    }
  }

  setOutput(text: string): void {
    setText(this.output, text);
  }

  destroy(): void {
    this.flush();
  }
}

export class Choice {
  readonly el: HTMLLabelElement;
  readonly select: HTMLSelectElement;
  private options: string[] = [];

  constructor(doc: Document, label: string, trait: string, onPick: (v: string) => void) {
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
          h(this.select.ownerDocument, "option", { text: o, attrs: { value: o } }),
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
          text: o,
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
        this.el.appendChild(h(doc, "label", {}, [box, doc.createTextNode(` ${o}`)]));
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
