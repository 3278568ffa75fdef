// The rows the view reports back to Python: selected_rows (click, ctrl/cmd-click, shift-click) and
// view_rows (all rows on screen, in screen order), debounced.
import { test } from "node:test";
import assert from "node:assert/strict";
import { setupDom, fakeModel, baseState, makeRow, tick } from "./test_env.js";

setupDom();
const { createView, nextSelection, PUBLISH_MS } = await import("./view.js");

const settle = () => new Promise((r) => setTimeout(r, PUBLISH_MS + 60));
const rowEl = (el, k) => el.querySelector(`.sbs-row[data-k="${k}"]`);
const click = (el, k, mods = {}) => rowEl(el, k).dispatchEvent(new window.MouseEvent("click", { bubbles: true, ...mods }));

function mount(n, rowsOver = () => ({}), state = baseState(n)) {
  const rows = Array.from({ length: n }, (_, k) => makeRow(k, rowsOver(k)));
  const model = fakeModel({ ...state, selected_rows: [], view_rows: [] }, { 0: rows });
  const sets = [];
  const set = model.set;
  model.set = (k, v) => { if (k === "selected_rows" || k === "view_rows") sets.push([k, v]); set(k, v); };
  const el = document.createElement("div");
  document.body.append(el);
  const dispose = createView({ model, el, mountGraphs: null });
  return { model, el, dispose, sets };
}

test("nextSelection: one, toggle, extend in screen order from the anchor", () => {
  const index = Uint32Array.from([5, 3, 9, 1, 7]);
  assert.deepEqual(nextSelection([3], 3, 9, "one", index), { selection: [9], anchor: 9 });
  assert.deepEqual(nextSelection([3], 3, 9, "toggle", index), { selection: [3, 9], anchor: 9 });
  assert.deepEqual(nextSelection([3, 9], 9, 3, "toggle", index), { selection: [9], anchor: 3 });
  assert.deepEqual(nextSelection([3], 3, 7, "extend", index), { selection: [3, 9, 1, 7], anchor: 3 });
  assert.deepEqual(nextSelection([1], 1, 5, "extend", index), { selection: [1, 9, 3, 5], anchor: 1 });
  assert.deepEqual(nextSelection([], -1, 7, "extend", index), { selection: [7], anchor: 7 }, "no anchor: one row");
});

test("click, ctrl-click, shift-click: selected rows shown and sent as selected_rows, in selection order", async () => {
  const { model, el, dispose } = mount(10);
  await tick();
  click(el, 2);
  click(el, 6, { ctrlKey: true });
  click(el, 4, { metaKey: true });
  assert.deepEqual([...el.querySelectorAll(".sbs-row.sbs-selected")].map((r) => Number(r.dataset.k)).sort(), [2, 4, 6]);
  assert.equal(rowEl(el, 4).getAttribute("aria-selected"), "true");
  assert.ok(rowEl(el, 4).classList.contains("sbs-focus"), "the last clicked row has the detail");
  assert.ok(el.querySelector(".sbs-detail").textContent.includes("node_4"));
  await settle();
  assert.deepEqual(model.get("selected_rows"), [2, 6, 4]);
  click(el, 6, { ctrlKey: true }); // toggles off
  click(el, 8, { shiftKey: true }); // anchor 6: rows 6..8 on screen
  await settle();
  assert.deepEqual(model.get("selected_rows"), [6, 7, 8]);
  click(el, 1);
  await settle();
  assert.deepEqual(model.get("selected_rows"), [1]);
  assert.equal(el.querySelectorAll(".sbs-row.sbs-selected").length, 1);
  dispose();
});

test("shift-click follows the screen order after a sort", async () => {
  const { model, el, dispose } = mount(6, (k) => ({ err_abs: [5, 1, 4, 2, 6, 3][k] * 1e-5 }));
  await tick();
  el.querySelector('.sbs-head > div[data-key="err_abs"]').click(); // worst first: 4, 0, 2, 5, 3, 1
  click(el, 0);
  click(el, 3, { shiftKey: true });
  await settle();
  assert.deepEqual(model.get("selected_rows"), [0, 2, 5, 3]);
  assert.deepEqual(model.get("view_rows"), [4, 0, 2, 5, 3, 1]);
  dispose();
});

