// The as-deployed banner (issue 33): the verdict of SbsWidget.check_deployed (trait `deployed`, see
// sbs_widget/views/deployed_check.py) above the table, and the toolbar's "Check as deployed" button.
// Every model string goes in as text (textContent through h); unknown keys of the result are ignored,
// a missing one leaves its line out.

import { h, clear } from "./dom.js";
import { fmtSeconds, messageText, visible } from "./format.js";

export const CHECK_DEPLOYED = "check_deployed"; // the message asking the kernel for a check (defaults)

// verdict -> colour level (CSS: data-level): the deployment at fault is an error, the export a warning
const LEVELS = { same: "ok", export: "warn", optimizer: "bad", "session-option": "bad", provider: "bad" };
const MAX_FUSED = 12;

/** A number sent as JSON: non-finite ones arrive as "Infinity" / "-Infinity" / "NaN". */
const num = (v) => (typeof v === "number" ? v : typeof v === "string" && v !== "" ? Number(v) : NaN);
const list = (v) => (Array.isArray(v) ? v : []);
const obj = (v) => (v && typeof v === "object" && !Array.isArray(v) ? v : {});

export function fmtRatio(v) {
  const x = num(v);
  if (Number.isNaN(x)) return "?";
  if (!Number.isFinite(x)) return x > 0 ? "inf" : "-inf";
  if (x === 0) return "0";
  return x >= 1000 || x < 0.01 ? x.toExponential(1) : String(Number(x.toPrecision(3)));
}

/** The output of `errors` farthest from torch (by its ratio to the tolerance; NaN counts as the worst). */
export function worstError(errors) {
  let best = null;
  let key = -Infinity;
  for (const e of list(errors)) {
    const r = num(obj(e).ratio);
    const k = Number.isNaN(r) ? Infinity : r;
    if (best === null || k > key) { best = e; key = k; }
  }
  return best;
}

/** What the banner says of a `deployed` state, as plain data (the banner draws it; tests read it).
 *  {state: "" | "running" | "error" | "done", level, verdict, setting, hint, message, cause, fused: [text],
 *   moreFused, written, deployed, footer, summary} */
export function describeDeployed(state, live = true) {
  const s = obj(state);
  const status = typeof s.status === "string" ? s.status : "";
  if (!status) return { state: "" };
  if (status === "running") {
    const setting = obj(s.setting);
    const what = [setting.session_options, list(setting.providers).join(", ")].filter(Boolean).map((x) => visible(x)).join(", ");
    return {
      state: "running",
      message: live ? `checking${what ? ` (${what})` : ""}… ${visible(s.message || "")}`.trim()
        : "the check had not ended when this copy was made",
    };
  }
  if (status !== "done") return { state: "error", message: messageText(s.message || "the check failed") };
  const r = obj(s.result);
  const verdict = typeof r.verdict === "string" ? r.verdict : "?";
  const fused = list(r.fused).map((f) => {
    const o = obj(f);
    const replaced = list(o.replaced).map((x) => visible(x));
    return `${visible(o.name ?? "?")} (${visible(o.op_type ?? "?")})${replaced.length ? ` replaced ${replaced.join(", ")}` : ""}`;
  });
  const errLine = (e) => {
    if (!e) return "";
    const o = obj(e);
    return `${fmtRatio(o.ratio)} × tolerance (output ${visible(o.name ?? "?")}, max |diff| ${fmtRatio(o.max_abs)})`;
  };
  const sessions = num(r.sessions);
  const steps = list(r.steps).length;
  const footer = [
    Number.isFinite(sessions) ? `${sessions} whole-model session${sessions === 1 ? "" : "s"}${steps ? ` (${steps} attribution step${steps === 1 ? "" : "s"})` : ""}` : "",
    fmtSeconds(num(r.seconds)),
    Number.isFinite(num(r.atol)) && Number.isFinite(num(r.rtol)) ? `atol=${num(r.atol)}, rtol=${num(r.rtol)}` : "",
  ].filter(Boolean).join(" · ");
  return {
    state: "done",
    level: LEVELS[verdict] || "",
    verdict,
    setting: visible(r.deployed ?? ""),
    hint: verdict === "export" ? "the as-written model already differs from torch: use the lockstep below"
      : verdict === "same" ? "the deployed run is as close to torch as the model as written" : "",
    cause: messageText(r.cause_text ?? ""),
    fused: fused.slice(0, MAX_FUSED),
    moreFused: Math.max(0, fused.length - MAX_FUSED),
    located: locatedLine(r.located),
    repro: typeof r.repro === "string" ? visible(r.repro) : "",
    written: errLine(worstError(r.written_errors)),
    deployed: errLine(worstError(r.deployed_errors)),
    footer,
    summary: typeof r.summary === "string" ? messageText(r.summary) : "",
  };
}

