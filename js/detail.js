// The detail of one record: both sides, every error figure, the rounding verdict and the |diff| histogram.

import { h, clear } from "./dom.js";
import { fmtErr, fmtInt, fmtSeconds, messageText, visible } from "./format.js";
import { colorFor, HISTOGRAM_EDGES } from "./rules.js";

function kv(pairs) {
  const grid = h("div", { class: "sbs-kv" });
  for (const [k, v] of pairs) {
    if (v === null || v === undefined || v === "") continue;
    grid.append(h("div", { text: k }), h("div", { text: visible(v) })); // full names, hidden characters escaped
  }
  return grid;
}

function histogram(counts) {
  const max = Math.max(1, ...counts);
  const bars = h("div", { class: "sbs-hist" });
  const labels = h("div", { class: "sbs-hist-labels" });
  counts.forEach((n, b) => {
    const lo = HISTOGRAM_EDGES[b];
    const hi = HISTOGRAM_EDGES[b + 1];
    const range = hi === undefined ? `≥ ${lo.toExponential(0)}` : `[${lo === 0 ? "0" : lo.toExponential(0)}, ${hi.toExponential(0)})`;
    // log height: one element beyond tolerance must stay visible next to a million within it
    const height = n ? 8 + 92 * (Math.log10(n + 1) / Math.log10(max + 1)) : 0;
    const bar = h("div", { class: "sbs-hist-bar", style: { height: `${height}%`, background: colorFor(hi === undefined ? lo * 10 : hi, "ok") } });
    bars.append(h("div", { title: `${range}: ${fmtInt(n)} elements` }, bar));
    labels.append(h("div", { text: b === 0 ? "0" : lo.toExponential(0).replace("e+", "e") }));
  });
  return h("div", {}, bars, labels);
}

const has = (v) => v !== null && v !== undefined;

/** How many times farther: "37×", "2.5×", "1.2e+4×". */
function times(x) {
  if (!Number.isFinite(x)) return "∞×";
  return `${x >= 100 && x < 1e4 ? Math.round(x) : x.toPrecision(2)}×`;
}

/** The rounding verdict: both runtimes against the node rerun in float64 on torch's inputs. */
function rounding(row) {
  const block = h("div", { class: "sbs-rounding" },
    kv([["torch vs float64", fmtErr(row.err_torch)], ["onnxruntime vs float64", fmtErr(row.err_onnx)],
      ["reference scale", fmtErr(row.ref_scale)]]));
  let text = null;
  if (row.noise === true) text = "rounding: onnxruntime about as close to exact as torch";
  else if (row.noise === false) {
    const t = row.err_torch, o = row.err_onnx;
    if (has(t) && has(o) && t > 0 && o / t > 1) text = `beyond rounding: onnxruntime ${times(o / t)} farther from exact than torch`;
    else if (t === 0 && o > 0) text = "beyond rounding: torch is exact, onnxruntime is not";
    else text = "beyond rounding";
  }
  if (text) block.append(h("div", { class: "sbs-verdict", "data-noise": String(row.noise), text }));
  return block;
}

/** ctx: {atol, rtol, within: bool|null (at the current tolerances), inside: what the row's inner values
 *  say ("9 inside · 1 mismatch") or null} */
export function renderDetail(container, row, ctx) {
  clear(container);
  if (!row) {
    container.append(h("div", { class: "sbs-muted", text: "Click a row to see its detail." }));
    return;
  }
  const verdict = ctx.within === null ? "not compared" : ctx.within ? "within tolerance" : "beyond tolerance";
  container.append(
    h("div", { class: "sbs-bar" },
      h("span", { class: "sbs-badge", "data-status": row.status, text: row.status }),
      h("span", { class: "sbs-muted", text: `#${row.i} · ${row.kind} · ${verdict}` })),
    h("h4", { text: "errors" }),
    kv([["err_abs", fmtErr(row.err_abs)], ["err_rel", fmtErr(row.err_rel)], ["err_dev", fmtErr(row.err_dev)],
      ["err_local", fmtErr(row.err_local)], ["min atol", fmtErr(row.min_atol)], ["err_nan", row.err_nan], ["> 0.1", fmtInt(row.err_h01)],
      ["> 0.01", fmtInt(row.err_h001)], ["elements", fmtInt(row.n_elements)],
      // at the run's tolerances: which indices of each axis hold the elements beyond it
      ["beyond tolerance at", row.err_where]]),
  );
  if (has(row.err_torch) || has(row.err_onnx)) container.append(h("h4", { text: "rounding (float64 reference)" }), rounding(row));
  if (Array.isArray(row.histogram) && row.histogram.length) {
    container.append(h("h4", { text: "|diff| histogram" }), histogram(row.histogram));
  }
  container.append(
    h("h4", { text: "torch.export (FX)" }),
    // an inner value: the FX node whose ONNX translation computes it, the torch op it is compared with
    kv([["name", row.ep_name], ["inside", row.inner_of], ["torch op", row.kind === "inner" ? row.inner_op || "unpaired" : null],
      ["target", row.ep_target], ["shape", row.ep_shape_type], ["origin", row.ep_origin],
      ["time", fmtSeconds(row.ep_time_run)], ["values inside", ctx.inside]]),
    h("h4", { text: "ONNX" }),
    kv([["value", row.onnx_name], ["node", row.onnx_node_name], ["op", row.onnx_op_type], ["shape", row.onnx_shape_type],
      ["time", fmtSeconds(row.onnx_time_run)]]),
  );
  // two models (SbsWidget.from_models): the value's twin in b, its verdict, or why it has none
  if (has(row.b_name) || has(row.b_status) || row.b_comment) {
    container.append(h("h4", { text: "ONNX b (transformed)" }),
      kv([["value", row.b_name ?? "no twin in b"], ["node", row.b_node_name], ["op", row.b_op_type], ["paired by", row.b_paired_by],
        ["err_abs", has(row.b_err_abs) ? fmtErr(row.b_err_abs) : null], ["err_rel", has(row.b_err_rel) ? fmtErr(row.b_err_rel) : null],
        ["err_local", has(row.b_err_local) ? fmtErr(row.b_err_local) : null], ["verdict", row.b_status], ["why", row.b_comment]]));
  }
  if (row.module) container.append(h("h4", { text: "module" }), h("div", { class: "sbs-trace", text: visible(row.module) }));
  if (row.stack_trace) container.append(h("h4", { text: "stack trace" }), h("div", { class: "sbs-trace", text: visible(row.stack_trace, true) }));
  if (row.comment) container.append(h("h4", { text: "comment" }), h("div", { class: "sbs-trace", text: messageText(row.comment) }));
}
