/**
 * The cells of the panels a page has been sent, kept by frame key, so that the kernel can send a
 * revisited panel (a slider moved back to a layer) as its key alone.
 *
 * Each panel of the `panels` trait carries `key`, which names its cells (the Python side hashes
 * the bytes with their shape and dtype: equal keys, equal cells). A panel with cells is kept under
 * its key; a panel sent with empty `data` takes the cells kept under its key. The page tells the
 * kernel which keys it holds (`frames` message), and which it was sent without cells and lacks
 * (`missing`): the kernel then sends the panels whole. Kept cells are the message's own memory (no
 * copy); the oldest are let go past a byte budget.
 */

import { asBytes } from "./decode";

/** What a page keeps per widget: enough for the layers of a few sweeps of a 4096-channel view. */
export const FRAME_BUDGET_BYTES = 128 * 2 ** 20;
/** The most frames kept per widget (the kernel reads at most 1024 keys). */
export const MAX_FRAMES = 512;

/** Frame cells by key, least recently used first. */
export class FrameCache {
  private readonly cells = new Map<string, Uint8Array>();
  private bytes = 0;

  constructor(
    readonly budgetBytes = FRAME_BUDGET_BYTES,
    readonly maxFrames = MAX_FRAMES,
  ) {}

  /** The cells kept under `key` (now the most recently used), or undefined. */
  get(key: string): Uint8Array | undefined {
    const found = this.cells.get(key);
    if (found !== undefined) {
      this.cells.delete(key);
      this.cells.set(key, found);
    }
    return found;
  }

  /** Keep `cells` under `key`; let the oldest go past the budget (never the one just kept). */
  put(key: string, cells: Uint8Array): void {
    const old = this.cells.get(key);
    if (old !== undefined) {
      this.cells.delete(key);
      this.bytes -= old.byteLength;
    }
    this.cells.set(key, cells);
    this.bytes += cells.byteLength;
    for (const [oldest, kept] of this.cells) {
      if (
        this.cells.size <= 1 ||
        (this.bytes <= this.budgetBytes && this.cells.size <= this.maxFrames)
      ) {
        break;
      }
      this.cells.delete(oldest);
      this.bytes -= kept.byteLength;
    }
  }

  /** The keys kept, oldest first. */
  keys(): string[] {
    return [...this.cells.keys()];
  }

  get size(): number {
    return this.cells.size;
  }

  get byteLength(): number {
    return this.bytes;
  }
}

/** The `panels` trait with every panel's cells: from the message, or from the cache by key. */
export interface FilledPanels {
  /** The panels, each with `data` (those whose key is missing keep their empty data). */
  panels: unknown;
  /** Keys sent without cells that the cache lacks: ask the kernel for the panels whole. */
  missing: string[];
  /** Whether cells were kept that the cache did not hold: tell the kernel the keys. */
  added: boolean;
}

function byteLength(data: unknown): number {
  if (data instanceof ArrayBuffer || ArrayBuffer.isView(data)) return data.byteLength;
  return -1; // not binary: left to the panel parser to report
}

/**
 * Keep the cells of the panels that came with them; give the panels that came as keys alone the
 * cells kept under their key. Anything that is not a list of dicts is returned as it is.
 */
export function fillPanels(raw: unknown, cache: FrameCache): FilledPanels {
  const out: FilledPanels = { panels: raw, missing: [], added: false };
  if (!Array.isArray(raw)) return out;
  out.panels = raw.map((p: unknown) => {
    if (p === null || typeof p !== "object" || Array.isArray(p)) return p;
    const panel = p as Record<string, unknown>;
    const key = panel.key;
    if (typeof key !== "string" || key === "") return panel;
    const size = byteLength(panel.data);
    if (size > 0) {
      if (cache.get(key) === undefined) out.added = true;
      cache.put(key, asBytes(panel.data));
      return panel;
    }
    if (size !== 0) return panel;
    const kept = cache.get(key);
    if (kept === undefined) {
      out.missing.push(key);
      return panel;
    }
    return { ...panel, data: kept };
  });
  return out;
}
