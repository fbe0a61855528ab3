/**
 * A fake CanvasRenderingContext2D that records calls and property writes,
 * for checking what drawing code draws without a real canvas.
 */

export interface Call {
  name: string;
  args: any[];
  /** Context state at call time. */
  fillStyle: any;
  font: any;
}

export function recorder(): {
  ctx: CanvasRenderingContext2D;
  calls: Call[];
  props: Record<string, any>;
} {
  const calls: Call[] = [];
  const props: Record<string, any> = { fillStyle: "#000", font: "10px sans-serif" };
  const ctx = new Proxy(
    {},
    {
      get(_t, key: string) {
        if (key in props) return props[key];
        if (key === "measureText") return (s: string) => ({ width: s.length * 6 });
        return (...args: any[]) => {
          calls.push({ name: key, args, fillStyle: props.fillStyle, font: props.font });
        };
      },
      set(_t, key: string, value) {
        props[key] = value;
        calls.push({
          name: `set:${key}`,
          args: [value],
          fillStyle: props.fillStyle,
          font: props.font,
        });
        return true;
      },
    },
  ) as CanvasRenderingContext2D;
  return { ctx, calls, props };
}

export const texts = (calls: Call[]): string[] =>
  calls.filter((c) => c.name === "fillText").map((c) => String(c.args[0]));
