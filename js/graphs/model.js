// What the graph views know, free of the DOM: the two graph structures, how their nodes link, the
// errors painted on them, which clusters are collapsed, and the DOT that draws the current view.
// Tested with node's test runner (model.test.js); the browser side lives in pane.js and index.js.

import { labelText, visible } from "../format.js";
import { BROADCAST, GRAPH_SPEC_MARKER, NOT_COMPARED, STUB_FILL, worse } from "../rules.js";
import { B_PAINT } from "../spec.gen.js";

export const SPEC_MARKER = `// ${GRAPH_SPEC_MARKER}`;

/** The graph structure the Python side put on the first line of its DOT, or null. */
export function parseSpec(dot) {
  if (!dot || !dot.startsWith(SPEC_MARKER)) return null;
  const end = dot.indexOf("\n");
  return JSON.parse(dot.slice(SPEC_MARKER.length, end < 0 ? undefined : end));
}

/** Adjacency, name lookups and cluster tree of one spec (see sbs_widget/graphs_spec.py). */
export function indexGraph(spec) {
  const n = spec.nodes.length;
  const preds = Array.from({ length: n }, () => []);
  const succs = Array.from({ length: n }, () => []);
  for (const [a, b] of spec.edges) {
    succs[a].push(b);
    preds[b].push(a);
  }
  const byName = new Map(spec.nodes.map((x, i) => [x.name, i]));
  const byValue = new Map();
  const byLink = new Map(); // fx node name -> ONNX node indices made from it
  spec.nodes.forEach((x, i) => {
    for (const v of x.outputs || []) byValue.set(v, i);
    for (const l of x.links || []) (byLink.get(l) ?? byLink.set(l, []).get(l)).push(i);
  });
  const clusters = spec.clusters;
  const depth = clusters.map(() => 0);
  const children = clusters.map(() => []);
  const members = clusters.map(() => []);
  const size = clusters.map(() => 0); // nodes anywhere below
  clusters.forEach((c, i) => {
    if (c.parent >= 0) {
      depth[i] = depth[c.parent] + 1; // parents come first
      children[c.parent].push(i);
    }
  });
  spec.nodes.forEach((x, i) => {
    if (x.cluster < 0) return;
    members[x.cluster].push(i);
    for (let c = x.cluster; c >= 0; c = clusters[c].parent) size[c]++;
  });
  return { spec, side: spec.side, nodes: spec.nodes, preds, succs, byName, byValue, byLink, depth, children,
    members, size };
}

/** Clusters of `g` from the outermost to the one holding node `i`. */
export function chainOf(g, i) {
  const chain = [];
  for (let c = g.nodes[i].cluster; c >= 0; c = g.spec.clusters[c].parent) chain.unshift(c);
  return chain;
}

/** Collapsed clusters for a first view of at most `budget` boxes: whole module levels are opened from
 * the top while they fit (a 16-layer LLaMA shows its layers with attention and MLP closed). */
export function defaultCollapsed(g, budget = 300) {
  if (g.nodes.length <= budget) return new Set();
  const nodeDepth = g.nodes.map((x) => (x.cluster < 0 ? 0 : g.depth[x.cluster] + 1));
  const maxDepth = g.depth.reduce((a, b) => Math.max(a, b), 0); // no spread: 100k+ clusters overflow it
  let open = 0;
  for (let d = 1; d <= maxDepth; d++) {
    const count = nodeDepth.filter((x) => x <= d).length + g.depth.filter((x) => x === d).length;
    if (count > budget) break;
    open = d;
  }
  return new Set(g.depth.flatMap((x, c) => (x === open ? [c] : [])));
}

/** Worst error and status per node from the table rows, plus which rows name which node. */
export function paintGraph(g, rows) {
  const paint = new Array(g.nodes.length).fill(null);
  const rowsOf = new Map();
  rows.forEach((row, k) => {
    const i = nodeOfRow(g, row);
    if (i < 0) return;
    (rowsOf.get(i) ?? rowsOf.set(i, []).get(i)).push(row.i ?? k);
    // b (two models): its value's error against torch, its verdict as a status (shared_rules.B_PAINT)
    if (g.side === "b") { if (row.b_status) paint[i] = worse(paint[i], row.b_err_abs ?? null, B_PAINT[row.b_status] ?? "ok"); }
    else paint[i] = worse(paint[i], row.err_abs ?? null, row.status || "ok");
  });
  return { paint, rowsOf };
}

