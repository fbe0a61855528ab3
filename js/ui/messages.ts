/**
 * Heading, error box and status line.  The heading is the `heading` trait:
 * what the figure shows (model and layer), hidden when empty.  The error box shows the `error` trait plus
 * problems found in the front end (e.g. a malformed panel); the rest of the
 * widget keeps working.  Text only, never markup.
 */

import { h, setHidden, setText } from "./dom";
import { getString, type Model, onChanges } from "./model";

export class Messages {
  readonly heading: HTMLDivElement;
  readonly error: HTMLDivElement;
  readonly status: HTMLDivElement;
  private local: string[] = [];
  private readonly unbind: () => void;

  constructor(
    doc: Document,
    private readonly model: Model,
  ) {
    this.heading = h(doc, "div", { className: "hw-heading" });
    this.error = h(doc, "div", { className: "hw-error", attrs: { role: "alert" } });
    this.status = h(doc, "div", {
      className: "hw-status",
      attrs: { role: "status", "aria-live": "polite" },
    });
    this.unbind = onChanges(model, ["error", "status", "heading"], () => this.sync());
    this.sync();
  }

  /** Problems detected in the browser, shown below the Python error. */
  setLocalProblems(problems: string[]): void {
    this.local = problems.slice();
    this.sync();
  }

  sync(): void {
    const parts = [getString(this.model, "error"), ...this.local].filter((s) => s.trim() !== "");
    setText(this.error, parts.join("\n"));
    setHidden(this.error, parts.length === 0);
    setText(this.status, getString(this.model, "status"));
    const heading = getString(this.model, "heading");
    setText(this.heading, heading);
    setHidden(this.heading, heading === "");
  }

  destroy(): void {
    this.unbind();
    this.heading.remove();
    this.error.remove();
    this.status.remove();
  }
}
