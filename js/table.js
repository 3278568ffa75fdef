// The virtualized diff table: a fixed pool of row elements repositioned on scroll, so the DOM holds
// about 30 rows whatever the run's size. Sorting and filtering work on an index (js/rows.js).

import { h, clear } from "./dom.js";
import { fmtErr, fmtInt, fmtMetric, visible } from "./format.js";
import { isMetric, metricName } from "./rules.js";
import { ROW_HEIGHT, VIEW_HEIGHT } from "./style.js";
import { isInputDependent, spreadColumns } from "./sets.js";
import { B_COLUMNS } from "./models.js";

const OVERSCAN = 6;

export const COLUMNS = [
  { key: "_tick", label: "", width: "24px", title: "tick to add the row's name to the reset set" },
  { key: "i", label: "#", width: "44px", num: true, title: "execution order" },
  { key: "status", label: "status", width: "72px" },
  { key: "kind", label: "kind", width: "54px" },
  // an FX node's values inside its ONNX translation: the disclosure on its row, the torch op on theirs
  { key: "_inner", label: "inside", width: "minmax(116px, 1fr)", title: "values computed inside the ONNX translation of the FX node: click to show them" },
  { key: "ep_name", label: "FX name", width: "minmax(96px, 1.4fr)" },
  { key: "onnx_name", label: "ONNX name", width: "minmax(96px, 1.4fr)" },
  { key: "onnx_op_type", label: "op", width: "minmax(52px, 0.6fr)" },
  { key: "ep_shape_type", label: "shape", width: "minmax(64px, 0.7fr)" },
  { key: "err_abs", label: "err_abs", width: "70px", num: true, err: true },
  { key: "err_rel", label: "err_rel", width: "70px", num: true, err: true },
  { key: "err_local", label: "err_local", width: "70px", num: true, err: true, title: "error of the node run on torch inputs (node_local=True)" },
  { key: "min_atol", label: "min atol", width: "70px", num: true, err: true, title: "smallest atol this pair passes at the run's rtol" },
  { key: "module", label: "module", width: "minmax(70px, 1fr)" },
];

/** The column of a metric (key "metric:<name>"): numeric, sortable, its name shown as text only (it
 *  comes from a user: textContent, hidden characters as escapes). */
export function metricColumn(key) {
  const name = visible(metricName(key));
  return { key, label: name, width: "minmax(70px, 0.6fr)", num: true, metric: true,
    title: `${name}: a metric asked for with metrics=, measured beside the verdict (it judges nothing)` };
}

/** The table's columns for the model's `columns`: the fixed ones, each metric's before "module", the
 *  spread's of input sets (js/sets.js) after "err_abs"; with `b` (two models, js/models.js) b's columns
 *  before the metrics. */
export function tableColumns(keys = [], { b = false } = {}) {
  const metrics = keys.filter(isMetric).map(metricColumn);
  const spread = spreadColumns(keys);
  if (!metrics.length && !spread.length && !b) return COLUMNS;
  const at = COLUMNS.findIndex((c) => c.key === "module");
  const err = COLUMNS.findIndex((c) => c.key === "err_abs") + 1;
  return [...COLUMNS.slice(0, err), ...spread, ...COLUMNS.slice(err, at), ...(b ? B_COLUMNS : []), ...metrics, ...COLUMNS.slice(at)];
}

/** Width of the "#" column for `n` rows: 44px up to 999, then as wide as the largest index written
 *  (fmtInt: "12,345") in the monospace digits plus the cell's padding, so no index is cut. */
export function indexWidth(n) {
  const chars = fmtInt(Math.max(0, n - 1)).length;
  return chars <= 3 ? "44px" : `calc(${chars}ch + 14px)`;
}

function cellText(col, row, child) {
  const v = row[col.key];
  // an inner row under its FX node: the part of its name after "<inner_of>::" (the full name on hover)
  if (child && col.key === "ep_name" && typeof v === "string" && v.startsWith(`${row.inner_of}::`)) {
    return visible(v.slice(row.inner_of.length + 2));
  }
  if (col.text) return col.text(row); // a column that writes its own text (the spread's: js/sets.js)
  if (col.err) return fmtErr(v);
  if (col.metric) return fmtMetric(v);
  if (col.key === "i") return fmtInt(v);
  return visible(v); // names come from models: bidi controls and NULs shown as escapes
}

/** A value a reset can replace: one an ONNX node computes (not an input, weight or folded constant),
 *  with a torch value to put in its place (an inner value: when paired with a finer torch reference). */
