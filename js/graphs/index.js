// The graphs area of the widget: FX and ONNX graphs side by side, painted by the table's errors, linked
// node to node and to the table. See mountGraphs for the contract with js/widget.js.
import { createLayout } from "./layout.js";
import {
  buildView, chainOf, counterparts, defaultCollapsed, errorPath, indexGraph, neighbourhood, nodeTitle, paintClusters,
  paintGraph, parseSpec, partOf,
} from "./model.js";
import { fmtInt, visible } from "../format.js";
import { createPane, el } from "./pane.js";
import { CSS } from "./style.js";
import { colorFor as defaultColorFor, ERROR_FILL, ERROR_LINE, errorColor, NOISE_FILL, NOT_COMPARED, ONE_SIDED_FILL, RESET_LINE } from "../rules.js";

// "b": the transformed copy of the ONNX model (two models, SbsWidget.from_models), a third pane when the
// model has its graph (onnx_b_dot); its nodes link to the rows through their b_* fields.
const SIDES = ["fx", "onnx", "b"];
const TITLES = { fx: "torch.export (FX)", onnx: "ONNX", b: "ONNX b (transformed)" };
const DOT = { fx: "fx_dot", onnx: "onnx_dot", b: "onnx_b_dot" };
const others = (side) => SIDES.filter((x) => x !== side);
const BIG_CLUSTER = 150; // expanding a cluster bigger than this keeps its sub-modules closed
// Graphviz (WebAssembly) recurses along a chain: 12,000 nodes in a row overflow its stack (node, 8,000
// pass). A view with more boxes than MAX_BOXES draws a part of PART nodes instead, and says so.
export const MAX_BOXES = 4000;
export const PART = 1500;

/**
 * ctx = { model, el, getRows(), onRows(cb) -> unsubscribe, colorFor(err, status), select(i), onSelect(cb) }.
 * Reads model "fx_dot" / "onnx_dot" (sbs_widget.graphs.dot_sources). Returns a cleanup function.
 */
