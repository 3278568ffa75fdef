// The progress bar: full when a run ends done, its end state visible (class, label), no transition then.
import { test } from "node:test";
import assert from "node:assert/strict";
import { setupDom } from "./test_env.js";

setupDom();
const { createProgress, meterState } = await import("./progress.js");
const { CSS } = await import("./style.js");

function bar() {
  const p = createProgress({ onWorst() {} });
  const [, meter, state, text] = p.main;
  return { p, meter, state, text, width: () => meter.firstChild.style.width };
}

test("done: the bar is full even if the last counts sent while running fell short", () => {
  const { p, meter, state, text, width } = bar();
  p.update("running", { fx_done: 118, fx_total: 139, onnx_done: 110, onnx_total: 131, n_rows: 200 });
  assert.equal(width(), `${(100 * 110) / 131}%`, "the slower side: ONNX 110/131 under FX 118/139");
  assert.equal(meter.dataset.state, "running");
  assert.equal(state.textContent, "83%");
  p.update("done", { fx_done: 118, fx_total: 139, onnx_done: 131, onnx_total: 131, n_rows: 250, finished: true });
  assert.equal(width(), "100%");
  assert.equal(meter.dataset.state, "done");
  assert.equal(meter.getAttribute("aria-valuenow"), "100");
  assert.equal(state.textContent, "100%");
  p.update("done", { fx_done: 139, fx_total: 139, onnx_done: 131, onnx_total: 131, n_rows: 250, finished: true });
  assert.equal(width(), "100%");
  assert.ok(text.textContent.includes("FX 139/139") && text.textContent.includes("ONNX 131/131"));
  p.update("done", { n_rows: 3, finished: true }); // saved records: no counts at all
  assert.equal(width(), "100%");
});

test("stopped and failed runs say so, with the bar as far as they got", () => {
  const { p, meter, state, width } = bar();
  p.update("stopped", { fx_done: 50, fx_total: 200, n_rows: 60, finished: true });
  assert.equal(width(), "25%");
  assert.equal(meter.dataset.state, "stopped");
  assert.equal(state.textContent, "stopped at 25%");
  assert.equal(meter.getAttribute("aria-valuetext"), "stopped at 25%");
  p.update("error", { fx_done: 199, fx_total: 200, n_rows: 60, finished: true }, "TimeoutError: node x");
  assert.equal(meter.dataset.state, "error");
  assert.equal(state.textContent, "failed at 99%");
  assert.equal(width(), "99.5%");
  p.update("preparing", {});
  assert.equal(meter.dataset.state, "running");
  assert.equal(width(), "0%");
});

test("meterState and the stylesheet: an ended run's bar has no transition", () => {
  assert.deepEqual(["idle", "preparing", "running", "done", "stopped", "error"].map(meterState),
    ["idle", "running", "running", "done", "stopped", "error"]);
  assert.match(CSS, /\.sbs-meter\[data-state=done\] > div \{[^}]*transition: none/);
  assert.match(CSS, /\.sbs-meter\[data-state=stopped\] > div, \.sbs-meter\[data-state=error\] > div \{[^}]*transition: none/);
});
