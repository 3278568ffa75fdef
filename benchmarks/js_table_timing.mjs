// Timings of the table's index work in Node (the tests assert behaviour only: a busy machine would fail
// a time bound). Medians of 7 runs each:
//   node benchmarks/js_table_timing.mjs
import { Nesting, SortCache, filterIndex, nestIndex, sortIndex } from "../js/rows.js";

function median(f, runs = 7) {
  const times = [];
  for (let k = 0; k < runs; k++) {
    const t0 = performance.now();
    f();
    times.push(performance.now() - t0);
  }
  times.sort((a, b) => a - b);
  return times[runs >> 1];
}

const flat = Array.from({ length: 50000 }, (_, k) => ({ i: k, ep_name: `node_${k}`, onnx_op_type: "Add", module: `m${k % 50}`, err_abs: ((k * 7919) % 100003) * 1e-9, status: "ok" }));
console.log(`50,000 rows: filter ${median(() => filterIndex(flat, { text: "node_1" }, {})).toFixed(1)} ms, ` +
  `sort err_abs ${median(() => sortIndex(Uint32Array.from(flat.keys()), flat, "err_abs", -1)).toFixed(1)} ms, ` +
  `sort name ${median(() => sortIndex(Uint32Array.from(flat.keys()), flat, "ep_name", 1)).toFixed(1)} ms`);

const nested = [];
for (let p = 0; p < 20000; p++) {
  nested.push({ i: nested.length, kind: "inner", inner_of: `n${p}`, ep_name: `n${p}::a`, err_abs: p * 1e-9, status: "ok" });
  nested.push({ i: nested.length, kind: "inner", inner_of: `n${p}`, ep_name: `n${p}::b`, err_abs: p * 1e-9, status: "ok" });
  nested.push({ i: nested.length, kind: "node", ep_name: `n${p}`, err_abs: p * 1e-8, status: "ok" });
}
console.log(`60,000 rows, a third nested, + sort: ${median(() => {
  const sorter = new SortCache();
  nestIndex(nested, filterIndex(nested, {}, {}), new Nesting().update(nested), { sort: (l) => sorter.sort(l, nested, "err_abs", -1) });
}).toFixed(1)} ms`);
