import { test } from "node:test";
import assert from "node:assert/strict";
import { setupDom, fakeModel, baseState, makeRow, tick } from "./test_env.js";

setupDom();
const { createView } = await import("./view.js");

function mount(n, rowsOver = () => ({})) {
  const rows = Array.from({ length: n }, (_, k) => makeRow(k, rowsOver(k)));
  const model = fakeModel(baseState(n), { 0: rows });
  const el = document.createElement("div");
  document.body.append(el);
  let graphsCtx = null;
  const dispose = createView({ model, el, mountGraphs: (ctx) => { graphsCtx = ctx; return () => {}; } });
  return { model, el, dispose, rows, graphs: () => graphsCtx };
}
const shownRows = (el) => [...el.querySelectorAll(".sbs-row")].filter((r) => r.style.display !== "none");
const header = (el, key) => el.querySelector(`.sbs-head > div[data-key="${key}"]`);

test("asks the model for its rows on render and shows them", async () => {
  const { model, el, dispose } = mount(5);
  assert.deepEqual(model.sent[0], { type: "get_rows", run: 0, start: 0, limit: 1000 });
  await tick();
  assert.equal(shownRows(el).length, 5);
  assert.equal(el.querySelector(".sbs-root").dataset.rows, "5");
  dispose();
  assert.equal(model.listeners(), 0, "cleanup removes every model listener");
  assert.equal(el.children.length, 0);
});

test("virtualized: 50,000 rows, a few dozen row elements; scrolling repaints them", async () => {
  const { el, dispose } = mount(50000);
  await tick();
  const root = el.querySelector(".sbs-root");
  assert.equal(root.dataset.rows, "50000");
  const n = el.querySelectorAll(".sbs-row").length;
  assert.ok(n < 60, `${n} row elements in the DOM`);
  const scroll = el.querySelector(".sbs-scroll");
  scroll.scrollTop = 22 * 30000;
  scroll.dispatchEvent(new window.Event("scroll"));
  await tick();
  const ks = shownRows(el).map((r) => Number(r.dataset.k));
  assert.ok(ks.includes(30000), "the rows at the scroll position are painted");
  assert.ok(el.querySelectorAll(".sbs-row").length < 60, "the pool stays small");
  console.log(`jsdom, 50,000 rows: filter ${root.dataset.filterMs} ms, sort ${root.dataset.sortMs} ms`);
  dispose();
});

test("click on err_abs sorts worst first, a second click reverses", async () => {
  const { el, dispose } = mount(200, (k) => ({ err_abs: k === 77 ? 0.5 : k * 1e-7, ...(k === 13 ? { err_abs: "NaN" } : {}) }));
  await tick();
  header(el, "err_abs").click();
  let first = shownRows(el).sort((a, b) => parseFloat(a.style.transform.slice(11)) - parseFloat(b.style.transform.slice(11)));
  assert.equal(first[0].dataset.k, "13", "NaN sorts as the worst");
  assert.equal(first[1].dataset.k, "77");
  assert.equal(header(el, "err_abs").dataset.sort, "▼");
  header(el, "err_abs").click();
  first = shownRows(el).sort((a, b) => parseFloat(a.style.transform.slice(11)) - parseFloat(b.style.transform.slice(11)));
  assert.equal(first[0].dataset.k, "0");
  dispose();
});

test("text filter and 'only beyond tolerance'", async () => {
  const { el, dispose } = mount(100, (k) => (k % 10 === 0 ? { err_abs: 1e-2, within_tolerance: false, status: "mismatch" } : {}));
  await tick();
  const root = el.querySelector(".sbs-root");
  const search = el.querySelector('input[aria-label="filter"]');
  search.value = "node_5";
  search.dispatchEvent(new window.Event("input"));
  assert.equal(root.dataset.shown, "11"); // node_5, node_50..59
  search.value = "";
  search.dispatchEvent(new window.Event("input"));
  const beyond = el.querySelector(".sbs-bar label input[type=checkbox]");
  beyond.checked = true;
  beyond.dispatchEvent(new window.Event("change"));
  assert.equal(root.dataset.shown, "10");
  dispose();
});

test("editing atol re-judges without asking the kernel for anything; colours stay (absolute scale)", async () => {
  const { model, el, dispose } = mount(3, () => ({ err_abs: 1e-3, err_rel: 1e-3, within_tolerance: false, status: "mismatch" }));
  await tick();
  const beyond = [...el.querySelectorAll("label")].find((l) => l.textContent.includes("only beyond")).querySelector("input");
  beyond.checked = true;
  beyond.dispatchEvent(new window.Event("change"));
  await tick();
  assert.equal(shownRows(el).length, 3);
  const before = shownRows(el)[0].style.background;
  const sent = model.sent.length;
  const atol = el.querySelector('input[aria-label="atol"]');
  atol.value = "0.01";
  atol.dispatchEvent(new window.Event("change"));
  await tick();
  assert.equal(model.get("atol"), 0.01);
  assert.equal(shownRows(el).length, 0); // 1e-3 is within atol 0.01
  beyond.checked = false;
  beyond.dispatchEvent(new window.Event("change"));
  await tick();
  assert.equal(shownRows(el)[0].style.background, before);
  assert.equal(model.sent.length, sent);
  dispose();
});

