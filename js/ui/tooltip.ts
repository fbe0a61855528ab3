/**
 * Hover tooltip: panel title, then either row label, column label and value, or (for panels
 * whose axes are heads) one line naming the cell by head and dimension with its value and one
 * with the original indices.  One absolutely positioned element, text set with textContent only.
 */

import { formatValue } from "../lib/format";
import { h, setHidden, setText } from "./dom";

export interface TooltipContent {
  title: string;
  row: string;
  col: string;
  value: number;
  /** What the row, the column and the value are ("variant", "layer", "ΔNLL"); empty: row, col, value. */
  rowName?: string;
  colName?: string;
  valueName?: string;
  /** "K h1·d36 × h2·d22 = 0.2310" (see lib/format groupedCell): the cell by head, when set. */
  cell?: string;
  /** Free lines below the title (a chart's point), shown instead of row, column and value. */
  lines?: string[];
}

/** Offset of the tooltip from the pointer, in px. */
const OFFSET = 14;

/** Class of each line below the title, by format. */
const PLAIN = ["hw-tt-row", "hw-tt-col", "hw-tt-value"];
const GROUPED = ["hw-tt-cell", "hw-tt-index"];
/** Most free lines a chart point's tooltip shows. */
const MAX_FREE_LINES = 4;
/** Narrowest a tooltip is made to fit a container, in px. */
const MIN_WIDTH = 120;

/**
 * Where a tooltip `size` px long starts along an axis of a container `length` px long, for a
 * pointer at `at`: after the pointer, else before it, else as far from the container's start as
 * it must to end inside (never before 0).
 */
export function place(at: number, size: number, length: number): number {
  if (at + OFFSET + size <= length) return at + OFFSET;
  if (at - OFFSET - size >= 0) return at - OFFSET - size;
  return Math.max(0, Math.min(at + OFFSET, length - size));
}

export class Tooltip {
  readonly el: HTMLDivElement;
  private readonly title: HTMLDivElement;
  private readonly rows: HTMLDivElement[];

  constructor(doc: Document) {
    this.title = h(doc, "div", { className: "hw-tt-title" });
    this.rows = Array.from({ length: MAX_FREE_LINES }, (_, i) =>
      h(doc, "div", { className: PLAIN[i] ?? "" }),
    );
    this.el = h(doc, "div", { className: "hw-tooltip", attrs: { role: "tooltip" } }, [
      this.title,
      ...this.rows,
    ]);
    this.el.hidden = true;
  }

  /** Lines as shown (title first), for tests and accessibility. */
  static lines(c: TooltipContent): string[] {
    if (c.lines) return [c.title, ...c.lines.slice(0, MAX_FREE_LINES)];
    if (c.cell) return [c.title, c.cell, `index ${c.row} × ${c.col}`];
    return [
      c.title,
      `${c.rowName || "row"}: ${c.row}`,
      `${c.colName || "col"}: ${c.col}`,
      `${c.valueName || "value"}: ${formatValue(c.value)}`,
    ];
  }

  /**
   * Show at pointer position (x, y) inside a container of the given size:
   * right of and below the pointer, flipped left / above when it would
   * overflow (and there is room on the other side), else moved left or up as
   * far as it must to stay inside.  It is never wider than the container: a
   * long line (a mechanism's subtitle) wraps.
   */
  show(
    c: TooltipContent,
    x: number,
    y: number,
    containerWidth: number,
    containerHeight = Infinity,
  ): void {
    const [t, ...rest] = Tooltip.lines(c);
    const classes = c.lines ? [] : c.cell ? GROUPED : PLAIN;
    setText(this.title, t);
    setHidden(this.title, t === "");
    this.rows.forEach((row, i) => {
      const cls = classes[i] ?? "";
      if (row.className !== cls) row.className = cls;
      setText(row, rest[i] ?? "");
      setHidden(row, i >= rest.length);
    });
    if (Number.isFinite(containerWidth) && containerWidth > 0) {
      this.el.style.maxWidth = `${Math.max(MIN_WIDTH, Math.floor(containerWidth))}px`;
    }
    setHidden(this.el, false);
    const w = this.el.offsetWidth;
    const hgt = this.el.offsetHeight;
    this.el.style.left = `${place(x, w, containerWidth)}px`;
    this.el.style.top = `${place(y, hgt, containerHeight)}px`;
  }

  hide(): void {
    setHidden(this.el, true);
  }

  get visible(): boolean {
    return !this.el.hidden;
  }

  /** The lines shown, joined by newlines. */
  get text(): string {
    return [this.title, ...this.rows]
      .filter((e) => !e.hidden || e === this.title)
      .map((e) => e.textContent ?? "")
      .join("\n");
  }
}
