// One graph pane: shows a Graphviz SVG, pans and zooms it, paints and highlights its boxes by DOT id.
// Pan and zoom move one CSS transform on a wrapper, so a 3,000-node SVG is moved by the compositor
// instead of being re-laid out by the browser on every wheel tick.
import { NOT_COMPARED } from "../rules.js";
import { brightFill } from "../theme.js";

const SHAPES = "polygon, path, ellipse";

export function createPane(root, { title, onNodeClick, onNodeHover, onClusterLabelClick }) {
  const box = el("div", "sbsg-pane");
  const head = el("div", "sbsg-pane-head", title);
  const note = el("div", "sbsg-note"); // why only a part of the graph is drawn
  note.hidden = true;
  const viewport = el("div", "sbsg-viewport");
  const stage = el("div", "sbsg-stage");
  viewport.append(stage);
  box.append(head, note, viewport);
  root.append(box);

  let view = { x: 0, y: 0, s: 1 };
  let items = new Map(); // DOT id -> <g> of a node (n12) or collapsed cluster box (c3)
  let clusters = new Map(); // cluster index -> <g class="cluster">
  let edges = new Map(); // "a->b" -> <g class="edge">
  const marked = new Map(); // class -> elements carrying it

  const apply = () => (stage.style.transform = `translate(${view.x}px, ${view.y}px) scale(${view.s})`);

  viewport.addEventListener("wheel", (e) => {
    e.preventDefault();
    const r = viewport.getBoundingClientRect();
    const mx = e.clientX - r.left;
    const my = e.clientY - r.top;
    const s = Math.min(Math.max(view.s * Math.exp(-e.deltaY * 0.0015), 0.02), 8);
    view = { x: mx - ((mx - view.x) * s) / view.s, y: my - ((my - view.y) * s) / view.s, s };
    stage.classList.remove("sbsg-glide");
    apply();
  }, { passive: false });

  // A press that moves more than a few pixels is a pan, otherwise a click on what is under it.
  let drag = null;
  viewport.addEventListener("pointerdown", (e) => {
    if (e.button !== 0) return;
    drag = { x: e.clientX, y: e.clientY, vx: view.x, vy: view.y, moved: false };
  });
  viewport.addEventListener("pointermove", (e) => {
    if (!drag) return;
    const dx = e.clientX - drag.x;
    const dy = e.clientY - drag.y;
    if (!drag.moved && Math.hypot(dx, dy) < 4) return;
    if (!drag.moved) viewport.setPointerCapture(e.pointerId);
    drag.moved = true;
    view = { ...view, x: drag.vx + dx, y: drag.vy + dy };
    stage.classList.remove("sbsg-glide");
    apply();
  });
  viewport.addEventListener("pointerup", (e) => {
    const moved = drag?.moved;
    drag = null;
    if (moved) return;
    const node = e.target.closest?.("g.node");
    if (node) return onNodeClick(node.dataset.key, e);
    const label = e.target.closest?.("g.cluster > text") && e.target.closest("g.cluster");
    if (label) onClusterLabelClick(Number(label.dataset.cluster));
  });
  viewport.addEventListener("pointerover", (e) => {
    const node = e.target.closest?.("g.node");
    onNodeHover(node ? node.dataset.key : null);
  });
  viewport.addEventListener("pointerleave", () => onNodeHover(null));

  return {
    box,
    viewport,
    /** Replace the drawing; keeps the zoom level, `keepCenterOn` (DOT ids) stays where it was. */
    show(svgText) {
      const doc = new DOMParser().parseFromString(svgText, "image/svg+xml");
      const svg = doc.documentElement;
      if (svg.nodeName !== "svg") throw new Error("layout did not return an SVG");
      // Graphviz sizes in pt; one pt per CSS pixel keeps its font sizes legible at scale 1.
      const [, , w, h] = (svg.getAttribute("viewBox") || "0 0 100 100").split(/\s+/).map(Number);
      svg.setAttribute("width", `${w}px`);
      svg.setAttribute("height", `${h}px`);
      stage.replaceChildren(document.adoptNode(svg)); // moved, not copied: the parsed document is dropped
      items = new Map();
      clusters = new Map();
      edges = new Map();
      marked.clear();
      for (const g of stage.querySelectorAll("g.node, g.cluster, g.edge")) {
        // Graphviz writes the DOT id as each group's first child <title>; removed, since the browser
        // tooltip would show DOT ids. (A direct child test: two selector queries per group cost ~30 ms.)
        const title = g.firstElementChild?.tagName === "title" ? g.firstElementChild : g.querySelector(":scope > title");
        const key = title?.textContent ?? "";
        title?.remove();
        if (g.classList.contains("node")) {
          g.dataset.key = key;
          items.set(key, g);
          const shape = g.querySelector(SHAPES);
          tone(g, shape?.getAttribute("fill"), shape?.getAttribute("fill-opacity"));
        }
        else if (g.classList.contains("cluster")) {
          g.dataset.cluster = key.slice("cluster_".length);
          clusters.set(Number(g.dataset.cluster), g);
        } else edges.set(key, g);
      }
      return { width: w, height: h, nodes: items.size };
    },
    /** `paintOf(key) -> {fill, status} | null` for every drawn box. */
    paint(paintOf, clusterPaintOf) {
      for (const [key, g] of items) {
        const p = paintOf(key);
        const shape = g.querySelector(SHAPES);
        if (shape) shape.setAttribute("fill", p ? p.fill : NOT_COMPARED);
        tone(g, p ? p.fill : NOT_COMPARED, shape?.getAttribute("fill-opacity"));
        g.dataset.status = p?.status ?? "";
      }
      for (const [c, g] of clusters) {
        const p = clusterPaintOf(c);
        const shape = g.querySelector(SHAPES);
        if (shape) shape.setAttribute("stroke", p ? p.fill : "#999999");
      }
    },
    /** Mark boxes (and edges between consecutive path boxes) with a class, replacing earlier marks. */
    mark(cls, keys, edgeKeys = []) {
      for (const g of marked.get(cls) || []) g.classList.remove(cls);
      const now = [];
      for (const k of keys) if (items.has(k)) now.push(items.get(k));
      for (const k of edgeKeys) if (edges.has(k)) now.push(edges.get(k));
      for (const g of now) g.classList.add(cls);
      marked.set(cls, now);
    },
    has: (key) => items.has(key),
    /** Put `idOf(key)` (the spec's node id, e.g. "fx:add_3") on each box as data-id, for tests and
     * for anyone inspecting the page, and `titleOf(key)` as its tooltip (the full name: labels are
     * shortened). Text only: a <title> element filled by textContent. */
    annotate(idOf, titleOf) {
      for (const [key, g] of items) {
        g.dataset.id = idOf(key);
        if (!titleOf) continue;
        const t = g.ownerDocument.createElementNS("http://www.w3.org/2000/svg", "title");
        t.textContent = titleOf(key);
        g.prepend(t);
      }
    },
    /** A line above the drawing (empty: none). */
    note(text) {
      note.textContent = text || "";
      note.hidden = !text;
    },
    /** Glide so that the boxes `keys` sit in the middle; zooms in if they would be unreadably small. */
    center(keys) {
      const rects = keys.filter((k) => items.has(k)).map((k) => items.get(k).getBoundingClientRect());
      if (!rects.length) return false;
      const sr = stage.getBoundingClientRect();
      const cx = (Math.min(...rects.map((r) => r.left)) + Math.max(...rects.map((r) => r.right))) / 2;
      const cy = (Math.min(...rects.map((r) => r.top)) + Math.max(...rects.map((r) => r.bottom))) / 2;
      const px = (cx - sr.left) / view.s;
      const py = (cy - sr.top) / view.s;
      const s = Math.max(view.s, 0.8);
      view = { x: viewport.clientWidth / 2 - px * s, y: viewport.clientHeight / 2 - py * s, s };
      stage.classList.add("sbsg-glide");
      apply();
      return true;
    },
    /** Whole drawing in view; with `readable`, fit the width only (never below 0.6) and show the top:
     * a deep network is tall and narrow, and shrunk to fit its height it is a thread of dots. */
    fit(readable = false) {
      const svg = stage.querySelector("svg");
      if (!svg) return;
      const w = parseFloat(svg.getAttribute("width"));
      const h = parseFloat(svg.getAttribute("height"));
      const vw = viewport.clientWidth;
      const vh = viewport.clientHeight;
      let s = Math.min(vw / w, vh / h, 1) * 0.98 || 1;
      if (readable) s = Math.max(s, Math.min(vw / w, 1) * 0.98, 0.6);
      view = { x: Math.max((vw - w * s) / 2, 0), y: Math.max((vh - h * s) / 2, 0), s };
      stage.classList.remove("sbsg-glide");
      apply();
    },
    message(text) {
      stage.replaceChildren(el("div", "sbsg-message", text));
      items = new Map();
    },
  };
}

/** data-tone="bright" on a box whose fill wants dark text in every theme (style.js). */
function tone(g, fill, opacity) {
  if (brightFill(fill, opacity === null || opacity === undefined ? 1 : Number(opacity))) g.dataset.tone = "bright";
  else delete g.dataset.tone;
}

export function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}
