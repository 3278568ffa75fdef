// Two ONNX models of one program (issue 47): SbsWidget.from_models compares the export `a` and a transformed
// copy `b` (quantized, float16, optimized...) against the torch program in one run. Each row carries its
// twin in b (record fields b_name, b_err_abs, b_err_local, b_status, b_comment...): the table shows them as
// a third family of columns, the panel above the table says how b went and filters the rows where b
// departs (b_status departs or inherits: shared_rules.B_DEPARTS). State: the `models_b` trait
// (sbs_widget/views/models_view.py). Every model string goes in through textContent or an attribute.

import { h } from "./dom.js";
import { fmtInt, visible } from "./format.js";
import { B_DEPARTS } from "./spec.gen.js";

const num = (v) => (typeof v === "number" && Number.isFinite(v) ? v : null);

/** Whether b departs at this row (its own nodes, or a departure upstream it inherits). */
export const isBDeparts = (row) => Boolean(row) && B_DEPARTS.includes(row.b_status);

/** The b verdict cell: the status, else why the value has no twin in b (b_comment: "fused into ..."). */
export function bVerdictText(row) {
  if (row.b_status) return visible(row.b_status);
  if (row.b_name === null || row.b_name === undefined) return row.b_comment ? `no twin: ${visible(row.b_comment)}` : "";
  return "";
}

/** The b columns of the table, after a's error columns. */
export const B_COLUMNS = [
  { key: "b_name", label: "b name", width: "minmax(96px, 1.2fr)", cls: "sbs-b-col", title: "the value of b paired with the row's ONNX value (b = the transformed copy of a)" },
  { key: "b_err_abs", label: "b err_abs", width: "70px", num: true, err: true, title: "max |torch - b|: b's value against the same torch value" },
  { key: "b_err_local", label: "b err_local", width: "70px", num: true, err: true, title: "b's nodes computing this value, fed a's values: their error against a's, relative to the value's magnitude" },
  { key: "b_status", label: "b verdict", width: "minmax(84px, 0.9fr)", cls: "sbs-b-verdict", title: "same · follows a · departs (b's own nodes) · inherits (a departure upstream) · rounding (b's precision); no twin: why",
    text: bVerdictText, tip: (row) => visible(row.b_comment || row.b_status || "") },
];

/** What the panel shows of a `models_b` state, as plain data (tests read it). */
export function describeModels(state) {
  const s = state && typeof state === "object" ? state : {};
  const status = typeof s.status === "string" ? s.status : "";
  if (!status) return { state: "" };
  const counts = s.counts && typeof s.counts === "object" ? s.counts : {};
  const parts = Object.entries(counts).map(([k, n]) => `${fmtInt(n)} ${visible(k)}`);
  const summary = status === "done"
    ? `${fmtInt(num(s.n_paired) ?? 0)} of ${fmtInt(num(s.n_records) ?? 0)} rows paired with b · ${fmtInt(num(s.n_departs) ?? 0)} where b departs`
      + (num(s.n_culprits) === null ? "" : ` · ${fmtInt(s.n_culprits)} culprit${s.n_culprits === 1 ? "" : "s"} in b`)
      + (parts.length ? ` (${parts.join(", ")})` : "")
    : status === "error" ? `failed: ${visible(String(s.message || ""), true)}` : visible(String(s.message || status));
  return { state: status, summary, departs: num(s.n_departs) ?? 0 };
}

/** The panel: the comparison's summary and the "b departs" filter. onFilter(checked). */
export function createModelsPanel({ onFilter }) {
  const summary = h("span", { class: "sbs-models-summary" });
  const only = h("input", { type: "checkbox", "aria-label": "b departs" });
  const el = h("div", { class: "sbs-models", hidden: true },
    h("span", { class: "sbs-models-title", text: "Two models (a, b)" }), summary,
    h("label", { title: "only the rows where b departs from a: b's own nodes (departs), or a departure upstream (inherits)" }, only, "b departs"));
  only.addEventListener("change", () => onFilter(only.checked));
  return {
    el,
    active: () => !el.hidden,
    onlyDeparts: () => only.checked && !el.hidden,
    update(state) {
      const d = describeModels(state);
      el.hidden = d.state === "";
      el.dataset.state = d.state;
      summary.textContent = d.summary || "";
    },
  };
}

export const MODELS_CSS = `
.sbs-models { background: var(--sbs-bg2); border-radius: 3px; padding: 4px 8px; display: flex; flex-wrap: wrap; align-items: center; gap: 4px 10px; }
.sbs-models[hidden] { display: none; }
.sbs-models-title { font-weight: 700; }
.sbs-models-summary { font-weight: 600; }
.sbs-models[data-state=error] .sbs-models-summary { color: var(--sbs-bad); }
/* the verdict on the theme's background, whatever the row's error tint (a's error) under it */
.sbs-row .sbs-b-verdict:not(:empty) { background: var(--sbs-bg); border-radius: 3px; }
.sbs-row[data-b-status=departs] .sbs-b-verdict, .sbs-row[data-b-status=inherits] .sbs-b-verdict { color: var(--sbs-bad); font-weight: 600; }
.sbs-row[data-b-status=rounding] .sbs-b-verdict { color: var(--sbs-noise); }
.sbs-row[data-b-twin=none] .sbs-b-verdict { color: var(--sbs-fg2); font-style: italic; }
`;
