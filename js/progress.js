// The progress line: nodes done on each side, time, current node, counts by status, worst error.
// The bar says how the run ended: full and green when done (whatever the counts last sent while it
// ran), red and as far as it got when stopped or failed; the end shows at once, with no transition.

import { h, clear } from "./dom.js";
import { fmtErr, fmtInt, fmtSeconds, messageText, visible } from "./format.js";
import { toNumber } from "./rows.js";
import { STATUSES } from "./rules.js";

export function createProgress({ onWorst }) {
  const badge = h("span", { class: "sbs-badge", "data-status": "idle", text: "idle" });
  const fill = h("div");
  const eta = createEta();
  const meter = h("div", { class: "sbs-meter", title: "nodes done on the slower side (FX or ONNX)", role: "progressbar", "aria-valuemin": "0", "aria-valuemax": "100", "data-state": "idle" }, fill);
  const state = h("span", { class: "sbs-progress-state", "data-state": "idle" });
  const text = h("span", { class: "sbs-num" });
  const current = h("span", { class: "sbs-current sbs-mono sbs-muted" });
  const counts = h("span", { class: "sbs-bar" });
  const worst = h("button", { class: "sbs-mono", title: "select the record with the largest err_abs", hidden: true });
  worst.addEventListener("click", () => onWorst());
  const message = h("div", { class: "sbs-message", hidden: true });
  return {
    badge,
    meter,
    main: [badge, meter, state, text, current],
    counts: [counts, worst],
    message,
    update(status, p, error, opts = {}) {
      badge.dataset.status = status;
      badge.textContent = status;
      const end = meterState(status);
      const frac = doneFraction(p);
      const pct = end === "done" ? 100 : 100 * frac;
      const label = `${Math.floor(pct)}%`;
      // no record yet while it runs: the export and the alignment, not the comparison, take the time
      const preparing = end === "running" && !(p.n_rows > 0) && !(p.fx_done > 0);
      meter.dataset.state = end;
      meter.setAttribute("aria-valuenow", String(Math.round(pct)));
      state.dataset.state = end;
      state.textContent = preparing ? "preparing"
        : { done: label, stopped: `stopped at ${label}`, error: `failed at ${label}`, running: label }[end] || "";
      meter.setAttribute("aria-valuetext", state.textContent || status);
      fill.style.width = `${pct}%`;
      const fxTotal = p.fx_total || 0;
      const parts = [];
      if (fxTotal) parts.push(`FX ${fmtInt(Math.min(p.fx_done || 0, fxTotal))}/${fmtInt(fxTotal)}`);
      if (p.onnx_total) parts.push(`ONNX ${fmtInt(Math.min(p.onnx_done || 0, p.onnx_total))}/${fmtInt(p.onnx_total)}`);
      parts.push(`${fmtInt(p.n_rows || 0)} records`);
      if (p.elapsed !== undefined && p.elapsed !== null) parts.push(fmtSeconds(p.elapsed));  // null: records computed elsewhere
      const left = preparing || p.finished || end !== "running" ? null : eta.update(p, frac);
      if (preparing) eta.reset();
      if (left !== null) parts.push(`~${fmtSeconds(left)} left`);
      text.textContent = parts.join(" · ");
      text.title = text.textContent;
      current.textContent = p.current && !p.finished ? visible(p.current) : "";
      current.title = current.textContent;
      clear(counts);
      const c = p.counts || {};
      for (const s of STATUSES) {
        if (c[s]) counts.append(h("span", { class: "sbs-chip", "data-status": s, text: `${s} ${fmtInt(c[s])}` }));
      }
      // a reset pair was fixed on purpose: never the worst (the kernel leaves it out; an older kernel may not)
      const w = opts.worstIsReset ? null : toNumber(p.worst);
      worst.hidden = w === null;
      worst.textContent = w === null ? "" : `worst ${fmtErr(w)} · ${visible(p.worst_name || "")}`;
      message.hidden = !error;
      message.textContent = messageText(error || "");
    },
  };
}

/** How far a run is, 0..1: the slower of FX done/total and ONNX done/total (ONNX when its total is
 *  known), so the bar never says 99% with most ONNX nodes to go. */
export function doneFraction(p) {
  const side = (done, total) => (total > 0 ? Math.min(Math.max(done || 0, 0), total) / total : null);
  const fx = side(p.fx_done, p.fx_total);
  const onnx = side(p.onnx_done, p.onnx_total);
  if (fx === null) return onnx ?? 0;
  return onnx === null ? fx : Math.min(fx, onnx);
}

/** The time left, from the pace since the first record this view saw (elapsed and the fraction done at
 *  that point), so the preparation before any record (export, alignment) does not slow the estimate.
 *  update(p, frac) -> seconds or null (no pace yet); reset() when a new run starts. Uses the run's own
 *  `elapsed`, never the clock. */
export function createEta() {
  let start = null; // {run, elapsed, frac}
  let last = null; // {run, elapsed, frac, left}: the same state again gives the same answer
  return {
    reset() { start = last = null; },
    update(p, frac) {
      const elapsed = p.elapsed;
      if (elapsed === null || elapsed === undefined || !Number.isFinite(elapsed)) return null;
      if (last && last.run === p.run && last.elapsed === elapsed && last.frac === frac) return last.left;
      const left = this.estimate(p.run, elapsed, frac);
      last = { run: p.run, elapsed, frac, left };
      return left;
    },
    estimate(run, elapsed, frac) {
      if (!start || start.run !== run || elapsed < start.elapsed || frac < start.frac) {
        start = { run, elapsed, frac };
        return null;
      }
      const df = frac - start.frac;
      const dt = elapsed - start.elapsed;
      if (!(df > 0) || !(dt > 0)) return null;
      return (dt / df) * Math.max(0, 1 - frac);
    },
  };
}

/** The bar's state for a widget status: idle, running (preparing too), done, stopped or error. */
export function meterState(status) {
  if (status === "done" || status === "stopped" || status === "error") return status;
  return status === "running" || status === "preparing" ? "running" : "idle";
}
