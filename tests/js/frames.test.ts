import { describe, expect, it } from "vitest";
import { FrameCache, fillPanels } from "../../js/lib/frames";
import { parsePanels } from "../../js/lib/panels";
import { f32View } from "./helpers/fake_model";

const empty = () => new DataView(new ArrayBuffer(0));

describe("FrameCache", () => {
  it("keeps cells by key, least recently used first, within its budget", () => {
    const cache = new FrameCache(10, 3);
    cache.put("a", new Uint8Array(4));
    cache.put("b", new Uint8Array(4));
    expect(cache.keys()).toEqual(["a", "b"]);
    expect(cache.get("a")?.byteLength).toBe(4); // now the most recent
    expect(cache.keys()).toEqual(["b", "a"]);
    cache.put("c", new Uint8Array(4)); // 12 bytes > 10: the oldest ("b") goes
    expect(cache.keys()).toEqual(["a", "c"]);
    expect(cache.byteLength).toBe(8);
    cache.put("c", new Uint8Array(2)); // the same key again replaces its cells
    expect(cache.byteLength).toBe(6);
    cache.put("d", new Uint8Array(1));
    cache.put("e", new Uint8Array(1)); // four frames > 3: "a" goes
    expect(cache.keys()).toEqual(["c", "d", "e"]);
    cache.put("big", new Uint8Array(64)); // larger than the budget: kept alone, never dropped at once
    expect(cache.keys()).toEqual(["big"]);
    expect(cache.get("gone")).toBeUndefined();
  });
});

describe("fillPanels", () => {
  it("keeps panels sent whole and fills those sent as keys alone", () => {
    const cache = new FrameCache();
    const whole = [{ key: "k1", rows: 1, cols: 2, data: f32View([1, 2]) }];
    const first = fillPanels(whole, cache);
    expect(first).toMatchObject({ missing: [], added: true });
    expect(cache.keys()).toEqual(["k1"]);
    expect(fillPanels(whole, cache).added).toBe(false); // held already: nothing to tell
    const again = fillPanels([{ key: "k1", rows: 1, cols: 2, data: empty() }], cache);
    expect(again.missing).toEqual([]);
    const parsed = parsePanels(again.panels);
    expect(parsed.problems).toEqual([]);
    expect(Array.from(parsed.panels[0]?.values ?? [])).toEqual([1, 2]);
  });

  it("names the keys it lacks and leaves other entries to the parser", () => {
    const cache = new FrameCache();
    const raw = [
      { key: "k9", rows: 1, cols: 1, data: empty() },
      { rows: 1, cols: 1, data: f32View([3]) }, // no key: as it is
      { key: "k2", rows: 1, cols: 1, data: "not bytes" }, // not binary: the parser reports it
      "not a dict",
    ];
    const filled = fillPanels(raw, cache);
    expect(filled.missing).toEqual(["k9"]);
    expect(filled.added).toBe(false);
    expect(cache.size).toBe(0);
    expect(fillPanels(null, cache)).toEqual({ panels: null, missing: [], added: false });
  });
});
