import { test } from "node:test";
import assert from "node:assert/strict";
import { RunRows, SortCache, decodeRows, filterIndex, isNoise, isWithin, sortIndex } from "./rows.js";
import { toCSV } from "./csv.js";
import { fmtErr } from "./format.js";
import { colorFor, STATUSES } from "./rules.js";

const enc = (x) => new TextEncoder().encode(JSON.stringify(x));

test("decodeRows restores NaN / inf sent as strings, numbers the rows from start", () => {
  const rows = decodeRows(enc([["a", "NaN"], ["b", "Infinity"], ["c", 0.5]]), ["ep_name", "err_abs"], 10);
  assert.equal(rows[0].i, 10);
  assert.ok(Number.isNaN(rows[0].err_abs));
  assert.equal(rows[1].err_abs, Infinity);
  assert.equal(rows[2].err_abs, 0.5);
  assert.equal(rows[2].ep_name, "c");
});

test("RunRows trims overlapping batches and refuses gaps", () => {
  const st = new RunRows();
  const r = (a, b) => Array.from({ length: b - a }, (_, k) => ({ i: a + k }));
  assert.equal(st.add(0, r(0, 3)), true);
  assert.equal(st.add(5, r(5, 7)), false); // gap: 3, 4 missing
  assert.equal(st.add(1, r(1, 5)), true); // overlap 1..2 dropped
  assert.deepEqual(st.rows.map((x) => x.i), [0, 1, 2, 3, 4]);
});

test("sortIndex: numeric, empty values last both ways, NaN as the worst", () => {
  const rows = [{ e: 1 }, { e: null }, { e: NaN }, { e: 3 }, { e: 0 }];
  const idx = () => Uint32Array.from(rows.keys());
  assert.deepEqual([...sortIndex(idx(), rows, "err_abs", 1)].length, 5);
  const rs = rows.map((r) => ({ err_abs: r.e }));
  assert.deepEqual([...sortIndex(idx(), rs, "err_abs", -1)], [2, 3, 0, 4, 1]);
  assert.deepEqual([...sortIndex(idx(), rs, "err_abs", 1)], [4, 0, 3, 2, 1]);
  const names = [{ ep_name: "b" }, { ep_name: null }, { ep_name: "a" }];
  assert.deepEqual([...sortIndex(Uint32Array.from([0, 1, 2]), names, "ep_name", 1)], [2, 0, 1]);
  assert.deepEqual([...sortIndex(Uint32Array.from([0, 1, 2]), names, "ep_name", -1)], [0, 2, 1]);
});

test("filterIndex: words, status, range, beyond tolerance", () => {
  const rows = [
    { ep_name: "linear_1", onnx_op_type: "MatMul", module: "decoder.mlp", err_abs: 1e-3, err_rel: 1e-3, status: "mismatch", within_tolerance: false },
    { ep_name: "add", onnx_op_type: "Add", module: "decoder", err_abs: 1e-7, err_rel: 1e-7, status: "ok", within_tolerance: true },
    { ep_name: "x", onnx_op_type: null, module: "", err_abs: null, status: "one-sided", ep_origin: "reshape_3" },
  ];
  const tol = { atol: 1e-4, rtol: 1e-4, runAtol: 1e-4, runRtol: 1e-4 };
  assert.deepEqual([...filterIndex(rows, { text: "reshape_3" }, tol)], [2]); // a user node's name finds its value
  assert.deepEqual([...filterIndex(rows, { text: "matmul MLP" }, tol)], [0]);
  assert.deepEqual([...filterIndex(rows, { text: "decoder" }, tol)], [0, 1]);
  assert.deepEqual([...filterIndex(rows, { status: "ok" }, tol)], [1]);
  assert.deepEqual([...filterIndex(rows, { min: "1e-5" }, tol)], [0]);
  assert.deepEqual([...filterIndex(rows, { max: "1e-5" }, tol)], [1]);
  assert.deepEqual([...filterIndex(rows, { beyond: true }, tol)], [0]);
  // a looser atol than the run's: the maxima decide
  assert.deepEqual([...filterIndex(rows, { beyond: true }, { ...tol, atol: 1e-2 })], []);
});

