// Inner rows (kind "inner") nested under their FX node's row: the index computation of js/rows.js,
// then the table in jsdom (disclosure, indent, keyboard, selection, CSV, view_rows).
import { test } from "node:test";
import assert from "node:assert/strict";
import { Nesting, SortCache, filterIndex, nestIndex } from "./rows.js";
import { insideText, resetName, resettable } from "./table.js";
import { setupDom, fakeModel, baseState, makeRow, tick, COLUMNS } from "./test_env.js";

// A run as the engine streams it: inner rows in ONNX node order, before their FX node's own row.
//  0 x (input) | 1-3 inside "attn" | 4 attn | 5 inside "lin" | 6 lin | 7 inside "gone" (no row for it) | 8 output
function run() {
  return [
    { kind: "input", ep_name: "x", onnx_name: "x", err_abs: 0, status: "ok" },
    { kind: "inner", inner_of: "attn", inner_op: "aten.matmul.default", ep_name: "attn::matmul", onnx_name: "v1", onnx_op_type: "MatMul", err_abs: 1e-6, status: "ok" },
    { kind: "inner", inner_of: "attn", inner_op: "aten._softmax.default", ep_name: "attn::_softmax", onnx_name: "v2", onnx_op_type: "Softmax", err_abs: 0.3, status: "mismatch" },
    { kind: "inner", inner_of: "attn", inner_op: null, ep_name: null, onnx_name: "v3", onnx_op_type: "Where", err_abs: null, status: "one-sided" },
    { kind: "node", ep_name: "attn", onnx_name: "attn", onnx_op_type: "MatMul", err_abs: 2e-3, status: "mismatch" },
    { kind: "inner", inner_of: "lin", inner_op: "aten.mm.default", ep_name: "lin::mm", onnx_name: "v5", onnx_op_type: "MatMul", err_abs: 5e-7, status: "ok" },
    { kind: "node", ep_name: "lin", onnx_name: "lin", onnx_op_type: "Add", err_abs: 1e-7, status: "ok" },
    { kind: "inner", inner_of: "gone", inner_op: "aten.mul.Tensor", ep_name: "gone::mul", onnx_name: "v7", onnx_op_type: "Mul", err_abs: 0.9, status: "mismatch" },
    { kind: "output", ep_name: "output", onnx_name: "out", onnx_op_type: "Identity", err_abs: 1e-5, status: "ok" },
  ].map((r, i) => ({ i, ...r }));
}
const all = (rows) => Uint32Array.from(rows.keys());
const nestOf = (rows) => new Nesting().update(rows);

test("Nesting: inner rows under the row named by inner_of, in record order; orphans stay on top", () => {
  const rows = run();
  const n = nestOf(rows);
  assert.deepEqual([...n.childrenOf(4)], [1, 2, 3]);
  assert.deepEqual([...n.childrenOf(6)], [5]);
  assert.equal(n.parentOf(2), 4);
  assert.equal(n.parentOf(7), -1, "no row named 'gone': at the top level");
  assert.equal(n.parentOf(4), -1);
  assert.equal(n.inner, 5);
  assert.deepEqual(n.summary(4), { n: 3, worst: "mismatch", count: 1 });
  assert.deepEqual(n.summary(6), { n: 1, worst: "ok", count: 1 });
  assert.equal(n.summary(0), null);
  assert.equal(insideText(n.summary(4), 3), "3 inside · 1 mismatch");
  assert.equal(insideText(n.summary(4), 1), "1/3 inside · 1 mismatch");
  assert.equal(insideText(n.summary(6), 1), "1 inside", "all ok: the count alone");
});

test("Nesting follows a streaming run: a parent arriving later adopts the rows before it", () => {
  const rows = run();
  const live = [];
  const n = new Nesting();
  for (const r of rows.slice(0, 3)) live.push(r);
  n.update(live);
  assert.equal(n.parentOf(1), -1, "attn's row not there yet: its inner rows stand alone");
  let idx = nestIndex(live, all(live), n);
  assert.deepEqual([...idx.screen], [0, 1, 2]);
  for (const r of rows.slice(3)) live.push(r);
  n.update(live);
  assert.equal(n.parentOf(1), 4);
  idx = nestIndex(live, all(live), n);
  assert.deepEqual([...idx.screen], [0, 4, 6, 7, 8], "collapsed by default");
  // another array (another run) starts over
  const other = run().slice(0, 2);
  n.update(other);
  assert.equal(n.parentOf(1), -1);
});

