// Colours of the views, taken from the page that hosts them. In order:
//   1. JupyterLab (and Notebook 7): its --jp-* variables; body[data-jp-theme-light] says light or dark.
//   2. VS Code's notebook webview: --vscode-* variables, body.vscode-light / vscode-dark / vscode-high-contrast.
//   3. Colab: --colab-* variables, html[theme=dark] (googlecolab/colabtools#1214).
//   4. Anything else (offline report, a plain page): the browser's prefers-color-scheme.
// VS Code's and Colab's widget managers load ipywidgets' CSS, which declares JupyterLab's *light*
// variables on :root (controls/css/labvariables.css): there a --jp-* variable is no sign of a light
// page, so on those hosts their own variables come first. The host is told by its body/html marks and,
// for a frame without them, by its variables (detectHost, set as data-host on the view's root).
// Each view reads --sbs-fg, --sbs-bg, ... and the status colours; nothing else in the CSS names a colour
// that depends on the page.

const LIGHT = {
  scheme: "light",
  fg: "#1f2328", fg2: "#59636e", bg: "#ffffff", accent: "#1f6feb", "on-accent": "#ffffff",
  ok: "#1d7a3e", bad: "#c62828", noise: "#1b6aa5", warn: "#8a5a00",
  // rows are tinted by their error (rules.js colours at alpha 0.55, made for a light background)
  veil: "transparent",
};
const DARK = {
  scheme: "dark",
  fg: "#e6edf3", fg2: "#a0a9b4", bg: "#1e1e1e", accent: "#4c9aff", "on-accent": "#0d1117",
  ok: "#5fd38a", bad: "#ff7b72", noise: "#6cb6ff", warn: "#e3b341",
  // on a dark background the same tints are veiled by half of it, so light text stays readable on them
  veil: "color-mix(in srgb, var(--sbs-bg) 50%, transparent)",
};

const defaults = (p) => Object.entries(p).map(([k, v]) => `--sbs-d-${k}: ${v};`).join(" ");

/** var(--a, var(--b, ... fallback)) */
const chain = (names, fallback) => names.reduceRight((acc, n) => `var(${n}, ${acc})`, fallback);

// Per variable: JupyterLab's, VS Code's, Colab's names; then the scheme default (or a mix of fg and bg).
const VARS = {
  fg: [["--jp-ui-font-color1"], ["--vscode-editor-foreground"], ["--colab-primary-text-color"], "var(--sbs-d-fg)"],
  fg2: [["--jp-ui-font-color2"], ["--vscode-descriptionForeground"], ["--colab-secondary-text-color"], "var(--sbs-d-fg2)"],
  bg: [["--jp-layout-color1"], ["--vscode-editor-background"], ["--colab-primary-surface-color"], "var(--sbs-d-bg)"],
  bg2: [["--jp-layout-color2"], ["--vscode-editorWidget-background"], ["--colab-secondary-surface-color"],
    "color-mix(in srgb, var(--sbs-fg) 7%, var(--sbs-bg))"],
  border: [["--jp-border-color2"], ["--vscode-panel-border"], ["--colab-border-color"],
    "color-mix(in srgb, var(--sbs-fg) 22%, var(--sbs-bg))"],
  accent: [["--jp-brand-color1"], ["--vscode-textLink-foreground"], [], "var(--sbs-d-accent)"],
  font: [["--jp-ui-font-family"], ["--vscode-font-family"], [], 'system-ui, -apple-system, "Segoe UI", sans-serif'],
  mono: [["--jp-code-font-family"], ["--vscode-editor-font-family"], [],
    "ui-monospace, SFMono-Regular, Menlo, Consolas, monospace"],
};

function declarations(hosts) {
  return Object.entries(VARS).map(([name, v]) => `--sbs-${name}: ${chain(hosts.flatMap((i) => v[i]), v[3])};`).join("\n  ");
}

