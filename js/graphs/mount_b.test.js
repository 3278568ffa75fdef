// The third graph pane of two ONNX models (SbsWidget.from_models): b's graph (model "onnx_b_dot") painted by
// the rows' b_err_abs and b_status, its nodes linked to the rows through b_node_name / b_name; without a graph
// of b the pane stays hidden. A fake anywidget model in jsdom, the real Graphviz (main-thread fallback).
import assert from "node:assert/strict";
import { test } from "node:test";
import { JSDOM } from "jsdom";

const dom = new JSDOM("<!doctype html><div id=host></div>", { pretendToBeVisual: true });
for (const k of ["document", "DOMParser", "requestAnimationFrame", "HTMLElement"]) globalThis[k] = dom.window[k];
const { mountGraphs } = await import("./index.js");
const { SPEC_MARKER } = await import("./model.js");

const spec = (side, names, extra = {}) => ({
  side,
  clusters: [],
  nodes: names.map((name) => ({ id: `${side}:${name}`, name, label: name, kind: "node", cluster: -1, outputs: [name],
    links: [], ...(extra[name] || {}) })),
  edges: names.slice(1).map((_, i) => [i, i + 1]),
});
const dotOf = (s) => `${SPEC_MARKER}${JSON.stringify(s)}\ndigraph {}`;
const FX = spec("fx", ["x", "conv", "relu"]);
const ONNX = spec("onnx", ["node_x", "node_conv", "node_relu"], { node_conv: { links: ["conv"] }, node_relu: { links: ["relu"] } });
// b: a's Conv quantized (DequantizeLinear before it), a hostile name drawn as text
const HOSTILE = "q<img src=x onerror=alert(1)>";
const B = spec("b", ["b_x", HOSTILE, "b_conv", "b_relu"]);
const ROWS = [
  { i: 0, ep_name: "conv", onnx_name: "conv", onnx_node_name: "node_conv", err_abs: 0, status: "ok",
    b_name: "b_conv_out", b_node_name: "b_conv", b_err_abs: 0.5, b_status: "departs" },
  { i: 1, ep_name: "relu", onnx_name: "relu", onnx_node_name: "node_relu", err_abs: 0, status: "ok",
    b_name: "b_relu", b_node_name: null, b_err_abs: 1e-3, b_status: "rounding" },
  { i: 2, ep_name: "x", onnx_name: "x", onnx_node_name: "node_x", err_abs: 0, status: "ok", b_name: null, b_comment: "fused into b_conv" },
];

function fakeCtx(data) {
  const selected = [];
  const selectCbs = new Set();
  const el = document.createElement("div");
  document.body.append(el);
  return {
    el, selected,
    tableSelect: (i) => { for (const cb of selectCbs) cb(i); },
    ctx: {
      model: { get: (k) => data[k], on() {}, off() {} },
      el,
      getRows: () => ROWS,
      onRows: () => () => {},
      colorFor: (err, status) => (status === "mismatch" ? "red" : status === "noise" ? "blue" : err === null ? "white" : "green"),
      select: (i) => selected.push(i),
      onSelect: (cb) => (selectCbs.add(cb), () => selectCbs.delete(cb)),
    },
  };
}
const until = async (fn, ms = 20000) => {
  const end = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > end) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 20));
  }
};
const box = (el, id) => el.querySelector(`g.node[data-id="${CSS.escape(id)}"]`);
globalThis.CSS = globalThis.CSS ?? { escape: (s) => s.replace(/["\\]/g, "\\$&") };
const fill = (el, id) => box(el, id).querySelector("polygon, path, ellipse").getAttribute("fill");
const frame = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));

test("two models: b's graph is a third pane, painted by b's verdicts, linked to the rows both ways", async () => {
  const f = fakeCtx({ fx_dot: dotOf(FX), onnx_dot: dotOf(ONNX), onnx_b_dot: dotOf(B) });
  const dispose = mountGraphs(f.ctx);
  await until(() => f.el.querySelectorAll(".sbsg-pane[data-renders]").length === 3);
  const panes = [...f.el.querySelectorAll(".sbsg-pane")];
  assert.equal(panes[2].hidden, false);
  assert.equal(panes[2].querySelector(".sbsg-pane-head").textContent, "ONNX b (transformed)");
  assert.ok(f.el.querySelector(".sbsg-panes").classList.contains("sbsg-three"));
  assert.equal(fill(f.el, "b:b_conv"), "red"); // departs: painted as a mismatch
  assert.equal(fill(f.el, "b:b_relu"), "blue"); // rounding: as noise (found by its value name)
  assert.equal(fill(f.el, "onnx:node_conv"), "green"); // a's own verdict, unchanged
  // the hostile name is text: no element made from it
  assert.equal(f.el.querySelector("img"), null);
  assert.ok(box(f.el, `b:${HOSTILE}`).textContent.includes(HOSTILE));

  // a row selected in the table: the node of b paired with it lights up, with a's and FX's
  f.tableSelect(0);
  await frame();
  for (const id of ["b:b_conv", "onnx:node_conv", "fx:conv"]) assert.ok(box(f.el, id).classList.contains("sbsg-sel"), id);
  assert.ok(!box(f.el, "b:b_relu").classList.contains("sbsg-sel"));

  // a click on a node of b selects its row and lights up a's twin
  for (const type of ["pointerdown", "pointerup"])
    box(f.el, "b:b_relu").dispatchEvent(new dom.window.MouseEvent(type, { bubbles: true, button: 0, clientX: 5, clientY: 5 }));
  assert.deepEqual(f.selected, [1]);
  assert.ok(box(f.el, "onnx:node_relu").classList.contains("sbsg-sel"));
  assert.ok(!box(f.el, "b:b_conv").classList.contains("sbsg-sel"));
  dispose();
});

test("one ONNX model: no pane for b", async () => {
  const f = fakeCtx({ fx_dot: dotOf(FX), onnx_dot: dotOf(ONNX) });
  const dispose = mountGraphs(f.ctx);
  await until(() => f.el.querySelectorAll(".sbsg-pane[data-renders]").length === 2);
  const panes = [...f.el.querySelectorAll(".sbsg-pane")];
  assert.equal(panes.length, 3);
  assert.equal(panes[2].hidden, true);
  assert.ok(!f.el.querySelector(".sbsg-panes").classList.contains("sbsg-three"));
  dispose();
});
