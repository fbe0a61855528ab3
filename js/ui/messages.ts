/**
 * Error box and status line.  The error box shows the `error` trait plus
 * problems found in the front end (e.g. a malformed panel); the rest of the
 * widget keeps working.  Text only, never markup.
 */

import { h, setHidden, setText } from "./dom";
import { getString, type Model, onChanges } from "./model";

export class Messages {
  readonly error: HTMLDivElement;
  readonly status: HTMLDivElement;
  private local: string[] = [];
  private readonly unbind: () => void;

  constructor(
    doc: Document,
    private readonly model: Model,
  ) {
    this.error = h(doc, "div", { className: "hw-error", attrs: { role: "alert" } });
    this.status = h(doc, "div", {
      className: "hw-status",
      attrs: { role: "status", "aria-live": "polite" },
    });
    this.unbind = onChanges(model, ["error", "status"], () => this.sync());
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
  }

  destroy(): void {
    this.unbind();
    this.error.remove();
    this.status.remove();
  }
}