/** Worst paint of each cluster over everything below it. */
export function paintClusters(g, paint) {
  const out = new Array(g.spec.clusters.length).fill(null);
  g.nodes.forEach((x, i) => {
    if (!paint[i]) return;
    for (let c = x.cluster; c >= 0; c = g.spec.clusters[c].parent) out[c] = worse(out[c], paint[i].err, paint[i].status);
  });
  return out;
}

/** The node a table row names on this side, or -1. */
export function nodeOfRow(g, row) {
  // an inner value (inside an FX node's ONNX translation) has no FX node of its own: its ep_name is
  // "<fx node>::<finer node>"; it paints its ONNX node, by node name or value name like any row
  if (g.side === "fx") return row.ep_name != null && row.kind !== "inner" ? g.byName.get(row.ep_name) ?? -1 : -1;
  if (g.side === "b") { // the second model (two models): the node of b paired with the row's value
    const byNode = row.b_node_name != null ? g.byName.get(row.b_node_name) : undefined;
    if (byNode !== undefined) return byNode;
    return row.b_name != null ? g.byValue.get(row.b_name) ?? -1 : -1;
  }
  const byNode = row.onnx_node_name != null ? g.byName.get(row.onnx_node_name) : undefined;
  if (byNode !== undefined) return byNode;
  return row.onnx_name != null ? g.byValue.get(row.onnx_name) ?? -1 : -1;
}

/** Counterparts of node `i` of `from` in `to`: the exporter's fx_node metadata and the rows both agree
 * on, merged; one FX node often becomes several ONNX nodes. Between the two ONNX models (a and b), the
 * rows alone: they pair b's values with a's. */
export function counterparts(from, to, i, rows) {
  const out = new Set();
  const name = from.nodes[i].name;
  if (from.side === "fx") for (const j of to.byLink.get(name) || []) out.add(j);
  else if (to.side === "fx") for (const l of from.nodes[i].links || []) if (to.byName.has(l)) out.add(to.byName.get(l));
  for (const row of rows) {
    if (nodeOfRow(from, row) === i) {
      const j = nodeOfRow(to, row);
      if (j >= 0) out.add(j);
    }
  }
  return [...out];
}

/** Nodes within `k` hops of `starts`, edges taken both ways. */
export function neighbourhood(g, starts, k) {
  const seen = new Set(starts);
  let frontier = [...starts];
  for (let step = 0; step < k && frontier.length; step++) {
    const next = [];
    for (const i of frontier)
      for (const j of [...g.preds[i], ...g.succs[i]]) if (!seen.has(j)) (seen.add(j), next.push(j));
    frontier = next;
  }
  return seen;
}

const isBad = (p) => p && (p.status === "mismatch" || p.status === "error");

/** Path from node `start` back to where its error starts: step to the worst mismatched input, looking
 * through nodes without a record (ONNX-only intermediates) up to `through` hops, until no input is
 * mismatched. Returns node indices, `start` first. */
export function errorPath(g, paint, start, through = 3) {
  const path = [start];
  if (!isBad(paint[start])) return path;
  const onPath = new Set(path);
  for (let cur = start; ; ) {
    // Breadth-first upstream through unpainted nodes; remember how each one was reached.
    const via = new Map([[cur, -1]]);
    let frontier = [cur];
    let best = -1;
    for (let hop = 0; hop < through && frontier.length && best < 0; hop++) {
      const next = [];
      for (const i of frontier)
        for (const p of g.preds[i]) {
          if (via.has(p) || onPath.has(p)) continue;
          via.set(p, i);
          if (isBad(paint[p])) {
            if (best < 0 || errOf(paint[p]) > errOf(paint[best])) best = p;
          } else if (!paint[p]) next.push(p);
        }
      frontier = next;
    }
    if (best < 0) return path;
    const hops = [];
    for (let i = best; i !== cur; i = via.get(i)) hops.unshift(i);
    for (const i of hops) (path.push(i), onPath.add(i));
    cur = best;
  }
}

