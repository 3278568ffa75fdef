// Keeps the view's copy of each run's rows in step with the kernel. The model says how many rows a
// run has (progress.n_rows for the streaming run, runs_meta[].n_records for finished ones); the view
// asks (get_rows) for what it lacks. Batches pushed while a run streams are taken when they continue
// what the view holds; anything else is asked for again, so no message sent before the view existed
// is ever needed.

import { RunRows, decodeRows } from "./rows.js";
import { MESSAGES } from "./rules.js";

const REQUEST_RETRY_MS = 5000; // a get_rows unanswered this long (kernel restarted) is asked again
const FIRST_PAGE = 1000; // a small first page paints the table fast; the rest follows in big pages
const PAGE = 25000;

export function createRowSync(model, onRows) {
  const runs = new Map(); // run id -> RunRows
  const runOf = (id) => { if (!runs.has(id)) runs.set(id, new RunRows()); return runs.get(id); };

  function expected(id) {
    const p = model.get("progress") || {};
    if (id === p.run) return p.n_rows || 0;
    return ((model.get("runs_meta") || [])[id] || {}).n_records || 0;
  }

  function request(id) {
    if (id === undefined || id === null || id < 0) return;
    const st = runOf(id);
    if (st.rows.length >= expected(id)) return;
    const now = Date.now();
    if (st.pendingSince && now - st.pendingSince < REQUEST_RETRY_MS) return;
    st.pendingSince = now;
    model.send({ type: MESSAGES.get_rows, run: id, start: st.rows.length, limit: st.rows.length ? PAGE : FIRST_PAGE });
  }

  function onMessage(msg, buffers) {
    if (!msg || msg.type !== MESSAGES.rows || !buffers || !buffers.length) return;
    const st = runOf(msg.run);
    if (msg.reply) st.pendingSince = 0;
    if (msg.start <= st.rows.length && st.add(msg.start, decodeRows(buffers[0], model.get("columns"), msg.start))) {
      onRows(msg.run);
    }
    request(msg.run);
  }
  model.on("msg:custom", onMessage);

  return {
    rows: (id) => (runs.get(id) || { rows: [] }).rows,
    /** How many rows run `id` has, as the model says. */
    expected,
    request,
    dispose: () => model.off("msg:custom", onMessage),
  };
}
