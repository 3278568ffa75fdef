import { test } from "node:test";
import assert from "node:assert/strict";
import { setupDom, fakeModel, baseState, tick } from "./test_env.js";

setupDom();
const { createStepStrip, describeSteps, loopColor, tokensText } = await import("./steps.js");
const { colorFor, NOISE_FILL, NOT_COMPARED } = await import("./rules.js");
const { createView } = await import("./view.js");

const loop = (over = {}) => ({ tokens: [5, 6], max_abs: 3e-7, max_rel: 1e-6, cosine: 1, top5: 1, token_agreement: 1,
  within_tolerance: true, noise: null, tie: null, comment: "", diverges: false, ...over });
const EVIL = '<img src=x onerror="alert(1)">';
// what SbsWidget.decoding holds after a decoding whose closed loop flips at step 1 (then stops), whose
// open loop diverges at step 2 and ties at step 3
const DECODED = {
  status: "done", message: "", done: 4, total: 4, atol: 1e-4, rtol: 1e-4,
  first_divergence: { closed_loop: 1, open_loop: 2 },
  steps: [
    { step: 0, length: 8, torch: [5, 6], closed: loop(), open: loop() },
    { step: 1, length: 9, torch: [7, 8], closed: loop({ tokens: [7, 9], token_agreement: 0.5, max_abs: 0.2, within_tolerance: false, noise: false, diverges: true }), open: loop({ tokens: [7, 8] }) },
    { step: 2, length: 10, torch: [1, 2], closed: null, open: loop({ tokens: [1, 2], max_abs: "Infinity", within_tolerance: false, noise: false, diverges: true }) },
    { step: 3, length: 11, torch: [3, 4], closed: null, open: loop({ tokens: [3, 9], token_agreement: 0.5, tie: true, noise: true, within_tolerance: false, max_abs: 2e-4, comment: `tie: ${EVIL}` }) },
  ],
};

test("token ids as text, cut after four", () => {
  assert.equal(tokensText([1, 2]), "1 2");
  assert.equal(tokensText([1, 2, 3, 4, 5, 6]), "1 2 3 4 …");
  assert.equal(tokensText(null), "");
});

test("colours: the table's scale; noise off it; a stopped loop not compared", () => {
  assert.equal(loopColor(loop()), colorFor(3e-7, "ok"));
  assert.equal(loopColor(loop({ max_abs: "Infinity", within_tolerance: false })), colorFor(Infinity, "mismatch"));
  assert.equal(loopColor(loop({ within_tolerance: false, noise: true })), NOISE_FILL);
  assert.equal(loopColor(null), NOT_COMPARED);
});

test("describe: states, first divergence per loop, ties with their comment", () => {
  assert.equal(describeSteps({}).state, "");
  assert.equal(describeSteps(null).state, "");
  const running = describeSteps({ status: "running", message: "decoding", done: 2, total: 5 });
  assert.deepEqual([running.state, running.done, running.total], ["running", 2, 5]);
  assert.equal(describeSteps({ status: "error", message: "InputError: no ids" }).message, "InputError: no ids");
  const d = describeSteps(DECODED);
  assert.equal(d.cells.length, 4);
  assert.deepEqual(d.first, { closed: 1, open: 2 });
  assert.match(d.message, /closed loop 1, open loop 2/);
  assert.deepEqual(d.cells.map((c) => [c.first.closed, c.first.open]), [[false, false], [true, false], [false, true], [false, false]]);
  assert.deepEqual(d.cells.map((c) => c.tie), [false, false, false, true]);
  assert.equal(d.cells[1].flipped, true);
  assert.equal(d.cells[2].stopped, true);
  assert.equal(d.cells[2].onnx, "—");
  assert.match(d.cells[3].tieText, /^tie \(open loop\): tie: <img/);
  assert.equal(describeSteps({ ...DECODED, first_divergence: {} }).message, "no divergence over 4 steps");
});

