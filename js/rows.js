// Rows of a run on the view side: decoding the batches the kernel sends, and the pure filter / sort /
// tolerance logic of the table (kept free of DOM so it is tested directly and stays fast).

import { SEVERITY, fromJson, isNumeric, isWithin } from "./rules.js";
import { isBDeparts } from "./models.js";

export { isNumeric, isWithin };

function asBytes(buffer) {
  if (buffer instanceof Uint8Array) return buffer;
  if (ArrayBuffer.isView(buffer)) return new Uint8Array(buffer.buffer, buffer.byteOffset, buffer.byteLength);
  return new Uint8Array(buffer);
}

/** Rows from a batch: UTF-8 JSON `[[v, ...], ...]` in `columns` order; row i = start + position.
 *  Non-finite numbers travel as strings ("NaN", "Infinity"). */
export function decodeRows(buffer, columns, start) {
  const values = JSON.parse(new TextDecoder().decode(asBytes(buffer)));
  return values.map((vals, k) => {
    const row = { i: start + k };
    for (let j = 0; j < columns.length; j++) {
      const v = fromJson(columns[j], vals[j]);
      row[columns[j]] = v === undefined ? null : v;
    }
    return row;
  });
}

/** Rows of one run, filled in order; batches may overlap (push + reply) or leave a gap (view opened
 *  mid-run): overlaps are trimmed, gaps refused so the caller asks for the missing rows. */
export class RunRows {
  constructor() {
    this.rows = [];
    this.pendingSince = 0; // time of the get_rows request in flight, 0 if none
  }
  add(start, rows) {
    if (start > this.rows.length) return false;
    const fresh = rows.slice(this.rows.length - start);
    for (const r of fresh) this.rows.push(r);
    return fresh.length > 0;
  }
}

const SEARCHED = ["ep_name", "ep_origin", "onnx_name", "onnx_node_name", "onnx_op_type", "ep_target", "module", "inner_op",
  "b_name", "b_node_name", "b_op_type"]; // (b_*: the second model's twin, js/models.js)

/** The search box's text as terms: {text, exact}. A term in double quotes ("mul_3") matches a name, op,
 *  target or module equal to it (case ignored), not one holding it (MatMul_3a); other words match
 *  anywhere. A quote not closed yet (typing) is a plain word. */
export function parseSearch(text) {
  const out = [];
  for (const m of String(text || "").toLowerCase().matchAll(/"([^"]*)"|(\S+)/g)) {
    if (m[1] !== undefined) { if (m[1].trim()) out.push({ text: m[1].trim(), exact: true }); }
    else {
      const w = m[2].replace(/"/g, "");
      if (w) out.push({ text: w, exact: false });
    }
  }
  return out;
}

function exactNames(row) {
  if (row._exact === undefined) row._exact = new Set(SEARCHED.map((c) => row[c]).filter(Boolean).map((v) => String(v).toLowerCase()));
  return row._exact;
}

function searchText(row) {
  // cached on the row: built once, filtering 50,000 rows is then a loop of includes()
  if (row._search === undefined) {
    // (ep_origin: the node of the user's program a decomposed value comes from, found by its own name)
    // (inner_op: the torch op an inner value is compared with, "aten._softmax.default")
    row._search = SEARCHED.map((c) => row[c]).filter(Boolean).join("\n").toLowerCase();
  }
  return row._search;
}

/** A pair whose difference is rounding: onnxruntime about as close to the float64 reference as torch
 *  (status noise; `noise` is also true on reset records that were noise). */
export const isNoise = (row) => row.status === "noise" || row.noise === true;

/** Indices of the rows passing `filter`:
 *  {text: "words all present in names/op/target/module, \"quoted\" ones equal to one", beyond: bool, hideNoise: bool, col: "err_abs",
 *   min, max, status, inputDependent: bool (input sets: the pairs beyond tolerance on some inputs only),
 *   bDeparts: bool (two models: the rows where b departs or inherits a departure)} */
