/**
 * Run by tests/export/test_protocol.py (bundled with esbuild, run with node): prints
 * the front end's protocol tables, and what its decoder makes of the panels
 * the kernel encoded (`panels` of the JSON on stdin, `data` as base64); then the
 * same panels sent again as their keys alone (empty `data`): what a page that
 * kept them decodes, and what a page that did not asks for.  Then what the
 * control bar makes of the `controls` it is given (and what it cannot show),
 * and what is wrong with each saved page's JSON of `pages`.
 */

import { parseControls } from "../../../js/lib/control_spec";
import { FrameCache, fillPanels } from "../../../js/lib/frames";
import { OFFLINE_RULES, pageProblems } from "../../../js/lib/offline";
import { type Panel, parsePanels } from "../../../js/lib/panels";
import * as protocol from "../../../js/lib/protocol";

declare const process: {
  stdin: { on(event: string, callback: (chunk?: unknown) => void): void };
  stdout: { write(text: string): void };
};

let input = "";
process.stdin.on("data", (chunk) => {
  input += String(chunk);
});
process.stdin.on("end", () => {
  const given = JSON.parse(input) as {
    panels: Record<string, unknown>[];
    controls: unknown[];
    pages: unknown[];
  };
  const sent = given.panels;
  const panels = sent.map((p) => {
    const raw = atob(String(p.data));
    const bytes = new Uint8Array(raw.length);
    for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
    return { ...p, data: new DataView(bytes.buffer) };
  });
  const decode = (found: Panel[]) =>
    found.map((p) => {
      const { raw, values, ...spec } = p;
      return { ...spec, values: Array.from(values, (v) => (Number.isNaN(v) ? null : v)) };
    });
  const kept = new FrameCache();
  const first = fillPanels(panels, kept);
  const parsed = parsePanels(first.panels);
  const decoded = decode(parsed.panels);
  const keysAlone = panels.map((p) => ({ ...p, data: new DataView(new ArrayBuffer(0)) }));
  const again = fillPanels(keysAlone, kept);
  const revisited = decode(parsePanels(again.panels).panels);
  const elsewhere = fillPanels(keysAlone, new FrameCache());
  const tables = Object.fromEntries(
    Object.entries(protocol).filter(([, value]) => typeof value === "object"),
  );
  process.stdout.write(
    JSON.stringify({
      tables,
      decoded,
      problems: parsed.problems,
      frames: { added: first.added, kept: kept.keys(), againMissing: again.missing, revisited },
      missing: elsewhere.missing,
      controls: given.controls.map((c) => parseControls(c)),
      pages: given.pages.map((page) => pageProblems(page)),
      rules: Object.keys(OFFLINE_RULES),
    }),
  );
});
