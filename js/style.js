// The view's CSS, injected into each view (it must work in JupyterLab, Notebook 7, VS Code, Colab and
// the offline report page alike). Colours come from the host page's variables (js/theme.js).
import { themeCSS } from "./theme.js";
import { STEPS_CSS } from "./steps.js";
import { SETS_CSS } from "./sets.js";
import { MODELS_CSS } from "./models.js";

export const ROW_HEIGHT = 22;
export const VIEW_HEIGHT = 396; // 18 rows

export const CSS = `
${themeCSS([".sbs-root", ".sbs-page"])}
.sbs-root {
  font: 12px/1.4 var(--sbs-font); color: var(--sbs-fg); background: var(--sbs-bg);
  border: 1px solid var(--sbs-border); border-radius: 4px; padding: 6px; box-sizing: border-box;
  display: flex; flex-direction: column; gap: 6px; min-width: 0;
}
.sbs-root *, .sbs-root *::before, .sbs-root *::after { box-sizing: border-box; }
.sbs-bar { display: flex; flex-wrap: wrap; align-items: center; gap: 6px 10px; min-height: 24px; }
.sbs-title { font-weight: 600; }
/* the toolbar stays on one line: a long title gives way (ellipsis, the full title on hover), not the buttons */
.sbs-bar.sbs-toolbar { flex-wrap: nowrap; min-width: 0; white-space: nowrap; }
.sbs-toolbar > * { flex: none; }
.sbs-toolbar > .sbs-title { flex: 0 1 auto; min-width: 48px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.sbs-toolbar > .sbs-current, .sbs-toolbar > .sbs-num { flex: 0 1 auto; min-width: 0; overflow: hidden; text-overflow: ellipsis; }
.sbs-toolbar > .sbs-spacer-flex { flex: 1 1 0; min-width: 0; }
.sbs-muted { color: var(--sbs-fg2); }
.sbs-mono, .sbs-num { font-family: var(--sbs-mono); font-variant-numeric: tabular-nums; }
.sbs-spacer-flex { flex: 1; }
.sbs-root button {
  font: inherit; color: var(--sbs-fg); background: var(--sbs-bg2); border: 1px solid var(--sbs-border);
  border-radius: 3px; padding: 1px 8px; height: 22px; cursor: pointer;
}
.sbs-root button:hover:not(:disabled) { border-color: var(--sbs-accent); }
.sbs-root button:disabled { opacity: 0.45; cursor: default; }
.sbs-root button.sbs-primary { background: var(--sbs-accent); color: var(--sbs-d-on-accent); border-color: var(--sbs-accent); }
.sbs-root input[type=text], .sbs-root input[type=number], .sbs-root select {
  font: inherit; color: var(--sbs-fg); background: var(--sbs-bg); border: 1px solid var(--sbs-border);
  border-radius: 3px; height: 22px; padding: 0 4px;
}
.sbs-root input.sbs-tol { width: 72px; font-family: var(--sbs-mono); }
.sbs-root input.sbs-range { width: 64px; font-family: var(--sbs-mono); }
.sbs-root label { display: inline-flex; align-items: center; gap: 4px; white-space: nowrap; }
.sbs-badge { display: inline-block; padding: 0 6px; border-radius: 9px; font-size: 11px; line-height: 18px;
  background: var(--sbs-bg2); border: 1px solid var(--sbs-border); white-space: nowrap; }
.sbs-badge[data-status=running], .sbs-badge[data-status=preparing] { border-color: var(--sbs-accent); color: var(--sbs-accent); }
.sbs-badge[data-status=done] { border-color: var(--sbs-ok); color: var(--sbs-ok); }
.sbs-badge[data-status=error], .sbs-badge[data-status=stopped] { border-color: var(--sbs-bad); color: var(--sbs-bad); }
.sbs-meter { width: 96px; height: 6px; border-radius: 3px; background: var(--sbs-bg2); overflow: hidden;
  border: 1px solid var(--sbs-border); flex: none; }
.sbs-meter > div { height: 100%; background: var(--sbs-accent); width: 0; transition: width 120ms linear; }
/* an ended run shows its end at once: a bar caught in its transition looks stopped short */
.sbs-meter[data-state=done] > div { background: var(--sbs-ok); transition: none; }
.sbs-meter[data-state=stopped] > div, .sbs-meter[data-state=error] > div { background: var(--sbs-bad); transition: none; }
.sbs-progress-state { font-weight: 600; }
.sbs-progress-state[data-state=done] { color: var(--sbs-ok); }
.sbs-progress-state[data-state=stopped], .sbs-progress-state[data-state=error] { color: var(--sbs-bad); }
.sbs-chip { display: inline-flex; align-items: center; gap: 3px; padding: 0 6px; border-radius: 3px;
  background: var(--sbs-bg2); font-family: var(--sbs-mono); font-size: 11px; line-height: 18px; }
.sbs-chip[data-status=mismatch], .sbs-chip[data-status=error] { color: var(--sbs-bad); }
/* noise: beyond tolerance by rounding alone; a blue off the green-red error scale */
.sbs-chip[data-status=noise] { color: var(--sbs-noise); }
.sbs-badge[data-status=noise] { border-color: var(--sbs-noise); color: var(--sbs-noise); }
.sbs-badge[data-status=mismatch] { border-color: var(--sbs-bad); color: var(--sbs-bad); }
.sbs-chip button { height: 16px; padding: 0 3px; border: none; background: none; line-height: 1; }
.sbs-current { max-width: 320px; overflow: hidden; text-overflow: ellipsis; white-space: nowrap; }
.sbs-message { color: var(--sbs-bad); font-family: var(--sbs-mono); white-space: pre-wrap; }
.sbs-compare { background: var(--sbs-bg2); border-radius: 3px; padding: 4px 8px; }
.sbs-compare details { display: inline-block; margin-left: 8px; }
.sbs-compare ul { margin: 2px 0 0; padding-left: 18px; max-height: 120px; overflow: auto; font-family: var(--sbs-mono); }
/* the as-deployed banner (js/deployed.js): its left edge and verdict badge take the verdict's colour */
.sbs-deployed { background: var(--sbs-bg2); border-radius: 3px; padding: 4px 8px; border-left: 4px solid var(--sbs-border);
  display: flex; flex-direction: column; gap: 2px; }
.sbs-deployed[hidden] { display: none; }
.sbs-deployed[data-state=running] { border-left-color: var(--sbs-accent); }
.sbs-deployed[data-state=error], .sbs-deployed[data-level=bad] { border-left-color: var(--sbs-bad); }
.sbs-deployed[data-level=ok] { border-left-color: var(--sbs-ok); }
.sbs-deployed[data-level=warn] { border-left-color: var(--sbs-warn); }
.sbs-deployed-head { display: flex; flex-wrap: wrap; align-items: center; gap: 4px 10px; }
.sbs-deployed-verdict { display: inline-block; padding: 0 7px; border-radius: 9px; font-weight: 600; line-height: 18px;
  border: 1px solid var(--sbs-border); white-space: nowrap; }
.sbs-deployed-verdict[data-level=ok] { color: var(--sbs-ok); border-color: var(--sbs-ok); }
.sbs-deployed-verdict[data-level=warn] { color: var(--sbs-warn); border-color: var(--sbs-warn); }
.sbs-deployed-verdict[data-level=bad] { color: var(--sbs-bad); border-color: var(--sbs-bad); }
.sbs-deployed-hint { color: var(--sbs-warn); }
.sbs-deployed[data-level=ok] .sbs-deployed-hint { color: var(--sbs-fg2); }
.sbs-deployed-cause, .sbs-deployed-fused li { font-family: var(--sbs-mono); overflow-wrap: anywhere; }
.sbs-deployed-fused ul { margin: 0; padding-left: 18px; max-height: 96px; overflow: auto; }
.sbs-deployed-summary pre { margin: 2px 0 0; font-family: var(--sbs-mono); font-size: 11px; white-space: pre-wrap; overflow-wrap: anywhere; }
.sbs-main { display: flex; gap: 6px; min-height: 0; align-items: stretch; }
.sbs-table { flex: 1 1 auto; min-width: 0; border: 1px solid var(--sbs-border); border-radius: 3px; }
.sbs-scroll { height: ${VIEW_HEIGHT + ROW_HEIGHT + 2}px; overflow: auto; position: relative; outline: none; }
.sbs-grid { display: grid; grid-template-columns: var(--sbs-cols); min-width: 850px; }
.sbs-head { position: sticky; top: 0; z-index: 2; background: var(--sbs-bg2); border-bottom: 1px solid var(--sbs-border);
  height: ${ROW_HEIGHT + 2}px; }
.sbs-head > div { padding: 3px 5px; font-weight: 600; cursor: pointer; user-select: none; white-space: nowrap;
  overflow: hidden; text-overflow: ellipsis; }
.sbs-head > div[data-sort]::before { content: attr(data-sort); margin-right: 2px; color: var(--sbs-accent); font-size: 9px; }
.sbs-body { position: relative; min-width: 850px; }
.sbs-row { position: absolute; left: 0; right: 0; height: ${ROW_HEIGHT}px; cursor: pointer;
  border-bottom: 1px solid color-mix(in srgb, var(--sbs-border) 50%, transparent); }
.sbs-row:hover { outline: 1px solid var(--sbs-border); outline-offset: -1px; }
/* the row's tint is its background-color (table.js); a dark theme veils it, a selected row adds the accent */
.sbs-row { background-image: linear-gradient(var(--sbs-veil), var(--sbs-veil)); }
.sbs-row.sbs-selected { box-shadow: inset 4px 0 0 var(--sbs-accent);
  background-image: linear-gradient(var(--sbs-sel), var(--sbs-sel)), linear-gradient(var(--sbs-veil), var(--sbs-veil));
  --sbs-sel: color-mix(in srgb, var(--sbs-accent) 22%, transparent); }
.sbs-row.sbs-focus { outline: 2px solid var(--sbs-accent); outline-offset: -2px; }
.sbs-row > div { padding: 0 5px; line-height: ${ROW_HEIGHT}px; white-space: nowrap; overflow: hidden; text-overflow: ellipsis; }
.sbs-row > div.sbs-num, .sbs-head > div.sbs-num { text-align: right; }
.sbs-row input { margin: 0; vertical-align: middle; }
.sbs-row > div.sbs-tick { padding: 0; text-align: center; text-overflow: clip; }
/* inner rows (values inside an FX node's ONNX translation): the "inside" column, shown where some exist */
.sbs-table:not(.sbs-flat) .sbs-grid, .sbs-table:not(.sbs-flat) .sbs-body { min-width: 970px; }
.sbs-table.sbs-flat .sbs-inside { display: none; }
.sbs-row > div.sbs-inside { padding: 0 3px; }
.sbs-root .sbs-row button.sbs-disclose { height: 18px; line-height: 16px; padding: 0 5px; font-size: 11px; max-width: 100%;
  overflow: hidden; text-overflow: ellipsis; white-space: nowrap; vertical-align: middle; }
.sbs-root .sbs-row button.sbs-disclose[hidden] { display: none; }
.sbs-root .sbs-row button.sbs-disclose[aria-expanded=true] { border-color: var(--sbs-accent); }
.sbs-root .sbs-row button.sbs-disclose:focus-visible { outline: 2px solid var(--sbs-accent); outline-offset: -1px; }
.sbs-disclose-worst[data-status=mismatch], .sbs-disclose-worst[data-status=error] { color: var(--sbs-bad); }
.sbs-disclose-worst[data-status=noise] { color: var(--sbs-noise); }
.sbs-inner-op { color: var(--sbs-fg2); font-family: var(--sbs-mono); font-size: 11px; }
.sbs-row.sbs-child > div.sbs-fxname { padding-left: 14px; }
.sbs-row.sbs-child > div.sbs-fxname::before { content: "\\21B3\\00A0"; color: var(--sbs-fg2); }
.sbs-empty { padding: 16px; color: var(--sbs-fg2); text-align: center; }
.sbs-foot { padding: 2px 6px; border-top: 1px solid var(--sbs-border); color: var(--sbs-fg2); display: flex; gap: 12px; }
.sbs-detail { flex: 0 0 240px; border: 1px solid var(--sbs-border); border-radius: 3px; padding: 6px 8px;
  overflow: auto; max-height: ${VIEW_HEIGHT + ROW_HEIGHT + 26}px; }
.sbs-detail h4 { margin: 6px 0 2px; font-size: 11px; text-transform: uppercase; letter-spacing: 0.04em; color: var(--sbs-fg2); }
.sbs-kv { display: grid; grid-template-columns: max-content 1fr; gap: 1px 8px; }
.sbs-kv > div:nth-child(odd) { color: var(--sbs-fg2); }
.sbs-kv > div:nth-child(even) { font-family: var(--sbs-mono); overflow-wrap: anywhere; }
.sbs-verdict { margin-top: 2px; }
.sbs-verdict[data-noise=true] { color: var(--sbs-noise); }
.sbs-verdict[data-noise=false] { color: var(--sbs-bad); }
.sbs-trace { font-family: var(--sbs-mono); white-space: pre-wrap; overflow-wrap: anywhere; font-size: 11px; }
.sbs-hist { display: flex; align-items: flex-end; gap: 2px; height: 54px; margin-top: 4px; }
.sbs-hist > div { flex: 1; display: flex; flex-direction: column; justify-content: flex-end; align-items: center; height: 100%; }
.sbs-hist-bar { width: 100%; min-height: 1px; border-radius: 2px 2px 0 0; }
.sbs-hist-labels { display: flex; gap: 2px; font-family: var(--sbs-mono); font-size: 9px; color: var(--sbs-fg2); }
.sbs-hist-labels > div { flex: 1; text-align: center; white-space: nowrap; font-size: 8px; letter-spacing: -0.02em; }
.sbs-reset { display: flex; flex-wrap: wrap; align-items: center; gap: 4px 8px; }
.sbs-reset input[type=text] { width: 220px; font-family: var(--sbs-mono); }
.sbs-graphs-box > summary { cursor: pointer; color: var(--sbs-fg2); }
.sbs-graphs-host { min-height: 40px; }
${STEPS_CSS}
${SETS_CSS}
${MODELS_CSS}`;
