"""The rules both the kernel and the view apply give the same answers on both sides.

The same records go through the Python rules (sbs_widget.shared_rules, the DOT painter) and, via
node, through the JS modules the bundle is built from (js/rules.js, js/rows.js, js/graphs/model.js).
"""

from __future__ import annotations

import json
import math
import pathlib
import re
import shutil
import subprocess

import pytest

from sbs_widget import shared_rules as rules
from sbs_widget.graphs.dot import _digraph, _paint
from sbs_widget.graphs.spec import GraphSpec
from sbs_widget.records import ERROR, MISMATCH, NOISE, OK, ONE_SIDED, RESET, STATUSES, Record
from sbs_widget.views.rows import encode_rows, within

ROOT = pathlib.Path(__file__).resolve().parent.parent
NAN, INF = math.nan, math.inf

# Reads {payload, tolerances, errors, spec}; answers with what the JS rules say of each.
JS = """
import { readFileSync } from "node:fs";
import { buildView, indexGraph, paintClusters, paintGraph } from "%(js)s/graphs/model.js";
import { decodeRows } from "%(js)s/rows.js";
import { colorFor, errorColor, isExact, isWithin, ROW_COLUMNS } from "%(js)s/rules.js";
const input = JSON.parse(readFileSync(0, "utf8"));
const rows = decodeRows(new TextEncoder().encode(input.payload), ROW_COLUMNS, 0);
const VALUES = %(values)s;
const num = (v) => (typeof v === "number" && !Number.isFinite(v) ? String(v) : v); // NaN/inf through JSON
const g = indexGraph(input.spec);
const { paint } = paintGraph(g, rows);
const clusterPaint = paintClusters(g, paint);
process.stdout.write(JSON.stringify({
  columns: ROW_COLUMNS,
  values: rows.map((r) => Object.fromEntries(VALUES.map((k) => [k, num(r[k])]))),
  within: input.tolerances.map((t) => rows.map((r) => isWithin(r, ...t))),
  exact: rows.map(isExact),
  color: rows.map((r) => colorFor(r.err_abs, r.status)),
  scale: input.errors.map((e) => errorColor(e === null ? null : Number(e))),
  paint: paint.map((p) => (p ? [num(p.err), p.status] : null)),
  dot: buildView(g, { paint, clusterPaint, colorFor }).dot,
}));
"""


def _records() -> list[Record]:
    base = dict(ep_shape_type="T1s2x3", onnx_shape_type="T1s2x3", err_rel=1e-3, err_nan=0)
    out = [Record(ep_name=f"n{k % 4}", status=s, err_abs=e, within_tolerance=w, **base)
           for k, (s, e, w) in enumerate([(OK, 1e-6, True), (MISMATCH, 5e-3, False), (RESET, 0.2, False),
                                          (OK, 0.0, True), (MISMATCH, 1e-9, None), (MISMATCH, 3e-4, None)])]
    out += [
        Record(ep_name="n0", status=MISMATCH, err_abs=NAN, err_rel=NAN, err_nan=3, within_tolerance=False),
        Record(ep_name="n1", status=MISMATCH, err_abs=INF, err_rel=INF, err_nan=0, err_local=-INF),
        Record(ep_name="n2", status=ONE_SIDED),
        Record(ep_name="n3", status=ERROR, comment="failed"),
        Record(ep_name="n4", status=ONE_SIDED, err_abs=1e-2),  # a one-sided record with a figure still has a colour
        Record(ep_name="n5", status=ERROR, err_abs=0.5),
        # integer and bool pairs are exact: 1 off is beyond any tolerance, 0 off within
        Record(ep_name="n5", status=MISMATCH, err_abs=1.0, err_rel=1e-9, ep_shape_type="T7s4", onnx_shape_type="T7s4"),
        Record(ep_name="n6", status=OK, err_abs=0.0, err_rel=0.0, ep_shape_type="T9s2x2", onnx_shape_type="T9s2x2"),
        Record(ep_name="n6", status=MISMATCH, err_abs=1.0, ep_shape_type="T1s4", onnx_shape_type="T6s4"),
        Record(ep_name="n7", status=MISMATCH, err_abs=2e-5, err_rel=None, ep_shape_type="T10s1x8",
               onnx_shape_type="T1s1x8"),
        # broadcast shapes: one side [1, 8] against [4, 8]
        Record(ep_name="n7", status=MISMATCH, err_abs=4e-4, err_rel=0.5, ep_shape_type="T1s1x8",
               onnx_shape_type="T1s4x8"),
        Record(ep_name="n8", status=OK, err_abs=2.0, err_rel=1e-6, ep_shape_type="(T1s2,T1s2)", onnx_shape_type=None),
        # rounding (issue 35): beyond tolerance, yet onnxruntime about as close to float64 as torch. A node
        # whose worst record is noise is painted noise; a mismatch beside it wins; a reset stays a reset.
        Record(ep_name="n9", status=OK, err_abs=1e-6, err_rel=1e-6, within_tolerance=True, min_atol=0.0),
        Record(ep_name="n9", status=NOISE, err_abs=3e-4, err_rel=2e-3, within_tolerance=False, min_atol=2.9e-4,
               err_torch=1.5e-4, err_onnx=1.8e-4, ref_scale=40.0, noise=True),
        Record(ep_name="n10", status=NOISE, err_abs=0.5, err_rel=1e-3, within_tolerance=False, min_atol=0.5,
               err_torch=0.25, err_onnx=0.3, ref_scale=2e4, noise=True),
        Record(ep_name="n10", status=MISMATCH, err_abs=1e-3, within_tolerance=False, min_atol=1e-3,
               err_torch=1e-7, err_onnx=1e-3, ref_scale=1.0, noise=False),
        Record(ep_name="n11", status=RESET, err_abs=2e-4, within_tolerance=False, min_atol=2e-4,
               err_torch=1e-4, err_onnx=1e-4, ref_scale=8.0, noise=True),
        Record(ep_name="n12", status=NOISE, err_abs=NAN, err_rel=NAN, err_nan=1, within_tolerance=False,
               min_atol=INF, err_torch=NAN, err_onnx=NAN, ref_scale=INF, noise=True),
    ]
    assert {r.status for r in out} == set(STATUSES)
    return out


