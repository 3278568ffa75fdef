// The virtualized diff table: a fixed pool of row elements repositioned on scroll, so the DOM holds
// about 30 rows whatever the run's size. Sorting and filtering work on an index (js/rows.js).

import { h, clear } from "./dom.js";
import { fmtErr, fmtInt, visible } from "./format.js";
import { ROW_HEIGHT, VIEW_HEIGHT } from "./style.js";

const OVERSCAN = 6;

export const COLUMNS = [
  { key: "_tick", label: "", width: "24px", title: "tick to add the row's name to the reset set" },
  { key: "i", label: "#", width: "44px", num: true, title: "execution order" },
  { key: "status", label: "status", width: "72px" },
  { key: "kind", label: "kind", width: "54px" },
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

function cellText(col, row) {
  const v = row[col.key];
  if (col.err) return fmtErr(v);
  if (col.key === "i") return fmtInt(v);
  return visible(v); // names come from models: bidi controls and NULs shown as escapes
}

/** A value a reset can replace: one an ONNX node computes (not an input, weight or folded constant). */
export function resettable(row) {
  return Boolean(row.onnx_name && row.ep_name) && row.onnx_op_type !== "initializer" && row.onnx_op_type !== "input";
}

/** opts: {onSort(key), onSelect(k, how: "one" | "toggle" | "extend"), onToggle(k), isTicked(row), colorOf(row), canTick} */
export function createTable(opts) {
  const head = h("div", { class: "sbs-head sbs-grid", role: "row" });
  const body = h("div", { class: "sbs-body", role: "rowgroup" });
  const empty = h("div", { class: "sbs-empty", text: "No rows yet." });
  const scroll = h("div", { class: "sbs-scroll", tabindex: "0", role: "grid" }, head, body, empty);
  const foot = h("div", { class: "sbs-foot sbs-mono" });
  const el = h("div", { class: "sbs-table" }, scroll, foot);
  el.style.setProperty("--sbs-cols", COLUMNS.map((c) => c.width).join(" "));

  let rows = [];
  let index = new Uint32Array(0);
  let selected = new Set(); // positions in rows (record i), not in index
  let focus = -1; // the row the detail shows (the last one clicked)
  let sort = { key: null, dir: 1 };
  const pool = [];

  for (const col of COLUMNS) {
    const cell = h("div", { class: col.num ? "sbs-num" : "", title: col.title || col.key, text: col.label, "data-key": col.key });
    if (col.key !== "_tick") cell.addEventListener("click", () => opts.onSort(col.key));
    head.append(cell);
  }

  function makeRow() {
    const tick = h("input", { type: "checkbox", tabindex: "-1", "aria-label": "reset" });
    const cells = COLUMNS.map((col) => (col.key === "_tick" ? h("div", { class: "sbs-tick" }, tick) : h("div", { class: col.num ? "sbs-num" : "" })));
    const rowEl = h("div", { class: "sbs-row sbs-grid", role: "row" }, cells);
    rowEl._cells = cells;
    rowEl._tick = tick;
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
    for (let c = 1; c < COLUMNS.length; c++) {
      const text = cellText(COLUMNS[c], row);
      const cell = rowEl._cells[c];
      if (cell.textContent !== text) {
        cell.textContent = text;
        cell.title = text;
      }
    }
    rowEl._tick.checked = opts.isTicked(row);
    rowEl._tick.disabled = !opts.canTick() || !resettable(row);
    rowEl._tick.title = resettable(row) ? "put in the reset set" : "not resettable: no ONNX node computes this value";
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
    if (ev.target === rowEl._tick) opts.onToggle(k);
    else opts.onSelect(k, ev.shiftKey ? "extend" : ev.ctrlKey || ev.metaKey ? "toggle" : "one");
  });
  // shift-click extends the selection of rows, not the page's text selection
  body.addEventListener("mousedown", (ev) => { if (ev.shiftKey && ev.target.closest(".sbs-row")) ev.preventDefault(); });
  scroll.addEventListener("keydown", (ev) => {
    if (ev.key !== "ArrowDown" && ev.key !== "ArrowUp") return;
    ev.preventDefault();
    const pos = index.indexOf(focus);
    const next = Math.max(0, Math.min(index.length - 1, pos + (ev.key === "ArrowDown" ? 1 : -1)));
    if (index.length) opts.onSelect(index[next], ev.shiftKey ? "extend" : "one");
  });

  return {
    el,
    /** New data: rows, the filtered + sorted index into them, the sort shown in the header. */
    set(newRows, newIndex, newSort) {
      rows = newRows;
      index = newIndex;
      sort = newSort;
      render(); // synchronous: sorting a column shows its result in the same task
    },
    setFooter(parts) {
      clear(foot);
      for (const p of parts) foot.append(h("span", { text: p }));
    },
    repaint: render,
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