export function mountGraphs(ctx) {
  const colorFor = ctx.colorFor || defaultColorFor;
  const t0 = performance.now();
  performance.mark("sbsg:mount");
  const root = el("div", "sbsg");
  root.append(el("style", null, CSS));
  const bar = el("div", "sbsg-bar");
  const panesBox = el("div", "sbsg-panes");
  const status = el("span", "sbsg-status");
  root.append(bar, panesBox);
  ctx.el.append(root);

  const state = { selected: null, hood: false, k: 2, trace: true, disposed: false };
  const sides = {};
  for (const side of SIDES) {
    sides[side] = {
      side, g: null, collapsed: new Set(), view: null, paint: [], clusterPaint: [], rowsOf: new Map(),
      layout: createLayout(), renderSeq: 0,
      pane: createPane(panesBox, {
        title: TITLES[side],
        onNodeClick: (key) => onBoxClick(side, key),
        onNodeHover: (key) => onHover(side, key),
        onClusterLabelClick: (c) => setCollapsed(side, c, true),
      }),
    };
  }
  const showB = (on) => {
    sides.b.pane.box.hidden = !on;
    panesBox.classList.toggle("sbsg-three", on);
  };
  showB(Boolean(ctx.model.get(DOT.b)));

  // Toolbar: view controls, neighbourhood mode, legend, timings.
  const button = (label, title, fn) => {
    const b = el("button", null, label);
    b.title = title;
    b.addEventListener("click", fn);
    bar.append(b);
    return b;
  };
  button("Fit", "Show the whole graphs", () => SIDES.forEach((s) => sides[s].pane.fit()));
  button("Expand all", "Open every module (slow on big graphs)", () => setAll(() => new Set()));
  button("Collapse", "Back to the module overview", () => setAll((s) => defaultCollapsed(s.g)));
  const hood = el("label", null);
  const hoodBox = Object.assign(el("input"), { type: "checkbox", title: "Only the nodes near the selection" });
  const kInput = Object.assign(el("input"), { type: "number", min: 1, max: 20, value: state.k });
  hood.append(hoodBox, " neighbourhood k=", kInput);
  hoodBox.addEventListener("change", () => ((state.hood = hoodBox.checked), renderAll()));
  kInput.addEventListener("change", () => ((state.k = Math.max(1, Number(kInput.value) || 1)), state.hood && renderAll()));
  const trace = el("label", null);
  const traceBox = Object.assign(el("input"), { type: "checkbox", checked: true });
  trace.append(traceBox, " trace error back");
  traceBox.addEventListener("change", () => ((state.trace = traceBox.checked), highlight()));
  bar.append(hood, trace, legend(colorFor), status);

  function load(side) {
    const s = sides[side];
    let spec;
    try {
      if (side === "b") showB(Boolean(ctx.model.get(DOT.b)));
      spec = parseSpec(ctx.model.get(DOT[side]));
    } catch (e) {
      s.pane.message(`Cannot read the graph: ${visible(e.message)}`);
      return;
    }
    if (!spec) {
      s.g = null;
      s.pane.message("No graph yet.");
      return;
    }
    performance.mark(`sbsg:parsed-${side}`);
    s.g = indexGraph(spec);
    s.collapsed = defaultCollapsed(s.g);
    repaintData(side);
    performance.mark(`sbsg:painted-${side}`);
    render(side, { fit: true });
    performance.mark(`sbsg:view-${side}`);
  }

  function repaintData(side) {
    const s = sides[side];
    if (!s.g) return;
    const { paint, rowsOf } = paintGraph(s.g, ctx.getRows());
    s.paint = paint;
    s.rowsOf = rowsOf;
    s.clusterPaint = paintClusters(s.g, paint);
  }

  async function render(side, { fit = false, centerOn = null } = {}) {
    const s = sides[side];
    if (!s.g) return;
    performance.mark(`sbsg:render-${side}`);
    let only = state.hood && state.selected ? hoodOf(side) : null;
    const opts = { collapsed: s.collapsed, paint: s.paint, clusterPaint: s.clusterPaint, colorFor };
    s.view = buildView(s.g, { ...opts, only });
    const boxes = new Set(s.view.repOf.filter(Boolean)).size + s.view.proxies.size;
    s.pane.note("");
    if (boxes > MAX_BOXES || only?.size > MAX_BOXES) {
      // Too big for one layout: the part around the selection, or the start of the graph.
      const starts = state.selected ? startsOf(side) : [];
      only = partOf(s.g, starts, PART);
      s.view = buildView(s.g, { ...opts, only });
      s.pane.note(`This view has ${fmtInt(boxes)} boxes (${fmtInt(s.g.nodes.length)} nodes), more than ` +
        `Graphviz lays out at once (${fmtInt(MAX_BOXES)}): showing ${fmtInt(only.size)} nodes ` +
        `${starts.length ? "around the selection" : "from the start of the graph"}. Select a row in the table or a ` +
        `node to draw its surroundings; collapse modules or tick "neighbourhood" for a smaller view.`);
    }
    const seq = ++s.renderSeq;
    const start = performance.now();
    let svg;
    try {
      svg = await s.layout.render(s.view.dot);
    } catch (e) {
      if (seq !== s.renderSeq || state.disposed) return;
      const msg = visible(e.message);
      const deep = /call stack|stack size|recursion|memory/i.test(msg);
      s.pane.message(deep
        ? `Graphviz could not lay out this view of ${fmtInt(s.g.nodes.length)} nodes (${msg}). ` +
          `Select a row in the table and tick "neighbourhood" to draw a part, or collapse modules.`
        : `Layout failed: ${msg}`);
      return;
    }
    if (seq !== s.renderSeq || state.disposed) return; // a newer view was asked for meanwhile
    performance.mark(`sbsg:laid-out-${side}`);
    const info = s.pane.show(svg);
    performance.mark(`sbsg:shown-${side}`);
    const idOf = (key) => {
      if (key[0] === "p") return `proxy:${idOf(s.view.proxies.get(key))}`;
      const i = Number(key.slice(1));
      return key[0] === "n" ? s.g.nodes[i].id : `cluster:${s.g.spec.clusters[i].path}`;
    };
    const titleOf = (key) => {
      if (key[0] === "p") return titleOf(s.view.proxies.get(key));
      const i = Number(key.slice(1));
      if (key[0] === "n") return nodeTitle(s.g, i);
      const cl = s.g.spec.clusters[i];
      const what = cl.fx != null ? `the ONNX translation of FX node ${visible(cl.fx)}` : visible(cl.path);
      return `${what}\n${fmtInt(s.g.size[i])} nodes`;
    };
    s.pane.annotate(idOf, titleOf);
    applyPaint(side);
    highlight();
    if (centerOn) s.pane.center(keysOf(side, centerOn)) || s.pane.fit(true);
    else if (fit || only) s.pane.fit(true);
    const ms = Math.round(performance.now() - start);
    s.pane.box.dataset.renderMs = ms;
    s.pane.box.dataset.renders = Number(s.pane.box.dataset.renders || 0) + 1;
    if (!root.dataset.firstMs) root.dataset.firstMs = Math.round(performance.now() - t0);
    // The element's own window's CustomEvent: the page's (or a test DOM's), not whatever global is in scope.
    const Custom = root.ownerDocument.defaultView?.CustomEvent ?? CustomEvent;
    root.dispatchEvent(new Custom("sbsg-rendered", { bubbles: true, detail: { side, ms } }));
    s.lastInfo = `${TITLES[side]}: ${info.nodes} boxes in ${ms} ms`;
    status.textContent = SIDES.map((x) => sides[x].lastInfo).filter(Boolean).join(" · ") +
      ` (${s.layout.mode()})`;
  }

  const renderAll = (opts) => SIDES.forEach((side) => render(side, opts));

  function setAll(collapsedOf) {
    for (const side of SIDES) if (sides[side].g) sides[side].collapsed = collapsedOf(sides[side]);
    renderAll({ fit: true });
  }

  /** Open or close module cluster `c` of `side`, and the same module on the other side (a translation
   * cluster, ONNX only, on its side alone). */
  function setCollapsed(side, c, close) {
    const { path, fx } = sides[side].g.spec.clusters[c];
    for (const x of fx != null ? [side] : SIDES) {
      const s = sides[x];
      const k = x === side ? c : s.g?.spec.clusters.findIndex((cl) => cl.path === path && cl.fx == null) ?? -1;
      if (k < 0) continue;
      if (close) s.collapsed.add(k);
      else {
        s.collapsed.delete(k);
        if (s.g.size[k] > BIG_CLUSTER) for (const child of s.g.children[k]) s.collapsed.add(child);
      }
      render(x, { centerOn: close ? null : { cluster: k } });
    }
  }

  function keysOf(side, what) {
    const s = sides[side];
    if (what.cluster !== undefined) {
      const keys = [];
      s.view.repOf.forEach((key, i) => key && chainOf(s.g, i).includes(what.cluster) && keys.push(key));
      return keys;
    }
    return [...new Set(what.nodes.map((i) => s.view.repOf[i]).filter(Boolean))];
  }

  function applyPaint(side) {
    const s = sides[side];
    if (!s.view) return;
    const byKey = (key) => {
      const idx = Number(key.slice(1));
      const p = key[0] === "c" ? s.clusterPaint[idx] : s.paint[idx];
      return p ? { fill: colorFor(p.err, p.status), status: p.status } : null;
    };
    s.pane.paint(byKey, (c) => (s.clusterPaint[c] ? { fill: colorFor(s.clusterPaint[c].err, s.clusterPaint[c].status) } : null));
  }

  // Hover asks for rows on every pointer move: keep the lookup until the rows change.
  let rowMap = null;
  const rowById = () => (rowMap ??= new Map(ctx.getRows().map((r, k) => [r.i ?? k, r])));

  // Rows stream in: repaint at most once per frame, never re-layout.
  let repaintQueued = false;
  const unRows = ctx.onRows?.(() => {
    rowMap = null;
    if (repaintQueued) return;
    repaintQueued = true;
    requestAnimationFrame(() => {
      repaintQueued = false;
      if (state.disposed) return;
      for (const side of SIDES) (repaintData(side), applyPaint(side));
      highlight();
    });
  });


  /** The nodes of side `to` linked to node `idx` of `side`. */
  function linked(side, idx, to) {
    const s = sides[side];
    const o = sides[to];
    if (!s.g || !o.g) return [];
    const byId = rowById();
    const rows = (s.rowsOf.get(idx) || []).map((i) => byId.get(i)).filter(Boolean);
    return counterparts(s.g, o.g, idx, rows);
  }

  function startsOf(side) {
    const sel = state.selected;
    return sel.side === side ? [sel.idx] : linked(sel.side, sel.idx, side);
  }

  const hoodOf = (side) => neighbourhood(sides[side].g, startsOf(side), state.k);

  /** True when every node of `nodes` is drawn (a part of a huge graph may leave them out). */
  const drawn = (side, nodes) => nodes.every((i) => sides[side].view?.repOf[i]);

  function onHover(side, key) {
    for (const x of SIDES) sides[x].pane.mark("sbsg-hover", []);
    if (key?.[0] === "p") key = sides[side].view.proxies.get(key);
    const s = sides[side];
    if (!key) return;
    s.pane.mark("sbsg-hover", [key]);
    const idx = Number(key.slice(1));
    for (const other of others(side)) {
      const o = sides[other];
      if (!o.view) continue;
      if (key[0] === "n") {
        o.pane.mark("sbsg-hover", keysOf(other, { nodes: linked(side, idx, other) }));
        continue;
      }
      // A translation box: its FX node. A module box: the same module on the other side, as a box or as
      // its drawn contents.
      const fx = s.g.spec.clusters[idx].fx;
      if (fx != null) {
        if (other === "fx") o.pane.mark("sbsg-hover", o.g.byName.has(fx) ? keysOf(other, { nodes: [o.g.byName.get(fx)] }) : []);
        continue;
      }
      const k = o.g.spec.clusters.findIndex((c) => c.path === s.g.spec.clusters[idx].path && c.fx == null);
      if (k >= 0) o.pane.mark("sbsg-hover", keysOf(other, { cluster: k }));
    }
  }

  let echo = null; // the row we selected ourselves: its onSelect must not re-center the graphs
  function onBoxClick(side, key) {
    if (key[0] === "p") key = sides[side].view.proxies.get(key); // a stub stands for its source
    const idx = Number(key.slice(1));
    if (key[0] === "c") return setCollapsed(side, idx, false);
    state.selected = { side, idx };
    const rows = sides[side].rowsOf.get(idx) || [];
    if (rows.length) {
      echo = rows[0];
      ctx.select?.(rows[0]);
    }
    if (state.hood) renderAll();
    else {
      highlight();
      // Bring the counterparts into view; open their modules first if they are closed.
      for (const other of others(side)) {
        if (!sides[other].view) continue;
        const twins = linked(side, idx, other);
        if (twins.length && (!revealed(other, twins) || !drawn(other, twins))) render(other, { centerOn: { nodes: twins } });
        else sides[other].pane.center(keysOf(other, { nodes: twins }));
      }
    }
  }

  /** Opens the collapsed clusters hiding `nodes`; true when nothing had to change. */
  function revealed(side, nodes) {
    const s = sides[side];
    let same = true;
    for (const i of nodes)
      for (const c of chainOf(s.g, i))
        if (s.collapsed.delete(c)) {
          same = false;
          if (s.g.size[c] > BIG_CLUSTER) for (const child of s.g.children[c]) s.collapsed.add(child);
        }
    return same;
  }

  function highlight() {
    const sel = state.selected;
    for (const side of SIDES) {
      const s = sides[side];
      if (!s.view) continue;
      if (!sel || !s.g) {
        s.pane.mark("sbsg-sel", []);
        s.pane.mark("sbsg-path", []);
        continue;
      }
      const own = sel.side === side;
      const nodes = own ? [sel.idx] : linked(sel.side, sel.idx, side);
      s.pane.mark("sbsg-sel", keysOf(side, { nodes }));
      if (!state.trace) {
        s.pane.mark("sbsg-path", []);
        continue;
      }
      const path = errorPath(sides[sel.side].g, sides[sel.side].paint, sel.idx);
      const pathNodes = own ? path : path.flatMap((i) => linked(sel.side, i, side));
      const { edgeKeys, stubKeys } = own ? pathEdges(s.view, path) : { edgeKeys: [], stubKeys: [] };
      s.pane.mark("sbsg-path", [...keysOf(side, { nodes: pathNodes }), ...stubKeys], edgeKeys);
    }
  }

  const unSelect = ctx.onSelect?.((i) => {
    if (i === echo) return void (echo = null);
    echo = null;
    const row = rowById().get(i);
    if (!row) return;
    let first = null;
    const found = {};
    for (const side of SIDES) {
      const s = sides[side];
      if (!s.g) continue;
      const idx = nodeIndex(s, row);
      if (idx >= 0) (found[side] = idx), (first ??= { side, idx });
    }
    if (!first) return;
    state.selected = first;
    for (const side of SIDES) {
      const nodes = found[side] !== undefined ? [found[side]] : first.side === side ? [] : linked(first.side, first.idx, side);
      if (!nodes.length) continue;
      if (state.hood || !revealed(side, nodes) || !drawn(side, nodes)) render(side, { centerOn: { nodes } });
      else (highlight(), sides[side].pane.center(keysOf(side, { nodes })));
    }
  });

  function nodeIndex(s, row) {
    for (const [idx, ids] of s.rowsOf) if (ids.includes(row.i)) return idx;
    return -1;
  }

  const listeners = SIDES.map((side) => {
    const cb = () => load(side);
    ctx.model.on?.(`change:${DOT[side]}`, cb);
    return () => ctx.model.off?.(`change:${DOT[side]}`, cb);
  });
  for (const side of SIDES) load(side);

  return () => {
    state.disposed = true;
    listeners.forEach((off) => off());
    unRows?.();
    unSelect?.();
    for (const side of SIDES) sides[side].layout.dispose();
    root.remove();
  };
}

