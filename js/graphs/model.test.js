// Linking, painting, collapsing and escaping against a small fake model: node --test js/graphs/
import assert from "node:assert/strict";
import { test } from "node:test";
import {
  buildView, counterparts, defaultCollapsed, errorPath, indexGraph, neighbourhood, nodeOfRow, paintClusters,
  paintGraph, parseSpec, quote, SPEC_MARKER,
  nodeTitle,
} from "./model.js";
import { colorFor, errorColor } from "../rules.js";

// FX: x -> linear -> gelu -> add -> output, all linear/gelu in module "mlp", "mlp.fc" holds linear.
const FX = {
  side: "fx",
  clusters: [{ path: "mlp", parent: -1 }, { path: "mlp.fc", parent: 0 }],
  nodes: [
    { id: "fx:x", name: "x", label: "x", kind: "input", cluster: -1 },
    { id: "fx:linear", name: "linear", label: "linear", kind: "node", cluster: 1 },
    { id: "fx:gelu", name: "gelu", label: "gelu", kind: "node", cluster: 0 },
    { id: "fx:add", name: "add", label: "add", kind: "node", cluster: -1 },
    { id: "fx:output", name: "output", label: "output", kind: "output", cluster: -1 },
  ],
  edges: [[0, 1], [1, 2], [2, 3], [0, 3], [3, 4]],
};
// ONNX: linear became MatMul + Add (two nodes, one FX node), plus an unnamed Cast nobody records.
const ONNX = {
  side: "onnx",
  clusters: [{ path: "mlp", parent: -1 }, { path: "mlp.fc", parent: 0 }],
  nodes: [
    { id: "onnx-in:x", name: "x", label: "x", kind: "input", cluster: -1, outputs: ["x"], links: ["x"] },
    { id: "onnx:node_MatMul_1", name: "node_MatMul_1", label: "MatMul", kind: "node", cluster: 1, outputs: ["val_1"], links: ["linear"] },
    { id: "onnx:node_linear", name: "node_linear", label: "Add", kind: "node", cluster: 1, outputs: ["linear"], links: ["linear"] },
    { id: "onnx:#3", name: "#3", label: "Cast", kind: "node", cluster: 0, outputs: ["val_3"], links: [] },
    { id: "onnx:node_gelu", name: "node_gelu", label: "Gelu", kind: "node", cluster: 0, outputs: ["gelu"], links: ["gelu"] },
    { id: "onnx:node_add", name: "node_add", label: "Add", kind: "node", cluster: -1, outputs: ["add"], links: ["add"] },
  ],
  edges: [[0, 1], [1, 2], [2, 3], [3, 4], [4, 5], [0, 5]],
};
const ROWS = [
  { i: 0, ep_name: "x", onnx_name: "x", onnx_node_name: null, err_abs: 0, status: "ok" },
  { i: 1, ep_name: "linear", onnx_name: "linear", onnx_node_name: "node_linear", err_abs: 1e-6, status: "ok" },
  { i: 2, ep_name: "gelu", onnx_name: "gelu", onnx_node_name: "node_gelu", err_abs: 0.5, status: "mismatch" },
  { i: 3, ep_name: "add", onnx_name: "add", onnx_node_name: "node_add", err_abs: 0.6, status: "mismatch" },
];
const fx = indexGraph(FX);
const onnx = indexGraph(ONNX);

test("parseSpec reads the header written by sbs_widget.graphs.dot_sources", () => {
  const dot = `${SPEC_MARKER}${JSON.stringify(FX)}\ndigraph fx {\n}`;
  assert.deepEqual(parseSpec(dot).nodes.map((n) => n.name), ["x", "linear", "gelu", "add", "output"]);
  assert.equal(parseSpec("digraph { a }"), null);
});