test("hostile names are shown as text, never parsed as HTML", async () => {
  const evil = '<img src=x onerror="globalThis.pwned=1"></script><b>bold</b>';
  const { el, dispose } = mount(3, () => ({ ep_name: evil, onnx_op_type: evil, module: evil, stack_trace: evil, comment: evil }));
  await tick();
  shownRows(el)[0].click();
  assert.equal(el.querySelector("img"), null);
  assert.equal(el.querySelector("b"), null);
  assert.ok([...el.querySelectorAll(".sbs-row div")].some((d) => d.textContent === evil));
  assert.ok(el.querySelector(".sbs-detail").textContent.includes(evil));
  await tick();
  assert.equal(globalThis.pwned, undefined);
  dispose();
});

test("row click shows the detail with the histogram; graphs get the same selection", async () => {
  const { el, dispose, graphs } = mount(4, (k) => ({ err_local: 3e-5, err_where: k === 2 ? "[0, :, 0:2] (8 of 64)" : null }));
  await tick();
  const box = el.querySelector(".sbs-graphs-box");
  box.open = true;
  box.dispatchEvent(new window.Event("toggle"));
  const ctx = graphs();
  assert.ok(ctx, "mountGraphs called when the graphs area opens");
  const seen = [];
  ctx.onSelect((i) => seen.push(i));
  shownRows(el)[2].click();
  const detail = el.querySelector(".sbs-detail").textContent;
  assert.ok(detail.includes("node_2") && detail.includes("val_2") && detail.includes("3.00e-5") && detail.includes("model.py:12"));
  assert.ok(detail.includes("beyond tolerance at[0, :, 0:2] (8 of 64)"), "where the elements beyond tolerance lie");
  assert.equal(el.querySelectorAll(".sbs-hist-bar").length, 10);
  ctx.select(3);
  assert.deepEqual(seen, [2, 3]);
  assert.equal(ctx.getRows().length, 4);
  assert.equal(typeof ctx.colorFor(1e-3, "mismatch"), "string");
  dispose();
});

test("ticking a row puts its name in reset_names; Rerun sends a message", async () => {
  const { model, el, dispose } = mount(3);
  await tick();
  shownRows(el)[1].querySelector("input").click();
  assert.deepEqual(model.get("reset_names"), ["node_1"]);
  assert.ok(model.saved > 0);
  assert.ok(el.querySelector(".sbs-reset").textContent.includes("node_1"));
  el.querySelector(".sbs-rerun").click();
  assert.equal(model.sent.at(-1).type, "rerun");
  dispose();
});

test("streamed batches: pushes append, a gap triggers a request for the missing rows", async () => {
  const all = Array.from({ length: 10 }, (_, k) => makeRow(k));
  const state = baseState(0);
  state.status = "running";
  state.progress = { ...state.progress, n_rows: 0, finished: false };
  const model = fakeModel(state, {});
  const el = document.createElement("div");
  const dispose = createView({ model, el, mountGraphs: null });
  assert.equal(model.sent.length, 0, "nothing to ask for yet");
  model.reply(0, 0, all.slice(0, 4));
  model.set("progress", { ...state.progress, n_rows: 4 });
  assert.equal(model.sent.length, 0, "rows arrived before the progress that counts them");
  model.reply(0, 6, all.slice(6, 8)); // a view opened mid-run misses 4..5
  model.set("progress", { ...state.progress, n_rows: 8 });
  assert.deepEqual(model.sent.at(-1), { type: "get_rows", run: 0, start: 4, limit: 25000 });
  model.reply(0, 4, all.slice(4, 8), true);
  await tick();
  assert.equal(el.querySelector(".sbs-root").dataset.rows, "8");
  dispose();
});

test("Stop is enabled while a run streams and asks the kernel to stop; the view follows the status", async () => {
  const state = baseState(0);
  state.status = "running";
  state.progress = { ...state.progress, n_rows: 0, fx_done: 3, fx_total: 10, eta: 2.5, current: "linear_1", finished: false };
  const model = fakeModel(state, {});
  const el = document.createElement("div");
  const dispose = createView({ model, el, mountGraphs: null });
  const stop = [...el.querySelectorAll("button")].find((b) => b.textContent === "Stop");
  assert.equal(stop.disabled, false);
  assert.ok(el.textContent.includes("FX 3/10") && el.textContent.includes("left") && el.textContent.includes("linear_1"));
  stop.click();
  assert.deepEqual(model.sent.at(-1), { type: "stop" });
  model.set("status", "stopped");
  assert.equal(stop.disabled, true);
  assert.equal(el.querySelector(".sbs-badge").textContent, "stopped");
  dispose();
});

const NOISE = { err_abs: 3e-4, err_rel: 1e-2, within_tolerance: false, status: "noise", noise: true, min_atol: 2.9e-4, err_torch: 1.5e-4, err_onnx: 1.8e-4, ref_scale: 40 };
const MISMATCH = { err_abs: 2e-3, err_rel: 1e-2, within_tolerance: false, status: "mismatch", noise: false, min_atol: 2e-3, err_torch: 1e-7, err_onnx: 3.7e-6, ref_scale: 2 };

