"""Speed and memory of sbs_widget against the floor and against onnx-diagnostic, side by side.

The floor for a model: eager ``ep.module()(*args)`` + creating ONE onnxruntime session whose outputs
are every intermediate value + one run of it (the least any side-by-side comparison must do).

Printed per model (medians over --repeat runs, each measurement in a fresh subprocess):
- ours / floor             (target <= 2.0): prepare + first run (sessions compiled), decomposed EP given;
- ours node_local / floor  (target <= 3.0);
- rerun / floor            a rerun on the prepared pair (reset experiments pay only this);
- ours / ours_outer        the cost of comparing the values inside translations (issue 32, target <= 1.3):
                           the same run with them left uncompared (SBS_WIDGET_INNER=0), side by side;
- onnx-diagnostic / ours   (target >= 20 on the tiny model): its run_aligned on the same decomposed EP;
- decomposition (s)        the one-time cost when the user hands over the user EP (cached afterwards);
- memory ratio             peak RSS above the loaded state / (weights + largest live set of the
                           eager run), target <= 2.0 (rerun_mem_ratio: a rerun's peak above the
                           prepared state, sessions built, over the same denominator); printed for
                           the floor too (floor_mem_ratio), and for one plain onnxruntime session
                           running the unmodified model once
                           (onnxruntime_mem_ratio: onnxruntime's fixed cost, for scale). The
                           peak is the kernel's high-water mark (reset at the start): a thread sampling
                           RSS every millisecond (before) slowed onnx-diagnostic by ~50% and us by less,
                           through GIL hand-offs, and could miss short peaks.

    pip install -e ".[bench]"
    python benchmarks/speed_memory.py                 # tiny 16-layer LLaMA (hidden 64) and mid one
    python benchmarks/speed_memory.py --models tiny --repeat 3 --no-reference
    python benchmarks/speed_memory.py --models large --repeat 1 --no-reference   # ~250 MB of weights
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings

MODELS = {
    "tiny": dict(layers=16, hidden=64, seq=16, batch=2),
    "mid": dict(layers=8, hidden=256, seq=128, batch=2),
    # not run by default: how the ratios hold on a model 100x the tiny one (~250 MB of weights)
    "large": dict(layers=6, hidden=1024, seq=256, batch=2),
}


# -- measurement helpers (run inside the subprocess) ------------------------------------------------

def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _hwm() -> int:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    raise OSError("no VmHWM")


def _reset_hwm() -> bool:
    """Reset the kernel's peak-RSS mark (Linux >= 4.0): the exact peak, read at the end, with no
    sampling thread to slow the process being measured."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False


class PeakRss:
    """Peak resident set size while active: the kernel's own mark where it can be reset, otherwise
    sampled every millisecond by a thread."""

    def __enter__(self):
        self.base = _rss()
        self.peak = self.base
        self._exact = _reset_hwm()
        if not self._exact:
            self._stop = threading.Event()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def _sample(self):
        while not self._stop.is_set():
            self.peak = max(self.peak, _rss())
            time.sleep(0.001)

    def __exit__(self, *exc):
        if self._exact:
            self.peak = max(self.peak, _hwm())
        else:
            self._stop.set()
            self._thread.join()
        self.peak = max(self.peak, _rss())

    @property
    def above(self) -> int:
        return self.peak - self.base


def _export(name: str, cache: str):
    """(user EP, decomposed EP, ONNX model, args, kwargs): exported once per benchmark run into
    ``cache`` (exporting costs ~50 s), loaded by every measuring subprocess."""
    import onnx
    import torch

    paths = {k: os.path.join(cache, f"{name}.{k}") for k in ("user.pt2", "decomposed.pt2", "onnx", "inputs.pt")}
    if not all(os.path.exists(p) for p in paths.values()):
        from sbs_widget.samples import zoo

        with contextlib.redirect_stderr(io.StringIO()):
            ep, prog, args, kwargs = zoo.export("llama", optimize=True, **MODELS[name])
        torch.export.save(ep, paths["user.pt2"])
        torch.export.save(prog.exported_program, paths["decomposed.pt2"])
        onnx.save(prog.model_proto, paths["onnx"])
        torch.save((args, kwargs), paths["inputs.pt"])
    import transformers.modeling_outputs  # noqa: F401  (registers the output classes with pytree)

    args, kwargs = torch.load(paths["inputs.pt"], weights_only=True)
    return (torch.export.load(paths["user.pt2"]), torch.export.load(paths["decomposed.pt2"]),
            onnx.load(paths["onnx"]), args, kwargs)


