import type { AnyModel } from "@anywidget/types";

type Cb = (...args: any[]) => void;

/** In-memory stand-in for an anywidget model (Backbone-like events). */
export class FakeModel {
  state: Record<string, any>;
  listeners = new Map<string, Cb[]>();
  saves: Record<string, any>[] = [];
  sent: any[] = [];
  widget_manager = { get_model: async () => this as any };

  constructor(state: Record<string, any> = {}) {
    this.state = { ...state };
  }
  get(key: string): any {
    return this.state[key];
  }
  set(key: string, value: any): void {
    const old = this.state[key];
    this.state[key] = value;
    if (old !== value) this.emit(`change:${key}`);
  }
  on(event: string, cb: Cb): void {
    const list = this.listeners.get(event) ?? [];
    list.push(cb);
    this.listeners.set(event, list);
  }
  off(event?: string | null, cb?: Cb | null): void {
    if (event == null) return void this.listeners.clear();
    if (cb == null) return void this.listeners.delete(event);
    const list = this.listeners.get(event) ?? [];
    const i = list.indexOf(cb);
    if (i >= 0) list.splice(i, 1);
  }
  emit(event: string, ...args: any[]): void {
    for (const cb of [...(this.listeners.get(event) ?? [])]) cb(...args);
  }
  save_changes(): void {
    this.saves.push({ ...this.state });
  }
  send(content: any): void {
    this.sent.push(content);
  }
  listenerCount(): number {
    let n = 0;
    for (const l of this.listeners.values()) n += l.length;
    return n;
  }
  asModel(): AnyModel {
    return this as unknown as AnyModel;
  }
}

export function f32View(values: number[], pad = 0): DataView {
  const buf = new ArrayBuffer(pad + 4 * values.length + 2);
  const dv = new DataView(buf, pad, 4 * values.length);
  values.forEach((v, i) => {
    dv.setFloat32(4 * i, v, true);
  });
  return dv;
}

export function rawPanel(fields: Record<string, any>): Record<string, any> {
  return {
    id: "p",
    title: "",
    subtitle: "",
    rows: 1,
    cols: 1,
    row_labels: null,
    col_labels: null,
    row_offset: 0,
    col_offset: 0,
    row_step: 1,
    col_step: 1,
    dtype: "float32",
    note: "",
    ...fields,
  };
}
