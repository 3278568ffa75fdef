"""Inner records (kind "inner": values inside the ONNX translation of one FX node) in the widget's
Python side: the rows the view receives, the static fallback, the offline page (rendered by the view's
own code in jsdom), and the ONNX graph's translation clusters against the records of a real run."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

import sbs_widget
from sbs_widget.records import KIND_INNER, RECORD_FIELDS, Record
from sbs_widget.views.rows import ROW_COLUMNS, decode_rows, encode_rows

ROOT = Path(__file__).resolve().parents[1]
EVIL = '<img src=x onerror="alert(1)"></script>'


def constructed() -> list[Record]:
    """A run as the engine streams it: inner records in ONNX node order, before their FX node's own."""
    return [
        Record(kind="input", ep_name="x", onnx_name="x", err_abs=0.0, status="ok"),
        Record(kind=KIND_INNER, inner_of="attn", inner_op="aten._softmax.default", ep_name="attn::_softmax",
               onnx_name="v_softmax", onnx_node_name="node_Softmax_3", onnx_op_type="Softmax", err_abs=0.25,
               status="mismatch"),
        Record(kind=KIND_INNER, inner_of="attn", inner_op=None, ep_name=None, onnx_name=f"v_{EVIL}",
               onnx_node_name="node_Where_4", onnx_op_type="Where", status="one-sided",
               comment="not paired with a finer torch value"),
        Record(kind="node", ep_name="attn", onnx_name="attn", onnx_node_name="node_attn", onnx_op_type="MatMul",
               err_abs=1e-3, status="mismatch"),
        Record(kind=KIND_INNER, inner_of=EVIL, inner_op="aten.mul.Tensor", ep_name=f"{EVIL}::mul",
               onnx_name="v_mul", onnx_node_name="node_Mul_6", onnx_op_type="Mul", err_abs=0.5, status="mismatch"),
        Record(kind="output", ep_name="output", onnx_name="out", onnx_op_type="Identity", err_abs=1e-6, status="ok"),
    ]


def test_rows_carry_inner_of_and_inner_op():
    # every field but metrics (a dict: one column per metric after these)
    assert ROW_COLUMNS == tuple(f for f in RECORD_FIELDS if f != "metrics")
    k = ROW_COLUMNS.index("inner_of")  # (b's fields of two models come after them)
    assert ROW_COLUMNS[k:k + 2] == ("inner_of", "inner_op")
    rows = decode_rows(encode_rows(constructed()))
    assert [(r["kind"], r["inner_of"], r["inner_op"]) for r in rows[1:3]] == [
        ("inner", "attn", "aten._softmax.default"), ("inner", "attn", None)]
    spec = (ROOT / "js" / "spec.gen.js").read_text()
    assert '"inner_of", "inner_op"' in spec  # the view decodes them (tests/test_shared_rules.py: not stale)


def test_fallback_lists_inner_values_escaped():
    w = sbs_widget.SbsWidget.from_records(constructed(), title="inner")
    page = w._repr_mimebundle_()[0]["text/html"]
    assert "attn::_softmax (aten._softmax.default)" in page
    assert "&lt;img src=x onerror=&quot;alert(1)&quot;&gt;&lt;/script&gt;::mul (aten.mul.Tensor)" in page
    assert "<img" not in page and "</script>" not in page
    # the one-sided inner value is not among the worst pairs; the filtered DataFrame stays flat
    assert "inside attn" not in page
    df = w.filtered_dataframe()
    assert list(df["kind"]).count("inner") == 3 and "inner_of" in df.columns


def test_fallback_names_an_unpaired_inner_value_by_its_fx_node():
    from sbs_widget.views.fallback import fallback_html

    recs = constructed()
    recs[2].status = "mismatch"  # listed now
    html = fallback_html(title="", run_id=0, status="done", records=recs, summary_lines=[], culprits=[], atol=1e-4,
                         rtol=1e-4)
    assert "inside attn (unpaired)" in html


# The offline page's data rendered by the view's own code in jsdom: the same path as a browser opening it.
RENDER = r"""
import { setupDom, tick } from "./js/test_env.js";
setupDom();
const { renderStatic } = await import("./js/static_model.js");
let text = "";
for await (const chunk of process.stdin) text += chunk;
const data = JSON.parse(text);
const el = document.createElement("div");
document.body.append(el);
renderStatic(el, data, () => () => {});
await tick(); await tick();
const filter = process.argv[process.argv.length - 1];
if (filter !== "-") {  // the filter box, as typed
  const search = el.querySelector('input[aria-label="filter"]');
  search.value = filter;
  search.dispatchEvent(new window.Event("input"));
}
const shown = (b) => (b.hidden ? null : b.textContent);
const rows = () => [...el.querySelectorAll(".sbs-row")].filter((r) => r.style.display !== "none")
  .sort((a, b) => parseFloat(a.style.transform.slice(11)) - parseFloat(b.style.transform.slice(11)))
  .map((r) => ({ k: Number(r.dataset.k), child: r.classList.contains("sbs-child"),
                 disclose: shown(r.querySelector(".sbs-disclose")),
                 op: r.querySelector(".sbs-inner-op").textContent }));
const before = rows();
const button = [...el.querySelectorAll(".sbs-disclose")].find((b) => !b.hidden);
button?.click();
const after = rows();
process.stdout.write(JSON.stringify({ before, after, imgs: el.querySelectorAll("img").length }));
"""