test("isWithin uses the engine's verdict at the run's tolerances only", () => {
  const row = { err_abs: 2e-4, err_rel: 1, status: "mismatch", within_tolerance: false, err_nan: 0 };
  assert.equal(isWithin(row, 1e-4, 1e-4, 1e-4, 1e-4), false);
  assert.equal(isWithin(row, 1e-3, 1e-4, 1e-4, 1e-4), true);
  assert.equal(isWithin({ err_abs: null, status: "one-sided" }, 1, 1, 1, 1), null);
  assert.equal(isWithin({ ...row, err_nan: 2 }, 1, 1, 1e-4, 1e-4), false);
});

test("isWithin at another atol: the element-wise rule (min_atol <= atol), at the run's rtol", () => {
  // every element passes at atol 1.5e-4 (rtol 1e-4), though the largest difference is 2e-4
  const row = { err_abs: 2e-4, err_rel: 1e-3, min_atol: 1.5e-4, status: "mismatch", within_tolerance: false, err_nan: 0 };
  assert.equal(isWithin(row, 1.6e-4, 1e-4, 1e-4, 1e-4), true);
  assert.equal(isWithin(row, 1.4e-4, 1e-4, 1e-4, 1e-4), false);
  // an rtol change is not judged from the figures (err_rel <= rtol would say within): the run's verdict
  assert.equal(isWithin(row, 1e-4, 0.9, 1e-4, 1e-4), false);
  // no min_atol (records saved before it): err_abs stands in
  assert.equal(isWithin({ ...row, min_atol: null }, 1.6e-4, 1e-4, 1e-4, 1e-4), false);
  assert.equal(isWithin({ ...row, min_atol: null }, 2e-4, 1e-4, 1e-4, 1e-4), true);
});

test("toCSV quotes commas, quotes and newlines; writes NaN/inf", () => {
  const csv = toCSV([{ i: 0, ep_name: 'a,"b"\nc', err_abs: NaN, histogram: [1, 2] }], ["ep_name", "err_abs", "histogram"]);
  assert.equal(csv, 'i,ep_name,err_abs,histogram\n0,"a,""b""\nc",NaN,1 2\n');
});

test("colorFor: one absolute log scale, green to red, NaN the worst, errors purple, nothing compared clear", () => {
  assert.equal(colorFor(1e-9, "ok"), colorFor(1e-7, "ok"));
  assert.equal(colorFor(10, "mismatch"), colorFor(NaN, "mismatch"));
  assert.equal(colorFor(Infinity, "mismatch"), colorFor(1, "mismatch"));
  assert.equal(colorFor(null, "error"), "#7b329476");
  assert.equal(colorFor(null, "ok"), "#ffffff00");
  assert.equal(new Set([-7, -6, -5, -4, -3, -2, -1, 0].map((e) => colorFor(10 ** e, "ok"))).size, 8);
  assert.equal(fmtErr(0.000123), "1.23e-4");
});

test("sorting and filtering 50,000 rows: every match kept, orders right (timings: benchmarks/js_table_timing.mjs)", () => {
  const rows = Array.from({ length: 50000 }, (_, k) => ({ i: k, ep_name: `node_${k}`, onnx_op_type: "Add", module: `m${k % 50}`, err_abs: ((k * 7919) % 100003) * 1e-9, status: "ok" }));
  const idx = filterIndex(rows, { text: "node_1" }, {});
  assert.equal(idx.length, rows.filter((r) => r.ep_name.includes("node_1")).length);
  const byErr = sortIndex(Uint32Array.from(rows.keys()), rows, "err_abs", -1);
  for (let k = 1; k < byErr.length; k++) assert.ok(rows[byErr[k - 1]].err_abs >= rows[byErr[k]].err_abs);
  const byName = sortIndex(Uint32Array.from(rows.keys()), rows, "ep_name", 1);
  assert.equal(byName.length, 50000);
  assert.equal(rows[byName[0]].ep_name, "node_0");
});

