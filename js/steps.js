// The step strip (project issue 50): the decode steps of SbsWidget(..., steps=N) above the table, one
// cell per step (step 0: the prompt). A cell is coloured by the closed loop's logits error on the one
// error scale of the table and the graphs (rules.js colorFor), with a bar below it for the open loop;
// it shows torch's tokens and the ONNX closed loop's (token ids as text). The first diverging step of
// each loop is marked, and a tie (a flipped token within float64 rounding) has its own mark whose
// tooltip is the kernel's comment, as text. A click asks the kernel for that step's lockstep run
// (message {type: "step", step}), which streams into the table as a run. State: the `decoding` trait
// (sbs_widget/views/steps_view.py). Every model string goes in through textContent or an attribute.

import { h, clear } from "./dom.js";
import { visible } from "./format.js";
import { colorFor, MESSAGES, NOT_COMPARED } from "./rules.js";

export const STEP_MESSAGE = MESSAGES.step;
const MAX_TOKENS = 4; // token ids shown per side in a cell (batch rows); the tooltip lists them all

/** A number sent as JSON: non-finite ones arrive as "Infinity" / "-Infinity" / "NaN". */
const num = (v) => (typeof v === "number" ? v : typeof v === "string" && v !== "" ? Number(v) : null);
const list = (v) => (Array.isArray(v) ? v : []);
const obj = (v) => (v && typeof v === "object" && !Array.isArray(v) ? v : null);
const isStep = (v) => Number.isInteger(v);

/** Token ids as text ("12 7", at most `limit`, then "…"); "" for none. */
export function tokensText(tokens, limit = MAX_TOKENS) {
  const t = list(tokens).map((x) => visible(String(x)));
  return t.length > limit ? `${t.slice(0, limit).join(" ")} …` : t.join(" ");
}

/** The table's status of a loop's logits: within tolerance "ok", beyond by rounding "noise", else "mismatch". */
export function loopStatus(loop) {
  if (!loop) return null;
  if (loop.within_tolerance) return "ok";
  return loop.noise === true ? "noise" : "mismatch";
}

/** The colour of a loop's step (the table's scale: its max abs error, noise off the scale). */
export function loopColor(loop) {
  return loop ? colorFor(num(loop.max_abs), loopStatus(loop)) : NOT_COMPARED;
}

const fmt = (v) => {
  const x = num(v);
  if (x === null || Number.isNaN(x)) return "?";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  return x === 0 ? "0" : Math.abs(x) >= 1e-3 && Math.abs(x) < 1e4 ? String(Number(x.toPrecision(4))) : x.toExponential(2);
};

function loopLine(name, loop) {
  if (!loop) return `${name} loop: stopped (a token flipped before: the two sides decode different texts)`;
  const verdict = loop.diverges ? "diverges" : loop.within_tolerance ? "within tolerance" : loop.noise === true ? "beyond tolerance by rounding" : "beyond tolerance";
  return `${name} loop: max |err| ${fmt(loop.max_abs)}, max rel ${fmt(loop.max_rel)}, cosine ${fmt(loop.cosine)}, ` +
    `top-5 ${fmt(loop.top5)}, tokens agree ${fmt(loop.token_agreement)}; ${verdict}` +
    (loop.comment ? `: ${visible(loop.comment)}` : "");
}

/** What the strip shows of a `decoding` state, as plain data (the strip draws it; tests read it):
 *  {state: "" | "running" | "error" | "done", message, done, total, first: {closed, open}, cells: [...]} */
