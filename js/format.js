// Number formatting and the error color scale, shared by the table, the detail and the graphs.

export function fmtErr(v) {
  if (v === null || v === undefined) return "";
  if (Number.isNaN(v)) return "NaN";
  if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
  if (v === 0) return "0";
  return v.toExponential(2);
}

export function fmtInt(v) {
  return v === null || v === undefined ? "" : Number(v).toLocaleString("en-US");
}

export function fmtSeconds(s) {
  if (s === null || s === undefined || !Number.isFinite(s)) return "";
  if (s < 1) return `${Math.round(s * 1000)} ms`;
  if (s < 60) return `${s.toFixed(1)} s`;
  return `${Math.floor(s / 60)} min ${Math.round(s % 60)} s`;
}

const clamp01 = (x) => Math.max(0, Math.min(1, x));

/** Background of a record by its error on a log scale around atol; translucent so that it reads on
 *  light and dark themes. Within atol: faint green (fainter the smaller); beyond: yellow (just over)
 *  to red (4 decades over); NaN/inf and failures: strong red; nothing compared: no tint. */
export function colorFor(err, status, atol = 1e-4) {
  if (status === "error") return "hsla(0, 85%, 50%, 0.45)";
  if (err === null || err === undefined) return "transparent";
  if (!Number.isFinite(err)) return "hsla(0, 85%, 50%, 0.55)";
  const tol = atol > 0 ? atol : 1e-12;
  if (err <= tol) {
    const t = err > 0 ? clamp01((Math.log10(err) - Math.log10(tol) + 6) / 6) : 0;
    return `hsla(140, 55%, 45%, ${(0.05 + 0.13 * t).toFixed(3)})`;
  }
  const t = clamp01(Math.log10(err / tol) / 4);
  return `hsla(${Math.round(48 - 48 * t)}, 90%, 50%, ${(0.28 + 0.32 * t).toFixed(3)})`;
}