test("nestIndex: collapsed by default, open shows the children under their parent; flat holds them all", () => {
  const rows = run();
  const n = nestOf(rows);
  let idx = nestIndex(rows, all(rows), n);
  assert.deepEqual([...idx.screen], [0, 4, 6, 7, 8]);
  assert.deepEqual([...idx.flat], [0, 4, 1, 2, 3, 6, 5, 7, 8]);
  assert.equal(idx.matched[4], 3);
  assert.equal(idx.open[4], 0);
  const open = new Set([4]);
  idx = nestIndex(rows, all(rows), n, { isOpen: (k) => open.has(k) });
  assert.deepEqual([...idx.screen], [0, 4, 1, 2, 3, 6, 7, 8]);
  assert.equal(idx.open[4], 1);
  open.add(6);
  idx = nestIndex(rows, all(rows), n, { isOpen: (k) => open.has(k) });
  assert.deepEqual([...idx.screen], [...idx.flat]);
});

test("nestIndex: sorting orders the parents, children follow their parent in their own order", () => {
  const rows = run();
  const n = nestOf(rows);
  const sorter = new SortCache();
  const sort = (level) => sorter.sort(level, rows, "err_abs", -1);
  let idx = nestIndex(rows, all(rows), n, { sort, isOpen: () => true });
  // top level by err_abs desc: gone::mul 0.9 (orphan), attn 2e-3, output 1e-5, lin 1e-7, x 0
  assert.deepEqual([...idx.screen], [7, 4, 1, 2, 3, 8, 6, 5, 0]);
  idx = nestIndex(rows, all(rows), n, { sort: (level) => sorter.sort(level, rows, "err_abs", 1), isOpen: () => true });
  assert.deepEqual([...idx.screen], [0, 6, 5, 8, 4, 1, 2, 3, 7], "children keep record order whatever the direction");
});

test("nestIndex: a filter matching an inner row shows it with its parent, opened; the parent's other rows stay out", () => {
  const rows = run();
  const n = nestOf(rows);
  const tol = { atol: 1e-4, rtol: 1e-4 };
  const isOpen = (k, auto) => auto;
  // "softmax": the inner_op of row 2 only
  let idx = nestIndex(rows, filterIndex(rows, { text: "softmax" }, tol), n, { isOpen });
  assert.deepEqual([...idx.screen], [4, 2]);
  assert.deepEqual([...idx.flat], [4, 2]);
  assert.equal(idx.matched[4], 1);
  // a parent matching by itself stays closed; its matching children are in flat
  idx = nestIndex(rows, filterIndex(rows, { status: "mismatch" }, tol), n, { isOpen });
  assert.deepEqual([...idx.screen], [4, 7]);
  assert.deepEqual([...idx.flat], [4, 2, 7]);
  // the user closed an auto-opened parent: closed it stays
  idx = nestIndex(rows, filterIndex(rows, { text: "softmax" }, tol), n, { isOpen: (k, auto) => (k === 4 ? false : auto) });
  assert.deepEqual([...idx.screen], [4]);
  assert.deepEqual([...idx.flat], [4, 2]);
  // a parent passing the filter with no child passing it: matched 0
  idx = nestIndex(rows, filterIndex(rows, { text: "lin" }, tol), n, { isOpen });
  assert.deepEqual([...idx.flat], [6, 5], "lin::mm matches 'lin' too");
  idx = nestIndex(rows, filterIndex(rows, { status: "ok", text: "add" }, tol), n, { isOpen });
  assert.deepEqual([...idx.screen], [6]);
  assert.equal(idx.matched[6], 0);
});

test("nestIndex without any nesting is the plain sorted index", () => {
  const rows = run().filter((r) => r.kind !== "inner");
  const n = nestOf(rows);
  const idx = nestIndex(rows, all(rows), n);
  assert.equal(idx.matched, null);
  assert.equal(idx.screen, idx.flat);
  assert.deepEqual([...idx.screen], [0, 1, 2, 3]);
});

test("an inner row's reset name is its ONNX value; unpaired inner rows cannot be reset", () => {
  const rows = run();
  assert.equal(resetName(rows[2]), "v2");
  assert.equal(resetName(rows[4]), "attn");
  assert.equal(resettable(rows[2]), true);
  assert.equal(resettable(rows[3]), false);
});

