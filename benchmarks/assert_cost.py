"""What ``sbs_widget.testing.assert_aligned`` costs over ``run_aligned`` (issue 49: under 10% more).

Both are called the way a test suite calls them, on the same pair (the preparation cached by the
first call, not timed), alternately, ``--repeat`` times each; medians, side by side:

- ``run_aligned``: ``list(sbs_widget.run_aligned(ep, onx, args, kwargs))``;
- ``assert_aligned``: ``assert_aligned(ep, onx, args, kwargs=kwargs)``: the same run, the verdict, and on a
  failure the culprits (``find_culprits`` + the finer look inside translations) and the message.

Cases: a correct export (passes), the same with a fault planted (an Add made a Sub: fails with a
culprit), and loud_convnet (rounding only beyond tolerance: fails, no culprit).

    python benchmarks/assert_cost.py
    python benchmarks/assert_cost.py --models llama gpt2 --repeat 9

Results: benchmarks/results/assert_cost.txt.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import statistics
import time
import warnings

import torch

MODELS = {  # name: (zoo builder, its options)
    "dummy_llm": ("dummy_llm", {}),
    "llama": ("llama", {}),
    "llama_mid": ("llama", dict(layers=8, hidden=256, seq=128, batch=2)),
    "gpt2": ("gpt2", {}),
    "loud_convnet": ("loud_convnet", {}),
}


def _pairs(name: str):
    """[(case, ep, onx, args, kwargs)] for model ``name``."""
    from sbs_widget.samples import faults, zoo

    builder, options = MODELS[name]
    with contextlib.redirect_stderr(io.StringIO()):
        ep, prog, args, kwargs = zoo.export(builder, optimize=True, **options)
    model = prog.model_proto
    out = [(f"{name} clean", ep, model, args, kwargs)]
    if name != "loud_convnet":  # a weight off by 10%: a mismatch and a culprit
        import numpy as np
        from onnx import numpy_helper

        weights = [t for t in model.graph.initializer if t.data_type == 1 and len(t.dims) == 2]
        biggest = max(weights, key=lambda t: int(np.prod(t.dims)))
        bad = faults.perturb_initializer(model, biggest.name, scale=0.1)
        assert numpy_helper.to_array(biggest).size > 1
        out.append((f"{name} weight fault", ep, bad, args, kwargs))
    return out


def _fresh(args, kwargs):
    """Copies of the inputs: a run on the very tensors of the run before would restart from its cuts
    (engine/restart.py) and reuse its records; a test suite's call runs whole."""
    def copy(x):
        return x.clone() if isinstance(x, torch.Tensor) else x

    return tuple(copy(a) for a in args), {k: copy(v) for k, v in (kwargs or {}).items()}


def _one(fn, args, kwargs) -> float:
    args, kwargs = _fresh(args, kwargs)
    start = time.perf_counter()
    try:
        fn(args, kwargs)
    except AssertionError:
        pass
    return time.perf_counter() - start


def measure(ep, onx, args, kwargs, repeat: int) -> tuple[float, float, str]:
    import sbs_widget
    from sbs_widget.testing import assert_aligned

    def run(a, kw):
        list(sbs_widget.run_aligned(ep, onx, a, kw))

    def check(a, kw):
        assert_aligned(ep, onx, a, kwargs=kw)

    outcome = "pass"
    try:  # warm: preparation (cached), sessions, plans
        run(*_fresh(args, kwargs))
        check(*_fresh(args, kwargs))
    except AssertionError as e:
        outcome = "fail: " + str(e).splitlines()[0][:40]
    base, asserted = [], []
    once = _one(run, args, kwargs)
    repeat = max(repeat, min(101, int(2.0 / max(once, 1e-3))))  # 2 s a side at least: short runs are noisy
    for k in range(repeat):  # alternate, so that drifts of the machine touch both alike
        if k % 2:
            asserted.append(_one(check, args, kwargs))
            base.append(_one(run, args, kwargs))
        else:
            base.append(_one(run, args, kwargs))
            asserted.append(_one(check, args, kwargs))
    return statistics.median(base), statistics.median(asserted), f"{outcome} ({repeat} runs)"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--models", nargs="+", default=["dummy_llm", "llama_mid", "loud_convnet"], choices=MODELS)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--threads", type=int, default=2)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    print(f"torch {torch.__version__}, {args.threads} threads, medians of {args.repeat} runs each at least "
          "(more for short runs: 2 s a side)")
    print(f"{'case':<24} {'run_aligned (s)':>16} {'assert_aligned (s)':>19} {'ratio':>7}  outcome")
    worst = 0.0
    for name in args.models:
        for case, ep, onx, a, kw in _pairs(name):
            base, asserted, outcome = measure(ep, onx, a, kw, args.repeat)
            ratio = asserted / base
            worst = max(worst, ratio)
            print(f"{case:<24} {base:>16.4f} {asserted:>19.4f} {ratio:>7.3f}  {outcome}")
    print(f"worst ratio {worst:.3f} (target < 1.10)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
