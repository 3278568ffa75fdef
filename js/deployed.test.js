import { test } from "node:test";
import assert from "node:assert/strict";
import { setupDom, fakeModel, baseState, makeRow, tick } from "./test_env.js";

setupDom();
const { createDeployedBanner, describeDeployed, fmtRatio, locatedLine, worstError } = await import("./deployed.js");

// what SbsWidget.deployed holds after the Denormal case (tests/test_widget_deployed.py), trimmed
const DENORMAL = {
  status: "done", message: "", setting: { session_options: "config={...}", providers: [] },
  result: {
    verdict: "session-option", deployed: "ORT_ENABLE_ALL, session.set_denormal_as_zero=1",
    written_errors: [{ name: "mul_1", max_abs: 0, max_rel: 0, ratio: 0, noise: null }],
    deployed_errors: [{ name: "mul_1", max_abs: 0.1499, max_rel: 1, ratio: 1303.7, noise: false }],
    sessions: 3, steps: [{ what: "without the session config entries", setting: "ORT_ENABLE_ALL", differs: false, ratio: 0 }],
    cause: { kind: "session-option", config: [["session.set_denormal_as_zero", "1"]] }, fused: [],
    atol: 1e-4, rtol: 1e-4, seconds: 0.58, rule: "...",
    cause_text: "session config session.set_denormal_as_zero=1", summary: "verdict: session-option\ncause: ...",
    located: { a: "key a later version may add" },
  },
};

test("numbers: ratios, non-finite strings, the worst output", () => {
  assert.equal(fmtRatio(1303.7), "1.3e+3");
  assert.equal(fmtRatio(0.5), "0.5");
  assert.equal(fmtRatio("Infinity"), "inf");
  assert.equal(fmtRatio(undefined), "?");
  assert.equal(worstError([{ name: "a", ratio: 2 }, { name: "b", ratio: "NaN" }, { name: "c", ratio: 5 }]).name, "b");
  assert.equal(worstError(null), null);
});

