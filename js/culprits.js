// The culprits panel: where the discrepancy starts (computed in Python after a run, trait `culprits`).
// Text only (textContent through h); a click selects the culprit's record in the table.

import { h, clear } from "./dom.js";
import { visible } from "./format.js";

const fmt = (x) => (typeof x === "number" && Number.isFinite(x) ? x.toPrecision(2) : "?");

export function createCulpritsPanel({ onSelect }) {
  const list = h("ol", { class: "sbs-culprits-list", style: { margin: "2px 0 0", paddingLeft: "22px", maxHeight: "160px", overflow: "auto" } });
  const head = h("summary", { text: "Culprits" });
  const el = h("details", { class: "sbs-culprits", open: true, hidden: true, style: { padding: "4px 8px" } }, head, list);
  return {
    el,
    update(culprits) {
      const items = Array.isArray(culprits) ? culprits : [];
      clear(list);
      el.hidden = items.length === 0;
      head.textContent = `Culprits: where the discrepancy starts (${items.length})`;
      for (const c of items) {
        const name = h("button", {
          class: "sbs-culprit-link",
          text: visible(`${c.onnx_op_type || "?"} ${c.onnx_node || c.onnx_name || "?"}`),
          title: `select ${visible(c.ep_name || c.onnx_name || "")} in the table`,
          style: { fontFamily: "var(--sbs-mono, monospace)", cursor: "pointer" },
          onclick: () => { if (Number.isInteger(c.i)) onSelect(c.i); },
        });
        const fx = (c.ep_name ? ` (FX ${visible(c.ep_name)})` : "") +
          (Number.isInteger(c.count) ? `, named on ${c.count} of ${c.n_inputs ?? "?"} inputs` : ""); // input sets: grouped
        list.append(h("li", { "data-i": String(c.i), "data-count": Number.isInteger(c.count) ? String(c.count) : null }, name, h("span", { class: "sbs-muted", text: `${fx} score ${fmt(c.score)}: ` }), h("span", { text: visible(c.reason || "", true) })));
      }
    },
  };
}
