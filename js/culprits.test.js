import { test } from "node:test";
import assert from "node:assert/strict";
import { setupDom } from "./test_env.js";

setupDom();
const { createCulpritsPanel } = await import("./culprits.js");

test("culprits panel: hidden when empty, text only, click selects the record", () => {
  const picked = [];
  const panel = createCulpritsPanel({ onSelect: (i) => picked.push(i) });
  panel.update([]);
  assert.equal(panel.el.hidden, true);
  panel.update([
    { i: 7, onnx_node: "node_<b>add</b>", onnx_op_type: "Sub", ep_name: "add", score: 0.9, reason: "Sub gives 0.5 on torch inputs" },
    { i: 3, onnx_node: "n2", onnx_op_type: "Cast", score: 0.6, reason: "rounds" },
  ]);
  assert.equal(panel.el.hidden, false);
  const items = panel.el.querySelectorAll("li");
  assert.equal(items.length, 2);
  assert.ok(items[0].textContent.includes("Sub gives 0.5 on torch inputs"));
  assert.equal(panel.el.querySelector("b"), null, "names are text, never HTML");
  items[1].querySelector("button").click();
  items[0].querySelector("button").click();
  assert.deepEqual(picked, [3, 7]);
});

test("in the view: the culprits trait fills the panel; a click selects the row", async () => {
  const { fakeModel, baseState, makeRow, tick } = await import("./test_env.js");
  const { createView } = await import("./view.js");
  const rows = Array.from({ length: 50 }, (_, k) => makeRow(k));
  const model = fakeModel(baseState(50), { 0: rows });
  const el = document.createElement("div");
  document.body.append(el);
  const dispose = createView({ model, el, mountGraphs: () => () => {} });
  await tick();
  assert.equal(el.querySelector(".sbs-culprits").hidden, true);
  model.set("culprits", [{ i: 42, onnx_node: "n42", onnx_op_type: "Add", ep_name: "node_42", score: 0.8, reason: "Add gives 0.1" }]);
  el.querySelector(".sbs-culprits button").click();
  await tick();
  assert.ok(el.querySelector(".sbs-detail").textContent.includes("node_42"), "the detail shows the culprit");
  dispose();
  assert.equal(model.listeners(), 0);
});
