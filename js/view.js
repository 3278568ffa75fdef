// The whole view of one SbsWidget: toolbar + progress, filters, the table and its detail, the reset
// panel, the graphs area. One instance per displayed output; all durable state is in the model and
// the rows come through js/sync.js. The view tells the kernel what it shows: `view_rows` (the rows on
// screen after filters and sort, all of them, in screen order) and `selected_rows` (in selection
// order), both positions in the current run's records, sent at most every PUBLISH_MS.

import { h } from "./dom.js";
import { CSS } from "./style.js";
import { fmtInt, messageText, visible } from "./format.js";
import { colorFor, isMetric, MESSAGES, metricName, STATUSES } from "./rules.js";
import { Nesting, SortCache, filterIndex, isNumeric, isWithin, nestIndex } from "./rows.js";
import { createRowSync } from "./sync.js";
import { createTable, insideText, resetName } from "./table.js";
import { renderDetail } from "./detail.js";
import { createProgress } from "./progress.js";
import { renderCompare } from "./compare.js";
import { createResetPanel } from "./reset.js";
import { createCulpritsPanel } from "./culprits.js";
import { CHECK_DEPLOYED, createDeployedBanner } from "./deployed.js";
import { STEP_MESSAGE, createStepStrip } from "./steps.js";
import { INPUT_MESSAGE, createSetsPanel } from "./sets.js";
import { createModelsPanel } from "./models.js";
import { toCSV } from "./csv.js";
import { detectHost } from "./theme.js";

export const PUBLISH_MS = 150; // view_rows / selected_rows: one update per this long at most
const PUBLISH_RUNNING_MS = 500; // while rows stream in

/** Same integers in the same order. */
export function sameInts(a, b) {
  if (!a || !b || a.length !== b.length) return false;
  for (let i = 0; i < a.length; i++) if (a[i] !== b[i]) return false;
  return true;
}

/** The selection after a click on record `k` (how: "one", "toggle" with ctrl/cmd, "extend" with
 *  shift: the rows from the anchor to `k` in screen order `index`). Returns {selection, anchor}. */
export function nextSelection(selection, anchor, k, how, index) {
  if (how === "toggle") {
    return selection.includes(k) ? { selection: selection.filter((x) => x !== k), anchor: k } : { selection: [...selection, k], anchor: k };
  }
  if (how === "extend" && anchor >= 0) {
    const from = index.indexOf(anchor);
    const to = index.indexOf(k);
    if (from >= 0 && to >= 0) {
      const step = to >= from ? 1 : -1;
      const out = [];
      for (let p = from; p !== to + step; p += step) out.push(index[p]);
      return { selection: out, anchor };
    }
  }
  return { selection: [k], anchor: k };
}


