"""Cost of a three-way run (issue 47): ``compare_models`` (torch, the export ``a`` and a transformed ``b``: b's
whole run, its pairing with a, b fed a's values, and the lockstep run measuring both) against the two-way run
``prepared.run`` on the same model and inputs, side by side, alternating, medians over --repeat. Target <= 1.5.

    python benchmarks/two_models_cost.py                      # bert, b = static QDQ quantization
    python benchmarks/two_models_cost.py --model llama --transform float16
    python benchmarks/two_models_cost.py --model bert --layers 4 --hidden 256 --seq 128
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="bert")
    ap.add_argument("--transform", default="quant_static_qdq")
    ap.add_argument("--repeat", type=int, default=7)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--hidden", type=int, default=None)
    ap.add_argument("--seq", type=int, default=None)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    from sbs_widget.engine.entry import prepare
    from sbs_widget.samples import zoo
    from sbs_widget.samples.transforms import TRANSFORMS, feeds_for
    from sbs_widget.twomodels.compare import compare_models

    size = {k: v for k, v in (("layers", a.layers), ("hidden", a.hidden), ("seq", a.seq)) if v is not None}
    ep, prog, args, kwargs = zoo.export(a.model, **size)
    model = prog.model_proto
    b = TRANSFORMS[a.transform](model, [feeds_for(model, args, kwargs)])
    p = prepare(prog, model)
    list(p.run(args, kwargs))  # (sessions compiled: the runs below are reruns for both)
    compare_models(p, None, b, args, kwargs)
    two, three = [], []
    for _ in range(a.repeat):
        # fresh tensors (the same values): a rerun on the very same tensors would restart from its cuts
        fresh = [(tuple(t.clone() for t in args), {k: v.clone() for k, v in kwargs.items()}) for _ in range(2)]
        for which in ((0, 1) if len(two) % 2 == 0 else (1, 0)):  # (each first in turn: ABBA)
            begin = time.perf_counter()
            if which == 0:
                list(p.run(*fresh[0]))
                two.append(time.perf_counter() - begin)
            else:
                found = compare_models(p, None, b, *fresh[1])  # (the prepared pair, as the two-way run uses it)
                three.append(time.perf_counter() - begin)
    med = statistics.median
    print(f"model {a.model} {size or ''}, b = {a.transform}: {len(found.records)} records, b's values paired "
          f"{found.matching.coverage:.0%}, culprits {len(found.culprits)}")
    print(f"two-way {med(two) * 1e3:.0f} ms, three-way {med(three) * 1e3:.0f} ms: three-way / two-way = "
          f"{med(three) / med(two):.2f} (target <= 1.5)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