test("nestIndex stays linear: 60,000 rows, a third inner", () => {
  const rows = [];
  for (let p = 0; p < 20000; p++) {
    rows.push({ i: rows.length, kind: "inner", inner_of: `n${p}`, ep_name: `n${p}::a`, err_abs: p * 1e-9, status: "ok" });
    rows.push({ i: rows.length, kind: "inner", inner_of: `n${p}`, ep_name: `n${p}::b`, err_abs: p * 1e-9, status: p % 7 ? "ok" : "mismatch" });
    rows.push({ i: rows.length, kind: "node", ep_name: `n${p}`, err_abs: p * 1e-8, status: "ok" });
  }
  const n = nestOf(rows);
  const sorter = new SortCache();
  const idx = nestIndex(rows, filterIndex(rows, {}, {}), n, { sort: (l) => sorter.sort(l, rows, "err_abs", -1) });
  assert.equal(idx.screen.length, 20000);
  assert.equal(idx.flat.length, 60000);
  assert.equal(idx.screen[0], 59999 - 0 * 3);
  // (its time is measured by benchmarks/js_table_timing.mjs, not asserted: a busy machine would fail it)
});

// --- the table in jsdom ------------------------------------------------------------------------

setupDom();
const { createView } = await import("./view.js");
const COLS = [...COLUMNS, "inner_of", "inner_op", "i"].filter((c) => c !== "i");

function mount(rows, state = {}) {
  const arrays = rows.map((r) => COLS.map((c) => (r[c] === undefined ? null : r[c])));
  const model = fakeModel({ ...baseState(rows.length), columns: COLS, ...state }, { 0: arrays });
  const el = document.createElement("div");
  document.body.append(el);
  const dispose = createView({ model, el, mountGraphs: () => () => {} });
  return { model, el, dispose, root: () => el.querySelector(".sbs-root") };
}
// what base rows need besides the nesting fields (makeRow's other columns)
const full = (r) => {
  const base = Object.fromEntries(COLUMNS.map((c, j) => [c, makeRow(r.i)[j]]));
  return { ...base, ...r };
};
const painted = (el) => [...el.querySelectorAll(".sbs-row")].filter((r) => r.style.display !== "none")
  .sort((a, b) => parseFloat(a.style.transform.slice(11)) - parseFloat(b.style.transform.slice(11)));
const ks = (el) => painted(el).map((r) => Number(r.dataset.k));
const rowEl = (el, k) => el.querySelector(`.sbs-row[data-k="${k}"]`);

test("table: the parent's disclosure says how many and the worst; a click opens it, indented children with their op", async () => {
  const { el, dispose, root } = mount(run().map(full));
  await tick();
  assert.deepEqual(ks(el), [0, 4, 6, 7, 8]);
  assert.ok(!el.querySelector(".sbs-table").classList.contains("sbs-flat"), "the inside column is shown");
  const b = rowEl(el, 4).querySelector("button.sbs-disclose");
  assert.equal(b.hidden, false);
  assert.equal(b.textContent, "▸ 3 · 1 mismatch");
  assert.equal(b.getAttribute("aria-expanded"), "false");
  assert.match(b.getAttribute("aria-label"), /show the values inside attn/);
  assert.equal(rowEl(el, 0).querySelector("button.sbs-disclose").hidden, true);
  assert.equal(rowEl(el, 7).querySelector(".sbs-inner-op").textContent, "aten.mul.Tensor", "an orphan shows its op");
  assert.equal(rowEl(el, 7).querySelector(".sbs-fxname").textContent, "gone::mul", "and its full name");
  b.click();
  assert.deepEqual(ks(el), [0, 4, 1, 2, 3, 6, 7, 8]);
  assert.equal(b.getAttribute("aria-expanded"), "true");
  assert.ok(b.textContent.startsWith("▾ "));
  const child = rowEl(el, 2);
  assert.ok(child.classList.contains("sbs-child"));
  assert.equal(child.querySelector(".sbs-inner-op").textContent, "aten._softmax.default");
  assert.equal(child.querySelector(".sbs-fxname").textContent, "_softmax", "the name after attn::");
  assert.equal(child.querySelector(".sbs-fxname").title, "attn::_softmax");
  assert.equal(rowEl(el, 3).querySelector(".sbs-inner-op").textContent, "unpaired");
  assert.equal(el.querySelectorAll(".sbs-row.sbs-selected").length, 0, "a disclosure click selects nothing");
  // the footer counts every row the filters pass; folded ones said apart
  b.click();
  assert.match(el.querySelector(".sbs-foot").textContent, /9 of 9 rows \(4 folded inside\)/);
  assert.equal(root().dataset.shown, "5");
  assert.equal(root().dataset.matched, "9");
  dispose();
});