export function resettable(row) {
  return Boolean(row.onnx_name && row.ep_name) && row.onnx_op_type !== "initializer" && row.onnx_op_type !== "input";
}

/** The name a tick puts in the reset set: an inner value's ONNX value (its ep_name names no FX node),
 *  otherwise the FX name, or the ONNX one for a value without FX twin. */
export function resetName(row) {
  return (row.kind === "inner" ? row.onnx_name : row.ep_name || row.onnx_name) || "";
}

/** How many inner rows a row holds and the worst status among them: ["9", "1 mismatch"] ("2/9" when the
 *  filter passes 2 of them; the worst "" when they are all ok). The disclosure shows "▸ 9 · 1 mismatch"
 *  under the column head "inside". */
export function insideParts(summary, matched) {
  const count = matched === summary.n ? `${summary.n}` : `${matched}/${summary.n}`;
  const worst = !summary.worst || summary.worst === "ok" ? "" : `${summary.count} ${summary.worst}`;
  return [count, worst];
}

/** The same in words: "9 inside · 1 mismatch", "2/9 inside" (labels, the detail panel). */
export function insideText(summary, matched) {
  const [count, worst] = insideParts(summary, matched);
  return worst ? `${count} inside · ${worst}` : `${count} inside`;
}

/** opts: {onSort(key), onSelect(k, how: "one" | "toggle" | "extend"), onToggle(k), onExpand(k, open?),
 *  isTicked(row), colorOf(row), canTick} */