test("the strip: a cell per step, text only, marks, a click says which step", () => {
  const clicked = [];
  const strip = createStepStrip({ onStep: (k) => clicked.push(k) });
  document.body.append(strip.el);
  strip.update(DECODED, { live: true, shownStep: 2, stepRuns: new Set([2]) });
  const cells = [...strip.el.querySelectorAll(".sbs-step")];
  assert.equal(cells.length, 4);
  assert.deepEqual(cells.map((c) => c.dataset.step), ["0", "1", "2", "3"]);
  assert.equal(cells[1].dataset.firstClosed, "true");
  assert.equal(cells[2].dataset.firstOpen, "true");
  assert.equal(cells[1].querySelector("[data-mark=first-closed]").textContent, "▼C");
  assert.equal(cells[2].querySelector("[data-mark=first-open]").textContent, "▽O");
  const tie = cells[3].querySelector("[data-mark=tie]");
  assert.equal(tie.textContent, "≈");
  assert.ok(tie.getAttribute("title").includes(EVIL), "the comment is the tooltip, verbatim as text");
  assert.equal(strip.el.querySelector("img"), null, "nothing from the model became HTML");
  assert.equal(cells[1].querySelector("[data-side=torch]").textContent, "7 8");
  assert.equal(cells[1].querySelector("[data-side=onnx]").textContent, "7 9");
  assert.equal(cells[1].querySelector("[data-side=onnx]").dataset.flipped, "true");
  assert.equal(cells[2].getAttribute("aria-pressed"), "true");
  assert.equal(cells[2].dataset.computed, "true");
  assert.equal(cells[0].style.backgroundColor !== "", true);
  assert.match(cells[2].title, /open loop: max \|err\| inf/);
  cells[3].click();
  assert.deepEqual(clicked, [3]);
  strip.update(DECODED, { live: false });
  assert.ok([...strip.el.querySelectorAll(".sbs-step")].every((c) => c.disabled), "no kernel: nothing to ask");
  strip.update({ status: "running", message: "decoding", done: 1, total: 4 });
  assert.equal(strip.el.querySelectorAll(".sbs-step").length, 0);
  assert.match(strip.el.textContent, /step 1 of 4/);
  strip.update({});
  assert.equal(strip.el.hidden, true);
  strip.el.remove();
});

test("in the view: above the table, a click sends the step, the run's step is pressed", async () => {
  const state = { ...baseState(0), decoding: DECODED, progress: { ...baseState(0).progress, step: 1 },
    runs_meta: [{ ...baseState(0).runs_meta[0], step: 1 }] };
  const model = fakeModel(state, { 0: [] });
  const el = document.createElement("div");
  document.body.append(el);
  const dispose = createView({ model, el, mountGraphs: () => () => {} });
  await tick();
  const strip = el.querySelector(".sbs-steps");
  assert.equal(strip.hidden, false);
  assert.ok(strip.compareDocumentPosition(el.querySelector(".sbs-main")) & window.Node.DOCUMENT_POSITION_FOLLOWING);
  assert.equal(el.querySelector('.sbs-step[data-step="1"]').getAttribute("aria-pressed"), "true");
  el.querySelector('.sbs-step[data-step="3"]').click();
  assert.deepEqual(model.sent.at(-1), { type: "step", step: 3 });
  // the kernel starts run 1 for step 3: the strip follows
  model.set("progress", { ...state.progress, run: 1, step: 3, n_rows: 0, finished: false });
  model.set("run_id", 1);
  await tick();
  assert.equal(el.querySelector('.sbs-step[data-step="3"]').getAttribute("aria-pressed"), "true");
  assert.equal(el.querySelector('.sbs-step[data-step="1"]').getAttribute("aria-pressed"), "false");
  assert.equal(el.querySelector('.sbs-step[data-step="1"]').dataset.computed, "true");
  assert.deepEqual([...el.querySelectorAll("select[aria-label='run'] option")].map((o) => o.textContent), ["run #0 · step 1", "run #1 · step 3"]);
  dispose();
  assert.equal(model.listeners(), 0);
});
