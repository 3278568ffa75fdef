import { test } from "node:test";
import assert from "node:assert/strict";
import { setupDom, fakeModel, baseState, makeRow, tick, COLUMNS } from "./test_env.js";

setupDom();
const { createSetsPanel, describeSets, inputText, isSpread, spreadColumns } = await import("./sets.js");
const { tableColumns } = await import("./table.js");
const { filterIndex, sortIndex } = await import("./rows.js");
const { SPREAD_FIELDS, SPREAD_PREFIX } = await import("./spec.gen.js");
const { createView } = await import("./view.js");
const { createCulpritsPanel } = await import("./culprits.js");

const EVIL = '<img src=x onerror="globalThis.pwned=1">';
const SPREAD = SPREAD_FIELDS.map((f) => SPREAD_PREFIX + f);
// pair k: beyond on inputs 2 and 3 of 4 when k is odd (input-dependent), worst input 3 (label hostile)
const spreadOf = (k) => [k % 2 ? 0.8 : 1e-7, k % 2 ? 0.3 : 0, k % 2 ? 2 : 0, 4, k % 2 ? 3 : 0, k % 2 ? EVIL : "short", k % 2 === 1];
const STATE = { status: "done", message: "", n_inputs: 4, labels: ["((T1s2x4x16,),{})", "b", "c", EVIL], errors: [null, null, null, null], n_input_dependent: 3, atol: 1e-4, rtol: 1e-4 };

function mount(n, state = STATE) {
  const rows = Array.from({ length: n }, (_, k) => [...makeRow(k, k % 2 ? { status: "mismatch", within_tolerance: false, err_abs: 0.8 } : {}), ...spreadOf(k)]);
  const model = fakeModel({ ...baseState(n), columns: [...COLUMNS, ...SPREAD], input_spread: state, runs_meta: [{ id: 0, status: "done", reset_names: [], atol: 1e-4, rtol: 1e-4, n_records: n, input: null }] }, { 0: rows });
  const el = document.createElement("div");
  document.body.append(el);
  const dispose = createView({ model, el });
  return { model, el, dispose };
}
const shownRows = (el) => [...el.querySelectorAll(".sbs-row")].filter((r) => r.style.display !== "none");

test("the spread columns: declared by the model's columns, after err_abs, numeric where numbers", () => {
  assert.deepEqual(SPREAD, ["spread:err_abs_max", "spread:err_abs_median", "spread:n_beyond", "spread:n_inputs", "spread:worst_input", "spread:worst_label", "spread:input_dependent"]);
  assert.ok(SPREAD.every(isSpread) && !isSpread("err_abs") && !isSpread("metric:x"));
  const cols = spreadColumns(SPREAD).map((c) => c.key);
  assert.deepEqual(cols, ["spread:err_abs_max", "spread:err_abs_median", "spread:n_beyond", "spread:worst_input", "spread:input_dependent"]);
  const keys = tableColumns([...COLUMNS, ...SPREAD]).map((c) => c.key);
  assert.equal(keys.indexOf("spread:err_abs_max"), keys.indexOf("err_abs") + 1);
  assert.equal(tableColumns(COLUMNS).some((c) => isSpread(c.key)), false, "a plain widget has no spread column");
  const rows = [{ "spread:err_abs_max": 0.5 }, { "spread:err_abs_max": NaN }, { "spread:err_abs_max": 1e-3 }];
  assert.deepEqual([...sortIndex(Uint32Array.from([0, 1, 2]), rows, "spread:err_abs_max", -1)], [1, 0, 2]);
});

test("inputs as text: index and label, a hostile label stays text", () => {
  assert.equal(inputText(3, "long"), "#3 long");
  assert.equal(inputText(null, "x"), "");
  const d = describeSets(STATE);
  assert.equal(d.summary, "4 input sets · 3 input-dependent pairs");
  assert.equal(d.inputs[3].text, `#3 ${EVIL}`);
  assert.equal(describeSets({}).state, "");
  assert.equal(describeSets({ status: "error", message: "boom" }).summary, "failed: boom");
});

