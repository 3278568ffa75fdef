// CSV of the rows on screen (filtered, sorted), every field of the records, then each metric's figure
// under the metric's name.

import { isMetric, metricName } from "./rules.js";

function cell(v) {
  if (v === null || v === undefined) return "";
  if (Array.isArray(v)) v = v.join(" ");
  const s = typeof v === "number" && !Number.isFinite(v) ? (Number.isNaN(v) ? "NaN" : v > 0 ? "inf" : "-inf") : String(v);
  // A spreadsheet runs a cell starting with = + - @ as a formula: names are untrusted, so such text
  // (not numbers) gets a leading apostrophe.
  const safe = typeof v !== "number" && /^[=+\-@\t\r]/.test(s) && !/^-?(\d|inf$|NaN$)/.test(s) ? `'${s}` : s;
  return /[",\n\r]/.test(safe) ? `"${safe.replace(/"/g, '""')}"` : safe;
}

export function toCSV(rows, columns, index) {
  const keys = ["i", ...columns.filter((c) => c !== "i")];
  // a metric's name comes from a user: its header cell is neutralised like any text cell
  const lines = [keys.map((c) => (isMetric(c) ? cell(metricName(c)) : c)).join(",")];
  const order = index || rows.map((_, k) => k);
  for (const k of order) {
    const row = rows[k];
    lines.push(keys.map((c) => cell(row[c])).join(","));
  }
  return lines.join("\n") + "\n";
}
