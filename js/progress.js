// The progress line: nodes done on each side, time, current node, counts by status, worst error.

import { h, clear } from "./dom.js";
import { fmtErr, fmtInt, fmtSeconds, visible } from "./format.js";
import { toNumber } from "./rows.js";
import { STATUSES } from "./rules.js";

export function createProgress({ onWorst }) {
  const badge = h("span", { class: "sbs-badge", "data-status": "idle", text: "idle" });
  const fill = h("div");
  const meter = h("div", { class: "sbs-meter", title: "FX nodes done" }, fill);
  const text = h("span", { class: "sbs-num" });
  const current = h("span", { class: "sbs-current sbs-mono sbs-muted" });
  const counts = h("span", { class: "sbs-bar" });
  const worst = h("button", { class: "sbs-mono", title: "select the record with the largest err_abs", hidden: true });
  worst.addEventListener("click", () => onWorst());
  const message = h("div", { class: "sbs-message", hidden: true });
  return {
    badge,
    main: [badge, meter, text, current],
    counts: [counts, worst],
    message,
    update(status, p, error) {
      badge.dataset.status = status;
      badge.textContent = status;
      const fxTotal = p.fx_total || 0;
      const fxDone = Math.min(p.fx_done || 0, fxTotal || Infinity);
      fill.style.width = fxTotal ? `${(100 * fxDone) / fxTotal}%` : status === "done" ? "100%" : "0";
      const parts = [];
      if (fxTotal) parts.push(`FX ${fmtInt(fxDone)}/${fmtInt(fxTotal)}`);
      if (p.onnx_total) parts.push(`ONNX ${fmtInt(p.onnx_done || 0)}/${fmtInt(p.onnx_total)}`);
      parts.push(`${fmtInt(p.n_rows || 0)} records`);
      if (p.elapsed !== undefined) parts.push(fmtSeconds(p.elapsed));
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
