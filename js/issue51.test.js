// Issue 51, the view's small defects: the "#" column past 999, exact name search, no reset pair as the
// worst, ANSI colours in messages, "Check as deployed" without a model, a one-line toolbar, and a
// progress that follows the slower side and leaves the preparation out of its estimate.
import { test } from "node:test";
import assert from "node:assert/strict";
import { setupDom, fakeModel, baseState, makeRow, tick } from "./test_env.js";

setupDom();
const { createView } = await import("./view.js");
const { createTable, indexWidth } = await import("./table.js");
const { filterIndex, parseSearch } = await import("./rows.js");
const { createProgress, doneFraction } = await import("./progress.js");
const { describeDeployed } = await import("./deployed.js");
const { messageText, stripAnsi } = await import("./format.js");
const { CSS } = await import("./style.js");

function mount(state, rows) {
  const model = fakeModel(state, { 0: rows });
  const el = document.createElement("div");
  document.body.append(el);
  const dispose = createView({ model, el, mountGraphs: () => () => {} });
  return { model, el, dispose };
}
const colWidth = (tableEl, n) => tableEl.style.getPropertyValue("--sbs-cols").split(/ (?![^(]*\))/)[n];

test("#1 the '#' column widens with the row count: 1,000 and 12,345 are not cut", () => {
  assert.equal(indexWidth(10), "44px");
  assert.equal(indexWidth(1000), "44px"); // last index 999
  assert.equal(indexWidth(1001), "calc(5ch + 14px)"); // "1,000"
  assert.equal(indexWidth(12346), "calc(6ch + 14px)"); // "12,345"
  const t = createTable({ onSort() {}, onSelect() {}, onToggle() {}, onExpand() {}, isTicked: () => false, colorOf: () => "", canTick: () => true });
  const rows = Array.from({ length: 12346 }, (_, i) => ({ i, status: "ok" }));
  t.set(rows, Uint32Array.from([12345]), { key: null, dir: 1 });
  assert.equal(colWidth(t.el, 1), "calc(6ch + 14px)");
  const cell = t.el.querySelector(".sbs-row > div.sbs-num");
  assert.equal(cell.textContent, "12,345");
  t.set(rows.slice(0, 10), Uint32Array.from([0]), { key: null, dir: 1 });
  assert.equal(colWidth(t.el, 1), "44px");
  t.destroy();
});

test("#2 search: \"mul_3\" in quotes is an exact name, mul_3 alone still a substring", () => {
  const rows = [
    { ep_name: "MatMul_3xx", onnx_name: "val_1", onnx_op_type: "MatMul" },
    { ep_name: "mul_3", onnx_name: "val_2", onnx_op_type: "Mul" },
    { ep_name: "mul_30", onnx_name: "mul_3", onnx_op_type: "Mul" },
    { ep_name: "add", onnx_name: "val_4", onnx_op_type: "Add" },
  ];
  assert.deepEqual([...filterIndex(rows, { text: "mul_3" })], [0, 1, 2]);
  assert.deepEqual([...filterIndex(rows, { text: '"mul_3"' })], [1, 2]);
  assert.deepEqual([...filterIndex(rows, { text: '"MUL_3" mul' })], [1, 2]);
  assert.deepEqual([...filterIndex(rows, { text: '"mul_3" "mul_30"' })], [2]);
  assert.deepEqual([...filterIndex(rows, { text: '"mul_3' })], [0, 1, 2], "a quote not closed yet: a plain word");
  assert.deepEqual(parseSearch('a "b c" d'), [{ text: "a", exact: false }, { text: "b c", exact: true }, { text: "d", exact: false }]);
});

test("#2 the search box says how to match exactly", () => {
  const { el, dispose } = mount(baseState(1), [makeRow(0)]);
  const search = el.querySelector('input[aria-label="filter"]');
  assert.match(search.placeholder, /"x": exact/);
  assert.match(search.title, /"mul_3" in double quotes/);
  dispose();
});

test("#3 the worst chip never names a reset pair", async () => {
  const state = baseState(3);
  state.progress = { ...state.progress, counts: { ok: 2, reset: 1 }, worst: 0.5, worst_name: "node_1", worst_i: 1 };
  const rows = [makeRow(0), makeRow(1, { status: "reset", err_abs: 0.5 }), makeRow(2)];
  const { el, model, dispose } = mount(state, rows);
  await tick();
  const worst = () => [...el.querySelectorAll(".sbs-bar button")].find((b) => b.title.startsWith("select the record"));
  assert.equal(worst().hidden, true, "the worst pair is the reset one: no chip");
  model.set("progress", { ...state.progress, worst: 1e-5, worst_name: "node_2", worst_i: 2 });
  assert.equal(worst().hidden, false);
  assert.match(worst().textContent, /worst 1\.00e-5 · node_2/);
  dispose();
});

