// Number formatting and safe display text, shared by the table, the detail and the graphs
// (the error colour scale is in rules.js).

import { HIDDEN_RANGES } from "./spec.gen.js";

export function fmtErr(v) {
  if (v === null || v === undefined) return "";
  if (Number.isNaN(v)) return "NaN";
  if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
  if (v === 0) return "0";
  return v.toExponential(2);
}

/** A metric's figure (cosine 0.99999871, sqnr_db 84.2, nmse 3.1e-9): six significant digits, so a cosine
 *  near 1 still shows how near; exponents beyond [1e-3, 1e6). */
export function fmtMetric(v) {
  if (v === null || v === undefined) return "";
  if (Number.isNaN(v)) return "NaN";
  if (!Number.isFinite(v)) return v > 0 ? "inf" : "-inf";
  if (v === 0) return "0";
  const a = Math.abs(v);
  if (a >= 1e-3 && a < 1e6) return String(Number(v.toPrecision(6)));
  return v.toExponential(3);
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

// Characters that hide, reorder or break text: C0/C1 controls, bidi embeddings/overrides/isolates and
// marks, zero-width and other format characters, line/paragraph separators, lone surrogates, tag
// characters. Model names are untrusted: "gelu\u202eTMATMUL" would otherwise display as another name.
// The set is HIDDEN_RANGES of sbs_widget/shared_rules.py (safe_text.HIDDEN in Python).
const cp = (n) => `\\u{${n.toString(16)}}`;
const HIDDEN = new RegExp(`[${HIDDEN_RANGES.map(([a, b]) => `${cp(a)}-${cp(b)}`).join("")}]`, "gu");

function escapeChar(ch) {
  const cp = ch.codePointAt(0);
  if (cp < 0x100) return `\\x${cp.toString(16).padStart(2, "0")}`;
  if (cp < 0x10000) return `\\u${cp.toString(16).padStart(4, "0")}`;
  return `\\U${cp.toString(16).padStart(8, "0")}`;
}

/** `text` with every hidden character shown as an escape (`\u202e`, `\x00`), for display as text
 *  (textContent, never innerHTML). `keepNewlines` leaves "\n" as a line break (stack traces). */
export function visible(text, keepNewlines = false) {
  if (text === null || text === undefined) return "";
  const s = String(text);
  HIDDEN.lastIndex = 0;
  if (!HIDDEN.test(s)) return s; // the common case: no copy
  return s.replace(HIDDEN, (ch) => (keepNewlines && ch === "\n" ? ch : escapeChar(ch)));
}

// ANSI CSI sequences (colours, cursor moves: ESC [ params intermediates final, or the 8-bit CSI) that
// tracebacks and loggers put in messages: removed before display; other hidden characters stay escaped.
// eslint-disable-next-line no-control-regex -- ESC is what is matched
const ANSI_CSI = /(?:\u001b\[|\u009b)[\u0030-\u003f]*[\u0020-\u002f]*[\u0040-\u007e]/g;

/** `text` without its ANSI CSI sequences ("\x1b[31mboom\x1b[0m" -> "boom"). */
export function stripAnsi(text) {
  if (text === null || text === undefined) return "";
  return String(text).replace(ANSI_CSI, "");
}

/** A message (an error, a traceback) for display: ANSI colours removed, then `visible` (newlines kept). */
export const messageText = (text) => visible(stripAnsi(text), true);

/** `text` cut to at most `limit` code points as head…tail (graph labels; the full name goes on hover). */
export function shorten(text, limit = 64) {
  const s = String(text ?? "");
  if (s.length <= limit) return s;
  const cps = Array.from(s); // code points: never split a surrogate pair
  if (cps.length <= limit) return s;
  const head = Math.ceil((limit - 1) * 0.65);
  return `${cps.slice(0, head).join("")}…${cps.slice(cps.length - (limit - 1 - head)).join("")}`;
}

/** One line of a graph label: shortened, then made visible. */
export const labelText = (text, limit = 64) => visible(shorten(text, limit));