def _live_set_bytes(program) -> tuple[int, int]:
    """(weights bytes, largest bytes of intermediates alive at once in an eager run)."""
    import torch

    nodes = list(program.graph.nodes)
    last = {}
    for i, n in enumerate(nodes):
        for inp in n.all_input_nodes:
            last[inp.name] = i

    def size(n):
        v = n.meta.get("val")
        vals = v if isinstance(v, (tuple, list)) else [v]
        return sum(x.numel() * x.element_size() for x in vals if isinstance(x, torch.Tensor))

    weights = sum(t.numel() * t.element_size() for t in program.state_dict.values())
    weights += sum(t.numel() * t.element_size() for t in program.constants.values() if isinstance(t, torch.Tensor))
    alive, live, peak = {}, 0, 0
    for i, n in enumerate(nodes):
        if n.op == "call_function" or (n.op == "placeholder" and n.name in program.graph_signature.user_inputs):
            alive[n.name] = size(n)
            live += alive[n.name]
            peak = max(peak, live)
        for inp in n.all_input_nodes:
            if last.get(inp.name) == i and inp.name in alive:
                live -= alive.pop(inp.name)
    return weights, peak


def _floor(ep, model, args, kwargs) -> float:
    import onnx
    import onnxruntime as ort
    import torch

    begin = time.perf_counter()
    with torch.no_grad():
        ep.module()(*args, **kwargs)
    eager = time.perf_counter() - begin
    m = onnx.ModelProto()
    m.CopyFrom(model)
    known = {o.name for o in m.graph.output}
    for node in m.graph.node:
        for o in node.output:
            if o and o not in known:
                vi = m.graph.output.add()
                vi.name = o
                known.add(o)
    begin = time.perf_counter()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(m.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    from sbs_widget.engine.fx_runner import flat_inputs

    flat = flat_inputs(ep, args, kwargs)[-len(ep.graph_signature.user_inputs):]
    feeds = {i.name: t.numpy() for i, t in zip(sess.get_inputs(), flat)}
    sess.run(None, feeds)
    return eager + time.perf_counter() - begin


def _plain_session_run(ep, data: bytes, args, kwargs) -> float:
    """One onnxruntime session on the model as exported (no extra outputs, given serialized) and one
    run of it."""
    import onnxruntime as ort
    import torch

    from sbs_widget.engine.fx_runner import flat_inputs

    begin = time.perf_counter()
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
    sess = ort.InferenceSession(data, opts, providers=["CPUExecutionProvider"])
    flat = flat_inputs(ep, args, kwargs)[-len(ep.graph_signature.user_inputs):]
    user = [t for t in flat if isinstance(t, torch.Tensor)]
    sess.run(None, {i.name: t.numpy() for i, t in zip(sess.get_inputs(), user)})
    return time.perf_counter() - begin


def _with_memory_format(op, fmt, kwargs):
    def call(*args):
        return op(*args, memory_format=fmt, **kwargs)

    return call


def _warm_up(program, model, args, kwargs) -> None:
    """The loaded state every mode starts from: both models loaded and run once, as a user has done
    before comparing them (they saw the outputs differ). The program's first run alone costs ~8 MB on
    the tiny model (MKL/oneDNN buffers the process keeps), more than its weights; onnxruntime's first
    run of a model faults in its kernels' code. The warm-up session is dropped and freed memory handed
    back to the system (``malloc_trim``) before the baseline is read, so a mode cannot reuse it.
    (Timings do not depend on it: onnx-diagnostic took 1.50 s with onnxruntime cold, 1.52 s warm.)"""
    import ctypes
    import gc

    import torch

    from sbs_widget.engine.fx_runner import flat_inputs

    with torch.no_grad():
        program.graph_module(*flat_inputs(program, args, kwargs))
    _plain_session_run(program, model.SerializeToString(), args, kwargs)  # the session is dropped on return
    gc.collect()
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):  # not glibc
        pass