const errOf = (p) => (p.err === null ? -1 : Number.isNaN(p.err) ? Infinity : p.err);

/** What is drawn: `repOf[i]` is the DOT id of the box showing node i (`n<i>`, or `c<k>` for its
 * outermost collapsed cluster, or null when filtered out), `proxies` stub id -> box (see below), `dot`
 * the DOT text. `newrank` ranks across clusters: without it dot ranks each module apart and a mask read
 * by every layer puts all decoder layers side by side. */
export function buildView(g, { collapsed = new Set(), only = null, paint = [], clusterPaint = [], colorFor, broadcast = BROADCAST }) {
  const clusters = g.spec.clusters;
  const repOf = g.nodes.map((x, i) => {
    if (only && !only.has(i)) return null;
    if (!only) for (const c of chainOf(g, i)) if (collapsed.has(c)) return `c${c}`;
    return `n${i}`;
  });
  const shown = new Set(repOf.filter(Boolean));
  const lines = [
    "digraph G {",
    'graph [newrank=true rankdir=TB fontname="Helvetica" fontsize=10 nodesep=0.15 ranksep=0.3 bgcolor="transparent"]',
    `node [shape=box style="filled,rounded" fontname="Helvetica" fontsize=9 height=0.3 fillcolor="${NOT_COMPARED}"]`,
    'edge [arrowsize=0.5 color="#777777"]',
  ];
  // Group shown boxes by the cluster they sit in; a collapsed box sits in its parent cluster.
  const inCluster = new Map();
  const place = (c, line) => (inCluster.get(c) ?? inCluster.set(c, []).get(c)).push(line);
  for (const key of shown) {
    const isCluster = key[0] === "c";
    const idx = Number(key.slice(1));
    if (isCluster) {
      const p = clusterPaint[idx];
      const label = `${labelText(clusterLabel(g, idx))}\n${g.size[idx]} node${g.size[idx] === 1 ? "" : "s"}`;
      place(clusters[idx].parent, `${key} [label=${quote(label)} shape=box3d style="filled" fillcolor=${quote(fill(p, colorFor))}]`);
    } else {
      const x = g.nodes[idx];
      // Python already shortened and escaped each line (graphs_spec.label_text); again here for any spec.
      const label = String(x.label ?? x.name).split("\n").map((line) => labelText(line)).join("\n");
      const shape = x.kind === "node" ? "" : x.kind === "weight" ? " shape=cylinder" : " shape=ellipse";
      place(x.cluster, `${key} [label=${quote(label)}${shape} fillcolor=${quote(fill(paint[idx], colorFor))}]`);
    }
  }
  const used = new Set(); // clusters holding something shown, with their ancestors
  for (const c of inCluster.keys()) for (let k = c; k >= 0 && !used.has(k); k = clusters[k].parent) used.add(k);
  // Depth first with an explicit stack: a hostile module depth must not overflow ours. A cluster's
  // boxes come first, then its sub-clusters in order, then its closing brace.
  const todo = [["members", -1, ""]];
  while (todo.length) {
    const [what, c, indent] = todo.pop();
    if (what === "close") {
      lines.push(`${indent}}`);
    } else if (what === "open") {
      const p = clusterPaint[c];
      lines.push(`${indent}subgraph cluster_${c} {`);
      const style = clusters[c].fx != null ? '"rounded,dashed"' : "rounded"; // an FX node's translation: dashed
      lines.push(`${indent}  label=${quote(labelText(clusterLabel(g, c)))} style=${style} penwidth=2 color=${quote(p ? fill(p, colorFor) : "#999999")}`);
      todo.push(["close", c, indent], ["members", c, `${indent}  `]);
    } else {
      for (const line of inCluster.get(c) || []) lines.push(indent + line);
      const kids = (c < 0 ? roots(g) : g.children[c]).filter((k) => used.has(k) && !(collapsed.has(k) && !only));
      for (let j = kids.length - 1; j >= 0; j--) todo.push(["open", kids[j], indent]);
    }
  }
  const edges = new Map(); // source box -> target boxes
  for (const [a, b] of g.spec.edges) {
    const ra = repOf[a];
    const rb = repOf[b];
    if (ra && rb && ra !== rb) (edges.get(ra) ?? edges.set(ra, new Set()).get(ra)).add(rb);
  }
  // A value read all over the graph (attention mask, rotary tables) would pull one long edge into every
  // layer: dot then spends seconds crossing them (6 s instead of 1.5 s on a 16-layer LLaMA). Each reader
  // gets a small stub named after the source instead; `proxies` maps a stub to the box it stands for.
  const proxies = new Map();
  const stubs = new Map(); // "source->target" drawn through a stub -> the stub's key
  const labelOf = (key) => labelText(key[0] === "c" ? clusterLabel(g, Number(key.slice(1))) : g.nodes[Number(key.slice(1))].name);
  for (const [ra, targets] of edges) {
    if (targets.size < broadcast) {
      for (const rb of targets) lines.push(`${ra}->${rb}`);
      continue;
    }
    for (const rb of targets) {
      const key = `p${proxies.size}`;
      proxies.set(key, ra);
      stubs.set(`${ra}->${rb}`, key);
      lines.push(`${key} [label=${quote(labelOf(ra))} shape=cds style=filled fillcolor="${STUB_FILL}" fontsize=7 height=0.2]`);
      lines.push(`${key}->${rb}`);
    }
  }
  lines.push("}");
  return { repOf, proxies, stubs, dot: lines.join("\n") };
}