test("table: keyboard: right opens the focused row, left closes it or goes to the parent", async () => {
  const { el, dispose } = mount(run().map(full));
  await tick();
  rowEl(el, 4).click();
  const scroll = el.querySelector(".sbs-scroll");
  const key = (k) => scroll.dispatchEvent(new window.KeyboardEvent("keydown", { key: k, bubbles: true }));
  key("ArrowRight");
  assert.deepEqual(ks(el), [0, 4, 1, 2, 3, 6, 7, 8]);
  key("ArrowDown");
  assert.ok(rowEl(el, 1).classList.contains("sbs-focus"));
  key("ArrowLeft");
  assert.ok(rowEl(el, 4).classList.contains("sbs-focus"), "left on a child selects its parent");
  key("ArrowLeft");
  assert.deepEqual(ks(el), [0, 4, 6, 7, 8]);
  dispose();
});

test("table: filtering opens the parents of matching inner rows; sort keeps children under parents", async () => {
  const { el, dispose } = mount(run().map(full));
  await tick();
  const search = el.querySelector('input[aria-label="filter"]');
  search.value = "softmax";
  search.dispatchEvent(new window.Event("input"));
  assert.deepEqual(ks(el), [4, 2]);
  assert.equal(rowEl(el, 4).querySelector("button.sbs-disclose").textContent, "▾ 1/3 · 1 mismatch");
  search.value = "";
  search.dispatchEvent(new window.Event("input"));
  assert.deepEqual(ks(el), [0, 4, 6, 7, 8], "closed again without the filter");
  rowEl(el, 4).querySelector("button.sbs-disclose").click();
  el.querySelector('.sbs-head > div[data-key="err_abs"]').click();
  assert.deepEqual(ks(el), [7, 4, 1, 2, 3, 8, 6, 0]);
  dispose();
});

test("table: CSV and view_rows hold every filtered row, folded ones included, after their parent", async () => {
  const { el, model, dispose } = mount(run().map(full));
  await tick();
  await new Promise((r) => setTimeout(r, 200));
  assert.deepEqual(model.get("view_rows"), [0, 4, 1, 2, 3, 6, 5, 7, 8]);
  let csvText = null;
  globalThis.navigator.clipboard = { writeText: async (t) => { csvText = t; } };
  [...el.querySelectorAll("button")].find((b) => b.textContent === "Copy CSV").click();
  await tick();
  const lines = csvText.trim().split("\n");
  assert.equal(lines.length, 10);
  assert.ok(lines[0].split(",").includes("inner_of"));
  assert.deepEqual(lines.slice(1).map((l) => Number(l.split(",")[0])), [0, 4, 1, 2, 3, 6, 5, 7, 8]);
  dispose();
});

test("table: selecting a folded row from elsewhere (culprit, graphs, worst) opens its parent; ticks take the ONNX name", async () => {
  const { el, model, dispose } = mount(run().map(full));
  await tick();
  // the graphs context's select(i) reveals; here through the culprits panel
  model.set("culprits", [{ i: 2, ep_name: "attn::_softmax", onnx_name: "v2", onnx_op_type: "Softmax", reason: "x" }]);
  el.querySelector(".sbs-culprit-link").click();
  assert.deepEqual(ks(el), [0, 4, 1, 2, 3, 6, 7, 8]);
  assert.ok(rowEl(el, 2).classList.contains("sbs-focus"));
  assert.match(el.querySelector(".sbs-detail").textContent, /insideattn/);
  assert.match(el.querySelector(".sbs-detail").textContent, /torch opaten\._softmax\.default/);
  rowEl(el, 2).querySelector("input[type=checkbox]").click();
  assert.deepEqual(model.get("reset_names"), ["v2"]);
  assert.equal(rowEl(el, 3).querySelector("input[type=checkbox]").disabled, true, "unpaired: nothing to reset it to");
  rowEl(el, 4).click();
  assert.match(el.querySelector(".sbs-detail").textContent, /values inside3 inside · 1 mismatch/);
  dispose();
});

test("table: no inner rows, no inside column", async () => {
  const { el, dispose } = mount(run().filter((r) => r.kind !== "inner").map((r, i) => full({ ...r, i })));
  await tick();
  assert.ok(el.querySelector(".sbs-table").classList.contains("sbs-flat"));
  assert.ok(!el.querySelector(".sbs-table").style.getPropertyValue("--sbs-cols").includes("0.9fr"));
  dispose();
});
