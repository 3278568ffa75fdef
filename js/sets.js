// Input sets (project issue 50, item 4): SbsWidget.from_input_sets compares the pair on many input sets;
// each row of the table is an aligned pair with its SPREAD across the inputs as columns (keys
// "spread:<field>", shared_rules.SPREAD_FIELDS): max and median err_abs, how many inputs are beyond
// tolerance (n_beyond of n_inputs), the worst input (its index and label), and whether the pair is
// input-dependent (beyond tolerance on some inputs only: the row is marked). The panel above the table
// says how many inputs and input-dependent pairs there are, filters to the input-dependent rows, and
// picks an input whose own records the kernel then shows as a run (message {type: "input", input: k},
// k null: all inputs), the selected row's worst input in one click. State: the `input_spread` trait
// (sbs_widget/views/sets_view.py). Every model string goes in through textContent or an attribute.

import { h, clear } from "./dom.js";
import { labelText, visible } from "./format.js";
import { MESSAGES, SPREAD_PREFIX } from "./rules.js";

export const INPUT_MESSAGE = MESSAGES.input;
export const DEPENDENT = `${SPREAD_PREFIX}input_dependent`;

/** Whether `key` is a spread column ("spread:err_abs_max"). */
export const isSpread = (key) => typeof key === "string" && key.startsWith(SPREAD_PREFIX);
const num = (v) => (typeof v === "number" ? v : null);
const list = (v) => (Array.isArray(v) ? v : []);

/** Whether a row is an input-dependent pair (its spread says so). */
export const isInputDependent = (row) => Boolean(row) && row[DEPENDENT] === true;

/** "#3 ((T1s2x16x16,),{})": an input by its index and label (text only: labels come from the inputs). */
export function inputText(k, label, limit = 40) {
  if (!Number.isInteger(k)) return "";
  return label ? `#${k} ${labelText(String(label), limit)}` : `#${k}`;
}

const SPREAD_COLUMNS = {
  err_abs_max: { label: "max err", width: "70px", num: true, err: true, title: "largest err_abs over the input sets" },
  err_abs_median: { label: "median err", width: "70px", num: true, err: true, title: "median err_abs over the input sets" },
  n_beyond: { label: "beyond", width: "58px", num: true, title: "inputs on which the pair is beyond tolerance, of the inputs it was compared on",
    text: (row) => (num(row[`${SPREAD_PREFIX}n_inputs`]) === null ? "" : `${row[`${SPREAD_PREFIX}n_beyond`] ?? 0}/${row[`${SPREAD_PREFIX}n_inputs`]}`) },
  worst_input: { label: "worst input", width: "minmax(90px, 1fr)", title: "the input of the largest err_abs (select the row, then \"show worst input\")",
    text: (row) => inputText(row[`${SPREAD_PREFIX}worst_input`], row[`${SPREAD_PREFIX}worst_label`]) },
  input_dependent: { label: "input-dep.", width: "76px", cls: "sbs-spread-dep", title: "input-dependent: beyond tolerance (mismatch) on some inputs only",
    text: (row) => (isInputDependent(row) ? "◆ yes" : "") },
};

/** The table's spread columns for the model's `columns` (those present, in SPREAD_FIELDS order). */
export function spreadColumns(keys = []) {
  return keys.filter(isSpread).map((key) => {
    const spec = SPREAD_COLUMNS[key.slice(SPREAD_PREFIX.length)];
    return spec ? { key, ...spec } : null;
  }).filter(Boolean);
}

/** What the panel shows of an `input_spread` state, as plain data (tests read it). */
export function describeSets(state) {
  const s = state && typeof state === "object" ? state : {};
  const status = typeof s.status === "string" ? s.status : "";
  if (!status) return { state: "", inputs: [] };
  const labels = list(s.labels);
  const errors = list(s.errors);
  const inputs = labels.map((label, k) => ({ k, text: inputText(k, label, 60), failed: Boolean(errors[k]), error: errors[k] ? visible(String(errors[k]), true) : "" }));
  const n = num(s.n_inputs) ?? inputs.length;
  const dep = num(s.n_input_dependent) ?? 0;
  const summary = status === "done" ? `${n} input set${n === 1 ? "" : "s"} · ${dep} input-dependent pair${dep === 1 ? "" : "s"}`
    + (errors.filter(Boolean).length ? ` · ${errors.filter(Boolean).length} failed` : "")
    : status === "error" ? `failed: ${visible(String(s.message || ""), true)}` : visible(String(s.message || "comparing the input sets"));
  return { state: status, summary, inputs, n, dependent: dep };
}

/** The panel. update(state, {live, shownInput, row}): `shownInput` the input whose records the table shows
 *  (null: all inputs), `row` the selected row (its worst input gets a button). onInput(k | null). */
export function createSetsPanel({ onInput, onFilter }) {
  const summary = h("span", { class: "sbs-sets-summary" });
  const only = h("input", { type: "checkbox", "aria-label": "input-dependent only" });
  const select = h("select", { "aria-label": "input set" });
  const worst = h("button", { type: "button", class: "sbs-sets-worst", hidden: true });
  const el = h("div", { class: "sbs-sets", hidden: true },
    h("span", { class: "sbs-sets-title", text: "Input sets" }), summary,
    h("label", { title: "only the pairs beyond tolerance on some inputs but not all" }, only, "input-dependent only"),
    h("label", {}, "show ", select), worst);
  only.addEventListener("change", () => onFilter(only.checked));
  select.addEventListener("change", () => onInput(select.value === "" ? null : Number(select.value)));
  let worstK = null;
  worst.addEventListener("click", () => { if (Number.isInteger(worstK)) onInput(worstK); });
  let last = null;
  return {
    el,
    onlyDependent: () => only.checked,
    describe: () => last,
    update(state, { live = true, shownInput = null, row = null } = {}) {
      const d = describeSets(state);
      last = d;
      el.hidden = d.state === "";
      el.dataset.state = d.state;
      summary.textContent = d.summary || "";
      clear(select);
      select.append(h("option", { value: "", text: "all inputs (spread)", selected: shownInput === null }),
        ...d.inputs.map((x) => h("option", { value: String(x.k), text: `${x.text}${x.failed ? " (failed)" : ""}`, title: x.error || x.text, selected: shownInput === x.k })));
      select.disabled = !live || d.state !== "done";
      worstK = row ? row[`${SPREAD_PREFIX}worst_input`] : null;
      worst.hidden = !Number.isInteger(worstK) || !live || d.state !== "done";
      worst.textContent = worst.hidden ? "" : `show worst input ${inputText(worstK, null)}`;
      worst.title = worst.hidden ? "" : `the records of ${inputText(worstK, row[`${SPREAD_PREFIX}worst_label`], 200)}, the input of this pair's largest error`;
    },
  };
}

export const SETS_CSS = `
.sbs-sets { background: var(--sbs-bg2); border-radius: 3px; padding: 4px 8px; display: flex; flex-wrap: wrap; align-items: center; gap: 4px 10px; }
.sbs-sets-title { font-weight: 700; }
.sbs-sets[hidden] { display: none; }
.sbs-sets-summary { font-weight: 600; }
.sbs-sets[data-state=error] .sbs-sets-summary { color: var(--sbs-bad); }
.sbs-row[data-input-dependent=true] .sbs-spread-dep { color: var(--sbs-bad); font-weight: 600; }
`;