/** Where the difference starts in the deployed graph (result.located), in one line, or "". */
export function locatedLine(located) {
  const o = obj(located);
  if (typeof o.value !== "string") return typeof o.note === "string" ? visible(o.note) : "";
  return `${visible(o.value)} (FX ${visible(o.fx_name ?? "?")}), computed by ${visible(o.op_type ?? "?")} ` +
    `'${visible(o.node ?? "?")}' in the deployed graph, ${fmtRatio(o.ratio)} × tolerance` +
    (Number.isFinite(num(o.vanished)) ? `; ${num(o.vanished)} values vanished into fused nodes` : "");
}

/** The banner and its toolbar button. update(state, live, {unavailable}): redraw from the `deployed`
 *  trait; `unavailable` (a reason) disables the button, with the reason as its title. */
export function createDeployedBanner({ onCheck }) {
  const el = h("div", { class: "sbs-deployed", hidden: true, role: "status" });
  const TITLE = "run the whole ONNX model as users deploy it (onnxruntime's defaults) and as written, both against torch";
  const button = h("button", {
    class: "sbs-check-deployed", text: "Check as deployed", hidden: true, title: TITLE,
    onclick: () => { button.disabled = true; onCheck(); },
  });
  const line = (cls, ...children) => h("div", { class: cls }, ...children);
  return {
    el,
    button,
    update(state, live = true, { unavailable = "" } = {}) {
      const d = describeDeployed(state, live);
      button.hidden = !live || (d.state !== "" && d.state !== "error");
      button.disabled = d.state === "running" || Boolean(unavailable);
      button.title = unavailable || TITLE;
      clear(el);
      el.hidden = d.state === "";
      el.dataset.state = d.state;
      el.dataset.level = d.level || "";
      if (d.state === "") return;
      const head = line("sbs-deployed-head", h("b", { text: "As deployed" }));
      el.append(head);
      if (d.state === "running") {
        head.append(h("span", { class: "sbs-badge", "data-status": "running", text: "running" }), h("span", { class: "sbs-muted", text: d.message }));
        return;
      }
      if (d.state === "error") {
        head.append(h("span", { class: "sbs-badge", "data-status": "error", text: "check failed" }));
        el.append(line("sbs-message", d.message));
        return;
      }
      head.append(...[
        h("span", { class: "sbs-deployed-verdict", "data-verdict": d.verdict, "data-level": d.level, text: d.verdict }),
        d.setting ? h("span", { class: "sbs-muted", text: `deployed as ${d.setting}` }) : null,
        d.hint ? h("span", { class: "sbs-deployed-hint", text: d.hint }) : null].filter(Boolean));
      if (d.cause) el.append(line("sbs-deployed-cause", h("span", { class: "sbs-muted", text: "cause: " }), h("span", { text: d.cause })));
      if (d.fused.length) {
        el.append(line("sbs-deployed-fused", h("span", { class: "sbs-muted", text: "fused nodes: " }),
          h("ul", {}, d.fused.map((f) => h("li", { text: f })), d.moreFused ? h("li", { class: "sbs-muted", text: `… ${d.moreFused} more` }) : null)));
      }
      if (d.located) el.append(line("sbs-deployed-located", h("span", { class: "sbs-muted", text: "starts at: " }), h("span", { text: d.located })));
      if (d.repro) el.append(line("sbs-deployed-repro", h("span", { class: "sbs-muted", text: "repro bundle: " }), h("code", { text: d.repro })));
      if (d.written || d.deployed) {
        el.append(line("sbs-deployed-errors",
          h("span", { class: "sbs-muted", text: "worst error as written: " }), h("span", { class: "sbs-num", text: d.written || "?" }),
          h("span", { class: "sbs-muted", text: " · as deployed: " }), h("span", { class: "sbs-num", text: d.deployed || "?" })));
      }
      if (d.footer) el.append(line("sbs-muted sbs-deployed-foot", d.footer));
      if (d.summary) el.append(h("details", { class: "sbs-deployed-summary" }, h("summary", { text: "summary" }), h("pre", { text: d.summary })));
    },
  };
}