def render_offline(path: Path, filter_text: str = "-") -> dict:
    """The page's rows drawn by the view in jsdom (after typing ``filter_text``), then after a click on
    the first disclosure drawn."""
    node = shutil.which("node")
    if not node or not (ROOT / "node_modules" / "jsdom").exists():
        pytest.skip("node or node_modules/jsdom missing (npm install)")
    page = path.read_text(encoding="utf-8")
    data = page.split('id="sbs-data">')[1].split("</script>")[0]
    done = subprocess.run([node, "--input-type=module", "-e", RENDER, filter_text], input=data.encode(), cwd=ROOT,
                          capture_output=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return json.loads(done.stdout.decode())


def test_offline_page_nests_inner_rows(tmp_path):
    w = sbs_widget.SbsWidget.from_records(constructed(), title=EVIL)
    out = render_offline(w.save_html(tmp_path / "inner.html"))
    # the input, attn (its two inner values folded), the orphan (no row named EVIL), the output
    assert [r["k"] for r in out["before"]] == [0, 3, 4, 5]
    assert out["before"][1]["disclose"] == "▸ 2 · 1 mismatch"
    assert out["before"][2]["op"] == "aten.mul.Tensor" and not out["before"][2]["child"]
    assert [r["k"] for r in out["after"]] == [0, 3, 1, 2, 4, 5]
    assert [(r["child"], r["op"]) for r in out["after"][2:4]] == [(True, "aten._softmax.default"), (True, "unpaired")]
    assert out["imgs"] == 0


# --- a real run: the zoo's LLaMA, whose rsqrt (Sqrt + Reciprocal) and silu (Sigmoid + Mul) the exporter
# writes as several ONNX nodes

@pytest.fixture(scope="module")
def llama():
    import warnings

    from sbs_widget.samples import zoo

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep, prog, args, kwargs = zoo.export("llama")
        w = sbs_widget.SbsWidget(ep, prog.model_proto, args, kwargs=kwargs, title="llama").wait(120)
    inner = [r for r in w.records if r.kind == KIND_INNER]
    assert inner, "the engine compares values inside translations"
    return w, inner


def test_real_run_each_translation_is_a_cluster_holding_its_inner_values(llama):
    from sbs_widget.graphs.dot import SPEC_MARKER

    w, inner = llama
    spec = json.loads(w.onnx_dot.split("\n", 1)[0].split(SPEC_MARKER, 1)[1])  # what the view draws
    cluster_of = {n["name"]: spec["clusters"][n["cluster"]] if n["cluster"] >= 0 else {} for n in spec["nodes"]}
    own = {r.ep_name: r for r in w.records if r.kind in ("node", "output")}
    for r in inner:
        assert cluster_of[r.onnx_node_name].get("fx") == r.inner_of, (r.onnx_node_name, r.inner_of)
        parent = own[r.inner_of]  # every inner value nests under its FX node's row in this run
        assert w.records.index(parent) > w.records.index(r), "inner records come before their FX node's"
        assert cluster_of[parent.onnx_node_name].get("fx") == r.inner_of
        module = spec["clusters"][cluster_of[r.onnx_node_name]["parent"]]
        assert module["path"] and "fx" not in module, "inside the module cluster it belongs to"


def test_real_run_offline_page_folds_inner_values(llama, tmp_path):
    w, inner = llama
    fx = inner[0].inner_of
    out = render_offline(w.save_html(tmp_path / "llama.html"), filter_text=fx)
    parent = next(i for i, r in enumerate(w.records) if r.kind == "node" and r.ep_name == fx)
    drawn = {r["k"]: r for r in out["before"]}
    assert not any(r["child"] for r in out["before"]), "folded: the filter matches the FX node itself"
    assert re.fullmatch(r"▸ \d+( · .+)?", drawn[parent]["disclose"] or "")
    at = [r["k"] for r in out["after"]].index(parent)
    opened = [r for r in out["after"][at + 1:] if r["child"]]
    ks = {i for i, r in enumerate(w.records) if r.kind == KIND_INNER and r.inner_of == fx}
    assert {r["k"] for r in opened} == ks and all(r["op"].startswith("aten.") for r in opened), opened


def test_real_run_an_inner_value_resets_by_its_onnx_name(llama):
    w, inner = llama
    name = next(r.onnx_name for r in inner if r.ep_name)  # what ticking its row puts in the reset set
    w.rerun(reset_names={name}).wait(120)
    assert w.status == "done", w.message
    assert [r.status for r in w.records if r.onnx_name == name] == ["reset"]