test("one FX node links to all the ONNX nodes made from it, and back", () => {
  const names = (g, ids) => ids.map((j) => g.nodes[j].name).sort();
  assert.deepEqual(names(onnx, counterparts(fx, onnx, 1, [])), ["node_MatMul_1", "node_linear"]);
  assert.deepEqual(names(fx, counterparts(onnx, fx, 1, [])), ["linear"]);
  assert.deepEqual(names(fx, counterparts(onnx, fx, 2, [])), ["linear"]);
  assert.deepEqual(counterparts(onnx, fx, 3, []), []); // ONNX-only node
  // Rows add links the metadata lacks (graph inputs carry no fx_node).
  assert.deepEqual(names(onnx, counterparts(fx, onnx, 0, [ROWS[0]])), ["x"]);
});

test("rows find their node by node name, or by value name when the node has none", () => {
  assert.equal(nodeOfRow(onnx, ROWS[2]), 4);
  assert.equal(nodeOfRow(onnx, { onnx_name: "val_3", onnx_node_name: null }), 3);
  assert.equal(nodeOfRow(fx, { ep_name: "nope" }), -1);
});

test("nodes are painted with their worst record, clusters with the worst below them", () => {
  const rows = [...ROWS, { i: 4, ep_name: "gelu", err_abs: 0.01, status: "reset" }];
  const { paint, rowsOf } = paintGraph(fx, rows);
  assert.deepEqual(paint[2], { err: 0.5, status: "mismatch" });
  assert.deepEqual(rowsOf.get(2), [2, 4]);
  assert.equal(paint[4], null);
  const clusters = paintClusters(fx, paint);
  assert.equal(clusters[0].err, 0.5);
  assert.equal(clusters[1].err, 1e-6);
});

test("the error path walks back to where the error starts, through unrecorded nodes", () => {
  const fxPaint = paintGraph(fx, ROWS).paint;
  assert.deepEqual(errorPath(fx, fxPaint, 3), [3, 2]); // add <- gelu; linear is fine
  const onnxPaint = paintGraph(onnx, ROWS).paint;
  assert.deepEqual(errorPath(onnx, onnxPaint, 5), [5, 4]);
  assert.deepEqual(errorPath(fx, fxPaint, 1), [1]); // not mismatched: nothing to trace
  const through = paintGraph(onnx, [{ onnx_node_name: "node_gelu", err_abs: 1, status: "mismatch" },
    { onnx_node_name: "node_linear", err_abs: 1, status: "mismatch" }]).paint;
  assert.deepEqual(errorPath(onnx, through, 4), [4, 3, 2]); // the Cast has no record: looked through
});

test("neighbourhood takes k hops both ways", () => {
  assert.deepEqual([...neighbourhood(fx, [2], 1)].sort(), [1, 2, 3]);
  assert.deepEqual([...neighbourhood(fx, [2], 2)].sort(), [0, 1, 2, 3, 4]);
});

