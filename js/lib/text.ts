/**
 * Text fitting with an injected measuring function, so layout stays pure:
 * the browser passes canvas measureText, tests pass `approxMeasure`.
 */

export type Measure = (text: string, font: string) => number;

export const FONT_FAMILY =
  'system-ui, -apple-system, "Segoe UI", Roboto, "Helvetica Neue", Arial, "DejaVu Sans", sans-serif';

/** Font string for canvas: e.g. font(12, "600"). */
export function font(sizePx: number, weight = "400", style = "normal"): string {
  return `${style} ${weight} ${sizePx}px ${FONT_FAMILY}`;
}

/** Font size in px parsed from a canvas font string (default 10). */
export function fontSize(f: string): number {
  const m = /(\d+(?:\.\d+)?)px/.exec(f);
  return m ? Number(m[1]) : 10;
}

/** Width estimate without a canvas: 0.6 em per character. */
export const approxMeasure: Measure = (text, f) => [...text].length * fontSize(f) * 0.6;

const ELLIPSIS = "…";

/** `text` shortened with an ellipsis so that it fits in maxWidth. */
export function fitText(text: string, maxWidth: number, f: string, measure: Measure): string {
  if (measure(text, f) <= maxWidth) return text;
  const chars = [...text];
  let lo = 0;
  let hi = chars.length;
  while (lo < hi) {
    const mid = Math.ceil((lo + hi) / 2);
    if (measure(chars.slice(0, mid).join("") + ELLIPSIS, f) <= maxWidth) lo = mid;
    else hi = mid - 1;
  }
  return lo === 0
    ? measure(ELLIPSIS, f) <= maxWidth
      ? ELLIPSIS
      : ""
    : chars.slice(0, lo).join("") + ELLIPSIS;
}

/**
 * A word longer than maxWidth in lines that fit: broken after its commas and semicolons (a long
 * spec such as `kv:int4@0,2-5;mqa@1`), a piece still too long cut with fitText.
 */
export function breakWord(word: string, maxWidth: number, f: string, measure: Measure): string[] {
  const parts = word.match(/[^,;]*[,;]|[^,;]+/g) ?? [word];
  const lines: string[] = [];
  let line = "";
  for (const part of parts) {
    if (line && measure(line + part, f) > maxWidth) {
      lines.push(line);
      line = part;
    } else line += part;
  }
  if (line) lines.push(line);
  return lines.map((l) => (measure(l, f) <= maxWidth ? l : fitText(l, maxWidth, f, measure)));
}

/** Greedy word wrap to maxWidth; a word longer than a line is broken by breakWord. */
export function wrapText(
  text: string,
  maxWidth: number,
  f: string,
  measure: Measure,
  maxLines = 4,
): string[] {
  const words = text.split(/\s+/).filter((w) => w.length > 0);
  const lines: string[] = [];
  let line = "";
  for (const w of words) {
    const candidate = line ? `${line} ${w}` : w;
    if (measure(candidate, f) <= maxWidth) {
      line = candidate;
      continue;
    }
    if (line) lines.push(line);
    const broken = measure(w, f) <= maxWidth ? [w] : breakWord(w, maxWidth, f, measure);
    lines.push(...broken.slice(0, -1));
    line = broken[broken.length - 1] ?? "";
  }
  if (line) lines.push(line);
  if (lines.length > maxLines) {
    const kept = lines.slice(0, maxLines);
    kept[maxLines - 1] = fitText(`${kept[maxLines - 1]} ${lines[maxLines]}…`, maxWidth, f, measure);
    return kept;
  }
  return lines;
}
