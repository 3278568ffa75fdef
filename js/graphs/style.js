// Styles of the graphs area, scoped under .sbsg. Status marks are strokes (not shapes) so that live
// repaints never need a new layout.
import { ERROR_LINE, RESET_LINE } from "../rules.js";

export const CSS = `
.sbsg { container-type: inline-size; font: 12px/1.4 var(--jp-ui-font-family, system-ui, sans-serif);
  color: var(--jp-ui-font-color1, #222); }
.sbsg-bar { display: flex; flex-wrap: wrap; gap: 6px 12px; align-items: center; margin: 4px 0; }
.sbsg-bar button { font: inherit; padding: 1px 8px; }
.sbsg-bar input[type=number] { width: 3.5em; font: inherit; }
.sbsg-legend { display: flex; gap: 10px; align-items: center; flex-wrap: wrap; color: var(--jp-ui-font-color2, #444); }
.sbsg-ramp { display: inline-block; width: 120px; height: 10px; border: 1px solid #999; vertical-align: middle; }
.sbsg-chip { display: inline-block; width: 14px; height: 10px; border: 1px solid #777; vertical-align: middle;
  margin-right: 3px; border-radius: 2px; }
.sbsg-panes { display: grid; grid-template-columns: 1fr 1fr; gap: 6px; }
@container (max-width: 760px) { .sbsg-panes { grid-template-columns: 1fr; } }
.sbsg-pane { border: 1px solid var(--jp-border-color2, #ccc); border-radius: 4px; min-width: 0; display: flex; flex-direction: column; }
.sbsg-pane-head { padding: 2px 6px; background: var(--jp-layout-color2, #f4f4f4);
  border-bottom: 1px solid var(--jp-border-color2, #ddd); font-weight: 600; }
.sbsg-viewport { position: relative; overflow: hidden; height: 520px; resize: vertical; cursor: grab;
  touch-action: none; user-select: none;
  /* a light canvas in every theme: Graphviz draws black text and edges, and the error ramp is made for white */
  background: #fff; color-scheme: light; }
.sbsg-viewport:active { cursor: grabbing; }
.sbsg-stage { position: absolute; left: 0; top: 0; transform-origin: 0 0; will-change: transform; }
.sbsg-stage.sbsg-glide { transition: transform 0.35s ease-out; }
.sbsg-message { padding: 12px; color: #666; } /* on the light canvas */
.sbsg-note { padding: 2px 6px; background: #fff4d6; color: #5a4300; border-bottom: 1px solid #e6cf8a; }
.sbsg-status { color: var(--jp-ui-font-color2, #666); font-variant-numeric: tabular-nums; }
.sbsg g.node { cursor: pointer; }
.sbsg g.cluster > text { cursor: pointer; }
.sbsg g.node[data-status="one-sided"] > :is(polygon, path, ellipse) { stroke-dasharray: 4 2; }
.sbsg g.node[data-status="reset"] > :is(polygon, path, ellipse) { stroke: ${RESET_LINE}; stroke-width: 3; }
.sbsg g.node[data-status="error"] > :is(polygon, path, ellipse) { stroke: ${ERROR_LINE}; stroke-width: 3; }
.sbsg g.node.sbsg-hover > :is(polygon, path, ellipse) { stroke: #ff8c00; stroke-width: 4; }
.sbsg g.node.sbsg-path > :is(polygon, path, ellipse) { stroke: #d40000; stroke-width: 3; }
.sbsg g.edge.sbsg-path > path { stroke: #d40000; stroke-width: 3; }
.sbsg g.edge.sbsg-path > polygon { stroke: #d40000; fill: #d40000; }
.sbsg g.node.sbsg-sel > :is(polygon, path, ellipse) { stroke: #0050ff; stroke-width: 5; }
`;
