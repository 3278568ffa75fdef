"""As deployed (issue 33): ``check_deployed`` with onnxruntime's defaults (ORT_ENABLE_ALL, CPU) on the
correct exports of the model zoo, and on the real deployment faults built in tests, with the verdict,
the sessions used and the time.

- zoo: every model of ``sbs_widget.samples.zoo`` (``trained_like`` weights), float32 and float16,
  exported with the exporter's optimizer on; the bar is 0 verdicts other than ``same``;
- cases: a float16 conv net whose BatchNormalization folds into float16 weights that overflow
  (``ConvBNFusion``; exported with the exporter's optimizer off, and on: it folds the BN itself, so the
  export is at fault; and the same fault on the zoo's residual ``convnet``, a model the rules were not
  written on), and ``session.set_denormal_as_zero=1`` on values that pass through denormals.

Each model runs in its own process, bounded by ``--timeout-per-model``.

    python benchmarks/deployed_zoo.py                      # all, both dtypes
    python benchmarks/deployed_zoo.py --models llama,resnet --dtypes float32
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time

ONE = r'''
import contextlib, io, json, sys, time, warnings
warnings.simplefilter("ignore")
import torch
import sbs_widget
from sbs_widget.samples import zoo
name, dtype = sys.argv[1], sys.argv[2]
with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
    if name.startswith("case:conv_bn_fp16"):
        from tests.test_deployed import ConvBN
        torch.manual_seed(0)
        m = ConvBN().eval()
        with torch.no_grad():
            m.c.weight.mul_(4000.0); m.bn.running_var.fill_(1e-4); m.bn.running_mean.normal_(); m.bn.weight.fill_(2.0)
        m = m.half(); args = (torch.rand(1, 4, 8, 8).half() * 0.01,); kwargs = {}
        ep = torch.export.export(m, args)
        # the exporter's own optimizer folds the BN too (then the export is at fault): off unless asked
        onx = torch.onnx.export(ep, args, dynamo=True, optimize=name.endswith("exporter_optimized")).model_proto
        options = None
    elif name == "case:zoo_convnet_bn_fp16":  # the same fault on a model not used to write the rules
        model, args, kwargs = zoo.BUILDERS["convnet"]()
        model = model.eval()
        conv = next(m for m in model.modules() if isinstance(m, torch.nn.Conv2d))
        bn = next(m for m in model.modules() if isinstance(m, torch.nn.BatchNorm2d))
        with torch.no_grad():
            conv.weight[0].mul_(3000.0); bn.running_var[0] = 1e-4; bn.weight[0] = 2.0
        model = model.half()
        args = tuple((a * 0.001).half() if a.is_floating_point() else a for a in args)
        ep = torch.export.export(model, args, kwargs)
        onx = torch.onnx.export(ep, args, kwargs=kwargs, dynamo=True, optimize=False).model_proto
        options = None
    elif name == "case:denormal_as_zero":
        from tests.test_deployed import Denormal
        args = (torch.rand(16, 16) + 0.5,); kwargs = {}
        ep = torch.export.export(Denormal(), args)
        onx = torch.onnx.export(ep, args, dynamo=True).model_proto
        options = {"config": {"session.set_denormal_as_zero": "1"}}
    else:
        ep, prog, args, kwargs = zoo.export(name, dtype=getattr(torch, dtype))
        onx, options = prog.model_proto, None
start = time.perf_counter()
r = sbs_widget.check_deployed(ep, onx, args, kwargs, session_options=options)
ww = max(r.written_errors, key=lambda e: e.ratio)
dw = max(r.deployed_errors, key=lambda e: e.ratio)
print(json.dumps({"verdict": r.verdict, "cause": r.cause.describe() if r.cause else "",
                  "located": r.located.describe() if r.located else "", "written": ww.ratio,
                  "written_noise": ww.noise, "deployed": dw.ratio, "sessions": r.sessions,
                  "steps": len(r.steps), "seconds": time.perf_counter() - start}))
'''


def main() -> int:
    from sbs_widget.samples.zoo import BUILDERS as MODELS

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default=",".join(MODELS))
    ap.add_argument("--dtypes", default="float32,float16")
    ap.add_argument("--timeout-per-model", type=float, default=300)
    ap.add_argument("--no-cases", action="store_true")
    ap.add_argument("--json", default=None, help="write the rows here")
    a = ap.parse_args()
    jobs = [(m, d) for m in a.models.split(",") for d in a.dtypes.split(",")]
    if not a.no_cases:
        jobs += [("case:conv_bn_fp16", "float16"), ("case:conv_bn_fp16_exporter_optimized", "float16"),
                 ("case:zoo_convnet_bn_fp16", "float16"), ("case:denormal_as_zero", "float32")]
    rows = []
    print(f"{'model':24s} {'dtype':8s} {'verdict':15s} {'written':>9s} {'deployed':>9s} {'sessions':>8s} {'s':>6s}  cause")
    for name, dtype in jobs:
        start = time.perf_counter()
        try:
            done = subprocess.run([sys.executable, "-c", ONE, name, dtype], capture_output=True, text=True,
                                  timeout=a.timeout_per_model)
            lines = done.stdout.strip().splitlines()
            row = json.loads(lines[-1]) if done.returncode == 0 and lines else \
                {"verdict": "error", "cause": (done.stderr.strip().splitlines() or ["?"])[-1][:100]}
        except subprocess.TimeoutExpired:
            row = {"verdict": "timeout", "cause": f"> {a.timeout_per_model} s"}
        row.update(model=name, dtype=dtype, wall=time.perf_counter() - start)
        rows.append(row)
        noise = " (rounding)" if row.get("written_noise") else ""
        print(f"{name:24s} {dtype:8s} {row['verdict']:15s} {row.get('written', float('nan')):9.3g} "
              f"{row.get('deployed', float('nan')):9.3g} {row.get('sessions', 0):8d} {row.get('seconds', 0):6.1f}  "
              f"{row.get('cause', '')}{noise}", flush=True)
    zoo = [r for r in rows if not r["model"].startswith("case:") and r["verdict"] not in ("error", "timeout")]
    print(f"\nzoo: {len(zoo)} exports checked, {sum(r['verdict'] != 'same' for r in zoo)} not 'same'; "
          f"{sum(r['verdict'] in ('error', 'timeout') for r in rows)} could not be built or ran out of time")
    if a.json:
        with open(a.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
