// jsdom has no canvas: its getContext returns null after printing a
// "not implemented" error.  Return null quietly, like a canvas-less browser.
if (typeof HTMLCanvasElement !== "undefined") {
  HTMLCanvasElement.prototype.getContext = function getContext() {
    return null;
  } as unknown as HTMLCanvasElement["getContext"];
}