test("filter 'input-dependent only' keeps the rows the spread marks", () => {
  const rows = [{ "spread:input_dependent": true }, { "spread:input_dependent": false }, {}];
  assert.deepEqual([...filterIndex(rows, { inputDependent: true })], [0]);
  assert.deepEqual([...filterIndex(rows, {})], [0, 1, 2]);
});

test("the view: spread cells as text, input-dependent rows marked, the filter, an input asked for", async () => {
  const { model, el, dispose } = mount(6);
  await tick();
  const root = el.querySelector(".sbs-root");
  const panel = el.querySelector(".sbs-sets");
  assert.equal(panel.hidden, false);
  assert.ok(panel.textContent.includes("4 input sets · 3 input-dependent pairs"));
  const head = [...el.querySelectorAll(".sbs-head > div")].map((d) => d.textContent);
  assert.ok(["max err", "median err", "beyond", "worst input", "input-dep."].every((x) => head.includes(x)));
  const row1 = shownRows(el).find((r) => r.dataset.k === "1");
  assert.equal(row1.dataset.inputDependent, "true");
  assert.equal(shownRows(el).find((r) => r.dataset.k === "0").dataset.inputDependent, undefined);
  const cells = [...row1.children].map((c) => c.textContent);
  assert.ok(cells.includes("2/4") && cells.includes(`#3 ${EVIL}`) && cells.includes("◆ yes"));
  assert.equal(el.querySelector("img"), null);
  const only = [...el.querySelectorAll("label")].find((l) => l.textContent.includes("input-dependent only")).querySelector("input");
  only.checked = true;
  only.dispatchEvent(new window.Event("change"));
  assert.equal(root.dataset.shown, "3");
  // the selected row's worst input, one click; the selector too
  row1.click();
  const worst = el.querySelector(".sbs-sets-worst");
  assert.equal(worst.hidden, false);
  assert.equal(worst.textContent, "show worst input #3");
  worst.click();
  assert.deepEqual(model.sent.at(-1), { type: "input", input: 3 });
  const select = el.querySelector('select[aria-label="input set"]');
  assert.equal(select.options.length, 5);
  select.value = "0";
  select.dispatchEvent(new window.Event("change"));
  assert.deepEqual(model.sent.at(-1), { type: "input", input: 0 });
  select.value = "";
  select.dispatchEvent(new window.Event("change"));
  assert.deepEqual(model.sent.at(-1), { type: "input", input: null });
  assert.equal(globalThis.pwned, undefined);
  dispose();
});

test("a widget without input sets shows no panel", async () => {
  const model = fakeModel(baseState(2), { 0: [makeRow(0), makeRow(1)] });
  const el = document.createElement("div");
  document.body.append(el);
  const dispose = createView({ model, el });
  await tick();
  assert.equal(el.querySelector(".sbs-sets").hidden, true);
  dispose();
});

test("grouped culprits say how many inputs name them, as text", () => {
  const panel = createCulpritsPanel({ onSelect: () => {} });
  panel.update([{ i: 4, onnx_node: EVIL, onnx_op_type: "Add", score: 0.9, reason: "r", count: 2, n_inputs: 4, inputs: [2, 3] }]);
  const li = panel.el.querySelector("li");
  assert.ok(li.textContent.includes("named on 2 of 4 inputs"));
  assert.equal(li.dataset.count, "2");
  assert.equal(panel.el.querySelector("img"), null);
});

test("the panel is disabled in a static page", () => {
  const panel = createSetsPanel({ onInput: () => {}, onFilter: () => {} });
  panel.update(STATE, { live: false, row: { "spread:worst_input": 2 } });
  assert.equal(panel.el.querySelector("select").disabled, true);
  assert.equal(panel.el.querySelector(".sbs-sets-worst").hidden, true);
});
