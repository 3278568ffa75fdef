// Bundles the front end into sbs_widget/static/ (committed, so `pip install` needs no node).
// js/widget.js -> widget.js (the anywidget ESM); js/graphs/page.js -> graphs_page.js when present.
import * as esbuild from "esbuild";
import { execFileSync } from "node:child_process";
import { existsSync, readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
const watch = process.argv.includes("--watch");

// js/spec.gen.js from sbs_widget/shared_rules.py (the one source of the rules both sides apply).
// The two package modules it needs are loaded without sbs_widget/__init__.py: no torch import, and a
// half-edited engine module elsewhere cannot break the build. Without Python the committed file stays
// (tests/test_shared_rules.py fails when it is stale).
const SPEC_SCRIPT = `
import sys, types
m = types.ModuleType("sbs_widget"); m.__path__ = ["sbs_widget"]; sys.modules["sbs_widget"] = m
from sbs_widget.shared_rules import js_module
sys.stdout.write(js_module())
`;
function writeSpec() {
  const target = join(root, "js/spec.gen.js");
  let text;
  for (const python of [process.env.PYTHON, "python", "python3"].filter(Boolean)) {
    try {
      text = execFileSync(python, ["-c", SPEC_SCRIPT], { cwd: root, encoding: "utf8", stdio: ["ignore", "pipe", "pipe"] });
      break;
    } catch (e) {
      if (e.code !== "ENOENT") throw e; // Python is there and the generator failed: say so
    }
  }
  if (text === undefined) console.warn("python not found: js/spec.gen.js left as committed");
  else if (!existsSync(target) || readFileSync(target, "utf8") !== text) writeFileSync(target, text);
}
writeSpec();

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
