// Rows of a run on the view side: decoding the batches the kernel sends, and the pure filter / sort /
// tolerance logic of the table (kept free of DOM so it is tested directly and stays fast).

import { fromJson, isNumeric, isWithin } from "./rules.js";

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

function searchText(row) {
  // cached on the row: built once, filtering 50,000 rows is then a loop of includes()
  if (row._search === undefined) {
    // (ep_origin: the node of the user's program a decomposed value comes from, found by its own name)
    row._search = [row.ep_name, row.ep_origin, row.onnx_name, row.onnx_node_name, row.onnx_op_type, row.ep_target, row.module]
      .filter(Boolean).join("\n").toLowerCase();
  }
  return row._search;
}

/** A pair whose difference is rounding: onnxruntime about as close to the float64 reference as torch
 *  (status noise; `noise` is also true on reset records that were noise). */
export const isNoise = (row) => row.status === "noise" || row.noise === true;

/** Indices of the rows passing `filter`:
 *  {text: "words all present in names/op/target/module", beyond: bool, hideNoise: bool, col: "err_abs",
 *   min, max, status} */
export function filterIndex(rows, filter = {}, tol = {}) {
  const words = (filter.text || "").toLowerCase().split(/\s+/).filter(Boolean);
  const col = filter.col || "err_abs";
  const min = filter.min === "" || filter.min === undefined || filter.min === null ? null : Number(filter.min);
  const max = filter.max === "" || filter.max === undefined || filter.max === null ? null : Number(filter.max);
  const out = new Uint32Array(rows.length);
  let n = 0;
  for (let k = 0; k < rows.length; k++) {
    const row = rows[k];
    if (filter.status && row.status !== filter.status) continue;
    if (filter.hideNoise && isNoise(row)) continue;
    if (words.length) {
      const s = searchText(row);
      let ok = true;
      for (const w of words) if (!s.includes(w)) { ok = false; break; }
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
