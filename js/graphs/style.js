// Styles of the graphs area, scoped under .sbsg. Status marks are strokes (not shapes) so that live
// repaints never need a new layout. Colours follow the host page (js/theme.js): inside the widget the
// variables come from .sbs-root, on the standalone graphs page from .sbs-page. Node text is the theme's
// foreground, except on a box whose fill is bright in any theme (data-tone="bright", pane.js).
import { ERROR_LINE, RESET_LINE } from "../rules.js";

export const CSS = `
.sbsg { container-type: inline-size; font: 12px/1.4 var(--sbs-font, system-ui, sans-serif);
  color: var(--sbs-fg, #222); }
.sbsg-bar { display: flex; flex-wrap: wrap; gap: 6px 12px; align-items: center; margin: 4px 0; }
.sbsg-bar button { font: inherit; padding: 1px 8px; color: var(--sbs-fg); background: var(--sbs-bg2);
  border: 1px solid var(--sbs-border); border-radius: 3px; cursor: pointer; }
.sbsg-bar input[type=number] { width: 3.5em; font: inherit; color: var(--sbs-fg); background: var(--sbs-bg);
  border: 1px solid var(--sbs-border); }
.sbsg-legend { display: flex; gap: 10px; align-items: center; flex-wrap: wrap; color: var(--sbs-fg2, #444); }
.sbsg-ramp { display: inline-block; width: 120px; height: 10px; border: 1px solid var(--sbs-border, #999); vertical-align: middle; }
.sbsg-chip { display: inline-block; width: 14px; height: 10px; border: 1px solid var(--sbs-fg2, #777); vertical-align: middle;
  margin-right: 3px; border-radius: 2px; }
.sbsg-panes { display: grid; grid-template-columns: 1fr 1fr; gap: 6px; }
.sbsg-panes.sbsg-three { grid-template-columns: 1fr 1fr 1fr; }
.sbsg-pane[hidden] { display: none; }
@container (max-width: 760px) { .sbsg-panes, .sbsg-panes.sbsg-three { grid-template-columns: 1fr; } }
.sbsg-pane { border: 1px solid var(--sbs-border, #ccc); border-radius: 4px; min-width: 0; display: flex; flex-direction: column; }
.sbsg-pane-head { padding: 2px 6px; background: var(--sbs-bg2, #f4f4f4);
  border-bottom: 1px solid var(--sbs-border, #ddd); font-weight: 600; }
.sbsg-viewport { position: relative; overflow: hidden; height: 520px; resize: vertical; cursor: grab;
  touch-action: none; user-select: none; background: var(--sbs-bg, #fff); }
.sbsg-viewport:active { cursor: grabbing; }
.sbsg-stage { position: absolute; left: 0; top: 0; transform-origin: 0 0; will-change: transform; }
.sbsg-stage.sbsg-glide { transition: transform 0.35s ease-out; }
.sbsg-message { padding: 12px; color: var(--sbs-fg2, #666); }
.sbsg-note { padding: 2px 6px; background: #fff4d6; color: #5a4300; border-bottom: 1px solid #e6cf8a; }
.sbsg-status { color: var(--sbs-fg2, #666); font-variant-numeric: tabular-nums; }
/* Graphviz draws in black: text, outlines and edges take the theme's ink instead */
.sbsg svg text { fill: var(--sbs-fg, #000); }
.sbsg g.node[data-tone="bright"] text { fill: #1f2328; }
.sbsg g.node > :is(polygon, path, ellipse, polyline) { stroke: var(--sbs-fg, #000); }
.sbsg g.edge > path { stroke: var(--sbs-edge, #777); }
.sbsg g.edge > polygon { stroke: var(--sbs-edge, #777); fill: var(--sbs-edge, #777); }
.sbsg { --sbs-edge: color-mix(in srgb, var(--sbs-fg, #000) 50%, var(--sbs-bg, #fff)); }
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
