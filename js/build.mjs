// Bundles the front end into sbs_widget/static/ (committed, so `pip install` needs no node).
// js/widget.js -> widget.js (the anywidget ESM); js/graphs/page.js -> graphs_page.js when present.
import * as esbuild from "esbuild";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const watch = process.argv.includes("--watch");

const entries = [
  ["js/widget.js", "sbs_widget/static/widget.js"],
  ["js/graphs/page.js", "sbs_widget/static/graphs_page.js"],
].filter(([src]) => existsSync(join(root, src)));

const common = {
  bundle: true,
  format: "esm",
  charset: "utf8", // keeps @viz-js/viz's inlined wasm compact
  define: { "define.amd": "false" }, // UMD dependencies must not take the AMD path in classic notebooks
  minify: !watch,
  legalComments: "none",
  logLevel: "info",
};

for (const [src, out] of entries) {
  const options = { ...common, entryPoints: [join(root, src)], outfile: join(root, out) };
  if (watch) await (await esbuild.context(options)).watch();
  else await esbuild.build(options);
}
