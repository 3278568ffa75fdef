// Metrics beside the verdict (metrics=): one sortable numeric column each, names shown as text only,
// a CSV column under the metric's name; rtol changes judged by a rerun. node --test js/
import { test } from "node:test";
import assert from "node:assert/strict";
import { setupDom, fakeModel, baseState, makeRow, tick, COLUMNS } from "./test_env.js";
import { fmtMetric } from "./format.js";
import { toCSV } from "./csv.js";
import { decodeRows, sortIndex } from "./rows.js";
import { METRIC_PREFIX, isNumeric } from "./rules.js";

setupDom();
const { createView } = await import("./view.js");

const EVIL = '<img src=x onerror="globalThis.pwnedMetric=1">';
const METRICS = ["cosine", "sqnr_db", EVIL, "__proto__"].map((n) => METRIC_PREFIX + n);

function mount(n, figures) {
  const columns = [...COLUMNS, ...METRICS];
  const rows = Array.from({ length: n }, (_, k) => [...makeRow(k), ...figures(k)]);
  const model = fakeModel({ ...baseState(n), columns }, { 0: rows });
  const el = document.createElement("div");
  document.body.append(el);
  const dispose = createView({ model, el, mountGraphs: () => () => {} });
  return { model, el, dispose };
}
const shownRows = (el) => [...el.querySelectorAll(".sbs-row")].filter((r) => r.style.display !== "none")
  .sort((a, b) => parseFloat(a.style.transform.slice(11)) - parseFloat(b.style.transform.slice(11)));
const header = (el, key) => [...el.querySelectorAll(".sbs-head > div")].find((d) => d.dataset.key === key);

test("metric keys are numeric; NaN and inf arrive as strings and come back as numbers", () => {
  assert.ok(isNumeric(METRICS[0]) && !isNumeric("cosine"));
  const [row] = decodeRows(new TextEncoder().encode(JSON.stringify([[1, "NaN", "-Infinity"]])), ["err_abs", ...METRICS.slice(0, 2)], 0);
  assert.ok(Number.isNaN(row[METRICS[0]]));
  assert.equal(row[METRICS[1]], -Infinity);
  // a metric named __proto__ is a plain key under its prefix: no prototype is touched
  const [odd] = decodeRows(new TextEncoder().encode(JSON.stringify([[0.5]])), [METRICS[3]], 0);
  assert.equal(odd[METRICS[3]], 0.5);
  assert.equal(Object.getPrototypeOf(odd), Object.prototype);
});

test("fmtMetric keeps six significant digits (a cosine near 1 shows how near)", () => {
  assert.equal(fmtMetric(0.99999871234), "0.999999");
  assert.equal(fmtMetric(84.21337), "84.2134");
  assert.equal(fmtMetric(3.1e-9), "3.100e-9");
  assert.equal(fmtMetric(Infinity), "inf");
  assert.equal(fmtMetric(NaN), "NaN");
  assert.equal(fmtMetric(null), "");
  assert.equal(fmtMetric(0), "0");
});

test("each metric is a column of the table, sortable as a number, its name as text", async () => {
  const { el, dispose } = mount(6, (k) => [1 - k * 1e-3, k === 4 ? "Infinity" : 40 + k, k, k % 2 ? null : 1]);
  await tick();
  for (const key of METRICS) assert.ok(header(el, key), `a column for ${key}`);
  assert.equal(header(el, METRICS[2]).textContent, EVIL, "the hostile name is the header's text");
  assert.equal(el.querySelector("img"), null);
  // the metric columns stand before "module"
  const keys = [...el.querySelectorAll(".sbs-head > div")].map((d) => d.dataset.key);
  assert.ok(keys.indexOf(METRICS[0]) > keys.indexOf("min_atol") && keys.indexOf(METRICS[3]) < keys.indexOf("module"));
  header(el, METRICS[0]).click(); // numeric: largest first
  assert.deepEqual(shownRows(el).map((r) => Number(r.dataset.k)), [0, 1, 2, 3, 4, 5]);
  header(el, METRICS[0]).click();
  assert.deepEqual(shownRows(el).map((r) => Number(r.dataset.k)), [5, 4, 3, 2, 1, 0]);
  header(el, METRICS[1]).click(); // inf sorts as a number, the largest
  assert.equal(shownRows(el)[0].dataset.k, "4");
  const cells = [...shownRows(el)[0].children].map((c) => c.textContent);
  assert.ok(cells.includes("inf") && cells.includes("0.996"), cells.join("|"));
  // the range filter offers the metrics too
  const options = [...el.querySelectorAll('select[aria-label="error column"] option')].map((o) => o.textContent);
  assert.ok(options.includes("cosine") && options.includes(EVIL));
  await tick();
  assert.equal(globalThis.pwnedMetric, undefined);
  dispose();
});

test("sortIndex on a metric: empty values last both ways", () => {
  const key = METRICS[0];
  const rows = [{ [key]: 0.5 }, { [key]: null }, { [key]: 0.9 }];
  assert.deepEqual([...sortIndex(Uint32Array.from([0, 1, 2]), rows, key, -1)], [2, 0, 1]);
  assert.deepEqual([...sortIndex(Uint32Array.from([0, 1, 2]), rows, key, 1)], [0, 2, 1]);
});

test("the CSV has one column per metric under its name, a formula-like name neutralised", () => {
  const rows = [{ i: 0, ep_name: "a", [METRICS[0]]: 0.5, [METRIC_PREFIX + "=cmd()"]: NaN }];
  const csv = toCSV(rows, ["ep_name", METRICS[0], METRIC_PREFIX + "=cmd()"]);
  assert.equal(csv, "i,ep_name,cosine,'=cmd()\n0,a,0.5,NaN\n");
});

test("an rtol other than the run's is said to apply on a rerun (the figures are at the run's rtol)", async () => {
  const { model, el, dispose } = mount(2, () => [1, 1, 1, 1]);
  await tick();
  const note = el.querySelector(".sbs-rtol-note");
  assert.equal(note.hidden, true);
  const rtol = el.querySelector('input[aria-label="rtol"]');
  rtol.value = "0.5";
  rtol.dispatchEvent(new window.Event("change"));
  assert.equal(model.get("rtol"), 0.5);
  assert.equal(note.hidden, false);
  assert.ok(note.textContent.includes("applies on a rerun"), note.textContent);
  model.set("rtol", 1e-4);
  assert.equal(note.hidden, true);
  dispose();
});
