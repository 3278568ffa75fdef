// A model without a kernel, for the offline HTML report: state frozen in the page, rows served from
// the embedded data through the same get_rows protocol the kernel answers.

import { MESSAGES } from "./rules.js";
import { createView } from "./view.js";

export function createStaticModel({ state, runs }) {
  const values = { ...state, _static: true };
  const handlers = new Map();
  const emit = (event, ...args) => { for (const cb of handlers.get(event) || []) cb(...args); };
  const encoder = new TextEncoder();
  return {
    get: (key) => values[key],
    set(key, value) { values[key] = value; emit(`change:${key}`); },
    save_changes() {},
    on(event, cb) { if (!handlers.has(event)) handlers.set(event, new Set()); handlers.get(event).add(cb); },
    off(event, cb) { handlers.get(event)?.delete(cb); },
    send(msg) {
      if (!msg || msg.type !== MESSAGES.get_rows) return;
      const rows = (runs[msg.run] || []).slice(msg.start, msg.start + (msg.limit || Infinity));
      const buffer = encoder.encode(JSON.stringify(rows));
      setTimeout(() => emit("msg:custom", { type: MESSAGES.rows, run: msg.run, start: msg.start, reply: true }, [buffer]), 0);
    },
  };
}

/** Mount the view in a plain page. data: {state: {trait: value}, runs: {id: [[row values]...]}} */
export function renderStatic(el, data, mountGraphs, prewarmGraphs) {
  return createView({ model: createStaticModel(data), el, mountGraphs, prewarmGraphs });
}
