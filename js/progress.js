// The progress line: nodes done on each side, time, current node, counts by status, worst error.
// The bar says how the run ended: full and green when done (whatever the counts last sent while it
// ran), red and as far as it got when stopped or failed; the end shows at once, with no transition.

import { h, clear } from "./dom.js";
import { fmtErr, fmtInt, fmtSeconds, visible } from "./format.js";
import { toNumber } from "./rows.js";
import { STATUSES } from "./rules.js";

export function createProgress({ onWorst }) {
  const badge = h("span", { class: "sbs-badge", "data-status": "idle", text: "idle" });
  const fill = h("div");
  const meter = h("div", { class: "sbs-meter", title: "FX nodes done", role: "progressbar", "aria-valuemin": "0", "aria-valuemax": "100", "data-state": "idle" }, fill);
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
    update(status, p, error) {
      badge.dataset.status = status;
      badge.textContent = status;
      const fxTotal = p.fx_total || 0;
      const fxDone = Math.min(p.fx_done || 0, fxTotal || Infinity);
      const end = meterState(status);
      const pct = end === "done" ? 100 : fxTotal ? (100 * fxDone) / fxTotal : 0;
      const label = `${Math.floor(pct)}%`;
      meter.dataset.state = end;
      meter.setAttribute("aria-valuenow", String(Math.round(pct)));
      state.dataset.state = end;
      state.textContent = { done: label, stopped: `stopped at ${label}`, error: `failed at ${label}`, running: label }[end] || "";
      meter.setAttribute("aria-valuetext", state.textContent || status);
      fill.style.width = `${pct}%`;
      const parts = [];
      if (fxTotal) parts.push(`FX ${fmtInt(fxDone)}/${fmtInt(fxTotal)}`);
      if (p.onnx_total) parts.push(`ONNX ${fmtInt(p.onnx_done || 0)}/${fmtInt(p.onnx_total)}`);
      parts.push(`${fmtInt(p.n_rows || 0)} records`);
      if (p.elapsed !== undefined && p.elapsed !== null) parts.push(fmtSeconds(p.elapsed));  // null: records computed elsewhere
      if (p.eta !== null && p.eta !== undefined && !p.finished) parts.push(`~${fmtSeconds(p.eta)} left`);
      text.textContent = parts.join(" · ");
      current.textContent = p.current && !p.finished ? visible(p.current) : "";
      current.title = current.textContent;
      clear(counts);
      const c = p.counts || {};
      for (const s of STATUSES) {
        if (c[s]) counts.append(h("span", { class: "sbs-chip", "data-status": s, text: `${s} ${fmtInt(c[s])}` }));
      }
      const w = toNumber(p.worst);
      worst.hidden = w === null;
      worst.textContent = w === null ? "" : `worst ${fmtErr(w)} · ${visible(p.worst_name || "")}`;
      message.hidden = !error;
      message.textContent = visible(error || "", true);
    },
  };
}

/** The bar's state for a widget status: idle, running (preparing too), done, stopped or error. */
export function meterState(status) {
  if (status === "done" || status === "stopped" || status === "error") return status;
  return status === "running" || status === "preparing" ? "running" : "idle";
}