test("view_rows: every matching row in screen order, after filters and sort; debounced into one update", async () => {
  const { model, el, dispose, sets } = mount(100);
  await settle();
  assert.deepEqual(model.get("view_rows"), Array.from({ length: 100 }, (_, k) => k), "all rows, not only the painted ones");
  const saved = model.saved;
  const search = el.querySelector('input[aria-label="filter"]');
  for (const text of ["n", "no", "node", "node_", "node_5"]) { // typing: five refreshes
    search.value = text;
    search.dispatchEvent(new window.Event("input"));
  }
  el.querySelector('.sbs-head > div[data-key="ep_name"]').click();
  el.querySelector('.sbs-head > div[data-key="ep_name"]').click(); // descending
  const before = sets.length;
  await settle();
  assert.equal(sets.length - before, 1, "one update for the whole burst");
  assert.equal(model.saved, saved + 1);
  assert.deepEqual(model.get("view_rows"), [59, 58, 57, 56, 55, 54, 53, 52, 51, 50, 5]);
  search.value = "nothing matches this";
  search.dispatchEvent(new window.Event("input"));
  await settle();
  assert.deepEqual(model.get("view_rows"), []);
  const n = sets.length;
  search.dispatchEvent(new window.Event("input")); // same view again: nothing sent
  await settle();
  assert.equal(sets.length, n);
  dispose();
});

test("view_rows follow the rows as they stream in", async () => {
  const all = Array.from({ length: 12 }, (_, k) => makeRow(k));
  const state = baseState(0);
  state.status = "running";
  state.progress = { ...state.progress, n_rows: 0, finished: false };
  const model = fakeModel({ ...state, selected_rows: [], view_rows: [] }, {});
  const el = document.createElement("div");
  const dispose = createView({ model, el, mountGraphs: null });
  model.reply(0, 0, all.slice(0, 5));
  model.set("progress", { ...state.progress, n_rows: 5 });
  await tick();
  model.reply(0, 5, all.slice(5, 12));
  model.set("progress", { ...state.progress, n_rows: 12 });
  model.set("status", "done");
  await new Promise((r) => setTimeout(r, 600)); // the slower pace while running
  assert.deepEqual(model.get("view_rows"), Array.from({ length: 12 }, (_, k) => k));
  dispose();
});

test("a selection set elsewhere (Python, another view) is shown; a reloaded view takes it back", async () => {
  const { model, el, dispose } = mount(8);
  await tick();
  model.set("selected_rows", [3, 5]);
  assert.deepEqual([...el.querySelectorAll(".sbs-row.sbs-selected")].map((r) => Number(r.dataset.k)).sort(), [3, 5]);
  assert.ok(el.querySelector(".sbs-detail").textContent.includes("node_5"));
  dispose();

  const rows = Array.from({ length: 8 }, (_, k) => makeRow(k));
  const again = fakeModel({ ...baseState(8), selected_rows: [6], view_rows: [] }, { 0: rows });
  const el2 = document.createElement("div");
  const dispose2 = createView({ model: again, el: el2, mountGraphs: null });
  await tick();
  assert.ok(el2.querySelector('.sbs-row[data-k="6"]').classList.contains("sbs-selected"));
  assert.ok(el2.querySelector(".sbs-detail").textContent.includes("node_6"), "the detail once the row arrived");
  dispose2();
});

test("an older run on screen: nothing is sent (positions are the current run's)", async () => {
  const state = { ...baseState(4), run_id: 1 };
  state.runs_meta = [...state.runs_meta, { ...state.runs_meta[0], id: 1 }];
  state.progress = { ...state.progress, run: 1 };
  const rows = Array.from({ length: 4 }, (_, k) => makeRow(k));
  const model = fakeModel({ ...state, selected_rows: [], view_rows: [] }, { 0: rows, 1: rows });
  const el = document.createElement("div");
  const dispose = createView({ model, el, mountGraphs: null });
  await settle();
  assert.deepEqual(model.get("view_rows"), [0, 1, 2, 3]);
  const runSel = el.querySelector('select[aria-label="run"]');
  runSel.value = "0";
  runSel.dispatchEvent(new window.Event("change"));
  await tick();
  click(el, 2);
  await settle();
  assert.deepEqual(model.get("selected_rows"), []);
  dispose();
});