export function createView({ model, el, mountGraphs, prewarmGraphs }) {
  const t0 = performance.now();
  const live = !model.get("_static");
  const disposers = [];
  const on = (event, fn) => { model.on(event, fn); disposers.push(() => model.off(event, fn)); };

  let shown = model.get("run_id");
  let filter = { text: "", beyond: false, hideNoise: false, status: "", col: "err_abs", min: "", max: "", inputDependent: false, bDeparts: false };
  let sort = { key: null, dir: 1 };
  let index = new Uint32Array(0); // the rows drawn, in screen order (inner rows of closed parents left out)
  let flat = index; // every row the filters select, in the same order (CSV, view_rows)
  const nesting = new Nesting(); // which inner rows nest under which FX node's row
  let toggled = new Map(); // parent row -> open or closed by the user (otherwise: closed, or open for a filter)
  let nest = null;
  // selected rows (record positions, in selection order), the one the detail shows, the shift anchor;
  // a reloaded view takes the selection back from the model
  let selection = shown === model.get("run_id") ? [...(model.get("selected_rows") || [])] : [];
  let focus = selection.length ? selection[selection.length - 1] : -1;
  let anchor = focus;
  let detailFor = null; // the row object the detail shows
  let firstRowMs = null;
  const sorter = new SortCache();
  const rowListeners = new Set();
  const selectListeners = new Set();

  const rowsShown = () => sync.rows(shown);
  const meta = () => model.get("runs_meta") || [];
  const progress = () => model.get("progress") || {};
  const running = () => ["preparing", "running"].includes(model.get("status"));
  const tolerances = () => {
    const p = progress();
    const m = p.run === shown ? p : meta()[shown] || {};
    return { atol: model.get("atol"), rtol: model.get("rtol"), runAtol: m.atol, runRtol: m.rtol };
  };
  const resetNames = () => [...(model.get("reset_names") || [])];
  const nameOf = resetName;
  const colorOfRow = (row) => colorFor(row.err_abs, row.status);

  const sync = createRowSync(model, (id) => { if (id === shown) scheduleRefresh(); });
  disposers.push(sync.dispose);
  const request = sync.request;

  // --- layout ----------------------------------------------------------------------------------
  const prog = createProgress({ onWorst: () => { const i = progress().worst_i; if (i !== null && i !== undefined && progress().run === shown) select(i, true); } });
  const stopBtn = h("button", { text: "Stop", title: "end the run; records so far are kept", onclick: () => model.send({ type: MESSAGES.stop }) });
  const rerunBtn = h("button", { text: "Rerun", title: "new run with the reset set below", onclick: () => model.send({ type: MESSAGES.rerun }) });
  const title = h("span", { class: "sbs-title" });

  const search = h("input", { type: "text", placeholder: 'filter names, op, module… ("x": exact)', "aria-label": "filter", style: { width: "200px" },
    title: 'words: each must appear in a name, the op, the target or the module (mul_3 also finds MatMul_3a);\n' +
      '"mul_3" in double quotes: a name, op or module equal to mul_3 (case ignored), nothing longer' });
  const beyond = h("input", { type: "checkbox", "aria-label": "only beyond tolerance" });
  const hideNoise = h("input", { type: "checkbox", "aria-label": "hide noise" });
  const statusSel = h("select", { "aria-label": "status" }, ["", ...STATUSES].map((s) => h("option", { value: s, text: s || "any status" })));
  const colSel = h("select", { "aria-label": "error column" });
  // the range filter's columns: the errors, then each metric (its name as text: it comes from a user)
  const updateColumns = () => {
    const keys = model.get("columns") || [];
    const b = models.active(); // two models: b's columns, its errors in the range filter (js/models.js)
    table.setColumns(keys, { b });
    const choices = ["err_abs", "err_rel", "err_local", "err_dev", "min_atol", ...(b ? ["b_err_abs", "b_err_rel", "b_err_local"] : []), ...keys.filter(isMetric)];
    const current = colSel.value || filter.col;
    colSel.replaceChildren(...choices.map((s) => h("option", { value: s, text: isMetric(s) ? visible(metricName(s)) : s, selected: s === current })));
    if (!choices.includes(current)) filter = { ...filter, col: "err_abs" };
  };
  const minIn = h("input", { type: "text", class: "sbs-range", placeholder: "min", "aria-label": "min error" });
  const maxIn = h("input", { type: "text", class: "sbs-range", placeholder: "max", "aria-label": "max error" });
  const atolIn = h("input", { type: "text", class: "sbs-tol", "aria-label": "atol" });
  const rtolIn = h("input", { type: "text", class: "sbs-tol", "aria-label": "rtol" });
  // the rows' figures are measured at their run's rtol: another rtol is judged by a new run
  const rtolNote = h("span", { class: "sbs-muted sbs-rtol-note", hidden: true });
  const runSel = h("select", { "aria-label": "run" });
  const copyBtn = h("button", { text: "Copy CSV", title: "copy the rows shown (filtered, sorted) as CSV" });
  const dlBtn = h("button", { text: "Download CSV" });

  const table = createTable({
    onSort: (key) => {
      sort = sort.key === key ? { key, dir: -sort.dir } : { key, dir: isNumeric(key) && key !== "i" ? -1 : 1 }; // errors: worst first
      refresh();
    },
    onSelect: (k, how) => select(k, false, how),
    onToggle: (k) => toggleReset(rowsShown()[k]),
    onExpand: (k, open) => expand(k, open),
    isTicked: (row) => model.get("reset_names").includes(nameOf(row)),
    colorOf: colorOfRow,
    canTick: () => live,
  });
  const detail = h("div", { class: "sbs-detail" });
  const compareEl = h("div", { class: "sbs-compare", hidden: true });
  const reset = createResetPanel({
    getNames: resetNames,
    setNames: (names) => { model.set("reset_names", names); model.save_changes(); },
    onRerun: () => model.send({ type: MESSAGES.rerun }),
    live,
  });
  const culprits = createCulpritsPanel({
    onSelect: (i) => { if (shown !== model.get("run_id")) showRun(model.get("run_id")); select(i, true); },
  });
  // the as-deployed verdict (issue 33) above the table; its button in the toolbar until a check ran
  const deployed = createDeployedBanner({ onCheck: () => model.send({ type: CHECK_DEPLOYED }) });
  // the decode steps (issue 50) above the table; a click asks for that step's lockstep run
  const stepOfRun = (id) => { const p = progress(); return p.run === id && p.step !== undefined ? p.step : (meta()[id] || {}).step ?? null; };
  const strip = createStepStrip({
    onStep: (k) => {
      const latest = model.get("run_id");
      if (stepOfRun(latest) === k && shown !== latest) showRun(latest); // already the current run: show it
      model.send({ type: STEP_MESSAGE, step: k });
    },
  });
  let stripDrawn = null; // what the strip last drew: redrawn when the decoding, the run shown or the runs change
  const updateStrip = () => {
    const decoding = model.get("decoding");
    const stepRuns = new Set([...meta().map((m) => m && m.step), stepOfRun(model.get("run_id"))].filter(Number.isInteger));
    const key = [shownStep(), ...[...stepRuns].sort((a, b) => a - b)].join(",");
    if (stripDrawn && stripDrawn.decoding === decoding && stripDrawn.key === key) return;
    stripDrawn = { decoding, key };
    strip.update(decoding, { live, shownStep: shownStep(), stepRuns });
  };
  const shownStep = () => stepOfRun(shown);
  // input sets (issue 50, item 4): the spread panel above the table; picking an input asks for its run
  const sets = createSetsPanel({
    onInput: (k) => model.send({ type: INPUT_MESSAGE, input: k }),
    onFilter: () => readFilter(),
  });
  const updateSets = () => sets.update(model.get("input_spread"), { live, shownInput: (meta()[shown] || {}).input ?? null, row: focus >= 0 ? rowsShown()[focus] : null });
  // two models (issue 47): b's summary and the "b departs" filter above the table, b's columns in it
  const models = createModelsPanel({ onFilter: () => readFilter() });
  const updateModels = () => {
    const was = models.active();
    models.update(model.get("models_b"));
    if (models.active() !== was) updateColumns();
  };
  models.update(model.get("models_b"));
  const graphsHost = h("div", { class: "sbs-graphs-host" });
  const graphsBox = h("details", { class: "sbs-graphs-box" }, h("summary", { text: "Graphs" }), graphsHost);

  const root = h("div", { class: "sbs-root", "data-host": detectHost(el.ownerDocument) || null },
    h("style", { text: CSS }),
    h("div", { class: "sbs-bar sbs-toolbar" }, title, ...prog.main, h("span", { class: "sbs-spacer-flex" }), runSel, live ? [deployed.button, stopBtn, rerunBtn] : null),
    h("div", { class: "sbs-bar" }, ...prog.counts, h("span", { class: "sbs-spacer-flex" }), copyBtn, dlBtn),
    prog.message,
    deployed.el,
    strip.el,
    sets.el,
    models.el,
    h("div", { class: "sbs-bar" },
      search, h("label", {}, beyond, "only beyond tolerance"),
      h("label", { title: "hide the pairs whose difference is rounding: onnxruntime about as close to a float64 reference as torch (status noise, and reset pairs that were noise)" }, hideNoise, "hide noise"),
      statusSel,
      h("label", {}, colSel, minIn, "–", maxIn),
      h("span", { class: "sbs-spacer-flex" }),
      h("label", { title: "re-judges the rows without rerunning (element-wise: a pair is within when its min atol is); the next run uses it" }, "atol", atolIn),
      h("label", { title: live ? "reruns the comparison: the rows' figures are measured at their run's rtol" : "applies on a rerun: the rows' figures are measured at their run's rtol" }, "rtol", rtolIn),
      rtolNote),
    compareEl,
    culprits.el,
    h("div", { class: "sbs-main" }, table.el, detail),
    reset.el,
    graphsBox,
  );
  el.append(root);

  // --- behaviour -------------------------------------------------------------------------------
  function refresh() {
    const rows = rowsShown();
    const a = performance.now();
    const idx = filterIndex(rows, filter, tolerances());
    const b = performance.now();
    nest = nestIndex(rows, idx, nesting.update(rows), {
      sort: (level) => sorter.sort(level, rows, sort.key, sort.dir),
      isOpen: (k, auto) => (toggled.has(k) ? toggled.get(k) : auto),
    });
    index = nest.screen;
    flat = nest.flat;
    const c = performance.now();
    table.set(rows, index, sort, { nesting, matched: nest.matched, open: nest.open });
    const d = performance.now();
    root.dataset.filterMs = (b - a).toFixed(1);
    root.dataset.sortMs = (c - b).toFixed(1);
    root.dataset.renderMs = (d - c).toFixed(1);
    root.dataset.rows = String(rows.length);
    root.dataset.shown = String(index.length);
    root.dataset.matched = String(flat.length);
    if (rows.length && firstRowMs === null) {
      firstRowMs = d - t0;
      root.dataset.firstRowMs = firstRowMs.toFixed(0);
    }
    table.setFooter([
      `${fmtInt(flat.length)} of ${fmtInt(rows.length)} rows${flat.length > index.length ? ` (${fmtInt(flat.length - index.length)} folded inside)` : ""}`,
      `filter ${root.dataset.filterMs} ms · sort ${root.dataset.sortMs} ms`,
    ]);
    if (focus >= 0 && detailFor !== (rows[focus] || null)) showDetail(); // its row arrived
    if (worstIsReset(progress()) !== worstReset) updateStatus(); // the worst pair's row arrived
    for (const cb of rowListeners) cb();
    schedulePublish();
  }
  let frame = 0;
  function scheduleRefresh() {
    if (!frame) frame = requestAnimationFrame(() => { frame = 0; refresh(); });
  }

  /** Show (open true) or hide the inner rows of row `k`; `open` undefined: the other way. */
  function expand(k, open) {
    if (!nest || !nest.matched || !nest.matched[k]) return;
    const now = nest.open[k] === 1;
    const next = open === undefined ? !now : Boolean(open);
    if (next === now) return;
    toggled.set(k, next);
    refresh();
  }

  function select(k, reveal, how = "one") {
    // a row folded inside its parent comes out when asked for (a culprit, the graphs, the worst pair)
    const parent = reveal ? nesting.parentOf(k) : -1;
    if (parent >= 0 && nest && nest.open && !nest.open[parent] && flat.includes(k)) {
      toggled.set(parent, true);
      refresh();
    }
    ({ selection, anchor } = nextSelection(selection, anchor, k, how, index));
    focus = selection.includes(k) ? k : selection.length ? selection[selection.length - 1] : -1;
    table.setSelection(selection, focus, reveal);
    showDetail();
    if (focus >= 0) for (const cb of selectListeners) cb(focus);
    updateSets();
    schedulePublish();
  }

  function showDetail() {
    const row = focus >= 0 ? rowsShown()[focus] : undefined;
    detailFor = row || null;
    const tol = tolerances();
    const summary = row ? nesting.update(rowsShown()).summary(focus) : null;
    renderDetail(detail, row, { atol: tol.atol, rtol: tol.rtol, within: row ? isWithin(row, tol.atol, tol.rtol, tol.runAtol, tol.runRtol) : null,
      inside: summary ? insideText(summary, summary.n) : null });
  }

  // --- what the kernel reads back (w.selected, w.filtered_dataframe()) ---------------------------
  let published = { view: model.get("view_rows") || [], selection: model.get("selected_rows") || [] };
  let publishTimer = 0;
  function schedulePublish() {
    if (!publishTimer) publishTimer = setTimeout(publish, running() ? PUBLISH_RUNNING_MS : PUBLISH_MS);
  }
  function publish() {
    publishTimer = 0;
    if (shown !== model.get("run_id")) return; // positions are in the current run's records
    if (rowsShown().length < sync.expected(shown)) return; // rows still on their way: the next refresh sends
    const view = Array.from(flat);
    let changed = false;
    if (!sameInts(view, published.view)) {
      published = { ...published, view };
      model.set("view_rows", view);
      changed = true;
    }
    if (!sameInts(selection, published.selection)) {
      published = { ...published, selection: [...selection] };
      model.set("selected_rows", [...selection]);
      changed = true;
    }
    if (changed) model.save_changes();
  }
  // another view of the same widget, or Python (w.selected_rows = [...]), changed the selection
  function adoptSelection() {
    const sel = model.get("selected_rows") || [];
    if (sameInts(sel, selection) || shown !== model.get("run_id")) return;
    published = { ...published, selection: [...sel] };
    selection = [...sel];
    focus = selection.length ? selection[selection.length - 1] : -1;
    anchor = focus;
    table.setSelection(selection, focus, false);
    showDetail();
    if (focus >= 0) for (const cb of selectListeners) cb(focus);
  }

  function toggleReset(row) {
    if (!row || !live) return;
    const name = nameOf(row);
    if (!name) return;
    const names = resetNames();
    model.set("reset_names", names.includes(name) ? names.filter((n) => n !== name) : [...names, name]);
    model.save_changes();
  }

  function readFilter() {
    filter = { text: search.value, beyond: beyond.checked, hideNoise: hideNoise.checked, status: statusSel.value, col: colSel.value, min: minIn.value, max: maxIn.value, inputDependent: sets.onlyDependent(), bDeparts: models.onlyDeparts() };
    refresh();
  }
  for (const input of [search, minIn, maxIn]) input.addEventListener("input", readFilter);
  for (const input of [beyond, hideNoise, statusSel, colSel]) input.addEventListener("change", readFilter);

  function setTolerance(name, input) {
    const v = Number(input.value);
    if (!(v >= 0) || input.value.trim() === "") { input.value = String(model.get(name)); return; }
    model.set(name, v);
    model.save_changes();
    onTolerance();
  }
  atolIn.addEventListener("change", () => setTolerance("atol", atolIn));
  rtolIn.addEventListener("change", () => setTolerance("rtol", rtolIn));
  function onTolerance() {
    atolIn.value = String(model.get("atol"));
    rtolIn.value = String(model.get("rtol"));
    updateRtolNote();
    if (filter.beyond) refresh();
    else { table.repaint(); for (const cb of rowListeners) cb(); }
    if (focus >= 0) showDetail();
  }

  function updateRtolNote() {
    const { rtol, runRtol } = tolerances();
    const other = runRtol !== undefined && runRtol !== null && rtol !== runRtol;
    rtolNote.hidden = !other;
    rtolNote.textContent = other ? `rows judged at this run's rtol ${runRtol}; rtol ${rtol} applies on a rerun` : "";
  }

  runSel.addEventListener("change", () => showRun(Number(runSel.value)));
  function showRun(id) {
    shown = id;
    toggled = new Map();
    selection = [];
    focus = anchor = -1;
    table.setSelection(selection, focus, false);
    detailFor = null;
    renderDetail(detail, null, {});
    request(id);
    refresh();
    updateRtolNote();
    updateStrip();
    updateSets();
  }
  function updateRuns() {
    const ids = new Set(meta().map((m) => m.id));
    const latest = model.get("run_id");
    if (latest >= 0) ids.add(latest);
    runSel.replaceChildren(...[...ids].sort((a, b) => a - b).map((id) => {
      const m = meta()[id];
      const step = Number.isInteger(m?.step) ? m.step : id === latest ? stepOfRun(id) : null; // a decode step's lockstep
      const input = Number.isInteger(m?.input) ? ` · input #${m.input}` : ""; // input sets: an input's own records
      const label = `run #${id}${Number.isInteger(step) ? ` · step ${step}` : ""}${input}${m && m.reset_names.length ? ` · reset ${m.reset_names.length}` : ""}`;
      return h("option", { value: String(id), text: label, selected: id === shown });
    }));
    runSel.hidden = ids.size < 2;
  }

  const csv = () => toCSV(rowsShown(), model.get("columns"), flat);
  copyBtn.addEventListener("click", async () => {
    const text = csv();
    try {
      await navigator.clipboard.writeText(text);
    } catch {
      // clipboard API refused (insecure context, permissions): the old way still works
      const area = h("textarea", { style: { position: "fixed", opacity: "0" } });
      area.value = text;
      root.append(area);
      area.select();
      document.execCommand("copy");
      area.remove();
    }
    copyBtn.textContent = "Copied";
    setTimeout(() => { copyBtn.textContent = "Copy CSV"; }, 1200);
  });
  dlBtn.addEventListener("click", () => {
    const url = URL.createObjectURL(new Blob([csv()], { type: "text/csv" }));
    const a = h("a", { href: url, download: `sbs_run${shown}.csv`, style: { display: "none" } });
    root.append(a);
    a.click();
    a.remove();
    setTimeout(() => URL.revokeObjectURL(url), 1000);
  });

  // the worst chip's record, when its row is here: a reset one is never shown as the worst
  const worstIsReset = (p) => {
    if (p.run !== shown || p.worst_i === null || p.worst_i === undefined) return false;
    const row = rowsShown()[p.worst_i];
    return Boolean(row) && row.status === "reset";
  };
  // "Check as deployed" needs an exported model: none when the last run failed before any record
  const noModel = () => {
    if (model.get("status") !== "error") return "";
    const p = progress();
    const latest = model.get("run_id");
    const m = meta().find((x) => x && x.id === latest) || {};
    const records = Math.max(p.run === latest ? p.n_rows || 0 : 0, m.n_records || 0);
    return records > 0 ? "" : "not available: the last run failed before any record, so there is no exported model to check (see the message; fix it and rerun)";
  };
  const updateDeployed = () => deployed.update(model.get("deployed"), live, { unavailable: noModel() });

  let worstReset = false;
  function updateStatus() {
    const p = progress();
    worstReset = worstIsReset(p);
    prog.update(model.get("status"), p, model.get("message"), { worstIsReset: worstReset });
    stopBtn.disabled = !running();
    rerunBtn.disabled = running();
    reset.update(running());
    updateDeployed();
    updateRtolNote();
  }

  on("change:progress", () => { updateStatus(); request(progress().run); updateStrip(); });
  on("change:decoding", updateStrip);
  on("change:input_spread", updateSets);
  on("change:models_b", () => { updateModels(); readFilter(); });
  on("change:status", updateStatus);
  on("change:message", updateStatus);
  on("change:run_id", () => { updateRuns(); showRun(model.get("run_id")); });
  on("change:runs_meta", () => { updateStrip(); updateSets(); updateRtolNote(); updateRuns(); request(shown); updateDeployed(); renderCompare(compareEl, model.get("compare"), meta()); });
  on("change:compare", () => renderCompare(compareEl, model.get("compare"), meta()));
  on("change:reset_names", () => { reset.update(running()); table.repaint(); });
  on("change:columns", () => { updateColumns(); refresh(); });
  on("change:atol", onTolerance);
  on("change:rtol", onTolerance);
  on("change:culprits", () => culprits.update(model.get("culprits")));
  on("change:deployed", updateDeployed);
  on("change:selected_rows", adoptSelection);
  const setTitle = () => { title.textContent = visible(model.get("title") || "sbs_widget"); title.title = title.textContent; };
  on("change:title", setTitle);

  // --- graphs (issue 5), mounted when first opened: layout costs time, most sessions never open it
  const graphsCtx = {
    model,
    el: graphsHost,
    getRows: rowsShown,
    onRows: (cb) => { rowListeners.add(cb); return () => rowListeners.delete(cb); },
    colorFor,
    select: (i) => select(i, true),
    onSelect: (cb) => { selectListeners.add(cb); return () => selectListeners.delete(cb); },
  };
  let graphsMounted = false;
  // Pointing at "Graphs" announces a click: start Graphviz's workers now, not after it.
  graphsBox.firstChild.addEventListener("pointerenter", () => prewarmGraphs?.(), { once: true });
  graphsBox.addEventListener("toggle", () => {
    if (!graphsBox.open || graphsMounted || !mountGraphs) return;
    graphsMounted = true;
    try {
      const dispose = mountGraphs(graphsCtx);
      if (typeof dispose === "function") disposers.push(dispose);
    } catch (err) {
      graphsHost.append(h("div", { class: "sbs-message", text: `graphs failed: ${messageText(String(err))}` }));
    }
  });

  setTitle();
  updateColumns();
  atolIn.value = String(model.get("atol"));
  rtolIn.value = String(model.get("rtol"));
  table.setSelection(selection, focus, false);
  showDetail();
  updateRuns();
  renderCompare(compareEl, model.get("compare"), meta());
  culprits.update(model.get("culprits"));
  updateStrip();
  updateSets();
  updateStatus();
  refresh();
  request(shown);

  return () => {
    if (frame) cancelAnimationFrame(frame);
    if (publishTimer) { clearTimeout(publishTimer); publish(); } // a click just before the view closed still counts
    table.destroy();
    for (const d of disposers) d();
    root.remove();
  };
}
