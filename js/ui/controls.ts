/**
 * The control bar, bound two-way to model traits: the UI follows every
 * trait change (so Python and saved state drive it) and user actions set
 * the trait and call save_changes.  Visibility follows availability:
 * layer slider when num_layers > 0, channel window when num_channels > 0,
 * kind / metric / alignment / mechanisms when their *_available list is
 * non-empty.
 */

import { h } from "./dom";
import { Checklist, Choice, Slider, Toggles } from "./inputs";
import { commit, getNumber, getString, getStringList, type Model, onChanges } from "./model";

export const CONTROL_TRAITS = [
  "view",
  "layer",
  "num_layers",
  "layer_label",
  "channel_start",
  "channel_width",
  "num_channels",
  "kind",
  "kinds_available",
  "metric",
  "metrics_available",
  "alignment",
  "alignments_available",
  "mechanisms",
  "mechanisms_available",
] as const;

/** "channels 64–127 of 128" */
export function channelText(start: number, width: number, total: number): string {
  const end = Math.min(total, start + width) - 1;
  return `channels ${start}–${end} of ${total}`;
}

export class Controls {
  readonly el: HTMLDivElement;
  readonly layer: Slider;
  readonly channelStart: Slider;
  readonly channelWidth: Slider;
  readonly channels: HTMLDivElement;
  readonly kind: Toggles;
  readonly metric: Choice;
  readonly alignment: Choice;
  readonly mechanisms: Checklist;
  readonly exportButton: HTMLButtonElement;
  private readonly unbind: () => void;

  constructor(
    doc: Document,
    private readonly model: Model,
    onExport: () => void,
  ) {
    const m = model;
    this.layer = new Slider(
      doc,
      "Layer",
      "layer",
      (v) => commit(m, { layer: v }),
      (v) => this.layer.setOutput(`layer ${v}…`),
    );
    this.channelStart = new Slider(
      doc,
      "Channels from",
      "channel_start",
      (v) => commit(m, { channel_start: v }),
      (v) => this.previewChannels(v, this.channelWidth.value),
    );
    this.channelWidth = new Slider(
      doc,
      "width",
      "channel_width",
      (w) => this.commitWidth(w),
      (w) => this.previewChannels(this.channelStart.value, w),
    );
    this.channels = h(doc, "div", { className: "hw-control hw-channels" }, [
      this.channelStart.el,
      this.channelWidth.el,
    ]);
    this.channelStart.output.hidden = true;
    this.kind = new Toggles(doc, "Kind", "kind", (v) => commit(m, { kind: v }));
    this.metric = new Choice(doc, "Metric", "metric", (v) => commit(m, { metric: v }));
    this.alignment = new Choice(doc, "Alignment", "alignment", (v) => commit(m, { alignment: v }));
    this.mechanisms = new Checklist(doc, "Mechanisms", "mechanisms", (v) =>
      commit(m, { mechanisms: v }),
    );
    this.exportButton = h(doc, "button", {
      className: "hw-export",
      text: "Export PNG",
      attrs: { type: "button", title: "Save the figure as headwidget.png (2× resolution)" },
    });
    this.exportButton.addEventListener("click", onExport);
    this.el = h(doc, "div", { className: "hw-controls" }, [
      this.layer.el,
      this.channels,
      this.kind.el,
      this.metric.el,
      this.alignment.el,
      this.mechanisms.el,
      this.exportButton,
    ]);
    this.unbind = onChanges(model, CONTROL_TRAITS, () => this.sync());
    this.sync();
  }

  private previewChannels(start: number, width: number): void {
    const total = getNumber(this.model, "num_channels");
    this.channelWidth.setOutput(
      `${channelText(Math.min(start, Math.max(0, total - width)), width, total)}…`,
    );
  }

  /** Commit a new width, pulling the start back so that the window stays inside. */
  private commitWidth(width: number): void {
    const total = getNumber(this.model, "num_channels");
    const start = Math.min(this.channelStart.value, Math.max(0, total - width));
    const values: Record<string, unknown> = { channel_width: width };
    if (start !== getNumber(this.model, "channel_start")) values.channel_start = start;
    commit(this.model, values);
  }

  /** Make every control show the model's current state. */
  sync(): void {
    const m = this.model;
    const numLayers = getNumber(m, "num_layers");
    const layer = getNumber(m, "layer");
    this.layer.el.hidden = numLayers < 1;
    this.layer.set(0, numLayers - 1, layer);
    this.layer.setOutput(getString(m, "layer_label") || `layer ${layer} of ${numLayers}`);

    const total = getNumber(m, "num_channels");
    const width = getNumber(m, "channel_width", total);
    const start = getNumber(m, "channel_start");
    this.channels.hidden = total <= 0;
    this.channelWidth.set(Math.min(1, total), total, width);
    this.channelStart.set(0, Math.max(0, total - this.channelWidth.value), start);
    this.channelWidth.setOutput(channelText(start, width, total));

    this.kind.set(getStringList(m, "kinds_available"), getString(m, "kind"));
    this.metric.set(getStringList(m, "metrics_available"), getString(m, "metric"));
    this.alignment.set(getStringList(m, "alignments_available"), getString(m, "alignment"));
    this.mechanisms.set(getStringList(m, "mechanisms_available"), getStringList(m, "mechanisms"));
  }

  destroy(): void {
    this.unbind();
    this.layer.destroy();
    this.channelStart.destroy();
    this.channelWidth.destroy();
    this.el.remove();
  }
}