test("SortCache gives the same order as sortIndex, filtered or not, and reuses it", () => {
  const rows = Array.from({ length: 2000 }, (_, k) => ({ err_abs: k % 7 === 0 ? null : ((k * 7919) % 101) * 1e-6, ep_name: `n${k % 13}` }));
  const cache = new SortCache();
  const all = Uint32Array.from(rows.keys());
  const some = Uint32Array.from([...rows.keys()].filter((k) => k % 3 === 0));
  for (const key of ["err_abs", "ep_name"]) {
    for (const dir of [1, -1]) {
      assert.deepEqual([...cache.sort(all, rows, key, dir)], [...sortIndex(all.slice(), rows, key, dir)]);
      assert.deepEqual([...cache.sort(some, rows, key, dir)], [...sortIndex(some.slice(), rows, key, dir)]);
    }
  }
  assert.equal(cache.orders.size, 4);
  rows.push({ err_abs: 1, ep_name: "z" }); // new rows (streaming) drop the cached orders
  assert.equal(cache.sort(Uint32Array.from(rows.keys()), rows, "err_abs", -1)[0], 2000);
  assert.equal(cache.orders.size, 1);
});

test("noise: its own colour off the error scale, hidden on demand, min_atol sorts like an error", () => {
  const noise = colorFor(3e-4, "noise");
  assert.equal(noise, "#6baed68c");
  assert.equal(colorFor(1e-9, "noise"), noise);
  assert.equal(colorFor(NaN, "noise"), noise);
  for (const e of [-8, -6, -4, -2, 0]) {
    assert.notEqual(colorFor(10 ** e, "ok"), noise);
    assert.notEqual(colorFor(10 ** e, "mismatch"), noise);
  }
  assert.notEqual(colorFor(3e-4, "reset"), noise, "a reset record that was noise stays painted as a reset");
  assert.ok(STATUSES.includes("noise"));

  const rows = [
    { ep_name: "a", err_abs: 1e-3, err_rel: 1, status: "mismatch", within_tolerance: false, noise: false, min_atol: 1e-3 },
    { ep_name: "b", err_abs: 3e-4, err_rel: 1, status: "noise", within_tolerance: false, noise: true, min_atol: 3e-4 },
    { ep_name: "c", err_abs: 1e-7, err_rel: 1e-7, status: "ok", within_tolerance: true, noise: null, min_atol: 0 },
    { ep_name: "d", err_abs: 2e-4, err_rel: 1, status: "reset", within_tolerance: false, noise: true, min_atol: 2e-4 },
    { ep_name: "e", err_abs: NaN, err_rel: NaN, err_nan: 2, status: "noise", within_tolerance: false, noise: true, min_atol: Infinity },
    { ep_name: "f", err_abs: null, status: "one-sided", min_atol: null },
  ];
  const tol = { atol: 1e-4, rtol: 1e-4, runAtol: 1e-4, runRtol: 1e-4 };
  assert.deepEqual(rows.map(isNoise), [false, true, false, true, true, false]);
  assert.deepEqual([...filterIndex(rows, { status: "noise" }, tol)], [1, 4]);
  // "only beyond tolerance" keeps its meaning; "hide noise" takes out the rounding, reset or not
  assert.deepEqual([...filterIndex(rows, { beyond: true }, tol)], [0, 1, 3, 4]);
  assert.deepEqual([...filterIndex(rows, { beyond: true, hideNoise: true }, tol)], [0]);
  assert.deepEqual([...filterIndex(rows, { hideNoise: true }, tol)], [0, 2, 5]);
  assert.deepEqual([...filterIndex(rows, { col: "min_atol", min: "2.5e-4" }, tol)], [0, 1, 4]);
  const all = () => Uint32Array.from(rows.keys());
  assert.deepEqual([...sortIndex(all(), rows, "min_atol", -1)], [4, 0, 1, 3, 2, 5]);
  assert.deepEqual([...sortIndex(all(), rows, "min_atol", 1)], [2, 3, 1, 0, 4, 5]);
});
