// Two ONNX models (SbsWidget.from_models): b's columns in the table, the "b departs" filter, b's culprits,
// with the rows' b_* fields as the kernel sends them (record fields, after the others in ROW_COLUMNS order).
import { test } from "node:test";
import assert from "node:assert/strict";
import { setupDom, fakeModel, baseState, makeRow, tick, COLUMNS } from "./test_env.js";

setupDom();
const { createView } = await import("./view.js");
const { filterIndex } = await import("./rows.js");
const { tableColumns } = await import("./table.js");
const { bVerdictText, describeModels } = await import("./models.js");
const { createCulpritsPanel } = await import("./culprits.js");

const EVIL = "relu_3<img src=x onerror=globalThis.pwned=1>";
const B_KEYS = ["b_name", "b_node_name", "b_op_type", "b_err_abs", "b_err_local", "b_status", "b_comment"];
const STATE = { status: "done", message: "", n_records: 4, n_paired: 3, counts: { rounding: 1, departs: 1, inherits: 1 },
  n_departs: 2, n_culprits: 1 };
const B_ROWS = [
  { b_name: "x_q", b_node_name: "QuantizeLinear_0", b_op_type: "QuantizeLinear", b_err_abs: 1e-3, b_err_local: 1e-3, b_status: "rounding", b_comment: "" },
  { b_name: EVIL, b_node_name: "conv_dq", b_op_type: "DequantizeLinear", b_err_abs: 0.9, b_err_local: 2.2, b_status: "departs", b_comment: "quantized: 2.2" },
  { b_name: "relu_4", b_node_name: "relu_4", b_op_type: "Relu", b_err_abs: 0.5, b_err_local: 1e-4, b_status: "inherits", b_comment: "" },
  { b_name: null, b_node_name: null, b_op_type: null, b_err_abs: null, b_err_local: null, b_status: null, b_comment: "fused into <b>Gemm_1</b>" },
];

function mount(state = STATE) {
  const rows = B_ROWS.map((b, k) => [...makeRow(k), ...B_KEYS.map((c) => b[c])]);
  const model = fakeModel({ ...baseState(rows.length), columns: [...COLUMNS, ...B_KEYS], models_b: state }, { 0: rows });
  const el = document.createElement("div");
  document.body.append(el);
  return { model, el, dispose: createView({ model, el }) };
}
const shownRows = (el) => [...el.querySelectorAll(".sbs-row")].filter((r) => r.style.display !== "none");

test("b's columns come after a's errors, only for two models", () => {
  const keys = tableColumns([], { b: true }).map((c) => c.key);
  assert.deepEqual(keys.slice(keys.indexOf("min_atol") + 1, keys.indexOf("module")), ["b_name", "b_err_abs", "b_err_local", "b_status"]);
  assert.ok(!tableColumns([]).some((c) => c.key.startsWith("b_")));
});

test("the b verdict: the status, else why the value has no twin in b; the filter keeps departs and inherits", () => {
  assert.equal(bVerdictText(B_ROWS[1]), "departs");
  assert.equal(bVerdictText(B_ROWS[3]), "no twin: fused into <b>Gemm_1</b>");
  assert.deepEqual([...filterIndex(B_ROWS, { bDeparts: true })], [1, 2]);
  assert.deepEqual([...filterIndex(B_ROWS, {})], [0, 1, 2, 3]);
  assert.deepEqual([...filterIndex(B_ROWS, { text: "conv_dq" })], [1]); // b's names are searched too
  assert.equal(describeModels({}).state, "");
  assert.equal(describeModels({ status: "error", message: "boom" }).summary, "failed: boom");
  assert.ok(describeModels(STATE).summary.startsWith("3 of 4 rows paired with b · 2 where b departs · 1 culprit in b"));
  // records of two models computed elsewhere (the CLI's offline page): no culprit count to give
  assert.equal(describeModels({ ...STATE, n_culprits: null, counts: {} }).summary, "3 of 4 rows paired with b · 2 where b departs");
});

