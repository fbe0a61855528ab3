/**
 * The widget's CSS, injected by JS as one <style> element per view so that
 * the bundle is a single self-contained file (no separate CSS asset, no
 * web fonts).  Every rule is scoped under .hw-root.  Fields and buttons carry
 * their own borders: a host's CSS reset (marimo's) would otherwise strip them.
 */

import { FONT_FAMILY } from "../lib/text";

export const CSS = `
.hw-root { font-family: ${FONT_FAMILY}; font-size: 13px; line-height: 1.35;
  color: var(--jp-ui-font-color1, #1f1f1f); display: block; max-width: 100%; min-width: 0; }
.hw-root [hidden] { display: none !important; }
.hw-bar { display: flex; align-items: flex-start; gap: 6px 18px; margin: 0 0 6px; }
.hw-controls { display: flex; flex-wrap: wrap; gap: 6px 18px; align-items: center; flex: 1 1 0;
  min-width: 0; }
.hw-figure { max-width: 100%; overflow-x: auto; }
.hw-control { display: inline-flex; gap: 6px; align-items: center; }
.hw-window { flex-wrap: wrap; gap: 6px 18px; min-width: 0; }
.hw-control > .hw-label { font-weight: 600; white-space: nowrap; }
.hw-control input[type=range] { width: 160px; margin: 0; }
.hw-control output { min-width: 7em; font-variant-numeric: tabular-nums; white-space: nowrap; }
.hw-entry { width: 9em; font: inherit; padding: 1px 3px; }
.hw-number { width: 5.5em; font: inherit; font-variant-numeric: tabular-nums; padding: 1px 3px; }
.hw-entry, .hw-number, .hw-root select, .hw-export, .hw-control > button {
  border: 1px solid #888; border-radius: 2px; background: #fff; color: #1f1f1f; }
.hw-toggles { display: inline-flex; }
.hw-toggles button { border: 1px solid #888; background: #f4f4f4; color: #1f1f1f; padding: 2px 9px;
  margin: 0; cursor: pointer; font: inherit; }
.hw-toggles button + button { border-left: none; }
.hw-toggles button[aria-pressed=true] { background: #2b5d9a; border-color: #2b5d9a; color: #fff; }
.hw-checklist { display: inline-flex; flex-wrap: wrap; gap: 2px 10px; border: 0; padding: 0; margin: 0; }
.hw-checklist legend { float: left; font-weight: 600; margin-right: 6px; padding: 0; }
.hw-root button:focus-visible, .hw-root select:focus-visible, .hw-root input:focus-visible,
.hw-panels:focus-visible { outline: 2px solid #1a73e8; outline-offset: 1px; }
.hw-export { font: inherit; padding: 2px 10px; cursor: pointer; flex: none; white-space: nowrap; }
.hw-play { font: inherit; min-width: 2.4em; padding: 1px 6px; cursor: pointer; }
.hw-error { border: 1px solid #c62828; background: #fdecea; color: #7f1d1d; padding: 6px 10px;
  margin: 0 0 6px; white-space: pre-wrap; border-radius: 3px; }
.hw-heading { font-weight: 600; font-size: 13px; margin: 0 0 4px; overflow-wrap: anywhere; }
.hw-status { font-size: 12px; color: var(--jp-ui-font-color2, #616161); min-height: 1.35em; margin: 0 0 4px; }
.hw-charts { position: relative; background: #fff; margin: 0 0 8px; }
.hw-chart { position: absolute; display: block; }
.hw-grid { position: relative; background: #fff; }
.hw-grid canvas { display: block; }
.hw-panels { position: relative; }
.hw-panel { position: absolute; overflow: hidden; }
.hw-panel canvas { position: absolute; left: 0; top: 0; }
.hw-overlay { pointer-events: none; }
.hw-tooltip { position: absolute; z-index: 10; pointer-events: none; background: rgba(255,255,255,0.97);
  color: #111; border: 1px solid #999; border-radius: 3px; padding: 4px 7px; font-size: 12px;
  width: max-content; white-space: normal; overflow-wrap: anywhere; box-sizing: border-box;
  box-shadow: 0 1px 4px rgba(0,0,0,0.25); }
.hw-tooltip .hw-tt-title { font-weight: 600; }
.hw-tooltip .hw-tt-value, .hw-tooltip .hw-tt-cell { font-variant-numeric: tabular-nums; }
.hw-tooltip .hw-tt-index { color: #555; }
.hw-sr { position: absolute; width: 1px; height: 1px; overflow: hidden; clip: rect(0 0 0 0);
  white-space: nowrap; margin: -1px; padding: 0; border: 0; }
`;

export function injectStyle(doc: Document, parent: HTMLElement): HTMLStyleElement {
  const s = doc.createElement("style");
  s.textContent = CSS;
  parent.appendChild(s);
  return s;
}