export function describeSteps(state) {
  const s = obj(state) || {};
  const status = typeof s.status === "string" ? s.status : "";
  const done = num(s.done) ?? 0;
  const total = num(s.total) ?? 0;
  if (!status) return { state: "", cells: [] };
  if (status === "error") return { state: "error", message: visible(s.message || "the decoding failed", true), cells: [] };
  if (status !== "done") return { state: "running", message: visible(s.message || ""), done, total, cells: [] };
  const fd = obj(s.first_divergence) || {};
  const first = { closed: isStep(fd.closed_loop) ? fd.closed_loop : null, open: isStep(fd.open_loop) ? fd.open_loop : null };
  const cells = list(s.steps).map((raw, i) => {
    const st = obj(raw) || {};
    const step = isStep(st.step) ? st.step : i;
    const closed = obj(st.closed);
    const open = obj(st.open);
    const ties = [["closed", closed], ["open", open]].filter(([, l]) => l && l.tie === true);
    const torch = list(st.torch);
    const onnx = closed ? list(closed.tokens) : [];
    return {
      step,
      length: num(st.length),
      torch: tokensText(torch),
      onnx: closed ? tokensText(onnx) : "—",
      flipped: closed ? onnx.some((t, k) => t !== torch[k]) : false,
      stopped: !closed,
      color: loopColor(closed),
      openColor: loopColor(open),
      diverges: { closed: Boolean(closed && closed.diverges), open: Boolean(open && open.diverges) },
      first: { closed: first.closed === step, open: first.open === step },
      tie: ties.length > 0,
      tieText: ties.map(([name, l]) => `tie (${name} loop): ${visible(l.comment || "the flipped tokens are within rounding")}`).join("\n"),
      title: [`step ${step}${step === 0 ? " (the prompt)" : ""}, length ${num(st.length) ?? "?"}`,
        `torch tokens: ${list(st.torch).map((x) => visible(String(x))).join(" ")}`,
        closed ? `ONNX tokens (closed loop): ${onnx.map((x) => visible(String(x))).join(" ")}` : "",
        loopLine("closed", closed), loopLine("open", open), "click: the node-by-node comparison at this step"].filter(Boolean).join("\n"),
    };
  });
  const summary = cells.length === 0 ? "no step"
    : first.closed === null && first.open === null ? `no divergence over ${cells.length} step${cells.length === 1 ? "" : "s"}`
      : `first divergence: closed loop ${first.closed ?? "none"}, open loop ${first.open ?? "none"}`;
  return { state: "done", message: summary, done, total, first, cells };
}

/** The strip. update(state, {live, shownStep, stepRuns}): redraw from the `decoding` trait; `shownStep`:
 *  the step whose run the table shows (marked pressed), `stepRuns`: steps that have a run already. */
export function createStepStrip({ onStep }) {
  const head = h("div", { class: "sbs-steps-head" });
  const cellsEl = h("div", { class: "sbs-steps-cells", role: "list" });
  const el = h("div", { class: "sbs-steps", hidden: true }, head, cellsEl);
  let last = null;

  function cell(c, { live, shownStep, stepRuns }) {
    const marks = [
      c.first.closed ? h("span", { class: "sbs-step-mark", "data-mark": "first-closed", text: "▼C", title: "first diverging step of the closed loop (ONNX fed its own tokens)" }) : null,
      c.first.open ? h("span", { class: "sbs-step-mark", "data-mark": "first-open", text: "▽O", title: "first diverging step of the open loop (ONNX fed torch's tokens: the error starts here)" }) : null,
      c.tie ? h("span", { class: "sbs-step-mark", "data-mark": "tie", text: "≈", title: c.tieText }) : null,
    ].filter(Boolean);
    return h("button", {
      class: "sbs-step", type: "button", role: "listitem", "data-step": String(c.step),
      "data-diverges": c.diverges.closed || c.diverges.open ? "true" : null,
      "data-first-closed": c.first.closed ? "true" : null, "data-first-open": c.first.open ? "true" : null,
      "data-tie": c.tie ? "true" : null, "data-stopped": c.stopped ? "true" : null,
      "data-computed": stepRuns.has(c.step) ? "true" : null,
      "aria-pressed": shownStep === c.step ? "true" : "false",
      title: c.title, disabled: !live, style: { backgroundColor: c.color },
      onclick: () => onStep(c.step),
    },
    h("span", { class: "sbs-step-top" }, h("span", { class: "sbs-step-k", text: String(c.step) }), ...marks),
    h("span", { class: "sbs-step-tok", "data-side": "torch", text: c.torch }),
    h("span", { class: "sbs-step-tok", "data-side": "onnx", "data-flipped": c.flipped ? "true" : null, text: c.onnx }),
    h("span", { class: "sbs-step-open", title: "open loop", style: { backgroundColor: c.openColor } }));
  }

  return {
    el,
    describe: () => last,
    update(state, { live = true, shownStep = null, stepRuns = new Set() } = {}) {
      const d = describeSteps(state);
      last = d;
      el.hidden = d.state === "";
      el.dataset.state = d.state;
      clear(head);
      clear(cellsEl);
      if (d.state === "") return;
      head.append(h("b", { text: "Decode steps" }));
      if (d.state === "running") {
        head.append(h("span", { class: "sbs-badge", "data-status": "running", text: "decoding" }),
          h("span", { class: "sbs-muted", text: `${d.message ? `${d.message}: ` : ""}step ${d.done} of ${d.total || "?"}` }));
        return;
      }
      if (d.state === "error") {
        head.append(h("span", { class: "sbs-badge", "data-status": "error", text: "failed" }));
        cellsEl.append(h("div", { class: "sbs-message", text: d.message }));
        return;
      }
      head.append(h("span", { class: "sbs-steps-summary", text: d.message }),
        h("span", { class: "sbs-muted", text: live ? "torch's tokens over the ONNX closed loop's; the bar below: the open loop; click a step for its node-by-node comparison" : "torch's tokens over the ONNX closed loop's; the bar below: the open loop" }));
      for (const c of d.cells) cellsEl.append(cell(c, { live, shownStep, stepRuns }));
    },
  };
}