export function createTable(opts) {
  const head = h("div", { class: "sbs-head sbs-grid", role: "row" });
  const body = h("div", { class: "sbs-body", role: "rowgroup" });
  const empty = h("div", { class: "sbs-empty", text: "No rows yet." });
  const scroll = h("div", { class: "sbs-scroll", tabindex: "0", role: "grid" }, head, body, empty);
  const foot = h("div", { class: "sbs-foot sbs-mono" });
  const el = h("div", { class: "sbs-table sbs-flat" }, scroll, foot);
  // the "inside" column only where some row is an inner value
  let flatCols = null;
  let iWidth = indexWidth(0);
  const setFlat = (flat, width = iWidth) => {
    if (flat === flatCols && width === iWidth) return;
    flatCols = flat;
    iWidth = width;
    el.classList.toggle("sbs-flat", flat);
    el.style.setProperty("--sbs-cols", cols.filter((c) => !flat || c.key !== "_inner").map((c) => (c.key === "i" ? width : c.width)).join(" "));
  };

  let cols = COLUMNS; // the fixed columns, and one per metric (setColumns)
  let hasB = false; // b's columns (two models: js/models.js)
  let INNER = cols.findIndex((c) => c.key === "_inner");
  let FX_NAME = cols.findIndex((c) => c.key === "ep_name");
  setFlat(true);

  let rows = [];
  let index = new Uint32Array(0);
  let selected = new Set(); // positions in rows (record i), not in index
  let focus = -1; // the row the detail shows (the last one clicked)
  let sort = { key: null, dir: 1 };
  let nest = null; // {nesting, matched, open} from rows.js nestIndex, null when nothing nests
  const pool = [];

  const cellClass = (col) => (col.cls ? col.cls : col.num ? "sbs-num" : col.key === "_inner" ? "sbs-inside" : col.key === "ep_name" ? "sbs-fxname" : "");
  function buildHead() {
    clear(head);
    for (const col of cols) {
      const cell = h("div", { class: cellClass(col), title: col.title || col.key, text: col.label, "data-key": col.key });
      if (col.key !== "_tick") cell.addEventListener("click", () => opts.onSort(col.key));
      head.append(cell);
    }
  }
  buildHead();

  function makeRow() {
    const tick = h("input", { type: "checkbox", tabindex: "-1", "aria-label": "reset" });
    const count = h("span");
    const worst = h("span", { class: "sbs-disclose-worst" });
    const disclose = h("button", { type: "button", class: "sbs-disclose", "aria-expanded": "false", hidden: true }, count, worst);
    disclose._count = count;
    disclose._worst = worst;
    const op = h("span", { class: "sbs-inner-op" });
    const cells = cols.map((col) => (col.key === "_tick" ? h("div", { class: "sbs-tick" }, tick)
      : col.key === "_inner" ? h("div", { class: "sbs-inside" }, disclose, op) : h("div", { class: cellClass(col) })));
    const rowEl = h("div", { class: "sbs-row sbs-grid", role: "row" }, cells);
    rowEl._cells = cells;
    rowEl._tick = tick;
    rowEl._disclose = disclose;
    rowEl._op = op;
    body.append(rowEl);
    return rowEl;
  }

  function paint(rowEl, pos) {
    const k = index[pos];
    const row = rows[k];
    rowEl.style.transform = `translateY(${pos * ROW_HEIGHT}px)`;
    rowEl.style.display = "";
    rowEl.dataset.k = String(k);
    rowEl.style.backgroundColor = opts.colorOf(row); // its tint; the stylesheet may veil it (dark themes)
    const on = selected.has(k);
    rowEl.classList.toggle("sbs-selected", on);
    rowEl.classList.toggle("sbs-focus", k === focus);
    rowEl.setAttribute("aria-selected", on ? "true" : "false");
    if (isInputDependent(row)) rowEl.dataset.inputDependent = "true";
    else delete rowEl.dataset.inputDependent;
    if (hasB) {
      rowEl.dataset.bStatus = row.b_status || "";
      rowEl.dataset.bTwin = row.b_name === null || row.b_name === undefined ? "none" : "paired";
    }
    const child = paintInner(rowEl, k, row);
    for (let c = 1; c < cols.length; c++) {
      if (c === INNER) continue;
      const text = cellText(cols[c], row, child);
      const cell = rowEl._cells[c];
      if (cell.textContent !== text) cell.textContent = text;
      const title = c === FX_NAME && child ? visible(row.ep_name) : cols[c].tip ? cols[c].tip(row) : text; // an inner row's full name
      if (cell.title !== title) cell.title = title;
    }
    rowEl._tick.checked = opts.isTicked(row);
    rowEl._tick.disabled = !opts.canTick() || !resettable(row);
    rowEl._tick.title = resettable(row) ? "put in the reset set" : "not resettable: no ONNX node computes this value";
  }

  // the "inside" cell: a parent's disclosure, an inner row's torch op; the FX name indented under its
  // parent. Returns whether the row is drawn under a parent.
  function paintInner(rowEl, k, row) {
    const summary = nest ? nest.nesting.summary(k) : null;
    const child = Boolean(nest) && nest.nesting.parentOf(k) >= 0;
    rowEl.classList.toggle("sbs-child", child);
    rowEl.classList.toggle("sbs-parent", Boolean(summary));
    const b = rowEl._disclose;
    if (summary) {
      const matched = nest.matched[k];
      const open = nest.open[k] === 1;
      const [count, worst] = insideParts(summary, matched);
      const text = insideText(summary, matched);
      b.hidden = false;
      b.disabled = matched === 0;
      b._count.textContent = `${open ? "▾" : "▸"} ${count}`;
      b._worst.textContent = worst ? ` · ${worst}` : "";
      b._worst.dataset.status = summary.worst || "ok";
      b.setAttribute("aria-expanded", open ? "true" : "false");
      const what = visible(row.ep_name || "");
      b.setAttribute("aria-label", `${open ? "hide" : "show"} the values inside ${what}: ${text}`);
      b.title = matched === 0 ? `${text}: none passes the filter` : `${open ? "hide" : "show"} the values computed inside the ONNX translation of ${what} (${text})`;
    } else if (!b.hidden) {
      b.hidden = true;
    }
    const opText = row.kind === "inner" ? visible(row.inner_op || "unpaired") : "";
    if (rowEl._op.textContent !== opText) {
      rowEl._op.textContent = opText;
      rowEl._op.title = row.kind !== "inner" ? "" : row.inner_op ? `compared with torch's ${opText}` : "not paired with a torch value (see the comment)";
    }
    return child;
  }

  let frame = 0;
  function render() {
    frame = 0;
    body.style.height = `${index.length * ROW_HEIGHT}px`;
    empty.style.display = index.length ? "none" : "";
    empty.textContent = rows.length ? "No row matches the filter." : "No rows yet.";
    const viewport = scroll.clientHeight || VIEW_HEIGHT + ROW_HEIGHT; // 0 before layout (or in jsdom)
    const top = Math.max(0, scroll.scrollTop);
    const first = Math.max(0, Math.floor(top / ROW_HEIGHT) - OVERSCAN);
    const last = Math.min(index.length, Math.ceil((top + viewport) / ROW_HEIGHT) + OVERSCAN);
    while (pool.length < last - first) pool.push(makeRow());
    for (let p = 0; p < pool.length; p++) {
      if (first + p < last) paint(pool[p], first + p);
      else {
        pool[p].style.display = "none";
        delete pool[p].dataset.k; // a hidden row must not answer for a record
      }
    }
    for (const cell of head.children) {
      if (cell.dataset.key === sort.key) cell.dataset.sort = sort.dir > 0 ? "▲" : "▼";
      else delete cell.dataset.sort;
    }
  }
  const schedule = () => { if (!frame) frame = requestAnimationFrame(render); };
  scroll.addEventListener("scroll", schedule, { passive: true });

  body.addEventListener("click", (ev) => {
    const rowEl = ev.target.closest(".sbs-row");
    if (!rowEl) return;
    const k = Number(rowEl.dataset.k);
    if (ev.target.closest(".sbs-disclose")) opts.onExpand(k);
    else if (ev.target === rowEl._tick) opts.onToggle(k);
    else opts.onSelect(k, ev.shiftKey ? "extend" : ev.ctrlKey || ev.metaKey ? "toggle" : "one");
  });
  // shift-click extends the selection of rows, not the page's text selection
  body.addEventListener("mousedown", (ev) => { if (ev.shiftKey && ev.target.closest(".sbs-row")) ev.preventDefault(); });
  scroll.addEventListener("keydown", (ev) => {
    if (ev.target.closest?.(".sbs-disclose")) return; // the button's own keys (Enter, Space)
    if ((ev.key === "ArrowRight" || ev.key === "ArrowLeft") && focus >= 0 && nest) {
      // right opens the focused row's inner values, left closes them (on an inner row: goes to its parent)
      const parent = nest.nesting.parentOf(focus);
      if (ev.key === "ArrowLeft" && parent >= 0) opts.onSelect(parent, "one");
      else if (nest.nesting.summary(focus)) opts.onExpand(focus, ev.key === "ArrowRight");
      else return;
      ev.preventDefault();
      return;
    }
    if (ev.key !== "ArrowDown" && ev.key !== "ArrowUp") return;
    ev.preventDefault();
    const pos = index.indexOf(focus);
    const next = Math.max(0, Math.min(index.length - 1, pos + (ev.key === "ArrowDown" ? 1 : -1)));
    if (index.length) opts.onSelect(index[next], ev.shiftKey ? "extend" : "one");
  });

  return {
    el,
    /** New data: rows, the filtered + sorted index into them, the sort shown in the header, and how
     *  inner rows nest ({nesting, matched, open}, see rows.js nestIndex; null: none nests). */
    set(newRows, newIndex, newSort, newNest = null) {
      rows = newRows;
      index = newIndex;
      sort = newSort;
      nest = newNest && newNest.matched ? newNest : null;
      let last = rows.length;
      if (last && rows[last - 1] && Number.isFinite(rows[last - 1].i)) last = Math.max(last, rows[last - 1].i + 1);
      setFlat(!(newNest && newNest.nesting && newNest.nesting.inner > 0), indexWidth(last));
      render(); // synchronous: sorting a column shows its result in the same task
    },
    setFooter(parts) {
      clear(foot);
      for (const p of parts) foot.append(h("span", { text: p }));
    },
    repaint: render,
    /** The model's `columns` (record fields, then "metric:<name>" keys): a metric column each; `b`: b's
     *  columns too (two models). */
    setColumns(keys, { b = false } = {}) {
      const next = tableColumns(keys || [], { b });
      hasB = b;
      if (next.length === cols.length && next.every((c, k) => c.key === cols[k].key)) return;
      cols = next;
      INNER = cols.findIndex((c) => c.key === "_inner");
      FX_NAME = cols.findIndex((c) => c.key === "ep_name");
      buildHead();
      for (const rowEl of pool) rowEl.remove(); // rows are rebuilt with the new cells
      pool.length = 0;
      const flat = flatCols;
      flatCols = null;
      setFlat(flat, iWidth);
      render();
    },
    /** Selected rows (record positions) and the focused one; `reveal` scrolls the focus into view. */
    setSelection(keys, k, reveal = false) {
      selected = new Set(keys);
      focus = k;
      if (reveal && k >= 0) {
        const pos = index.indexOf(k);
        if (pos >= 0) {
          const y = pos * ROW_HEIGHT;
          const viewport = scroll.clientHeight || VIEW_HEIGHT;
          if (y < scroll.scrollTop || y > scroll.scrollTop + viewport - 2 * ROW_HEIGHT) scroll.scrollTop = Math.max(0, y - viewport / 2);
        }
      }
      render();
    },
    destroy() { if (frame) cancelAnimationFrame(frame); },
  };
}