def measure(mode: str, name: str, cache: str) -> dict:
    warnings.simplefilter("ignore")
    import torch

    ep, decomposed, model, args, kwargs = _export(name, cache)
    _warm_up(decomposed, model, args, kwargs)
    out: dict = {"mode": mode, "model": name}
    if mode == "export":
        out["seconds"] = 0.0
    elif mode == "floor":
        with PeakRss() as mem:
            out["seconds"] = _floor(decomposed, model, args, kwargs)
        out["rss_above"] = mem.above
        out["weights"], out["live"] = _live_set_bytes(decomposed)
    elif mode == "onnxruntime":  # what running the model once in onnxruntime costs, for scale
        data = model.SerializeToString()  # outside the window: the least such a session costs
        with PeakRss() as mem:
            out["seconds"] = _plain_session_run(decomposed, data, args, kwargs)
        out["rss_above"] = mem.above
    elif mode in ("ours", "ours_local", "ours_outer"):
        from sbs_widget.engine import metrics
        from sbs_widget.engine.entry import prepare

        with PeakRss() as mem:
            begin = time.perf_counter()
            p = prepare(decomposed, model)
            n = sum(1 for _ in p.run(args, kwargs, node_local=mode == "ours_local"))
            out["seconds"] = time.perf_counter() - begin
        out["records"] = n
        out["rss_above"] = mem.above
        out["compiled"] = metrics._compare is not None
        with PeakRss() as mem:  # above the prepared state: what each reset experiment adds
            begin = time.perf_counter()
            sum(1 for _ in p.run(args, kwargs, node_local=mode == "ours_local"))
            out["rerun"] = time.perf_counter() - begin
        out["rerun_rss_above"] = mem.above
    elif mode == "decompose":
        from sbs_widget.load.readers import decompose_as_exporter

        begin = time.perf_counter()
        decompose_as_exporter(ep)
        out["seconds"] = time.perf_counter() - begin
    elif mode == "reference":
        from onnx_diagnostic.reference import OnnxruntimeEvaluator
        from onnx_diagnostic.torch_onnx.sbs import run_aligned

        # onnx-diagnostic 0.9.3 cannot read torch.memory_format kwargs (clone(memory_format=...)) in
        # transformers' decomposed graphs: move the kwarg into the callable, same computation.
        for node in decomposed.graph.nodes:
            fmt = node.kwargs.get("memory_format") if node.op == "call_function" else None
            if fmt is not None:
                op, rest = node.target, {k: v for k, v in node.kwargs.items() if k != "memory_format"}
                node.target = _with_memory_format(op, fmt, rest)
                node.kwargs = {}
        with PeakRss() as mem, contextlib.redirect_stdout(io.StringIO()):
            begin = time.perf_counter()
            n = sum(1 for _ in run_aligned(decomposed, model, OnnxruntimeEvaluator, args, kwargs,
                                           use_tensor=False, exc=False))
            out["seconds"] = time.perf_counter() - begin
        out["records"] = n
        out["rss_above"] = mem.above
    else:
        raise ValueError(mode)
    del torch
    return out


# -- driver ---------------------------------------------------------------------------------------

