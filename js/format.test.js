// Hostile names (issue 31): hidden characters made visible, long names shortened. node --test js/
import assert from "node:assert/strict";
import { test } from "node:test";
import { labelText, shorten, visible } from "./format.js";
import { toCSV } from "./csv.js";

test("bidi controls, NUL and other hidden characters become visible escapes", () => {
  assert.equal(visible("relu\u202eTMATMUL"), "relu\\u202eTMATMUL");
  assert.equal(visible("a\x00b\x1b[31mc\x7f\x85"), "a\\x00b\\x1b[31mc\\x7f\\x85");
  for (const cp of [0x202a, 0x202b, 0x202c, 0x202d, 0x202e, 0x2066, 0x2067, 0x2068, 0x2069, 0x200e, 0x200f, 0x061c, 0x200b, 0xfeff, 0x2028]) {
    const out = visible(`x${String.fromCodePoint(cp)}y`);
    assert.equal(out, `x\\u${cp.toString(16).padStart(4, "0")}y`);
  }
  assert.equal(visible("tag\u{e0041}"), "tag\\U000e0041");
  assert.equal(visible("lone\ud800"), "lone\\ud800");
  // printable text, emoji (a surrogate pair) and non-Latin scripts are left alone, without a copy
  for (const s of ["decoder.layers.0.mlp", "日本語", "emoji 😀", "\\N already a backslash"]) assert.equal(visible(s), s);
  assert.equal(visible("line\nbreak\ttab"), "line\\x0abreak\\x09tab");
  assert.equal(visible("trace\n  at x\u202e", true), "trace\n  at x\\u202e");
  assert.equal(visible(null), "");
  assert.equal(visible(12), "12");
  // idempotent: the Python side escapes labels first, the browser escapes again
  assert.equal(visible(visible("a\u202e\x00")), visible("a\u202e\x00"));
});

test("long names are shortened head…tail by code points", () => {
  const long = `${"a".repeat(50_000)}MIDDLE${"z".repeat(50_000)}`;
  const short = shorten(long);
  assert.equal(Array.from(short).length, 64);
  assert.ok(short.startsWith("aaaa") && short.endsWith("zzzz") && short.includes("…"));
  assert.equal(shorten("short"), "short");
  assert.equal(shorten("x".repeat(64)), "x".repeat(64));
  // never splits a surrogate pair
  const emoji = shorten("😀".repeat(100));
  assert.equal(Array.from(emoji).length, 64);
  assert.ok(!/[\ud800-\udbff](?![\udc00-\udfff])/.test(emoji));
  // shortened first, then escaped: a label of hidden characters stays bounded
  const label = labelText("\u202e".repeat(100_000));
  assert.ok(label.length < 64 * 6 + 1 && label.startsWith("\\u202e"));
});

test("CSV cells starting with a formula character are neutralised, numbers are not", () => {
  const rows = [{ i: 0, ep_name: "=HYPERLINK(\"http://x\")", onnx_name: "@SUM(A1)", err_abs: -1.5, module: "-1e-3" }];
  const csv = toCSV(rows, ["ep_name", "onnx_name", "err_abs", "module"]);
  assert.equal(csv.split("\n")[1], `0,"'=HYPERLINK(""http://x"")",'@SUM(A1),-1.5,-1e-3`);
});
