// The layout service end to end in node: node has no Worker global, so this also proves the
// main-thread fallback (same bundled Graphviz, decompressed from viz_source.gen.js).
import assert from "node:assert/strict";
import { test } from "node:test";
import { createLayout } from "./layout.js";

test("renders DOT to SVG, falling back to the main thread without Worker", async () => {
  const layout = createLayout();
  const svg = await layout.render('digraph { a -> "b<img onerror=x>" }');
  assert.equal(layout.mode(), "main thread");
  assert.match(svg, /<svg/);
  assert.match(svg, /b&lt;img onerror=x&gt;/);
  await assert.rejects(layout.render("digraph { a -> }"), /syntax error/);
  layout.dispose();
});