export function filterIndex(rows, filter = {}, tol = {}) {
  const terms = parseSearch(filter.text);
  const col = filter.col || "err_abs";
  const min = filter.min === "" || filter.min === undefined || filter.min === null ? null : Number(filter.min);
  const max = filter.max === "" || filter.max === undefined || filter.max === null ? null : Number(filter.max);
  const out = new Uint32Array(rows.length);
  let n = 0;
  for (let k = 0; k < rows.length; k++) {
    const row = rows[k];
    if (filter.status && row.status !== filter.status) continue;
    if (filter.hideNoise && isNoise(row)) continue;
    if (filter.inputDependent && row["spread:input_dependent"] !== true) continue; // input sets: js/sets.js
    if (filter.bDeparts && !isBDeparts(row)) continue; // two models: js/models.js
    if (terms.length) {
      let ok = true;
      for (const w of terms) if (w.exact ? !exactNames(row).has(w.text) : !searchText(row).includes(w.text)) { ok = false; break; }
      if (!ok) continue;
    }
    if (min !== null || max !== null) {
      const v = row[col];
      if (v === null || v === undefined) continue;
      const x = Number.isNaN(v) ? Infinity : v;
      if (min !== null && !(x >= min)) continue;
      if (max !== null && !(x <= max)) continue;
    }
    if (filter.beyond) {
      const w = isWithin(row, tol.atol, tol.rtol, tol.runAtol, tol.runRtol);
      if (w !== false && row.status !== "error") continue;
    }
    out[n++] = k;
  }
  return out.subarray(0, n);
}

/** Sort `index` (positions into rows) by `key`, in place; empty values last in both directions,
 *  NaN errors count as the largest, ties keep execution order. */
export function sortIndex(index, rows, key, dir = 1) {
  if (!key) return index;
  if (isNumeric(key)) {
    const keys = new Float64Array(rows.length);
    const empty = new Uint8Array(rows.length);
    for (const k of index) {
      const v = rows[k][key];
      if (v === null || v === undefined) empty[k] = 1;
      else keys[k] = Number.isNaN(v) ? Infinity : v;
    }
    return index.sort((a, b) => empty[a] - empty[b] || (keys[a] - keys[b]) * dir || (a - b) || 0);
  }
  const keys = new Array(rows.length);
  for (const k of index) {
    const v = rows[k][key];
    keys[k] = v === null || v === undefined ? "" : typeof v === "string" ? v : String(v);
  }
  return index.sort((a, b) => {
    const x = keys[a], y = keys[b];
    if (x === y) return a - b;
    if (x === "") return 1;
    if (y === "") return -1;
    return (x < y ? -1 : 1) * dir;
  });
}

/** A number from a synced value (NaN/inf arrive as strings); null stays null. */
export function toNumber(v) {
  if (v === null || v === undefined) return null;
  return typeof v === "number" ? v : Number(v);
}

/** Full-table orders kept per (column, direction) while the rows do not change: a filter or a
 *  direction already seen re-sorts in one linear pass over a cached order instead of a sort. */
export class SortCache {
  constructor() {
    this.rows = null;
    this.n = -1;
    this.orders = new Map();
  }
  sort(index, rows, key, dir = 1) {
    if (!key) return index;
    if (rows !== this.rows || rows.length !== this.n) {
      this.rows = rows;
      this.n = rows.length;
      this.orders.clear();
    }
    const id = `${key}\u0000${dir}`;
    let order = this.orders.get(id);
    if (!order) {
      order = sortIndex(Uint32Array.from(rows.keys()), rows, key, dir);
      this.orders.set(id, order);
    }
    if (index.length === rows.length) return order.slice();
    const keep = new Uint8Array(rows.length);
    for (const k of index) keep[k] = 1;
    const out = new Uint32Array(index.length);
    let n = 0;
    for (const k of order) if (keep[k]) out[n++] = k;
    return out;
  }
}

// --- inner rows (kind "inner"): values computed inside the ONNX translation of one FX node, nested
// under that node's own row (kind node/output, ep_name == inner_of). Inner rows arrive before their
// FX node's row; until it exists (streaming, or never) they stand at the top level.

const NO_CHILDREN = Object.freeze([]);
const isParentKind = (row) => row.kind === "node" || row.kind === "output";

/** Which row each inner row nests under, kept in step with a run's rows as they arrive: each new
 *  row is looked at once (`update` after every batch is linear in the new rows). */
