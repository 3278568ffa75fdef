"""Records and culprits before and after a change to the engine: the same exports, run by two
checkouts, must give the same records (every field but times) and the same culprits.

    python benchmarks/same_records.py dump --out /tmp/before.jsonl          # in the old checkout
    python benchmarks/same_records.py dump --out /tmp/after.jsonl           # in the new one
    python benchmarks/same_records.py diff /tmp/before.jsonl /tmp/after.jsonl

``dump`` exports the zoo's models once into ``--cache`` (float32 and float16, optimize on and off;
both checkouts then read the same files), runs each with the default options and with
``node_local=True``, and runs the fault suite's faults (``culprit_accuracy.make_faults``, one per
kind) through the culprit finder, writing the top-3 culprits. ``diff`` prints the first differences
and exits 1 when there is any.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import json
import math
import os
import sys
import warnings

MODELS = ["mlp", "convnet", "lstm", "llama", "gpt2", "bert", "vit", "qwen2", "phi3", "gemma", "mistral",
          "bart", "deberta", "convnext"]
FAULT_MODELS = ["dummy_llm", "llama", "bert", "gpt2"]
TIMES = {"ep_time_run", "onnx_time_run"}


def _exports(name: str, dtype: str, optimize: bool, cache: str):
    """``(.pt2 path, .onnx path, args, kwargs)``, exported once into ``cache``."""
    import torch

    from sbs_widget.samples import zoo

    stem = os.path.join(cache, f"{name}-{dtype}-{'opt' if optimize else 'raw'}")
    if not os.path.exists(stem + ".onnx"):
        with contextlib.redirect_stderr(io.StringIO()):
            ep, prog, args, kwargs = zoo.export(name, optimize=optimize,
                                                dtype=torch.float16 if dtype == "float16" else None)
        torch.export.save(ep, stem + ".pt2")
        torch.save((args, kwargs), stem + ".inputs.pt")
        prog.save(stem + ".onnx")
    args, kwargs = torch.load(stem + ".inputs.pt", weights_only=True)
    return stem + ".pt2", stem + ".onnx", args, kwargs  # (read by prepare: transformers types registered)


def _jsonable(x):
    if isinstance(x, float):
        return repr(x) if not math.isfinite(x) else x
    if isinstance(x, (list, tuple)):
        return [_jsonable(v) for v in x]
    if isinstance(x, dict):
        return {str(k): _jsonable(v) for k, v in x.items()}
    if x is None or isinstance(x, (int, str, bool)):
        return x
    return repr(x)


def dump(a) -> int:
    from sbs_widget.engine.entry import prepare

    os.makedirs(a.cache, exist_ok=True)
    with open(a.out, "w") as out:
        for name in a.models:
            for dtype in ("float32", "float16"):
                for optimize in (True, False):
                    key = f"{name} {dtype} optimize={optimize}"
                    try:
                        ep, path, args, kwargs = _exports(name, dtype, optimize, a.cache)
                    except Exception as e:  # an export the exporter cannot do is the same for both checkouts
                        out.write(json.dumps({"run": key, "export_error": type(e).__name__}) + "\n")
                        continue
                    prepared = prepare(ep, path)
                    for node_local in (False, True):
                        try:
                            records = list(prepared.run(args, kwargs, node_local=node_local))
                        except Exception as e:
                            out.write(json.dumps({"run": key, "node_local": node_local,
                                                  "error": f"{type(e).__name__}: {e}"}) + "\n")
                            continue
                        for i, rec in enumerate(records):
                            fields = {k: v for k, v in dataclasses.asdict(rec).items() if k not in TIMES}
                            out.write(json.dumps({"run": key, "node_local": node_local, "i": i,
                                                  **_jsonable(fields)}) + "\n")
                    print(key, "done", flush=True)
        if a.faults:
            sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
            import culprit_accuracy as ca

            for name in FAULT_MODELS:
                for optimize in (False, True):
                    ep, model, args, kwargs = ca.export(name, optimize)
                    model = model.model_proto
                    faults = ca.make_faults(model, args, kwargs, per_kind=1, seed=0)
                    results, false_alarms = ca.evaluate(ep, model, args, kwargs, faults)
                    out.write(json.dumps({"faults": f"{name} optimize={optimize}", "false_alarms": false_alarms})
                              + "\n")
                    for fault, rank, _how, found, *_ in results:
                        out.write(json.dumps({"faults": f"{name} optimize={optimize}", "fault": fault.description,
                                              "rank": rank, "culprits": [[c.onnx_node, c.onnx_name, c.ep_name]
                                                                         for c in found]}) + "\n")
                    print(name, optimize, "faults done", flush=True)
    return 0


def diff(a) -> int:
    with open(a.before) as f:
        before = f.read().splitlines()
    with open(a.after) as f:
        after = f.read().splitlines()
    shown = 0
    for i, (x, y) in enumerate(zip(before, after)):
        # (a field added since, empty: ``metrics`` is None unless asked for)
        dx, dy = ({k: v for k, v in json.loads(line).items() if not (k == "metrics" and v is None)}
                  for line in (x, y))
        if dx != dy:
            changed = {k: (dx.get(k), dy.get(k)) for k in set(dx) | set(dy) if dx.get(k) != dy.get(k)}
            print(f"line {i + 1}: {dx.get('run') or dx.get('faults')} {dx.get('ep_name')}/{dx.get('onnx_name')}: "
                  f"{changed}")
            shown += 1
            if shown >= 20:
                break
    if len(before) != len(after):
        print(f"{len(before)} lines before, {len(after)} after")
    same = shown == 0 and len(before) == len(after)
    print(f"{len(before)} lines compared: {'identical' if same else 'DIFFERENT'}")
    return 0 if same else 1


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("--out", required=True)
    d.add_argument("--cache", default="/tmp/sbs_same_records")
    d.add_argument("--models", nargs="+", default=MODELS)
    d.add_argument("--no-faults", dest="faults", action="store_false")
    c = sub.add_parser("diff")
    c.add_argument("before")
    c.add_argument("after")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    return dump(a) if a.cmd == "dump" else diff(a)


if __name__ == "__main__":
    sys.exit(main())