/** The theme's CSS for the elements matched by `scopes` (class selectors: ".sbs-root"). */
export function themeCSS(scopes) {
  const under = (prefixes) => prefixes.flatMap((p) => scopes.map((s) => `${p} ${s}`)).join(",\n");
  const own = (attr) => scopes.map((s) => `${s}${attr}`);
  const all = scopes.join(", ");
  return `
${all} {
  ${defaults(LIGHT)}
  ${declarations([0, 1, 2])}
  --sbs-ok: var(--sbs-d-ok); --sbs-bad: var(--sbs-d-bad); --sbs-noise: var(--sbs-d-noise); --sbs-warn: var(--sbs-d-warn);
  --sbs-veil: var(--sbs-d-veil);
  color-scheme: var(--sbs-d-scheme);
}
@media (prefers-color-scheme: dark) {
  ${all} { ${defaults(DARK)} }
}
${under(['body[data-jp-theme-light="false"]', "body.vscode-dark", "body.vscode-high-contrast:not(.vscode-high-contrast-light)", 'html[theme="dark"]'])} {
  ${defaults(DARK)}
}
${under(['body[data-jp-theme-light="true"]', "body.vscode-light", "body.vscode-high-contrast-light", 'html[theme="light"]'])} {
  ${defaults(LIGHT)}
}
${[under(["body.vscode-light", "body.vscode-dark", "body.vscode-high-contrast"]), ...own('[data-host="vscode"]')].join(",\n")} {
  ${declarations([1])}
}
${[under(['html[theme="dark"]', 'html[theme="light"]']), ...own('[data-host="colab"]')].join(",\n")} {
  ${declarations([2])}
}
`;
}

/** "vscode", "colab", "jupyter" or "" (a plain page), from the variables and marks of `doc`. */
export function detectHost(doc = globalThis.document) {
  if (!doc?.documentElement) return "";
  const body = doc.body;
  if (body && /(^|\s)vscode-(light|dark|high-contrast)/.test(body.className)) return "vscode";
  if (doc.documentElement.hasAttribute("theme")) return "colab";
  const view = doc.defaultView;
  if (!view?.getComputedStyle) return "";
  const has = (el, name) => !!el && view.getComputedStyle(el).getPropertyValue(name).trim() !== "";
  const root = doc.documentElement;
  if (has(root, "--vscode-editor-background") || has(body, "--vscode-editor-background")) return "vscode";
  if (has(root, "--colab-primary-surface-color") || has(body, "--colab-primary-surface-color")) return "colab";
  if (body?.hasAttribute("data-jp-theme-light") || has(root, "--jp-layout-color1")) return "jupyter";
  return "";
}

/** Relative luminance (WCAG 2) of [r, g, b] in 0..255. */
export function luminance(rgb) {
  const lin = (c) => { const s = c / 255; return s <= 0.03928 ? s / 12.92 : ((s + 0.055) / 1.055) ** 2.4; };
  return 0.2126 * lin(rgb[0]) + 0.7152 * lin(rgb[1]) + 0.0722 * lin(rgb[2]);
}

/** [r, g, b, a] of "#rgb", "#rrggbb" or "#rrggbbaa"; null for anything else. */
export function parseHex(text) {
  const m = /^#([0-9a-f]{3}|[0-9a-f]{6}|[0-9a-f]{8})$/i.exec(String(text || "").trim());
  if (!m) return null;
  let hex = m[1];
  if (hex.length === 3) hex = [...hex].map((c) => c + c).join("");
  const n = (k) => parseInt(hex.slice(k, k + 2), 16);
  return [n(0), n(2), n(4), hex.length === 8 ? n(6) / 255 : 1];
}

const DARK_BG = parseHex(DARK.bg);

/** Whether a box filled with `fill` needs dark text in a dark theme: its tint over the dark background
 *  is bright enough that dark text reads better on it than light text (a pale fill is bright anyway). `opacity`: the shape's fill-opacity. */
export function brightFill(fill, opacity = 1) {
  const c = parseHex(fill);
  if (!c) return false;
  const a = c[3] * (Number.isFinite(opacity) ? opacity : 1);
  const mixed = [0, 1, 2].map((k) => c[k] * a + DARK_BG[k] * (1 - a));
  return luminance(mixed) > 0.17;
}