export class Nesting {
  constructor() {
    this.reset(null);
  }
  reset(rows) {
    this.rows = rows;
    this.n = 0;
    this.parent = new Int32Array(0); // k -> the row it nests under, -1 at the top level
    this.byName = new Map(); // ep_name of node/output rows -> k
    this.waiting = new Map(); // inner_of without its row yet -> inner rows (record order)
    this.kids = new Map(); // k -> its inner rows (record order)
    this.summaries = new Map(); // k -> summary(k), cached
    this.inner = 0; // rows of kind "inner", nested or not
  }
  /** Take the rows added since the last call (a different array starts over). */
  update(rows) {
    if (rows !== this.rows || rows.length < this.n) this.reset(rows);
    if (rows.length === this.n) return this;
    if (this.parent.length < rows.length) {
      const grown = new Int32Array(Math.max(rows.length, 2 * this.parent.length)).fill(-1);
      grown.set(this.parent.subarray(0, this.n));
      this.parent = grown;
    }
    for (let k = this.n; k < rows.length; k++) {
      const row = rows[k];
      if (row.kind === "inner") this.inner++;
      if (row.kind === "inner" && row.inner_of !== null && row.inner_of !== undefined) {
        const p = this.byName.get(row.inner_of);
        if (p === undefined) {
          const w = this.waiting.get(row.inner_of);
          if (w) w.push(k);
          else this.waiting.set(row.inner_of, [k]);
        } else {
          this.parent[k] = p;
          (this.kids.get(p) ?? this.kids.set(p, []).get(p)).push(k);
          this.summaries.delete(p);
        }
      } else if (isParentKind(row) && row.ep_name !== null && row.ep_name !== undefined && !this.byName.has(row.ep_name)) {
        this.byName.set(row.ep_name, k);
        const w = this.waiting.get(row.ep_name);
        if (w) {
          for (const c of w) this.parent[c] = k;
          this.kids.set(k, w);
          this.waiting.delete(row.ep_name);
        }
      }
    }
    this.n = rows.length;
    return this;
  }
  /** The row `k` nests under, or -1. */
  parentOf(k) {
    return k < this.n ? this.parent[k] : -1;
  }
  /** The inner rows nested under `k`, in record order. */
  childrenOf(k) {
    return this.kids.get(k) || NO_CHILDREN;
  }
  /** Whether any row has inner rows nested under it. */
  get any() {
    return this.kids.size > 0;
  }
  /** {n, worst, count}: how many inner rows `k` holds, their worst status and how many have it; null
   *  for a row without any. */
  summary(k) {
    const kids = this.kids.get(k);
    if (!kids) return null;
    let s = this.summaries.get(k);
    if (!s) {
      s = { n: kids.length, worst: null, count: 0 };
      for (const c of kids) {
        const status = this.rows[c].status || "ok";
        const rank = SEVERITY[status] ?? 0;
        const best = s.worst === null ? -1 : SEVERITY[s.worst] ?? 0;
        if (rank > best) (s.worst = status), (s.count = 1);
        else if (status === s.worst) s.count++;
      }
      this.summaries.set(k, s);
    }
    return s;
  }
}

/** The table's order with inner rows nested: `filtered` (positions passing the filter, any order) gives
 *  the top level, the rows not nested under another; `sort(index)` orders the top level (children follow
 *  their parent in record order); a parent passing no filter is drawn for a child that passes it, and is
 *  then open unless the user closed it. `isOpen(k, auto)`: whether parent `k` shows its children (`auto`:
 *  the parent is drawn only for them).
 *  Returns {screen, flat, matched, open}: `screen` the rows drawn (children of closed parents left
 *  out), `flat` every row the filter selects in the same order (what CSV and `view_rows` hold),
 *  `matched[k]` how many of the children of `k` pass the filter, `open[k]` 1 where they are drawn
 *  (matched and open are null when no row nests under another). Linear in the rows, plus the sort of the top level. */
export function nestIndex(rows, filtered, nesting, { sort = (index) => index, isOpen = (k, auto) => auto } = {}) {
  const n = rows.length;
  if (!nesting.any) {
    const screen = sort(filtered);
    return { screen, flat: screen, matched: null, open: null };
  }
  const pass = new Uint8Array(n);
  const matched = new Uint32Array(n);
  const top = new Uint8Array(n); // 1: at the top level by itself, 2: only for a child passing the filter
  for (const k of filtered) pass[k] = 1;
  let count = 0;
  for (const k of filtered) {
    const p = nesting.parentOf(k);
    if (p < 0) {
      if (!top[k]) count++;
      top[k] = 1;
    } else {
      matched[p]++;
      if (!pass[p] && !top[p]) (top[p] = 2), count++;
    }
  }
  const level = new Uint32Array(count);
  let m = 0;
  for (let k = 0; k < n; k++) if (top[k]) level[m++] = k;
  const order = sort(level);
  let total = order.length;
  for (const k of order) total += matched[k];
  const flat = new Uint32Array(total);
  const screen = new Uint32Array(total);
  const opened = new Uint8Array(n);
  let f = 0;
  let s = 0;
  for (const k of order) {
    flat[f++] = k;
    screen[s++] = k;
    if (!matched[k]) continue;
    const open = isOpen(k, top[k] === 2);
    opened[k] = open ? 1 : 0;
    for (const c of nesting.childrenOf(k)) {
      if (!pass[c]) continue;
      flat[f++] = c;
      if (open) screen[s++] = c;
    }
  }
  return { screen: screen.subarray(0, s), flat, matched, open: opened };
}
