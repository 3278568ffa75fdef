// jsdom globals for the view tests (node's test runner, no browser, no Jupyter).
import { JSDOM } from "jsdom";

export function setupDom() {
  const dom = new JSDOM("<!doctype html><html><body></body></html>", { pretendToBeVisual: true });
  const w = dom.window;
  for (const key of ["window", "document", "Node", "HTMLElement", "Blob", "URL", "navigator", "requestAnimationFrame", "cancelAnimationFrame"]) {
    Object.defineProperty(globalThis, key, { value: key === "window" ? w : w[key], configurable: true, writable: true });
  }
  return dom;
}

/** A model like anywidget's: traits, change events, custom messages; get_rows answered from `runs`. */
export function fakeModel(state, runs = {}) {
  const values = { ...state };
  const handlers = new Map();
  const sent = [];
  const emit = (event, ...args) => { for (const cb of [...(handlers.get(event) || [])]) cb(...args); };
  const model = {
    sent,
    saved: 0,
    get: (k) => values[k],
    set(k, v) { values[k] = v; emit(`change:${k}`); },
    save_changes() { model.saved++; },
    on(e, cb) { if (!handlers.has(e)) handlers.set(e, new Set()); handlers.get(e).add(cb); },
    off(e, cb) { handlers.get(e)?.delete(cb); },
    send(msg) {
      sent.push(msg);
      if (msg.type === "get_rows" && runs[msg.run]) model.reply(msg.run, msg.start, runs[msg.run].slice(msg.start, msg.start + msg.limit), true);
    },
    /** what the kernel's _publish / _send_page do */
    reply(run, start, rows, reply = false) {
      emit("msg:custom", { type: "rows", run, start, reply }, [new TextEncoder().encode(JSON.stringify(rows))]);
    },
    emit,
    listeners: () => [...handlers.values()].reduce((n, s) => n + s.size, 0),
  };
  return model;
}

export const COLUMNS = ["ep_name", "onnx_name", "onnx_node_name", "ep_target", "onnx_op_type", "ep_shape_type",
  "onnx_shape_type", "err_abs", "err_rel", "err_local", "err_nan", "status", "kind", "module", "stack_trace",
  "histogram", "within_tolerance", "comment", "err_where", "min_atol", "err_torch", "err_onnx", "ref_scale", "noise"];

export function makeRow(k, over = {}) {
  const r = {
    ep_name: `node_${k}`, onnx_name: `val_${k}`, onnx_node_name: `n${k}`, ep_target: "aten.add.Tensor",
    onnx_op_type: k % 3 ? "Add" : "MatMul", ep_shape_type: "f32[2,30,16]", onnx_shape_type: "f32[2,30,16]",
    err_abs: (k * 7919 % 1000) * 1e-7, err_rel: 1e-6, err_local: null, err_nan: 0, status: "ok", kind: "node",
    module: `decoder.layer${k % 4}`, stack_trace: "model.py:12 forward", histogram: [1, 2, 3, 0, 0, 0, 0, 0, 0, 0],
    within_tolerance: true, comment: "", err_where: null, min_atol: 0, err_torch: null, err_onnx: null, ref_scale: null,
    noise: null, ...over,
  };
  return COLUMNS.map((c) => r[c]);
}

export function baseState(n) {
  return {
    title: "t", status: "done", message: "", run_id: 0, columns: COLUMNS, atol: 1e-4, rtol: 1e-4, reset_names: [],
    compare: {}, fx_dot: "", onnx_dot: "",
    progress: { run: 0, n_rows: n, fx_done: n, fx_total: n, onnx_done: 0, onnx_total: 0, counts: { ok: n }, atol: 1e-4, rtol: 1e-4, finished: true, elapsed: 1 },
    runs_meta: [{ id: 0, status: "done", reset_names: [], atol: 1e-4, rtol: 1e-4, n_records: n }],
  };
}

export const tick = () => new Promise((r) => setTimeout(r, 30)); // lets requestAnimationFrame run
