/**
 * anywidget entry point of headwidget: `export default { render }`.
 * All rendering lives in ui/view.ts; pure logic in lib/.
 */

import type { AnyModel, RenderProps } from "@anywidget/types";
import { View } from "./ui/view";

function render({ model, el }: Pick<RenderProps, "model" | "el">): () => void {
  const view = new View(model as AnyModel, el);
  return () => view.destroy();
}

export default { render };
