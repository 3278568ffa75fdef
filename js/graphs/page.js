// The standalone graphs page written by `python -m sbs_widget graph`: reads the data embedded in the
// page, shows a small records table and the linked graphs. Works offline from a file:// URL.
import { colorFor, fromJson } from "../rules.js";
import { visible } from "../format.js";
import { mountGraphs } from "./index.js";
import { prewarmLayout } from "./layout.js";
import { themeCSS } from "../theme.js";

const TABLE_CSS = `${themeCSS([".sbs-page"])}
body.sbs-page { margin: 12px; font: 13px var(--sbs-font); color: var(--sbs-fg); background: var(--sbs-bg); }
h1 { font-size: 16px; margin: 0 0 6px; }
.sbsp-table { max-height: 260px; overflow: auto; border: 1px solid var(--sbs-border); margin-top: 8px; }
.sbsp-table table { border-collapse: collapse; width: 100%; table-layout: fixed; font: 12px ui-monospace, monospace; }
.sbsp-table th { position: sticky; top: 0; background: var(--sbs-bg2); text-align: left; }
.sbsp-table td, .sbsp-table th { padding: 1px 6px; border-bottom: 1px solid var(--sbs-border); white-space: nowrap;
  overflow: hidden; text-overflow: ellipsis; }
.sbsp-table tr.sbsp-selected td { outline: 2px solid var(--sbs-accent); outline-offset: -2px; }
.sbsp-table tbody tr { cursor: pointer; }
`;

function main() {
  performance.mark("sbsg:page-main");
  prewarmLayout(2); // Graphviz starts in its workers while the page parses its data and builds the table
  const data = JSON.parse(document.getElementById("sbs-graphs-data").textContent);
  const style = document.createElement("style");
  style.textContent = TABLE_CSS;
  document.head.append(style);
  const h1 = document.createElement("h1");
  h1.textContent = visible(data.title);
  const graphs = document.createElement("div");
  const tableBox = document.createElement("div");
  tableBox.className = "sbsp-table";
  document.body.classList.add("sbs-page"); // the page's colours: js/theme.js (light or dark, as the browser)
  document.body.append(h1, graphs, tableBox);

  // numbers as the kernel sends them: NaN and infinities arrive as strings (shared_rules.NON_FINITE)
  const rows = data.rows.map((r, i) => {
    const row = { i };
    for (const [k, v] of Object.entries(r)) row[k] = fromJson(k, v);
    return row;
  });
  const selectListeners = new Set();
  const trs = new Map();
  let selected = null;
  const select = (i) => {
    trs.get(selected)?.classList.remove("sbsp-selected");
    selected = i;
    const tr = trs.get(i);
    tr?.classList.add("sbsp-selected");
    tr?.scrollIntoView({ block: "nearest" });
    for (const cb of selectListeners) cb(i);
  };
  if (!rows.length) tableBox.hidden = true;

  // The same object shape js/widget.js passes; the "model" only ever holds the two DOT strings.
  const model = { get: (name) => data[name], on() {}, off() {} };
  mountGraphs({
    model, el: graphs, colorFor, select, getRows: () => rows, onRows: () => () => {},
    onSelect: (cb) => (selectListeners.add(cb), () => selectListeners.delete(cb)),
  });
  // The table waits for the graphs: building it holds the main thread, which both the layout workers'
  // start and the drawing of their results need. Both panes drawn (or 3 s, whatever happens), it comes.
  const drawn = new Set();
  let built = false;
  const build = () => built || !rows.length || ((built = true), table(tableBox, rows, trs, select, () => selected));
  graphs.addEventListener("sbsg-rendered", (e) => drawn.add(e.detail.side).size === 2 && build());
  setTimeout(build, 3000);
}

const COLUMNS = ["i", "status", "ep_name", "onnx_name", "onnx_node_name", "err_abs", "err_local", "module"];
const WIDTHS = [4, 7, 18, 18, 18, 8, 8, 19]; // % of the width: a fixed layout costs nothing per row
const CHUNK = 150;

/** The records table, in small chunks: one long task of 10,000 cells (a 1,000-node model) would hold
 * the main thread for ~0.6 s. */
function table(box, rows, trs, select, selected) {
  const t = document.createElement("table");
  const cols = t.appendChild(document.createElement("colgroup"));
  for (const w of WIDTHS) cols.appendChild(document.createElement("col")).style.width = `${w}%`;
  const head = t.createTHead().insertRow();
  for (const c of COLUMNS) head.append(Object.assign(document.createElement("th"), { textContent: c }));
  const body = t.createTBody();
  box.append(t);
  let next = 0;
  const chunk = () => {
    const end = Math.min(rows.length, next + CHUNK);
    const frag = document.createDocumentFragment();
    for (; next < end; next++) frag.append(row(rows[next], trs, select));
    body.append(frag);
    trs.get(selected())?.classList.add("sbsp-selected");
    if (next < rows.length) setTimeout(chunk, 0);
    else box.dataset.built = "1";
  };
  chunk();
}

function row(r, trs, select) {
  const tr = document.createElement("tr");
  tr.dataset.row = r.i;
  for (const c of COLUMNS) {
    const td = tr.insertCell();
    const v = r[c];
    // names come from models: bidi controls and NULs shown as escapes, so no name displays as another
    td.textContent = v === null || v === undefined ? "" : typeof v === "number" && c !== "i" ? v.toExponential(2) : visible(v);
    td.title = td.textContent;
    if (c === "err_abs") td.style.background = colorFor(r.err_abs, r.status);
  }
  // Our own select() also tells the graphs, which center on the pair.
  tr.addEventListener("click", () => select(r.i));
  trs.set(r.i, tr);
  return tr;
}

main();
