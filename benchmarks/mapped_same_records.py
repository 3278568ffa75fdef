"""Weights read from the ``.pt2`` file (``load/mapped_weights.py``) give the records of weights held in
memory, on the zoo's families (issue 37): each model is exported, saved as files, and run from the paths
twice, ``SBS_WIDGET_MAP_WEIGHTS=0`` and ``=1``; the records (every field but times) are compared as
sorted sets. The zoo's models are small, so the 1 MB floor of the segments' weight budget would leave
their segments as they are: ``--no-floor`` drops it, so that the float32 cut rule (segments reading 1/8
of the weights each, ``segments.weights_budget``) cuts them as it cuts a big model.

    python benchmarks/mapped_same_records.py --no-floor
    python benchmarks/mapped_same_records.py --models mistral gpt_neox --dtype float16
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import tempfile
import warnings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=["gpt2", "bert", "vit", "qwen2", "phi3", "gemma"])
    ap.add_argument("--dtype", default=None, choices=[None, "float16"])
    ap.add_argument("--no-floor", action="store_true", help="no 1 MB floor on the segments' weight budget")
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    import onnx
    import torch

    from sbs_widget.engine import entry, segments
    from sbs_widget.engine import prepared as prepared_module
    from sbs_widget.load.mapped_weights import MAP_ENV
    from sbs_widget.samples import zoo

    if a.no_floor:
        def budget(index, mapped=False):
            found = segments.weights_budget(index, mapped)
            return (found[0], max(1, sum(found[0]) // segments.WEIGHTS_SHARE)) if found and mapped else found
        prepared_module.weights_budget = budget

    def records(pt2, onx, args, kwargs, mapped: bool):
        os.environ[MAP_ENV] = "1" if mapped else "0"
        entry._PREPARED.clear()
        p = entry.prepare(pt2, onx)
        out = sorted((tuple((k, v) for k, v in sorted(dataclasses.asdict(r).items()) if "time" not in k)
                      for r in p.run(args, kwargs)), key=repr)
        return out, len(next(iter(p._plans.values()))), len(p.weight_files)

    failures = 0
    for i, name in enumerate(a.models):
        optimize = i % 2 == 1  # both kinds of export, alternating
        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            ep, prog, args, kwargs = zoo.export(name, optimize=optimize, dtype=getattr(torch, a.dtype or "float32"))
        folder = tempfile.mkdtemp(prefix="sbs_mapped_")
        pt2, onx = os.path.join(folder, "m.pt2"), os.path.join(folder, "m.onnx")
        torch.export.save(ep, pt2)
        onnx.save_model(prog.model_proto, onx)
        held, cut_held, _ = records(pt2, onx, args, kwargs, mapped=False)
        mapped, cut_mapped, files = records(pt2, onx, args, kwargs, mapped=True)
        statuses: dict[str, int] = {}
        for r in mapped:
            status = dict(r)["status"]
            statuses[status] = statuses.get(status, 0) + 1
        same = held == mapped and files == 1
        failures += not same
        print(f"{name} (optimize={optimize}, {a.dtype or 'float32'}): same records {same}, {len(held)} records, "
              f"segments {cut_held} held / {cut_mapped} mapped, statuses {statuses}", flush=True)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
