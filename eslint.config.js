// ESLint (flat config) for the front end: `npm run lint` (eslint .).
// @eslint/js recommended, nothing turned off. The one deliberate exception is inline, with its reason
// after `--` (js/format.js: no-control-regex on the regex whose job is to find control characters).
import js from "@eslint/js";
import globals from "globals";

export default [
  {
    // The committed bundles (built from js/ by `npm run build`), generated sources, local build output.
    ignores: ["sbs_widget/static/**", "**/*.gen.js", "build/**", "dist/**", "tmp/**", "bench_out/**"],
  },
  {
    // A disable comment that no longer suppresses anything is an error, so exceptions cannot go stale.
    linterOptions: { reportUnusedDisableDirectives: "error" },
  },
  js.configs.recommended,
  {
    // The front end: ES modules bundled by esbuild, run in the browser (notebook or graphs page).
    files: ["**/*.js", "**/*.mjs"],
    languageOptions: { ecmaVersion: "latest", sourceType: "module", globals: { ...globals.browser } },
  },
  {
    // Run by node, not the browser: unit tests, their jsdom setup, build/render scripts, this file.
    files: ["js/**/*.test.js", "js/test_env.js", "**/*.mjs", "eslint.config.js"],
    languageOptions: { globals: { ...globals.node } },
  },
];
