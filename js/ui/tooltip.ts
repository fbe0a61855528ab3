/**
 * Hover tooltip: panel title, row label, column label and value.  One
 * absolutely positioned element, text set with textContent only.
 */

import { formatValue } from "../lib/format";
import { h, setHidden, setText } from "./dom";

export interface TooltipContent {
  title: string;
  row: string;
  col: string;
  value: number;
}

/** Offset of the tooltip from the pointer, in px. */
const OFFSET = 14;

export class Tooltip {
  readonly el: HTMLDivElement;
  private readonly title: HTMLDivElement;
  private readonly row: HTMLDivElement;
  private readonly col: HTMLDivElement;
  private readonly value: HTMLDivElement;

  constructor(doc: Document) {
    this.title = h(doc, "div", { className: "hw-tt-title" });
    this.row = h(doc, "div", { className: "hw-tt-row" });
    this.col = h(doc, "div", { className: "hw-tt-col" });
    this.value = h(doc, "div", { className: "hw-tt-value" });
    this.el = h(doc, "div", { className: "hw-tooltip", attrs: { role: "tooltip" } }, [
      this.title,
      this.row,
      this.col,
      this.value,
    ]);
    this.el.hidden = true;
  }

  /** Lines as shown, for tests and accessibility. */
  static lines(c: TooltipContent): [string, string, string, string] {
    return [c.title, `row: ${c.row}`, `col: ${c.col}`, `value: ${formatValue(c.value)}`];
  }

  /**
   * Show at pointer position (x, y) inside a container of the given size:
   * right of and below the pointer, flipped left / above when it would
   * overflow (and there is room on the other side).
   */
  show(
    c: TooltipContent,
    x: number,
    y: number,
    containerWidth: number,
    containerHeight = Infinity,
  ): void {
    const [t, r, k, v] = Tooltip.lines(c);
    setText(this.title, t);
    setHidden(this.title, t === "");
    setText(this.row, r);
    setText(this.col, k);
    setText(this.value, v);
    setHidden(this.el, false);
    const w = this.el.offsetWidth;
    const hgt = this.el.offsetHeight;
    const left =
      x + OFFSET + w > containerWidth && x - OFFSET - w >= 0 ? x - OFFSET - w : x + OFFSET;
    const top =
      y + OFFSET + hgt > containerHeight && y - OFFSET - hgt >= 0 ? y - OFFSET - hgt : y + OFFSET;
    this.el.style.left = `${left}px`;
    this.el.style.top = `${top}px`;
  }

  hide(): void {
    setHidden(this.el, true);
  }

  get visible(): boolean {
    return !this.el.hidden;
  }

  get text(): string {
    return [this.title, this.row, this.col, this.value].map((e) => e.textContent ?? "").join("\n");
  }
}
