// Hostile graphs (issue 31) with the real Graphviz (main-thread fallback in node): names with NUL, bidi
// controls, Graphviz escapes and 100k characters; a 20,000-node chain that overflows Graphviz's stack.
import assert from "node:assert/strict";
import { test } from "node:test";
import { JSDOM } from "jsdom";
import { buildView, indexGraph, quote, SPEC_MARKER } from "./model.js";
import { createLayout } from "./layout.js";

const dom = new JSDOM("<!doctype html><div id=host></div>", { pretendToBeVisual: true });
for (const k of ["document", "DOMParser", "requestAnimationFrame", "HTMLElement"]) globalThis[k] = dom.window[k];
const { mountGraphs, MAX_BOXES, PART } = await import("./index.js");

const LONG = `${"L".repeat(100_000)}end`;
const NAMES = ["nul\x00byte", "rtl\u202eevil", "esc\\N\\G\\l", 'quote"];x[', "new\nline", LONG, `${LONG}2`];
const chainSpec = (names) => ({
  side: "onnx",
  clusters: [{ path: `mod\x00\u202e${"m".repeat(1000)}`, parent: -1 }],
  nodes: names.map((name, i) => ({ id: `onnx:${name}`, name, label: name, op: "Relu", kind: "node", cluster: i % 2 ? 0 : -1,
    outputs: [name], links: [] })),
  edges: names.slice(1).map((_, i) => [i, i + 1]),
});
const until = async (fn, ms = 60000) => {
  const end = Date.now() + ms;
  while (!fn()) {
    if (Date.now() > end) throw new Error("timed out");
    await new Promise((r) => setTimeout(r, 20));
  }
};

test("quote never lets a NUL or a Graphviz escape through", () => {
  assert.equal(quote("a\x00b"), '"a\\\\x00b"');
  assert.equal(quote("x\\N"), '"x\\\\N"');
  assert.equal(quote('a"b\nc'), '"a\\"b\\nc"');
});

test("hostile names lay out, one box each, shown escaped and shortened", async () => {
  const g = indexGraph(chainSpec(NAMES));
  const view = buildView(g, {});
  assert.ok(!view.dot.includes("\x00") && !view.dot.includes("\u202e"));
  const layout = createLayout();
  const svg = await layout.render(view.dot);
  layout.dispose();
  const doc = new dom.window.DOMParser().parseFromString(svg, "image/svg+xml");
  const nodes = [...doc.querySelectorAll("g.node")];
  assert.equal(nodes.length, NAMES.length); // no node merged, split or invented
  const texts = [...doc.querySelectorAll("text")].map((t) => t.textContent);
  assert.ok(texts.includes("nul\\x00byte") && texts.includes("rtl\\u202eevil"), texts.join("|"));
  assert.ok(texts.includes("esc\\N\\G\\l"), texts.join("|")); // shown literally, not substituted
  assert.ok(texts.includes('quote"];x['));
  assert.ok(texts.includes("new") && texts.includes("line")); // a label's newline is its line break (Python escapes names' own)
  assert.ok(Math.max(...texts.map((t) => t.length)) <= 64 * 6);
  assert.ok(texts.some((t) => t.startsWith("LLLL") && t.endsWith("end")));
});

test("tooltips carry the full name; a 20,000-node chain draws a part with a note", async () => {
  const n = 20_000;
  const names = Array.from({ length: n }, (_, i) => (i === 1 ? LONG : `relu_${i}`));
  const spec = chainSpec(names);
  const data = { fx_dot: "", onnx_dot: `${SPEC_MARKER}${JSON.stringify(spec)}\ndigraph {}` };
  const el = document.createElement("div");
  document.body.append(el);
  const dispose = mountGraphs({ model: { get: (k) => data[k], on() {}, off() {} }, el, getRows: () => [],
    onRows: () => () => {}, select() {}, onSelect: () => () => {} });
  const pane = el.querySelectorAll(".sbsg-pane")[1];
  await until(() => pane.dataset.renders || pane.querySelector(".sbsg-message"));
  assert.equal(pane.querySelector(".sbsg-message"), null, pane.textContent.slice(0, 300));
  const note = pane.querySelector(".sbsg-note");
  assert.ok(!note.hidden);
  assert.match(note.textContent, /20,000 nodes/);
  assert.match(note.textContent, new RegExp(`more than Graphviz lays out at once \\(${MAX_BOXES.toLocaleString("en-US")}\\)`));
  assert.equal(pane.querySelectorAll("g.node").length, PART);
  const long = [...pane.querySelectorAll("g.node")].find((g) => g.dataset.id === `onnx:${LONG}`);
  assert.equal(long.querySelector("title").textContent, `${LONG}\nRelu`); // full name on hover
  dispose();
});