export const STEPS_CSS = `
.sbs-steps { background: var(--sbs-bg2); border-radius: 3px; padding: 4px 8px; display: flex; flex-direction: column; gap: 4px; }
.sbs-steps[hidden] { display: none; }
.sbs-steps-head { display: flex; flex-wrap: wrap; align-items: center; gap: 4px 10px; }
.sbs-steps-summary { font-weight: 600; }
/* the hint on the strip's panel: JupyterLab's dark muted text on its panel colour reads at 4.2:1, under WCAG's 4.5 */
.sbs-steps .sbs-muted { color: color-mix(in srgb, var(--sbs-fg) 80%, var(--sbs-bg2)); }
.sbs-steps[data-state=done] .sbs-steps-summary { color: var(--sbs-fg); }
.sbs-steps-cells { display: flex; gap: 3px; overflow-x: auto; padding-bottom: 2px; }
.sbs-root button.sbs-step { display: flex; flex-direction: column; align-items: stretch; gap: 0; height: auto; min-width: 58px;
  padding: 2px 4px 0; font-family: var(--sbs-mono); font-size: 11px; line-height: 15px; text-align: left;
  background-image: linear-gradient(var(--sbs-veil), var(--sbs-veil)); border: 1px solid var(--sbs-border); }
.sbs-root button.sbs-step:disabled { opacity: 1; cursor: default; }
.sbs-root button.sbs-step[aria-pressed=true] { outline: 2px solid var(--sbs-accent); outline-offset: -2px; }
.sbs-root button.sbs-step[data-diverges=true] { border-color: var(--sbs-bad); }
.sbs-root button.sbs-step[data-first-closed=true], .sbs-root button.sbs-step[data-first-open=true] { border: 2px solid var(--sbs-bad); }
.sbs-root button.sbs-step[data-stopped=true] { border-style: dashed; }
.sbs-step-top { display: flex; gap: 3px; align-items: center; }
.sbs-step-k { font-weight: 600; }
.sbs-step[data-computed=true] .sbs-step-k::after { content: "\\2022"; color: var(--sbs-accent); margin-left: 2px; }
/* the marks and a flipped token keep their colour on the view's background: on a cell tinted by a large error
   (red, veiled in a dark theme) red text would not read */
.sbs-step-mark { font-weight: 700; color: var(--sbs-bad); background: var(--sbs-bg); border-radius: 2px; padding: 0 2px; }
.sbs-step-mark[data-mark=tie] { color: var(--sbs-noise); }
.sbs-step-tok { white-space: nowrap; }
/* the ONNX line: the view's own text colour (a muted one is unreadable on a tinted cell in a dark theme), italic */
.sbs-step-tok[data-side=onnx] { color: var(--sbs-fg); font-style: italic; }
.sbs-step-tok[data-flipped=true] { color: var(--sbs-bad); font-weight: 600; background: var(--sbs-bg); border-radius: 2px;
  padding: 0 2px; margin: 0 -2px; }
.sbs-step-open { display: block; height: 5px; margin: 2px -4px 0; border-top: 1px solid var(--sbs-border); }
`;