test("collapsed clusters become one box, edges rewired and deduplicated", () => {
  const { repOf, dot } = buildView(fx, { collapsed: new Set([0]), colorFor });
  assert.deepEqual(repOf, ["n0", "c0", "c0", "n3", "n4"]);
  assert.match(dot, /c0 \[label="mlp\\n2 nodes" shape=box3d/);
  assert.equal(dot.match(/n0->c0/g).length, 1);
  assert.doesNotMatch(dot, /cluster_0/);
  const open = buildView(fx, { colorFor, paint: paintGraph(fx, ROWS).paint });
  assert.match(open.dot, /subgraph cluster_0 \{[\s\S]*subgraph cluster_1 \{[\s\S]*n1 \[/);
  assert.match(open.dot, /label="fc"/); // relative to its parent "mlp"
  assert.match(open.dot, new RegExp(`n2 \\[label="gelu" fillcolor="${colorFor(0.5, "mismatch")}"`));
});

test("a value read by many boxes gets one stub per reader instead of long edges", () => {
  const { proxies, dot } = buildView(fx, { colorFor, broadcast: 2 }); // x feeds linear and add
  assert.deepEqual([...proxies.values()], ["n0", "n0"]);
  assert.match(dot, /p0 \[label="x" shape=cds/);
  assert.match(dot, /p0->n1/);
  assert.match(dot, /p1->n3/);
  assert.doesNotMatch(dot, /n0->/);
});

test("an error path through a stub marks the stub and its edge", async () => {
  const { pathEdges } = await import("./index.js");
  const view = buildView(fx, { colorFor, broadcast: 2 }); // x -> add is drawn as p1 -> n3
  const path = [3, 0]; // add's error starts at x (downstream first)
  assert.deepEqual(pathEdges(view, path), { edgeKeys: ["p1->n3"], stubKeys: ["p1"] });
  const plain = buildView(fx, { colorFor });
  assert.deepEqual(pathEdges(plain, [2, 1]), { edgeKeys: ["n1->n2"], stubKeys: [] });
});

test("a weight is drawn as a cylinder", () => {
  const spec = structuredClone(FX);
  spec.nodes.push({ id: "fx:p_w", name: "p_w", label: "fc.weight", kind: "weight", cluster: 1 });
  spec.edges.push([5, 1]);
  const { dot } = buildView(indexGraph(spec), { colorFor });
  assert.match(dot, /n5 \[label="fc.weight" shape=cylinder/);
  assert.match(dot, /n5->n1/);
});

test("neighbourhood view keeps only the chosen nodes and ignores collapsing", () => {
  const { repOf, dot } = buildView(fx, { collapsed: new Set([0]), only: new Set([1, 2]), colorFor });
  assert.deepEqual(repOf, [null, "n1", "n2", null, null]);
  assert.match(dot, /n1->n2/);
});

test("a big graph opens whole module levels while they fit the budget", () => {
  assert.deepEqual([...defaultCollapsed(fx, 100)], []); // small: everything open
  assert.deepEqual([...defaultCollapsed(fx, 4)], [0]); // 3 top-level nodes + mlp
  // 4 layers of 3 nodes, each layer holding an "attn" module of 2 nodes: 20 boxes in all.
  const layers = [];
  const nodes = [];
  for (let l = 0; l < 4; l++) {
    const c = layers.push({ path: `layers.${l}`, parent: -1 }) - 1;
    const a = layers.push({ path: `layers.${l}.attn`, parent: c }) - 1;
    for (const cluster of [c, a, a, c, c]) nodes.push({ name: `n${nodes.length}`, label: "", kind: "node", cluster });
  }
  const big = indexGraph({ side: "fx", nodes, edges: [], clusters: layers });
  assert.deepEqual([...defaultCollapsed(big, 16)], [1, 3, 5, 7]); // layers open, attn closed: 16 boxes
  assert.deepEqual([...defaultCollapsed(big, 15)], [0, 2, 4, 6]);
});

test("DOT quoting keeps hostile names inert", () => {
  assert.equal(quote('"];evil['), '"\\"];evil["');
  assert.equal(quote("a\\"), '"a\\\\"');
  assert.equal(quote("<img onerror=alert(1)>"), '"<img onerror=alert(1)>"');
  assert.equal(quote("two\nlines"), '"two\\nlines"');
  const evil = indexGraph({ ...FX, nodes: FX.nodes.map((n, i) => (i === 2 ? { ...n, label: '"];x->y;z[' } : n)) });
  assert.match(buildView(evil, { colorFor }).dot, /label="\\"\];x->y;z\["/);
});

test("color scale matches sbs_widget.shared_rules.error_color", () => {
  assert.equal(errorColor(0), "#1a98508c");
  assert.equal(errorColor(1e-4), "#ddd6838c");
  assert.equal(errorColor(1), "#d730278c");
  assert.equal(errorColor(NaN), "#d730278c"); // NaN is the worst error, as in the table's sort
  assert.equal(errorColor(null), "#ffffff00");
  assert.equal(colorFor(null, "error"), "#7b329476");
});

test("a node whose worst record is noise is painted noise; a mismatch beside it wins; errorPath stops at noise", () => {
  const rows = [
    { i: 0, ep_name: "linear", err_abs: 1e-6, status: "ok" },
    { i: 1, ep_name: "linear", err_abs: 3e-4, status: "noise", noise: true },
    { i: 2, ep_name: "gelu", err_abs: 0.2, status: "noise", noise: true },
    { i: 3, ep_name: "gelu", err_abs: 1e-3, status: "mismatch", noise: false },
    { i: 4, ep_name: "add", err_abs: 0.5, status: "mismatch" },
  ];
  const { paint } = paintGraph(fx, rows);
  assert.deepEqual(paint[1], { err: 3e-4, status: "noise" });
  assert.deepEqual(paint[2], { err: 0.2, status: "mismatch" });
  const { dot } = buildView(fx, { colorFor, paint });
  assert.match(dot, new RegExp(`n1 \\[label="linear" fillcolor="${colorFor(3e-4, "noise")}"`));
  assert.equal(colorFor(3e-4, "noise"), "#6baed68c");
  assert.match(dot, new RegExp(`n2 \\[label="gelu" fillcolor="${colorFor(0.2, "mismatch")}"`));
  // rounding is not where an error starts: the path from add goes to gelu (a mismatch), not further to linear
  assert.deepEqual(errorPath(fx, paint, 3), [3, 2]);
});

test("a node's hover text names the user's nodes whose value it holds", () => {
  const g = { nodes: [{ name: "view_3", op: "view", kind: "node", yours: ["reshape", "to_5"] }, { name: "x", kind: "input" }] };
  assert.equal(nodeTitle(g, 0), "view_3\nview\nyour program: reshape, to_5");
  assert.equal(nodeTitle(g, 1), "x");
});

test("a translation cluster (the ONNX nodes of one FX node) is labelled by the FX name, as text, inside its module", async () => {
  const { clusterLabel } = await import("./model.js");
  const evil = '<img src=x onerror=alert(1)>"];x[\\N';
  const spec = {
    ...ONNX,
    clusters: [...ONNX.clusters, { path: `mlp.fc::${evil}`, parent: 1, fx: evil }],
    nodes: ONNX.nodes.map((n, i) => (i === 1 || i === 2 ? { ...n, cluster: 2, links: [evil] } : n)),
  };
  const g = indexGraph(spec);
  assert.equal(clusterLabel(g, 2), evil);
  assert.equal(clusterLabel(g, 1), "fc");
  const inner = { i: 9, kind: "inner", inner_of: "linear", ep_name: "linear::mm", onnx_name: "val_1", onnx_node_name: "node_MatMul_1", err_abs: 0.25, status: "mismatch" };
  const { paint } = paintGraph(g, [...ROWS, inner]);
  assert.equal(paint[1].status, "mismatch", "the inner row paints its own ONNX node");
  assert.equal(paint[2].err, 1e-6, "the FX node's row paints the node of its value");
  assert.equal(nodeOfRow(fx, inner), -1, "no FX node for an inner value");
  const view = buildView(g, { paint, clusterPaint: paintClusters(g, paint), colorFor });
  const open = view.dot.split("\n").findIndex((line) => line.includes("subgraph cluster_2"));
  assert.ok(open > view.dot.split("\n").findIndex((line) => line.includes("subgraph cluster_1")), "nested in its module");
  assert.equal(view.dot.split("\n")[open + 1].trim().split(" style=")[0], `label=${quote(evil)}`);
  assert.ok(view.dot.includes('style="rounded,dashed"'));
  const closed = buildView(g, { collapsed: new Set([2]), paint, clusterPaint: paintClusters(g, paint), colorFor });
  assert.equal(closed.repOf[1], "c2");
  assert.ok(closed.dot.includes(`c2 [label=${quote(`${evil}\n2 nodes`)}`));
});
