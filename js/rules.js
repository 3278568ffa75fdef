// The rules the view shares with the kernel, applied to the data of spec.gen.js (generated from
// sbs_widget/shared_rules.py, where each rule's Python twin lives and the colour scale is
// explained). tests/test_shared_rules.py feeds the same records to both and compares the answers.
import { COLOR_SCALE, EXACT_ELEM_TYPES, METRIC_PREFIX, NO_VERDICT, NUMERIC_COLUMNS, SEVERITY, SHAPE_TYPE, SPREAD_NUMERIC, SPREAD_PREFIX } from "./spec.gen.js";

export { BROADCAST, GRAPH_SPEC_MARKER, HISTOGRAM_EDGES, MESSAGES, METRIC_PREFIX, NON_FINITE, ROW_COLUMNS, SEVERITY, SPREAD_PREFIX, STATUSES } from "./spec.gen.js";

const NUMERIC = new Set([...NUMERIC_COLUMNS, ...SPREAD_NUMERIC.map((f) => SPREAD_PREFIX + f)]); // the spread's too (input sets)
const EXACT = new Set(EXACT_ELEM_TYPES);
const SHAPE = new RegExp(SHAPE_TYPE);

/** Whether `key` is a metric's column ("metric:cosine": shared_rules.METRIC_PREFIX + the name). */
export const isMetric = (key) => typeof key === "string" && key.startsWith(METRIC_PREFIX);

/** The metric's name of a metric column key (shown as text only: names come from users). */
export const metricName = (key) => key.slice(METRIC_PREFIX.length);

export const isNumeric = (key) => NUMERIC.has(key) || isMetric(key);

/** A value of column `key` as sent in JSON, back to a number: NaN and infinities arrive as strings. */
export const fromJson = (key, v) => (typeof v === "string" && isNumeric(key) ? Number(v) : v);

/** Whether a side of `row` holds integers or bools (by its shape text "T7s2x3"). */
export function isExact(row) {
  for (const text of [row.ep_shape_type, row.onnx_shape_type]) {
    const m = text ? SHAPE.exec(text) : null;
    if (m && EXACT.has(Number(m[1]))) return true;
  }
  return false;
}

/** views/rows.py within (Tolerance.within_record): at the run's atol the engine's verdict; at another atol
 *  the element-wise rule itself, min_atol <= atol (min_atol: the smallest atol every element passes at the
 *  run's rtol; err_abs where a record has none); integer pairs exact, a NaN/Inf disagreement beyond. The
 *  figures speak of the run's rtol only: `rtol` is not re-judged here (the widget reruns on an rtol
 *  change; a saved view says it applies on a rerun). null when nothing was compared. */
export function isWithin(row, atol, rtol, runAtol) { // (callers pass the run's rtol too, as to views/rows.py within)
  if (row.err_abs === null || row.err_abs === undefined) return null;
  if (NO_VERDICT.includes(row.status)) return null;
  if (atol === runAtol && row.within_tolerance !== null && row.within_tolerance !== undefined)
    return Boolean(row.within_tolerance);
  if (row.err_nan || Number.isNaN(row.err_abs)) return false;
  if (isExact(row)) return row.err_abs === 0;
  const least = row.min_atol === null || row.min_atol === undefined ? row.err_abs : row.min_atol;
  return least <= atol;
}

/** shared_rules.worse: a node's paint {err, status} after one more record (largest error, NaN wins;
 *  worst status). */
export function worse(p, err, status) {
  if (!p) return { err: err ?? null, status };
  const old = p.err;
  let e;
  if (old === null) e = err ?? null;
  else if (err === null || err === undefined) e = old;
  else if (Number.isNaN(old) || Number.isNaN(err)) e = NaN;
  else e = Math.max(old, err);
  return { err: e, status: (SEVERITY[status] ?? 0) > (SEVERITY[p.status] ?? 0) ? status : p.status };
}

const STOPS = COLOR_SCALE.stops.map((s) => [1, 3, 5].map((k) => parseInt(s.slice(k, k + 2), 16)));
export const NOT_COMPARED = COLOR_SCALE.not_compared;
export const ONE_SIDED_FILL = COLOR_SCALE.one_sided;
export const ERROR_FILL = COLOR_SCALE.error;
export const ERROR_LINE = COLOR_SCALE.error_line;
export const RESET_LINE = COLOR_SCALE.reset_line;
export const STUB_FILL = COLOR_SCALE.stub;
export const NOISE_FILL = COLOR_SCALE.noise;

/** shared_rules.error_color: colour of an absolute error (null: nothing compared; NaN/inf: the worst). */
export function errorColor(err) {
  if (err === null || err === undefined) return NOT_COMPARED;
  const { log_lo: lo, log_hi: hi } = COLOR_SCALE;
  let t = Number.isFinite(err) ? (Math.log10(Math.max(err, 1e-30)) - lo) / (hi - lo) : 1;
  t = Math.min(Math.max(t, 0), 1) * (STOPS.length - 1);
  const i = Math.min(Math.floor(t), STOPS.length - 2);
  const f = t - i;
  const rgb = STOPS[i].map((a, k) => Math.round(a + (STOPS[i + 1][k] - a) * f));
  return `#${rgb.map((v) => v.toString(16).padStart(2, "0")).join("")}${COLOR_SCALE.alpha}`;
}

/** shared_rules.color_for: colour of a record (or a node's worst paint) by its error and status. */
export function colorFor(err, status) {
  if (status === "error") return ERROR_FILL;
  if (status === "one-sided" && (err === null || err === undefined)) return ONE_SIDED_FILL;
  // beyond tolerance by rounding alone: off the green-red scale, whatever its size
  if (status === "noise") return NOISE_FILL;
  return errorColor(err);
}
