// The theme: host variables chained in order, scheme defaults, host detection, text tone on graph boxes.
import { test } from "node:test";
import assert from "node:assert/strict";
import { JSDOM } from "jsdom";
import { brightFill, detectHost, parseHex, themeCSS } from "./theme.js";
import { COLOR_SCALE } from "./spec.gen.js";
import { errorColor } from "./rules.js";

test("themeCSS: JupyterLab, then VS Code, then Colab, then the scheme's default", () => {
  const css = themeCSS([".x"]);
  assert.ok(css.includes("--sbs-bg: var(--jp-layout-color1, var(--vscode-editor-background, var(--colab-primary-surface-color, var(--sbs-d-bg))));"));
  assert.ok(css.includes("--sbs-fg: var(--jp-ui-font-color1, var(--vscode-editor-foreground, var(--colab-primary-text-color, var(--sbs-d-fg))));"));
  assert.ok(css.includes("--sbs-border: var(--jp-border-color2, var(--vscode-panel-border, var(--colab-border-color,"));
  assert.match(css, /@media \(prefers-color-scheme: dark\) \{\s*\.x \{ --sbs-d-scheme: dark;/);
  // VS Code and Colab pages carry ipywidgets' light --jp-* defaults: there their own variables come first
  assert.match(css, /body\.vscode-dark \.x[\s\S]*?\{\s*--sbs-d-scheme: dark/);
  assert.match(css, /body\.vscode-light \.x,[\s\S]*?\.x\[data-host="vscode"\] \{\s*--sbs-fg: var\(--vscode-editor-foreground, var\(--sbs-d-fg\)\);/);
  assert.match(css, /html\[theme="dark"\] \.x,[\s\S]*?\.x\[data-host="colab"\] \{\s*--sbs-fg: var\(--colab-primary-text-color, var\(--sbs-d-fg\)\);/);
  assert.match(css, /body\[data-jp-theme-light="false"\] \.x/);
  assert.ok(!/\dvh\b/.test(css), "fixed pixel heights only");
});

test("detectHost: VS Code's body classes, Colab's html[theme], JupyterLab's body mark, else a plain page", () => {
  const doc = (html) => new JSDOM(html).window.document;
  assert.equal(detectHost(doc('<html><body class="vscode-body vscode-dark"></body></html>')), "vscode");
  assert.equal(detectHost(doc('<html><body class="vscode-high-contrast"></body></html>')), "vscode");
  assert.equal(detectHost(doc('<html theme="dark"><body></body></html>')), "colab");
  assert.equal(detectHost(doc('<html><body data-jp-theme-light="true"></body></html>')), "jupyter");
  assert.equal(detectHost(doc("<html><body></body></html>")), "");
});

test("brightFill: pale boxes keep dark text in a dark theme, deep tints get light text", () => {
  assert.deepEqual(parseHex("#1a9850"), [26, 152, 80, 1]);
  assert.equal(parseHex("#ffffff00")[3], 0);
  assert.equal(parseHex("rgb(1,2,3)"), null);
  assert.equal(brightFill(COLOR_SCALE.stub), true, "the stubs' opaque light grey");
  assert.equal(brightFill(COLOR_SCALE.not_compared), false, "transparent: the canvas shows");
  assert.equal(brightFill(errorColor(1e-9)), false, "green at 55% over a dark canvas is dark");
  assert.equal(brightFill(errorColor(10 ** -3.5)), true, "the yellow middle is bright");
  assert.equal(brightFill("#fee08b", 0.2), false, "fill-opacity counts");
});