test("the view: b's columns as text, the 'b departs' filter narrows the rows, sorting by b err_abs", async () => {
  const { el, dispose } = mount();
  await tick();
  const root = el.querySelector(".sbs-root");
  const panel = el.querySelector(".sbs-models");
  assert.equal(panel.hidden, false);
  const head = [...el.querySelectorAll(".sbs-head > div")].map((d) => d.textContent);
  assert.ok(["b name", "b err_abs", "b err_local", "b verdict"].every((x) => head.includes(x)), head);
  const row1 = shownRows(el).find((r) => r.dataset.k === "1");
  assert.equal(row1.dataset.bStatus, "departs");
  assert.ok([...row1.children].some((c) => c.textContent === EVIL));
  const row3 = shownRows(el).find((r) => r.dataset.k === "3");
  assert.equal(row3.dataset.bTwin, "none");
  assert.ok([...row3.children].some((c) => c.textContent === "no twin: fused into <b>Gemm_1</b>"));
  assert.equal(el.querySelector("img"), null);
  assert.equal(el.querySelector(".sbs-row b"), null);
  assert.equal(root.dataset.shown, "4");
  row1.click(); // the detail: b's side of the row, as text
  const detail = el.querySelector(".sbs-detail").textContent;
  assert.ok(detail.includes("ONNX b (transformed)") && detail.includes("conv_dq") && detail.includes("quantized: 2.2"), detail);
  const only = panel.querySelector("input");
  only.checked = true;
  only.dispatchEvent(new window.Event("change"));
  assert.equal(root.dataset.shown, "2");
  assert.deepEqual(shownRows(el).map((r) => r.dataset.k).sort(), ["1", "2"]);
  el.querySelector('.sbs-head > div[data-key="b_err_abs"]').click(); // worst first
  assert.deepEqual(shownRows(el).sort((a, b) => parseFloat(a.style.transform.slice(11)) - parseFloat(b.style.transform.slice(11))).map((r) => r.dataset.k), ["1", "2"]);
  assert.ok([...el.querySelectorAll('select[aria-label="error column"] option')].some((o) => o.value === "b_err_abs"));
  assert.equal(globalThis.pwned, undefined);
  dispose();
});

test("a widget of one ONNX model shows neither the panel nor b's columns", async () => {
  const model = fakeModel(baseState(2), { 0: [makeRow(0), makeRow(1)] });
  const el = document.createElement("div");
  document.body.append(el);
  const dispose = createView({ model, el });
  await tick();
  assert.equal(el.querySelector(".sbs-models").hidden, true);
  assert.ok(![...el.querySelectorAll(".sbs-head > div")].some((d) => d.textContent === "b verdict"));
  dispose();
});

test("b's culprits: the node of b, its op, the transformation and err_local, as text; a click selects the row", () => {
  const picked = [];
  const panel = createCulpritsPanel({ onSelect: (i) => picked.push(i) });
  panel.update([{ side: "b", i: 1, onnx_node: EVIL, op_type: "DequantizeLinear", b_value: "relu_3", a_value: "relu_3",
    err_local: 2.2, excess: 8.8, precision: "quantized", transformation: "quantized: Conv, DequantizeLinear" }]);
  const li = panel.el.querySelector("li");
  assert.equal(li.dataset.side, "b");
  assert.equal(li.dataset.node, EVIL);
  assert.ok(li.textContent.includes(`DequantizeLinear ${EVIL}`) && li.textContent.includes("err_local 2.2"));
  assert.ok(li.textContent.includes("quantized: Conv, DequantizeLinear"));
  assert.ok(panel.el.querySelector("summary").textContent.startsWith("Culprits in b"));
  assert.equal(panel.el.querySelector("img"), null);
  li.querySelector("button").click();
  assert.deepEqual(picked, [1]);
});