/** Drawn edges along `path` (node indices, downstream first); an edge drawn through a stub marks the
 * stub and its edge. */
export function pathEdges(view, path) {
  const edgeKeys = [];
  const stubKeys = [];
  const rep = view.repOf;
  path.slice(1).forEach((p, k) => {
    const edge = `${rep[p]}->${rep[path[k]]}`;
    const stub = view.stubs?.get(edge);
    if (stub) (stubKeys.push(stub), edgeKeys.push(`${stub}->${rep[path[k]]}`));
    else edgeKeys.push(edge);
  });
  return { edgeKeys, stubKeys };
}

function legend(colorFor) {
  const box = el("span", "sbsg-legend");
  const ramp = el("span", "sbsg-ramp");
  const stops = [-8, -7, -6, -5, -4, -3, -2, -1, 0].map((e, k) => `${colorFor(10 ** e, "mismatch")} ${k * 12.5}%`);
  ramp.style.background = `linear-gradient(to right, ${stops.join(", ")})`;
  const chip = (fill, style, text) => {
    const c = el("span", "sbsg-chip");
    c.style.cssText = `background:${fill};${style}`;
    const item = el("span");
    item.append(c, text);
    return item;
  };
  box.append(
    el("span", null, "|err| 1e-8"), ramp, el("span", null, "1"),
    chip(NOISE_FILL, "", "noise (rounding)"),
    chip(ONE_SIDED_FILL, "border-style:dashed", "one-sided"),
    chip(errorColor(0), `border:2px solid ${RESET_LINE}`, "reset"),
    chip(ERROR_FILL, `border:2px solid ${ERROR_LINE}`, "error"),
    chip(NOT_COMPARED, "", "not compared"),
  );
  return box;
}
