"""The CUDA path, checked on a machine with a GPU: inputs on CUDA (the FX side then runs there) and
onnxruntime's CUDA provider when the installed build has it (its CPU provider otherwise).

For each model (built from a small config, ``zoo.trained_like``) and export mode, the same prepared
pair is run with CPU inputs and with CUDA inputs (``node_local=True``) and the two runs' records are
set side by side:

- beyond / errors: records beyond tolerance / with status error (0 / 0 on a correct export);
- coverage: share of the user program's nodes compared (must equal the CPU run's);
- worst: the largest |diff|; differs from the CPU run's only by the kernels' rounding;
- status_diff: records whose status differs between the CPU and the CUDA run;
- gpu_MB: torch's peak CUDA memory during the CUDA run (the FX side did run on the GPU);
- reset: a run with one value reset (``reset_names``) marks that record ``reset``.

Then the same with TF32 allowed in torch's matmuls and convolutions (what many training scripts
set): the tool should report those differences, not hide them.

    python benchmarks/cuda_check.py [--models dummy_llm,mlp,convnet,llama,gpt2,bert]

Without a GPU it runs the CPU side only (a dry run of the script).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import sys
import time
import warnings

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # speed_memory's model sizes


def _to(device, value):
    """``value`` (nested args / kwargs) with every tensor on ``device``."""
    import torch
    from torch.utils._pytree import tree_map_only

    return tree_map_only(torch.Tensor, lambda t: t.to(device), value)


def _run(prepared, args, kwargs, **options):
    import torch

    from sbs_widget.engine.summary import summarize

    if torch.cuda.is_available():
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    begin = time.perf_counter()
    records = list(prepared.run(args, kwargs, **options))
    seconds = time.perf_counter() - begin
    s = summarize(records, prepared)
    row = dict(records=len(records), beyond=s.by_status.get("mismatch", 0), errors=s.by_status.get("error", 0),
               coverage=round(100 * (s.coverage or 0), 1), worst=f"{s.worst.err_abs:.1e}" if s.worst else "-",
               seconds=round(seconds, 3))
    return records, row


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="dummy_llm,mlp,convnet,llama,gpt2,bert")
    parser.add_argument("--speed", default="mid", help="LLaMA sizes timed with CPU vs CUDA inputs "
                        "(speed_memory.py's tiny, mid, large; '' for none)")
    args = parser.parse_args(argv)
    warnings.simplefilter("ignore")
    import onnxruntime
    import pandas as pd
    import torch

    from sbs_widget.engine.entry import prepare
    from sbs_widget.engine.runtimes import get_runtime
    from sbs_widget.samples import zoo

    cuda = torch.cuda.is_available()
    print(f"torch {torch.__version__}, onnxruntime {onnxruntime.__version__}, "
          f"GPU: {torch.cuda.get_device_name() if cuda else 'none'}; onnxruntime providers: "
          f"{onnxruntime.get_available_providers()}; sbs_widget with CUDA inputs uses "
          f"{get_runtime('onnxruntime', cuda=True).providers}", flush=True)
    rows = []
    for tf32 in (False, True):
        if tf32 and not cuda:
            break
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = tf32
        for name in args.models.split(","):
            for optimize in (False, True):
                with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                    ep, prog, a, kw = zoo.export(name, optimize=optimize)
                prepared = prepare(ep, prog.model_proto)
                cpu_records, cpu = _run(prepared, a, kw, node_local=True)
                row = dict(model=name, optimize=optimize, tf32=tf32, **{f"cpu_{k}": v for k, v in cpu.items()})
                if cuda:
                    gpu_records, gpu = _run(prepared, _to("cuda", a), _to("cuda", kw), node_local=True)
                    row.update({f"cuda_{k}": v for k, v in gpu.items()})
                    row["gpu_MB"] = round(torch.cuda.max_memory_allocated() / 2**20, 1)
                    row["status_diff"] = sum(x.status != y.status for x, y in zip(cpu_records, gpu_records)) + \
                        abs(len(cpu_records) - len(gpu_records))
                    first = next((r for r in gpu_records if r.status == "mismatch"), None)
                    if first is not None:
                        row["first_beyond"] = f"{first.ep_name} ({first.ep_target}) {first.err_abs:.1e}"
                    failed = next((r for r in gpu_records if r.status == "error"), None)
                    if failed is not None:
                        row["first_error"] = f"{failed.ep_name}/{failed.onnx_name}: {(failed.comment or '')[:160]}"
                    if not tf32:  # a reset experiment on CUDA inputs: the middle compared node
                        nodes = [r for r in gpu_records if r.kind == "node" and r.status == "ok" and r.onnx_node_name]
                        target = nodes[len(nodes) // 2].ep_name
                        reset_records, _ = _run(prepared, _to("cuda", a), _to("cuda", kw), reset_names=[target])
                        row["reset"] = "ok" if any(r.ep_name == target and r.status == "reset"
                                                   for r in reset_records) else "NOT MARKED"
                rows.append(row)
                print(pd.DataFrame(rows[-1:]).to_string(index=False), file=sys.stderr, flush=True)
    print()
    print(pd.DataFrame(rows).to_string(index=False))
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
    timings = []
    for size in filter(None, args.speed.split(",")):
        from speed_memory import MODELS

        with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
            ep, prog, a, kw = zoo.export("llama", optimize=True, **MODELS[size])
        decomposed = prog.exported_program  # (the decomposition is timed by speed_memory.py)
        for device in ("cpu", "cuda") if cuda else ("cpu",):
            da, dkw = _to(device, a), _to(device, kw)
            begin = time.perf_counter()
            prepared = prepare(decomposed, prog.model_proto)
            first_records, first = _run(prepared, da, dkw)
            first_s = time.perf_counter() - begin
            _, again = _run(prepared, da, dkw)
            timings.append(dict(model=size, inputs=device, prepare_and_first_run_s=round(first_s, 3),
                                rerun_s=again["seconds"], records=first["records"], beyond=first["beyond"],
                                errors=first["errors"], worst=first["worst"]))
            print(pd.DataFrame(timings[-1:]).to_string(index=False), file=sys.stderr, flush=True)
    if timings:
        print()
        print(pd.DataFrame(timings).to_string(index=False))
    return 0


if __name__ == "__main__":
    sys.exit(main())