def _spawn(mode: str, name: str, cache: str) -> dict:
    cmd = [sys.executable, __file__, "--one", mode, "--models", name, "--cache", cache]
    # ours_outer: the same run with the values inside translations left uncompared (what each costs)
    env = {**os.environ, "SBS_WIDGET_INNER": "0"} if mode == "ours_outer" else None
    res = subprocess.run(cmd, capture_output=True, text=True, cwd=os.path.dirname(os.path.dirname(__file__)),
                         env=env)
    line = [ln for ln in res.stdout.splitlines() if ln.startswith("{")]
    if res.returncode != 0 or not line:
        raise RuntimeError(f"{mode} on {name} failed:\n{res.stderr[-3000:]}")
    return json.loads(line[-1])


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="tiny,mid")
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--no-reference", action="store_true", help="skip onnx-diagnostic")
    parser.add_argument("--one", help=argparse.SUPPRESS)
    parser.add_argument("--cache", help="folder for the exported models (default: a fresh temporary one)")
    args = parser.parse_args(argv)
    if args.one:
        print(json.dumps(measure(args.one, args.models, args.cache)))
        return 0
    cache = args.cache or tempfile.mkdtemp(prefix="sbs_bench_")
    modes = ["floor", "onnxruntime", "ours", "ours_outer", "ours_local", "decompose"]
    if not args.no_reference:
        try:
            import onnx_diagnostic  # noqa: F401
            modes.append("reference")
        except ImportError:
            print("onnx-diagnostic is not installed (pip install -e '.[bench]'): skipped", file=sys.stderr)
    rows = []
    for name in args.models.split(","):
        _spawn("export", name, cache)
        runs: dict[str, list[dict]] = {m: [] for m in modes}
        for r in range(args.repeat):
            for mode in modes:  # interleaved: each repeat measures every mode under the same load
                if mode == "reference" and r > 0 and name != "tiny":
                    continue  # slow; one run is enough on the bigger model
                runs[mode].append(_spawn(mode, name, cache))
                print(f"  {name} {mode} #{r}: {runs[mode][-1]['seconds']:.3f}s", file=sys.stderr, flush=True)
        med = {m: statistics.median(x["seconds"] for x in v) for m, v in runs.items() if v}
        floor = runs["floor"][0]
        denominator = floor["weights"] + floor["live"]
        row = {
            "model": name, **MODELS[name],
            "floor_s": round(med["floor"], 3), "ours_s": round(med["ours"], 3),
            "ours/floor": round(med["ours"] / med["floor"], 2),
            "ours_local/floor": round(med["ours_local"] / med["floor"], 2),
            "rerun/floor": round(statistics.median(x["rerun"] for x in runs["ours"]) / med["floor"], 2),
            # the values inside translations compared (issue 32) against the same run without them
            "ours/ours_outer": round(med["ours"] / med["ours_outer"], 2),
            "rerun/rerun_outer": round(statistics.median(x["rerun"] for x in runs["ours"])
                                       / statistics.median(x["rerun"] for x in runs["ours_outer"]), 2),
            "decompose_s": round(med["decompose"], 2),
            "mem_ratio": round(statistics.median(x["rss_above"] for x in runs["ours"]) / denominator, 2),
            # a rerun's peak above the prepared state (sessions built): what a reset experiment adds
            "rerun_mem_ratio": round(statistics.median(x["rerun_rss_above"] for x in runs["ours"]) / denominator, 2),
            "mem_ratio_local": round(statistics.median(x["rss_above"] for x in runs["ours_local"]) / denominator, 2),
            # the same ratio for the floor itself (one session exposing every intermediate)
            "floor_mem_ratio": round(statistics.median(x["rss_above"] for x in runs["floor"]) / denominator, 2),
            # and for one plain onnxruntime session running the model as exported: below the target
            # only where the model's weights and values outweigh onnxruntime's own fixed cost
            "onnxruntime_mem_ratio": round(statistics.median(x["rss_above"] for x in runs["onnxruntime"])
                                           / denominator, 2),
            "weights_MB": round(floor["weights"] / 2**20, 1), "live_MB": round(floor["live"] / 2**20, 1),
            # the compiled comparison (sbs_widget/engine/_compare.c) in use, or numpy's path (no C compiler)
            "compiled_compare": all(x["compiled"] for x in runs["ours"]),
        }
        if "reference" in med:
            row["onnx_diagnostic_s"] = round(med["reference"], 2)
            row["onnx_diagnostic/ours"] = round(med["reference"] / med["ours"], 1)
            row["onnx_diagnostic_mem_ratio"] = round(runs["reference"][0]["rss_above"] / denominator, 2)
        rows.append(row)
    print()
    for row in rows:
        print(" | ".join(f"{k}={v}" for k, v in row.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