test("#4 ANSI colour sequences are stripped from messages, other hidden characters stay escaped", () => {
  assert.equal(stripAnsi("\x1b[31mboom\x1b[0m \x1b[1;32mok\x1b[m\x9b2K"), "boom ok");
  assert.equal(messageText("\x1b[31mError\x1b[0m: bad\u202e\nline 2\x00"), "Error: bad\\u202e\nline 2\\x00");
  const p = createProgress({ onWorst() {} });
  p.update("error", { n_rows: 0, finished: true }, "\x1b[31mExportError\x1b[0m: torch.export failed\x07");
  assert.equal(p.message.hidden, false);
  assert.equal(p.message.textContent, "ExportError: torch.export failed\\x07");
  assert.equal(describeDeployed({ status: "error", message: "\x1b[1mInputError\x1b[22m" }).message, "InputError");
});

test("#5 'Check as deployed' is disabled, with the reason, after a run that failed before any record", () => {
  const state = { ...baseState(0), status: "error", message: "ExportError: no",
    progress: { run: 0, n_rows: 0, fx_done: 0, fx_total: 0, finished: true },
    runs_meta: [{ id: 0, status: "error", reset_names: [], atol: 1e-4, rtol: 1e-4, n_records: 0 }] };
  const { el, model, dispose } = mount(state, [0, 1, 2, 3].map((k) => makeRow(k))); // rows the next run will have
  const button = el.querySelector("button.sbs-check-deployed");
  assert.equal(button.hidden, false);
  assert.equal(button.disabled, true);
  assert.match(button.title, /failed before any record/);
  model.set("progress", { run: 0, n_rows: 4, fx_done: 4, fx_total: 4, finished: true });
  model.set("status", "done");
  assert.equal(button.disabled, false);
  assert.match(button.title, /as users deploy it/);
  model.set("status", "error"); // failed later on: there is a model, with records
  assert.equal(button.disabled, false);
  dispose();
});

test("#6 a long title does not wrap the toolbar: one line, ellipsis, the full title on hover", () => {
  const long = "a very long title ".repeat(20).trim();
  const { el, model, dispose } = mount({ ...baseState(1), title: long }, [makeRow(0)]);
  const title = el.querySelector(".sbs-title");
  assert.equal(title.title, long);
  assert.ok(title.parentElement.classList.contains("sbs-toolbar"));
  assert.match(CSS, /\.sbs-bar\.sbs-toolbar \{[^}]*flex-wrap: nowrap/);
  assert.match(CSS, /\.sbs-toolbar > \.sbs-title \{[^}]*text-overflow: ellipsis/);
  model.set("title", "short");
  assert.equal(title.title, "short");
  dispose();
});

test("#7 the percentage follows the slower side; 'preparing' before any record; no estimate from the preparation", () => {
  assert.equal(doneFraction({ fx_done: 154, fx_total: 155, onnx_done: 1, onnx_total: 155 }), 1 / 155);
  assert.equal(doneFraction({ fx_done: 5, fx_total: 10 }), 0.5);
  assert.equal(doneFraction({}), 0);
  const p = createProgress({ onWorst() {} });
  const [, meter, state, text, current] = p.main;
  p.update("running", { run: 0, n_rows: 0, fx_done: 0, fx_total: 100, onnx_done: 0, onnx_total: 200, elapsed: 30, eta: 999, current: "exporting with torch.export" });
  assert.equal(state.textContent, "preparing");
  assert.equal(current.textContent, "exporting with torch.export");
  assert.doesNotMatch(text.textContent, /left/);
  p.update("running", { run: 0, n_rows: 160, fx_done: 99, fx_total: 100, onnx_done: 0, onnx_total: 200, elapsed: 40, eta: 999 });
  assert.equal(state.textContent, "0%", "FX 99/100 but ONNX 0/200: 0%, not 99%");
  assert.equal(meter.getAttribute("aria-valuenow"), "0");
  assert.doesNotMatch(text.textContent, /left/, "no pace yet");
  // 10 s after the first record, a tenth more done: 10 s per tenth, 9 tenths to go; the 30 s of
  // preparation do not count
  p.update("running", { run: 0, n_rows: 300, fx_done: 100, fx_total: 100, onnx_done: 20, onnx_total: 200, elapsed: 50, eta: 999 });
  assert.equal(state.textContent, "10%");
  assert.match(text.textContent, /~1 min 30 s left/);
  assert.match(text.textContent, /ONNX 20\/200/);
  p.update("running", { run: 0, n_rows: 300, fx_done: 100, fx_total: 100, onnx_done: 20, onnx_total: 200, elapsed: 50, eta: 999 });
  assert.match(text.textContent, /~1 min 30 s left/, "the same state again: the same estimate");
  p.update("done", { run: 0, n_rows: 400, fx_done: 100, fx_total: 100, onnx_done: 200, onnx_total: 200, elapsed: 60, finished: true });
  assert.equal(state.textContent, "100%");
  assert.doesNotMatch(text.textContent, /left/);
});
