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
      const inB = items.some((c) => c.side === "b");
      if (inB) head.textContent = `Culprits in b: where b departs from a (${items.length})`;
      for (const c of items) {
        if (c.side === "b") { list.append(bItem(c, onSelect)); continue; }
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

/** A culprit in b (two models, BCulprit): the node of b, its op, the transformation that made it, its
 *  err_local (fed a's values) and how far beyond what its precision explains. */
function bItem(c, onSelect) {
  const name = h("button", {
    class: "sbs-culprit-link",
    text: visible(`${c.op_type || "?"} ${c.onnx_node || c.b_value || "?"}`),
    title: `select ${visible(c.b_value || c.a_value || "")} in the table`,
    style: { fontFamily: "var(--sbs-mono, monospace)", cursor: "pointer" },
    onclick: () => { if (Number.isInteger(c.i)) onSelect(c.i); },
  });
  const value = c.b_value ? ` (b value ${visible(c.b_value)}${c.a_value && c.a_value !== c.b_value ? `, a value ${visible(c.a_value)}` : ""})` : "";
  return h("li", { "data-i": String(c.i), "data-side": "b", "data-node": c.onnx_node || "" }, name,
    h("span", { class: "sbs-muted", text: `${value} err_local ${fmt(c.err_local)}, ${fmt(c.excess)}× its precision: ` }),
    h("span", { class: "sbs-culprit-transformation", text: visible(c.transformation || c.precision || "", true) }));
}
