// mountGraphs against a fake anywidget model in jsdom, with the real Graphviz (main-thread fallback):
// painting as rows stream in, click -> counterpart + table selection, table selection -> highlight.
import assert from "node:assert/strict";
import { test } from "node:test";
import { JSDOM } from "jsdom";
import { NOT_COMPARED } from "../rules.js";

const dom = new JSDOM("<!doctype html><div id=host></div>", { pretendToBeVisual: true });
for (const k of ["document", "DOMParser", "requestAnimationFrame", "HTMLElement"]) globalThis[k] = dom.window[k];
const { mountGraphs } = await import("./index.js");
const { SPEC_MARKER } = await import("./model.js");

const spec = (side, names, extra = {}) => ({
  side,
  clusters: [{ path: "block", parent: -1 }],
  nodes: names.map((name, i) => ({ id: `${side}:${name}`, name, label: name, kind: "node", cluster: i === 1 ? 0 : -1,
    outputs: [name], links: [], ...(extra[name] || {}) })),
  edges: names.slice(1).map((_, i) => [i, i + 1]),
});
const FX = spec("fx", ["x", "linear", "relu"]);
const ONNX = spec("onnx", ["node_x", "node_MatMul", "node_linear", "node_relu"], {
  node_MatMul: { links: ["linear"] }, node_linear: { links: ["linear"] }, node_relu: { links: ["relu"] },
});
const dotOf = (s) => `${SPEC_MARKER}${JSON.stringify(s)}\ndigraph {}`;

function fakeCtx() {
  const rows = [];
  const rowCbs = new Set();
  const selectCbs = new Set();
  const selected = [];
  const data = { fx_dot: dotOf(FX), onnx_dot: dotOf(ONNX) };
  const el = document.createElement("div");
  document.body.append(el);
  return {
    rows, selected, el,
    push(row) {
      rows.push(row);
      for (const cb of rowCbs) cb();
    },
    tableSelect(i) {
      for (const cb of selectCbs) cb(i);
    },
    ctx: {
      model: { get: (k) => data[k], on() {}, off() {} },
      el,
      getRows: () => rows,
      onRows: (cb) => (rowCbs.add(cb), () => rowCbs.delete(cb)),
      colorFor: (err, status) => (status === "mismatch" ? "red" : err === null ? "white" : "green"),
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
const box = (el, id) => el.querySelector(`g.node[data-id="${id}"]`);
const fill = (el, id) => box(el, id).querySelector("polygon, path, ellipse").getAttribute("fill");
const frame = () => new Promise((r) => requestAnimationFrame(() => setTimeout(r, 0)));

test("paints live, links both ways, selects the table row", async () => {
  const f = fakeCtx();
  const dispose = mountGraphs(f.ctx);
  await until(() => f.el.querySelectorAll(".sbsg-pane[data-renders]").length === 2);
  assert.equal(fill(f.el, "fx:linear"), NOT_COMPARED); // nothing compared yet

  // Rows stream in: colors change without a new layout.
  const renders = f.el.querySelector(".sbsg-pane").dataset.renders;
  f.push({ i: 0, ep_name: "linear", onnx_name: "linear", onnx_node_name: "node_linear", err_abs: 0.5, status: "mismatch" });
  f.push({ i: 1, ep_name: "relu", onnx_name: "relu", onnx_node_name: "node_relu", err_abs: 0, status: "ok" });
  await frame();
  assert.equal(fill(f.el, "fx:linear"), "red");
  assert.equal(fill(f.el, "onnx:node_linear"), "red");
  assert.equal(fill(f.el, "onnx:node_relu"), "green");
  assert.equal(f.el.querySelector(".sbsg-pane").dataset.renders, renders);

  // Click an FX node: both ONNX nodes made from it light up, the table selects its row.
  const click = (g) => {
    for (const type of ["pointerdown", "pointerup"])
      g.dispatchEvent(new dom.window.MouseEvent(type, { bubbles: true, button: 0, clientX: 5, clientY: 5 }));
  };
  click(box(f.el, "fx:linear"));
  assert.deepEqual(f.selected, [0]);
  for (const id of ["fx:linear", "onnx:node_linear", "onnx:node_MatMul"]) assert.ok(box(f.el, id).classList.contains("sbsg-sel"), id);
  assert.ok(!box(f.el, "onnx:node_relu").classList.contains("sbsg-sel"));

  // The table selects another row: the graphs follow.
  f.tableSelect(1);
  await frame();
  assert.ok(box(f.el, "fx:relu").classList.contains("sbsg-sel"));
  assert.ok(box(f.el, "onnx:node_relu").classList.contains("sbsg-sel"));
  assert.ok(!box(f.el, "fx:linear").classList.contains("sbsg-sel"));

  // Hovering an ONNX node marks its FX twin.
  box(f.el, "onnx:node_MatMul").dispatchEvent(new dom.window.MouseEvent("pointerover", { bubbles: true }));
  assert.ok(box(f.el, "fx:linear").classList.contains("sbsg-hover"));

  // Hovering a closed module marks the same module on the other side.
  box(f.el, "fx:linear").dispatchEvent(new dom.window.MouseEvent("pointerover", { bubbles: true }));
  const title = [...f.el.querySelectorAll(".sbsg-pane:first-child g.cluster > text")].find((t) => t.textContent === "block");
  for (const type of ["pointerdown", "pointerup"])
    title.dispatchEvent(new dom.window.MouseEvent(type, { bubbles: true, button: 0, clientX: 5, clientY: 5 }));
  await until(() => box(f.el, "cluster:block") && f.el.querySelectorAll('g.node[data-id="cluster:block"]').length === 2);
  f.el.querySelector('.sbsg-pane:first-child g.node[data-id="cluster:block"]')
    .dispatchEvent(new dom.window.MouseEvent("pointerover", { bubbles: true }));
  assert.ok(f.el.querySelector('.sbsg-pane:nth-child(2) g.node[data-id="cluster:block"]').classList.contains("sbsg-hover"));

  dispose();
  assert.equal(f.el.querySelector(".sbsg"), null);
});
