"""What the rounding verdict (issue 35) costs: runs with the float64 reference against runs without,
side by side in one process on one prepared pair (sessions compiled once, before timing), medians.

- clean:      the default run, reference on / off. On a correct float32 export no pair fails the
              tolerance: the verdict should cost nothing (target <= 1.05).
- all fail:   atol = rtol = 0, so every floating pair fails the tolerance and gets a float64 rerun and
              a node-local run: reference on (node_local off, as by default) over today's node_local
              run with reference off (target <= 2.0).
- float16:    the default run of the model cast to float16, reference on / off (the float16 default
              tolerance, 1e-3, sends more pairs to the verdict).

    python benchmarks/noise_cost.py                       # tiny LLaMA (16 layers), loud conv net
    python benchmarks/noise_cost.py --models llama_mid --repeat 5
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

MODELS = {
    "llama_tiny": ("llama", dict(layers=16, hidden=64, seq=16, batch=2)),
    "llama_mid": ("llama", dict(layers=8, hidden=256, seq=128, batch=2)),
    "loud_convnet": ("loud_convnet", {}),
    "bert": ("bert", {}),
}


def _time(prepared, args, kwargs, repeat: int, **options) -> float:
    list(prepared.run(args, kwargs, **options))  # warm: sessions, plans
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        list(prepared.run(args, kwargs, **options))
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def measure(name: str, repeat: int, dtype=None) -> dict:
    from sbs_widget.engine.entry import prepare
    from sbs_widget.samples import zoo

    builder, kw = MODELS[name]
    ep, prog, args, kwargs = zoo.export(builder, optimize=True, dtype=dtype, **kw)
    p = prepare(ep, prog.model_proto)
    out = {"model": name + ("" if dtype is None else " float16")}
    off = _time(p, args, kwargs, repeat, reference=False)
    on = _time(p, args, kwargs, repeat, reference=True)
    out["clean_off_s"], out["clean_on_s"], out["clean_ratio"] = off, on, on / off
    if dtype is None:
        local = _time(p, args, kwargs, repeat, reference=False, node_local=True, atol=0.0, rtol=0.0)
        fail = _time(p, args, kwargs, repeat, reference=True, atol=0.0, rtol=0.0)
        out["node_local_s"], out["all_fail_s"], out["all_fail_ratio"] = local, fail, fail / local
    statuses: dict[str, int] = {}
    for r in p.run(args, kwargs):
        statuses[r.status] = statuses.get(r.status, 0) + 1
    out["statuses"] = statuses
    return out


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="llama_tiny,loud_convnet")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--float16", action="store_true", help="also the models cast to float16")
    args = parser.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        rows.append(measure(name, args.repeat))
        print(rows[-1], flush=True)
        if args.float16:
            rows.append(measure(name, args.repeat, torch.float16))
            print(rows[-1], flush=True)
    print("\n| model | clean: on / off | all pairs fail: reference / node_local | statuses (default run) |")
    print("|---|---|---|---|")
    for r in rows:
        fail = f"{r['all_fail_ratio']:.2f} ({r['all_fail_s']:.3f} s / {r['node_local_s']:.3f} s)" \
            if "all_fail_ratio" in r else "-"
        print(f"| {r['model']} | {r['clean_ratio']:.3f} ({r['clean_on_s']:.3f} s / {r['clean_off_s']:.3f} s) "
              f"| {fail} | {r['statuses']} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