test("noise: a status of the select, its own colour and count, hidden by 'hide noise' under 'only beyond tolerance'", async () => {
  // rows 0, 10, ..., 90 mismatch; 5, 15, ..., 95 noise; the rest ok
  const { model, el, dispose } = mount(100, (k) => (k % 10 === 0 ? MISMATCH : k % 10 === 5 ? NOISE : {}));
  model.set("progress", { ...model.get("progress"), counts: { ok: 80, noise: 10, mismatch: 10 } });
  await tick();
  const root = el.querySelector(".sbs-root");
  const status = el.querySelector('select[aria-label="status"]');
  assert.deepEqual([...status.options].map((o) => o.value), ["", "ok", "noise", "mismatch", "one-sided", "reset", "error"]);
  status.value = "noise";
  status.dispatchEvent(new window.Event("change"));
  assert.equal(root.dataset.shown, "10");
  const painted = shownRows(el)[0].style.background;
  assert.ok(painted, "a noise row has a background");
  assert.equal(new Set(shownRows(el).map((r) => r.style.background)).size, 1, "one colour whatever the error");
  status.value = "";
  status.dispatchEvent(new window.Event("change"));

  const beyond = el.querySelector('input[aria-label="only beyond tolerance"]');
  const hide = el.querySelector('input[aria-label="hide noise"]');
  assert.ok(hide.closest("label").textContent.includes("hide noise"));
  beyond.checked = true;
  beyond.dispatchEvent(new window.Event("change"));
  assert.equal(root.dataset.shown, "20", "beyond tolerance still means within_tolerance false: noise included");
  hide.checked = true;
  hide.dispatchEvent(new window.Event("change"));
  assert.equal(root.dataset.shown, "10", "the real mismatches");
  assert.ok(shownRows(el).every((r) => Number(r.dataset.k) % 10 === 0));
  beyond.checked = false;
  beyond.dispatchEvent(new window.Event("change"));
  assert.equal(root.dataset.shown, "90");

  const chips = [...el.querySelectorAll(".sbs-chip")].map((c) => [c.dataset.status, c.textContent]);
  assert.deepEqual(chips, [["ok", "ok 80"], ["noise", "noise 10"], ["mismatch", "mismatch 10"]]);
  assert.ok(el.querySelector("style").textContent.includes(".sbs-chip[data-status=noise]"));
  dispose();
});

test("min atol: a sortable error column, worst first", async () => {
  const { el, dispose } = mount(50, (k) => ({ min_atol: k === 31 ? 0.25 : k === 7 ? null : k * 1e-6 }));
  await tick();
  const head = header(el, "min_atol");
  assert.equal(head.textContent, "min atol");
  assert.equal(head.title, "smallest atol this pair passes at the run's rtol");
  head.click();
  const order = () => shownRows(el).sort((a, b) => parseFloat(a.style.transform.slice(11)) - parseFloat(b.style.transform.slice(11)));
  let first = order();
  assert.equal(first[0].dataset.k, "31");
  assert.equal(head.dataset.sort, "▼");
  const col = [...el.querySelectorAll(".sbs-head > div")].indexOf(head);
  assert.equal(first[0].children[col].textContent, "2.50e-1");
  head.click();
  first = order();
  assert.equal(first[0].dataset.k, "0");
  assert.equal(first[0].children[col].textContent, "0");
  dispose();
});

test("detail: the rounding verdict, as text", async () => {
  const evil = '<img src=x onerror="globalThis.pwned=2">';
  const { el, dispose } = mount(4, (k) => (k === 1 ? { ...NOISE, ep_name: evil } : k === 2 ? MISMATCH : k === 3 ? { ...MISMATCH, err_torch: 0 } : {}));
  await tick();
  const detail = () => el.querySelector(".sbs-detail");
  shownRows(el)[1].click();
  let text = detail().textContent;
  assert.ok(text.includes("torch vs float641.50e-4"), text);
  assert.ok(text.includes("onnxruntime vs float641.80e-4"));
  assert.ok(text.includes("reference scale4.00e+1"));
  assert.ok(text.includes("min atol2.90e-4"));
  assert.equal(detail().querySelector(".sbs-verdict").textContent, "rounding: onnxruntime about as close to exact as torch");
  assert.equal(detail().querySelector(".sbs-badge").textContent, "noise");
  assert.equal(detail().querySelector("img"), null);
  shownRows(el)[2].click();
  assert.equal(detail().querySelector(".sbs-verdict").textContent, "beyond rounding: onnxruntime 37× farther from exact than torch");
  shownRows(el)[3].click();
  assert.equal(detail().querySelector(".sbs-verdict").textContent, "beyond rounding: torch is exact, onnxruntime is not");
  shownRows(el)[0].click(); // within tolerance: no reference computed, no block
  assert.equal(detail().querySelector(".sbs-verdict"), null);
  assert.ok(!detail().textContent.includes("float64"));
  await tick();
  assert.equal(globalThis.pwned, undefined);
  dispose();
});
