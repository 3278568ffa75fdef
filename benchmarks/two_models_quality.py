"""Two ONNX models of one program (issue 47): for each family, ``a`` (the export) against ``b`` made by the real
tools (``samples/transforms.py``: onnxruntime's offline optimizer, onnxslim, float16, dynamic and static QDQ
quantization), then one fault placed in ``b`` per kind (``B_FAULTS``) on the transform it belongs to.

CLEAN lines: the share of b's float values paired with a value of a, and the values called a departure (0 on a
correct transformation). FAULT lines: HIT when the first culprit is the edited node of b.

    python benchmarks/two_models_quality.py resnet bert vit gpt2 llama convnext distilbert qwen2
"""
import sys
import time
import warnings

warnings.simplefilter("ignore")
from sbs_widget.samples import zoo
from sbs_widget.samples.transforms import B_FAULTS, TRANSFORMS, exporter_optimize_pair, feeds_for
from sbs_widget.twomodels.compare import compare_models

CLEAN = ("onnxslim", "onnxsim", "ort_all", "quant_dynamic")
PLAN = [("wrong_rewrite", "ort_extended"), ("bad_float16_cast", "float16"), ("quant_scale_2x", "quant_static_qdq"),
        ("fused_wrong_constant", "ort_extended"), ("fused_wrong_constant", "ort_all")]
names = sys.argv[1:]
hits = total = clean_departs = clean_culprits = 0
begin = time.perf_counter()
for name in names:
    ep, prog, args, kw = zoo.export(name)
    a = prog.model_proto
    feeds = feeds_for(a, args, kw)
    made = {}
    for t in sorted({t for _, t in PLAN} | set(CLEAN)):
        try:
            made[t] = TRANSFORMS[t](a, [feeds])
        except Exception as e:
            print(name, t, "transform failed", str(e)[:100])
            continue
        try:
            c = compare_models(prog, a, made[t], args, kw)
        except Exception as e:
            print(name, t, "compare failed", type(e).__name__, str(e)[:150])
            continue
        st = {}
        for r in c.records:
            st[r.b_status] = st.get(r.b_status, 0) + 1
        clean_departs += st.get('departs', 0)
        clean_culprits += len(c.culprits)
        print(f"CLEAN {name} {t}: cov {c.matching.coverage:.2f} of {len(c.matching.b_float)}; departs {st.get('departs',0)}; culprits {[(x.onnx_node, x.op_type) for x in c.culprits[:2]]}")
    try:  # the exporter's own optimizer: optimize=False (a) against optimize=True (b), one translation
        ep2, a2, b2, args2, kw2 = exporter_optimize_pair(name)
        c = compare_models(ep2, a2, b2, args2, kw2)
        departs = sum(1 for r in c.records if r.b_status == "departs")
        clean_departs += departs
        clean_culprits += len(c.culprits)
        print(f"CLEAN {name} exporter_optimize: cov {c.matching.coverage:.2f} of {len(c.matching.b_float)}; "
              f"departs {departs}; culprits {[(x.onnx_node, x.op_type) for x in c.culprits[:2]]}")
    except Exception as e:
        print(name, "exporter_optimize", "compare failed", type(e).__name__, str(e)[:150])
    for fault, t in PLAN:
        if t not in made:
            continue
        try:
            bad, edited = B_FAULTS[fault](made[t])
        except Exception as e:
            print(name, fault, "no pattern:", str(e)[:80])
            continue
        try:
            c = compare_models(prog, a, bad, args, kw)
        except Exception as e:
            print(name, fault, "compare failed", type(e).__name__, str(e)[:150])
            continue
        first = c.culprits[0].onnx_node if c.culprits else None
        hits, total = hits + (first in edited), total + 1
        print(f"FAULT {name} {fault} on {t}: first {first} edited {edited} -> {'HIT' if first in edited else 'MISS'}; culprits {[(x.onnx_node, x.op_type, round(x.excess,1)) for x in c.culprits[:3]]}")
print(f"faults named first: {hits} of {total}; on correct transformations: {clean_departs} values called a "
      f"departure, {clean_culprits} culprits ({time.perf_counter() - begin:.0f} s)")
