// The error color scale, identical to sbs_widget.graphs.error_color: log10 |err| from 1e-7 (green)
// through 1e-3.5 (yellow) to 1 (red), mixed with white so black labels stay readable. The widget passes
// its table's colorFor instead; this one serves the standalone page and tests.
const LO = -7;
const HI = 0;
const STOPS = [[0x1a, 0x98, 0x50], [0xfe, 0xe0, 0x8b], [0xd7, 0x30, 0x27]];
const LIGHT = 0.55;
export const NOT_COMPARED = "#ffffff";
export const ONE_SIDED_FILL = "#e8e8e8";
export const ERROR_FILL = "#c2a5cf";

export function errorColor(err) {
  if (err === null || err === undefined || Number.isNaN(err)) return NOT_COMPARED;
  let t = err === Infinity ? 1 : (Math.log10(Math.max(err, 1e-30)) - LO) / (HI - LO);
  t = Math.min(Math.max(t, 0), 1) * (STOPS.length - 1);
  const i = Math.min(Math.floor(t), STOPS.length - 2);
  const f = t - i;
  const rgb = STOPS[i].map((a, k) => Math.round(255 - (255 - (a + (STOPS[i + 1][k] - a) * f)) * LIGHT));
  return `#${rgb.map((v) => v.toString(16).padStart(2, "0")).join("")}`;
}

/** Fill for a record's error and status (the shape of the widget's ctx.colorFor). */
export function colorFor(err, status) {
  if (status === "error") return ERROR_FILL;
  if (status === "one-sided" && (err === null || err === undefined)) return ONE_SIDED_FILL;
  return errorColor(err);
}