def _spec() -> GraphSpec:
    """n0 feeds six readers (drawn as stubs), n1 five (plain edges); two nested clusters."""
    spec = GraphSpec(side="fx")
    inner = spec.cluster_of(["m", "m.layer"])
    for i in range(15):
        spec.nodes.append({"id": f"fx:n{i}", "name": f"n{i}", "label": f"n{i}", "op": "x", "kind": "node",
                           "cluster": inner if i in (2, 3) else (0 if i in (4, 5) else -1)})
    spec.edges += [(0, k) for k in range(2, 8)] + [(1, k) for k in range(8, 13)]
    return spec


def _run_js(payload: str, tolerances, errors, spec) -> dict:
    node = shutil.which("node")
    if node is None or not (ROOT / "node_modules").exists():
        pytest.skip("node or node_modules missing (npm install)")
    script = JS % {"js": (ROOT / "js").as_uri(), "values": json.dumps(VALUES)}
    done = subprocess.run([node, "--input-type=module", "-e", script], capture_output=True, timeout=120,
                          input=json.dumps({"payload": payload, "tolerances": tolerances, "errors": errors,
                                            "spec": spec}).encode())
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout)


VALUES = ("err_abs", "err_rel", "err_local", "min_atol", "err_torch", "err_onnx", "ref_scale", "noise")


def _num(v):
    return rules.json_value(v)


def test_spec_gen_is_current():
    # npm run build writes it; a change to shared_rules.py without a rebuild fails here
    assert (ROOT / "js" / "spec.gen.js").read_text(encoding="utf-8") == rules.js_module()


