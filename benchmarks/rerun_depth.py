"""Reruns by reset depth (issue 37): a rerun that restarts at the last kept cut before the reset
(``engine/restart.py``) against a full rerun (``keep_cuts=0``), side by side on one ``Prepared``, with
the memory the cuts hold.

For each depth d (10%, 50%, 90% of the compared pairs, in execution order) the reset is the ONNX value
of the pair at that depth; each rerun is timed ``--repeat`` times, restarted and full alternating, and
the medians reported with their ratio. The first run (which keeps the cuts) is timed too, with a run
keeping none, to show what keeping costs. Records of both reruns are checked equal.

    python benchmarks/rerun_depth.py                                   # LLaMA 8 layers, hidden 256
    python benchmarks/rerun_depth.py --model-dir /tmp/sbs_big/llama_1g --repeat 2   # 1.2 GB (big_memory.py build)
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--depths", default="0.1,0.5,0.9")
    ap.add_argument("--model-dir", default=None,
                    help="a folder with user.pt2, model.onnx and inputs.pt (benchmarks/big_memory.py build) instead "
                         "of a LLaMA exported here")
    a = ap.parse_args()

    import warnings

    warnings.simplefilter("ignore")
    from sbs_widget.engine.entry import prepare
    from sbs_widget.engine.restart import REUSED
    from sbs_widget.samples import zoo

    if a.model_dir:
        import os

        from sbs_widget.load.readers import load_inputs

        ep = os.path.join(a.model_dir, "user.pt2")
        p = prepare(ep, os.path.join(a.model_dir, "model.onnx"))
        args, kwargs = load_inputs(os.path.join(a.model_dir, "inputs.pt"), None)
        what = a.model_dir
    else:
        ep, prog, args, kwargs = zoo.export("llama", layers=a.layers, hidden=a.hidden, seq=a.seq, batch=a.batch)
        p = prepare(ep, prog.model_proto)
        what = f"LLaMA {a.layers} layers, hidden {a.hidden}, seq {a.seq}, batch {a.batch}"
    weights = p.schedule.weight_bytes
    print(f"{what}: weights {weights / 2**20:.0f} MiB, {len(p.index.nodes)} ONNX nodes, "
          f"live set {p.schedule.live_bytes / 2**20:.1f} MiB")

    def timed(**kw):
        start = time.perf_counter()
        records = list(p.run(args, kwargs, **kw))
        return records, time.perf_counter() - start

    list(p.run(args, kwargs))  # warm: sessions compiled, plans made
    keep, none = [], []
    for _ in range(a.repeat):
        none.append(timed(keep_cuts=0)[1])
        p.cache.run_cuts = None  # a first run: nothing to restart from
        first, seconds = timed()
        keep.append(seconds)
    cuts = p.cache.run_cuts
    print(f"first run keeping cuts {statistics.median(keep):.3f} s, keeping none {statistics.median(none):.3f} s "
          f"(ratio {statistics.median(keep) / statistics.median(none):.2f}); {len(cuts.cuts)} cuts kept, "
          f"{cuts.nbytes / 2**20:.1f} MiB (budget {cuts.budget / 2**20:.0f} MiB)")
    pairs = [r for r in first if r.kind == "node" and r.onnx_name and r.ep_name and r.status in ("ok", "noise")]
    print(f"{'depth':>6s} {'restarted s':>12s} {'full s':>8s} {'ratio':>6s} {'reused':>7s}  same records")
    for depth in map(float, a.depths.split(",")):
        target = pairs[min(len(pairs) - 1, int(len(pairs) * depth))].onnx_name
        fast, slow = [], []
        for _ in range(a.repeat):
            p.cache.run_cuts = None
            list(p.run(args, kwargs))  # the run before each rerun: a first run, no reset, cuts kept
            restarted, seconds = timed(reset_names=[target])
            fast.append(seconds)
            full, seconds = timed(reset_names=[target], keep_cuts=0)
            slow.append(seconds)
        reused = sum(REUSED in (r.comment or "") for r in restarted)

        def figures(records):
            return sorted((str(r.kind), str(r.ep_name), str(r.onnx_name), r.status, repr(r.err_abs)) for r in records)

        f, s = statistics.median(fast), statistics.median(slow)
        print(f"{depth:6.0%} {f:12.3f} {s:8.3f} {f / s:6.2f} {reused:7d}  {figures(restarted) == figures(full)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
