// anywidget entry of SbsWidget (bundled into sbs_widget/static/widget.js by js/build.mjs).

import { mountGraphs } from "./graphs/index.js";
import { prewarmLayout } from "./graphs/layout.js";
import { createView } from "./view.js";
import { renderStatic as renderStaticView } from "./static_model.js";

export function renderStatic(el, data) {
  return renderStaticView(el, data, mountGraphs, prewarmLayout);
}

export default {
  render({ model, el }) {
    return createView({ model, el, mountGraphs, prewarmGraphs: prewarmLayout });
  },
};