def test_python_and_js_rules_agree():
    records = _records()
    # (2.95e-4: between n9's min_atol and its err_abs, the element-wise rule says within; 0.9 rtol: not
    # re-judged from the figures, the run's verdict stands)
    tolerances = [(1e-4, 1e-4, 1e-4, 1e-4), (1e-2, 1e-4, 1e-4, 1e-4), (1e-5, 0.9, 1e-4, 1e-4), (0.0, 0.0, 1e-4, 1e-4),
                  (3.0, 3.0, 1e-4, 1e-4), (2.95e-4, 1e-4, 1e-4, 1e-4), (1e-4, 0.9, 1e-4, 1e-4)]
    errors = [None, 0.0, 1e-30, 1e-7, 1e-5, 1e-4, 3.1622776601683795e-4, 1e-3, 0.37, 1.0, 7.0, "NaN", "Infinity"]
    spec = _spec()
    js = _run_js(encode_rows(records).decode(), tolerances, errors, spec.to_json())

    assert js["columns"] == list(rules.ROW_COLUMNS)
    # non-finite values: encoded by Python, read back by the view as the same numbers
    assert js["values"] == [{k: _num(getattr(r, k)) for k in VALUES} for r in records]
    assert js["exact"] == [rules.is_exact(r) for r in records]
    for t, answers in zip(tolerances, js["within"]):
        assert answers == [within(r, *t) for r in records], t
    assert js["color"] == [rules.color_for(r.err_abs, r.status) for r in records]
    noise_colors = {c for c, r in zip(js["color"], records) if r.status == NOISE}
    assert noise_colors == {rules.COLOR_SCALE["noise"]}, "noise is painted noise, whatever its error"
    assert js["scale"] == [rules.error_color(None if e is None else float(e)) for e in errors]

    # graph paint: the worst error and status per node, then the DOT colours and broadcast stubs
    py_paint = _paint(spec, records)
    assert js["paint"] == [list(map(_num, py_paint[n["id"]])) if n["id"] in py_paint else None for n in spec.nodes]
    py_dot = _digraph(spec, py_paint).source

    def fills(dot):
        return dict(re.findall(r'^\s*n(\d+) \[.*?\bfillcolor="([^"]+)"', dot, re.M))

    def clusters(dot):
        return dict(re.findall(r'subgraph cluster_(\d+) \{\n[^\n]*?\bcolor="([^"]+)"', dot))

    assert fills(js["dot"]) == fills(py_dot) and len(fills(py_dot)) == len(spec.nodes)
    assert clusters(js["dot"]) == clusters(py_dot) and len(clusters(py_dot)) == 2
    node = {n["name"]: str(i) for i, n in enumerate(spec.nodes)}
    assert fills(py_dot)[node["n9"]] == fills(py_dot)[node["n12"]] == rules.COLOR_SCALE["noise"]  # worst: noise
    assert fills(py_dot)[node["n10"]] == rules.color_for(0.5, MISMATCH)  # a mismatch beside noise wins
    assert fills(py_dot)[node["n11"]] == rules.color_for(2e-4, RESET)
    assert js["dot"].count("shape=cds") == py_dot.count("shape=cds") == 6  # n0's six readers; n1's five are edges


def test_rules_on_their_own():
    r = Record(status=MISMATCH, err_abs=1.0, err_rel=0.0, ep_shape_type="T7s3", onnx_shape_type="T7s3")
    assert within(r, 10.0, 10.0, 1e-4, 1e-4) is False  # integers: exact at any tolerance
    assert within(Record(status=ONE_SIDED, err_abs=1.0), 1, 1, 1, 1) is None
    # another atol: the element-wise rule (min_atol <= atol), not err_abs <= atol or err_rel <= rtol
    noise = Record(status=NOISE, err_abs=3e-4, err_rel=2e-3, within_tolerance=False, min_atol=2.9e-4)
    assert within(noise, 2.95e-4, 1e-4, 1e-4, 1e-4) is True and within(noise, 2.8e-4, 1e-4, 1e-4, 1e-4) is False
    assert within(noise, 1e-4, 0.5, 1e-4, 1e-4) is False  # an rtol change is judged by a rerun, not here
    assert rules.error_color(NAN) == rules.error_color(INF) == rules.error_color(1.0)  # NaN is the worst
    assert rules.error_color(None) == rules.COLOR_SCALE["not_compared"]
    assert rules.worse((1.0, OK), NAN, ONE_SIDED) == (pytest.approx(NAN, nan_ok=True), OK)
    assert set(rules.SEVERITY) == set(STATUSES)
    assert set(rules.MESSAGES) == {"get_rows", "rows", "rerun", "stop", "step", "input"}
    # every numeric Record field is converted back from its JSON string by the view
    assert "err_abs" in rules.NUMERIC_COLUMNS and "err_where" not in rules.NUMERIC_COLUMNS


def test_widget_answers_the_shared_message_names():
    # the kernel's side of the protocol the view speaks with MESSAGES (js/sync.js, js/view.js)
    from sbs_widget.views.widget import SbsWidget

    records = _records()
    w = SbsWidget.from_records(records)
    sent = []
    w.send = lambda content, buffers=None: sent.append((content, buffers))  # no frontend: keep what goes out
    w._on_msg(w, {"type": rules.MESSAGES["get_rows"], "run": 0, "start": 2}, [])
    assert sent[-1][0] == {"type": rules.MESSAGES["rows"], "run": 0, "start": 2, "reply": True}
    assert bytes(sent[-1][1][0]) == encode_rows(records[2:])
    w._on_msg(w, {"type": rules.MESSAGES["stop"]}, [])  # nothing running: no answer, no error
    assert len(sent) == 1
