"""Cost of decode steps (issue 50), side by side in one process, medians over --repeat:

- decode / floor: ``steps.decode`` (closed and open loop, figures, judging) for --steps tokens, against
  the floor for generation: the torch program (eager, its graph module) plus ONE plain onnxruntime
  session (default options) running the same steps, each side fed its own outputs. Target <= 1.3.
- open step / lockstep: one step of the open loop run apart (torch and the whole ONNX model on torch's
  inputs, judged) against one lockstep run (``prepared.run``) at that length. Target <= 1.2.
- memory: resident memory after each step (MiB above the first step), and the cache's own size: the
  growth must be the cache's, nothing kept from the steps before.

    python benchmarks/decode_cost.py                        # the tiny LLaMA (16 layers, hidden 64, as
                                                            # speed_memory.py's) with its cache, 32 steps
    python benchmarks/decode_cost.py --no-cache             # exported without a cache (zoo, dynamic)
    python benchmarks/decode_cost.py --family qwen2 --steps 16
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings


def _rss_mib() -> float:
    import os

    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def _model(args):
    if args.no_cache:
        from sbs_widget.samples import zoo

        ep, prog, a, kw = zoo.export("llama", optimize=True, dynamic=True, layers=args.layers, hidden=args.hidden)
        return ep, prog.model_proto, a, kw
    from sbs_widget.samples.decoders import export_with_cache

    ep, prog, kw = export_with_cache(args.family, layers=args.layers, hidden=args.hidden)
    return ep, prog.model_proto, (), kw


def _floor(p, gen_inputs, sides, weights, steps: int, session) -> float:
    """Torch and one plain onnxruntime session, each fed its own outputs, ``steps`` + 1 forward calls
    (torch on the thread count ``steps.decode`` gives it: one for small ops, its fastest here)."""
    import numpy as np

    from sbs_widget.steps.mapping import next_inputs

    mapping = gen_inputs["mapping"]
    begin = time.perf_counter()
    flat = dict(gen_inputs["first"])
    for _ in range(steps + 1):
        out = sides.torch(weights, flat)  # (the graph module itself, on decode's thread count)
        flat = next_inputs(mapping, flat, out, out[mapping.logits][:, -1].argmax(-1))
    torch_s = time.perf_counter() - begin
    names = dict(p.alignment.input_pairs)
    outputs = [o.name for o in session.get_outputs()]
    begin = time.perf_counter()
    flat = dict(gen_inputs["first"])
    import torch

    for _ in range(steps + 1):
        feeds = {names[k]: np.ascontiguousarray(v.numpy()) for k, v in flat.items() if k in names}
        out = [torch.from_numpy(o) for o in session.run(outputs, feeds)]
        flat = next_inputs(mapping, flat, out, out[mapping.logits][:, -1].argmax(-1))
    return torch_s + time.perf_counter() - begin


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--family", default="llama")
    ap.add_argument("--no-cache", action="store_true")
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--hidden", type=int, default=64)
    ap.add_argument("--steps", type=int, default=32)
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    import onnxruntime
    import torch

    from sbs_widget.engine.entry import prepare
    from sbs_widget.engine.fx_runner import flat_inputs
    from sbs_widget.engine.runtimes import get_runtime
    from sbs_widget.steps.decode import _loop_step, _Sides, decode

    ep, model, args, kwargs = _model(a)
    p = prepare(ep, model)
    gen = decode(p, args, kwargs, steps=a.steps)  # (sessions compiled: the runs below are reruns)
    sides = _Sides(p, get_runtime())
    placeholders = flat_inputs(p.decomposed_ep, args, kwargs)
    n_user = len(sides.user_inputs)
    weights = placeholders[:len(placeholders) - n_user]
    first = {"first": dict(zip(sides.user_inputs, placeholders[len(placeholders) - n_user:])), "mapping": gen.mapping}
    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    ours, floor, rss = [], [], []
    for _ in range(a.repeat):
        floor.append(_floor(p, first, sides, weights, a.steps, session))
        marks = []
        begin = time.perf_counter()
        decode(p, args, kwargs, steps=a.steps, progress=lambda done, total: marks.append(_rss_mib()))
        ours.append(time.perf_counter() - begin)
        rss.append(marks)
    k = a.steps // 2
    step_args, step_kwargs = gen.kwargs_at(k)
    apart, lockstep = [], []
    for _ in range(a.repeat):
        begin = time.perf_counter()
        out_t = sides.torch(weights, gen.inputs[k])
        out_o = sides.onnx(gen.inputs[k])
        _loop_step(out_o[gen.mapping.logits], out_t[gen.mapping.logits], gen.tolerance, p, weights, gen.inputs[k],
                   sides, gen.mapping)
        apart.append(time.perf_counter() - begin)
        begin = time.perf_counter()
        list(p.run(step_args, step_kwargs))
        lockstep.append(time.perf_counter() - begin)
    cache_mib = sum(t.numel() * t.element_size() for name, t in gen.inputs[-1].items()
                    if any(name == n for _, n in gen.mapping.cache)) / 2**20
    held = {}  # every tensor the decoding keeps for the steps' inputs, counted once per storage
    for step in range(len(gen.inputs)):
        for t in gen.inputs[step].values():
            if isinstance(t, torch.Tensor):
                held[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
    held_mib = sum(held.values()) / 2**20
    med = statistics.median
    print(f"model: {'no cache' if a.no_cache else a.family + ' with its cache'}, {a.layers} layers, hidden "
          f"{a.hidden}, {a.steps} steps; first divergence {gen.first_divergence}")
    print(f"decode {med(ours):.3f} s, floor {med(floor):.3f} s: decode / floor = {med(ours) / med(floor):.2f} "
          f"(target <= 1.3)")
    print(f"open step apart {med(apart) * 1e3:.1f} ms, lockstep at step {k} {med(lockstep) * 1e3:.1f} ms: "
          f"open step / lockstep = {med(apart) / med(lockstep):.2f} (target <= 1.2)")
    last = rss[-1]
    print(f"resident memory above step 0 at steps 1, {a.steps // 2}, {a.steps}: "
          f"{last[1] - last[0]:.1f}, {last[a.steps // 2] - last[0]:.1f}, {last[-1] - last[0]:.1f} MiB; "
          f"the cache at the last step: {cache_mib:.2f} MiB")
    print(f"the inputs of all {len(gen.inputs)} steps, kept for the lockstep on demand: {held_mib:.2f} MiB "
          f"(a past step's cache is a view of the newest)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
