// What changed since the previous run (computed in the kernel: widget_rows.compare_runs).

import { h, clear } from "./dom.js";
import { fmtErr, fmtInt, visible } from "./format.js";
import { toNumber } from "./rows.js";

function nameList(label, names, total) {
  if (!total) return null;
  const list = h("ul", {}, names.map((n) => h("li", { text: visible(n) })));
  if (total > names.length) list.append(h("li", { class: "sbs-muted", text: `… ${fmtInt(total - names.length)} more` }));
  return h("details", {}, h("summary", { text: `${fmtInt(total)} ${label}` }), list);
}

export function renderCompare(el, cmp, runsMeta) {
  clear(el);
  el.hidden = !cmp || cmp.after === undefined;
  if (el.hidden) return;
  const worst = (w) => (w ? `${fmtErr(toNumber(w.err_abs))} (${visible(w.name)})` : "–");
  const resetNames = (runsMeta[cmp.after] || {}).reset_names || [];
  const parts = [
    h("span", { class: "sbs-title", text: `Run #${cmp.after} vs #${cmp.before}` }),
    h("span", { class: "sbs-muted", text: resetNames.length ? ` · reset ${resetNames.length}` : " · no reset" }),
    h("span", { class: "sbs-mono", text: ` · worst ${worst(cmp.worst_before)} → ${worst(cmp.worst_after)}` }),
    h("span", { text: cmp.n_moved_in || cmp.n_moved_out ? "" : " · no record crossed the tolerance" }),
    nameList("moved into tolerance", cmp.moved_in || [], cmp.n_moved_in || 0),
    nameList("moved out of tolerance", cmp.moved_out || [], cmp.n_moved_out || 0),
  ];
  el.append(...parts.filter(Boolean));
}