test("describe: each state; unknown keys ignored, missing ones tolerated", () => {
  assert.equal(describeDeployed({}).state, "");
  assert.equal(describeDeployed(null).state, "");
  assert.equal(describeDeployed({ status: "running", message: "preparing" }).state, "running");
  assert.match(describeDeployed({ status: "running" }, false).message, /had not ended/);
  assert.equal(describeDeployed({ status: "error", message: "InputError: bad" }).message, "InputError: bad");
  const d = describeDeployed(DENORMAL);
  assert.equal(d.level, "bad");
  assert.equal(d.cause, "session config session.set_denormal_as_zero=1");
  assert.match(d.deployed, /1\.3e\+3 × tolerance \(output mul_1/);
  assert.match(d.written, /^0 × tolerance/);
  assert.match(d.footer, /3 whole-model sessions \(1 attribution step\) · 580 ms · atol=0.0001/);
  assert.equal(describeDeployed({ status: "done", result: { verdict: "same" } }).level, "ok");
  const exp = describeDeployed({ status: "done", result: { verdict: "export", fused: "not a list", steps: 3 } });
  assert.equal(exp.level, "warn");
  assert.match(exp.hint, /use the lockstep below/);
  assert.equal(describeDeployed({ status: "done" }).verdict, "?");
  assert.equal(d.located, "");  // a located object without a value and without a note: no line
});

test("where it starts: the located value, its node, the repro folder, as text", () => {
  const located = { value: "getitem<b>", fx_name: "getitem", node: "node_conv2d", op_type: "Conv", ratio: "Infinity",
    vanished: 1, note: "..." };
  assert.equal(locatedLine(located), "getitem<b> (FX getitem), computed by Conv 'node_conv2d' in the deployed graph, " +
    "inf × tolerance; 1 values vanished into fused nodes");
  assert.equal(locatedLine({ value: null, note: "every surviving value agrees" }), "every surviving value agrees");
  const b = createDeployedBanner({ onCheck: () => {} });
  b.update({ status: "done", result: { verdict: "optimizer", located, repro: "/tmp/r<i>" } }, true);
  assert.match(b.el.querySelector(".sbs-deployed-located").textContent, /getitem<b> \(FX getitem\)/);
  assert.equal(b.el.querySelector(".sbs-deployed-repro code").textContent, "/tmp/r<i>");
  assert.equal(b.el.querySelectorAll("b").length, 1);  // only the banner's own title: no markup from strings
});

test("banner: verdict, cause, fused nodes, errors, as text only; the button until a check ran", () => {
  const asked = [];
  const b = createDeployedBanner({ onCheck: () => asked.push(1) });
  b.update({}, true);
  assert.equal(b.el.hidden, true);
  assert.equal(b.button.hidden, false);
  b.button.click();
  assert.equal(asked.length, 1);
  b.update({ status: "running", message: "running the model", setting: { session_options: "onnxruntime's defaults" } }, true);
  assert.equal(b.el.hidden, false);
  assert.equal(b.el.dataset.state, "running");
  assert.equal(b.button.hidden, true);
  assert.match(b.el.textContent, /checking \(onnxruntime's defaults\)… running the model/);
  const hostile = structuredClone(DENORMAL);
  hostile.result.verdict = "optimizer";
  hostile.result.cause_text = "optimization level ORT_ENABLE_ALL: transformer(s) <img src=x onerror=alert(1)>";
  hostile.result.fused = [{ name: "fused_<b>gelu</b>", op_type: "Gelu", replaced: ["node_mul", "node_erf\u202e"] },
    ...Array.from({ length: 14 }, (_, k) => ({ name: `f${k}`, op_type: "X", replaced: [] }))];
  b.update(hostile, true);
  assert.equal(b.el.dataset.level, "bad");
  assert.ok(!b.el.textContent.includes("null"), "no hint: nothing printed for it");
  assert.equal(b.el.querySelector(".sbs-deployed-verdict").textContent, "optimizer");
  assert.equal(b.el.querySelector("img"), null, "model strings are text, never HTML");
  assert.equal(b.el.querySelector("b b, li b"), null);
  const items = [...b.el.querySelectorAll(".sbs-deployed-fused li")].map((li) => li.textContent);
  assert.equal(items[0], "fused_<b>gelu</b> (Gelu) replaced node_mul, node_erf\\u202e");
  assert.equal(items.at(-1), "… 3 more");
  assert.match(b.el.querySelector(".sbs-deployed-cause").textContent, /<img src=x/);
  assert.match(b.el.querySelector(".sbs-deployed-errors").textContent, /as written: 0 × tolerance.*as deployed: 1\.3e\+3 × tolerance/);
  assert.equal(b.button.hidden, true);
  b.update({ status: "error", message: "InputError: unknown optimization level 'max'" }, true);
  assert.equal(b.el.dataset.state, "error");
  assert.match(b.el.querySelector(".sbs-message").textContent, /unknown optimization level/);
  assert.equal(b.button.hidden, false, "after a failed check the button offers another");
  b.update(DENORMAL, false);
  assert.equal(b.button.hidden, true, "no button in a static copy");
});

test("in the view: above the table, the toolbar button sends check_deployed, the trait redraws", async () => {
  const { createView } = await import("./view.js");
  const model = fakeModel(baseState(3), { 0: [0, 1, 2].map((k) => makeRow(k)) });
  const el = document.createElement("div");
  document.body.append(el);
  const dispose = createView({ model, el, mountGraphs: () => () => {} });
  await tick();
  const banner = el.querySelector(".sbs-deployed");
  assert.equal(banner.hidden, true);
  const root = el.querySelector(".sbs-root");
  const children = [...root.children];
  assert.ok(children.indexOf(banner) < children.indexOf(el.querySelector(".sbs-main")), "above the table");
  const button = el.querySelector(".sbs-bar button.sbs-check-deployed");
  assert.equal(button.hidden, false);
  button.click();
  assert.deepEqual(model.sent.at(-1), { type: "check_deployed" });
  model.set("deployed", { status: "running", message: "starting" });
  assert.equal(button.hidden, true);
  model.set("deployed", DENORMAL);
  assert.equal(banner.hidden, false);
  assert.equal(banner.querySelector(".sbs-deployed-verdict").dataset.verdict, "session-option");
  dispose();
  assert.equal(model.listeners(), 0);
});

test("offline copy: the static model shows the banner, no button", async () => {
  const { renderStatic } = await import("./static_model.js");
  const el = document.createElement("div");
  document.body.append(el);
  const state = { ...baseState(1), deployed: DENORMAL };
  const dispose = renderStatic(el, { state, runs: { 0: [makeRow(0)] } }, null, null);
  await tick();
  assert.equal(el.querySelector(".sbs-deployed").hidden, false);
  assert.match(el.querySelector(".sbs-deployed").textContent, /session-option/);
  assert.equal(el.querySelector(".sbs-check-deployed"), null);
  dispose();
});