function roots(g) {
  return g.spec.clusters.flatMap((c, i) => (c.parent < 0 ? [i] : []));
}

/** A cluster's label: its module path relative to the parent cluster ("layers.0", "self_attn"); a
 * translation's (the ONNX nodes made from one FX node): that node's name. */
export function clusterLabel(g, c) {
  const { path, parent, fx } = g.spec.clusters[c];
  if (fx != null) return String(fx);
  const prefix = parent >= 0 ? g.spec.clusters[parent].path + "." : "";
  return path.startsWith(prefix) ? path.slice(prefix.length) : path;
}

function fill(p, colorFor) {
  return p && colorFor ? colorFor(p.err, p.status) : NOT_COMPARED;
}

/** A DOT double-quoted string showing `text` literally (mirrors sbs_widget.graphs.quote): backslashes
 * doubled so Graphviz escapes (\\N, \\l) in model names stay text, quotes escaped, newlines kept as line
 * breaks, NULs and other hidden characters shown as escapes (Graphviz reads a NUL as the end of its
 * input). Graphviz XML-escapes the SVG it writes, so markup in names is drawn as text. */
export function quote(text) {
  const lines = String(text).split("\n").map((line) => visible(line).replace(/\\/g, "\\\\").replace(/"/g, '\\"'));
  return `"${lines.join("\\n")}"`;
}

/** Hover text of node `i`: its full name (never shortened) and op, hidden characters escaped, and the
 * nodes of the user's program whose value it holds (`yours`: rewritten or dropped by decomposition). */
export function nodeTitle(g, i) {
  const x = g.nodes[i];
  const text = (x.kind === "node" || x.kind === "weight") && x.op ? `${visible(x.name)}\n${visible(x.op)}` : visible(x.name);
  return x.yours && x.yours.length ? `${text}\nyour program: ${x.yours.map((n) => visible(n)).join(", ")}` : text;
}

/** Up to `limit` nodes to draw when the whole view is more than Graphviz can lay out: breadth first
 * from `starts` (both edge directions), or the first nodes in graph order when nothing is selected. */
export function partOf(g, starts, limit) {
  if (!starts.length) return new Set(g.nodes.slice(0, limit).map((_, i) => i));
  const seen = new Set(starts.slice(0, limit));
  const queue = [...seen];
  for (let q = 0; q < queue.length && seen.size < limit; q++)
    for (const j of [...g.preds[queue[q]], ...g.succs[queue[q]]]) {
      if (seen.size >= limit) break;
      if (!seen.has(j)) (seen.add(j), queue.push(j));
    }
  return seen;
}
