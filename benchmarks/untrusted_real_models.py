"""Correct exports still load, and give the same records, under the untrusted-file checks (issue 45).

Every zoo family is exported (float32 and float16, torch.onnx's optimizer on and off, a dynamic batch
on every other one), saved as files (``.pt2``, ``.onnx``, inputs by ``torch.save``), and compared twice
from those files: the program loaded by ``torch.export.load`` itself (trusting the file), and by the
paths (every check of ``load/``: members, call specs, expressions, operators, plain files). A refusal is
a failure; so are records that differ (every field but times). (A dynamic program saved and loaded again
numbers its symbolic-size nodes anew, so records from the object in memory may name other nodes: the
comparison is between two loads of the same file.) One LLaMA exported with its DynamicCache goes through the same. It also prints what the
checks cost against ``torch.export.load`` alone (median over the models).

    timeout 3600 python benchmarks/untrusted_real_models.py
    timeout 900 python benchmarks/untrusted_real_models.py --models mlp gpt2 --dtypes float32
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import io
import os
import statistics
import tempfile
import time
import warnings


def _records(records) -> list:
    return sorted((tuple((k, v) for k, v in sorted(dataclasses.asdict(r).items()) if "time" not in k)
                   for r in records), key=repr)


def _llama_with_cache():
    import torch
    import transformers
    from transformers.cache_utils import DynamicCache
    from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, use_cache=True,
                                   attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).eval()
    register_cache_pytrees_for_model(model)
    cache = DynamicCache(config=cfg)
    for layer in range(2):
        cache.update(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), layer)
    ids = torch.randint(0, 100, (1, 2))
    kwargs = {"attention_mask": torch.ones(1, 5, dtype=torch.int64), "past_key_values": cache}
    ep = torch.export.export(model, (ids,), kwargs=kwargs, strict=False)
    prog = torch.onnx.export(ep, (ids,), kwargs=kwargs, dynamo=True)
    return ep, prog, (ids,), kwargs


def main() -> int:
    from sbs_widget.samples import zoo

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", default=list(zoo.BUILDERS) + ["llama_cache"])
    ap.add_argument("--dtypes", nargs="+", default=["float32", "float16"])
    a = ap.parse_args()
    warnings.simplefilter("ignore")
    import onnx
    import torch

    import sbs_widget
    from sbs_widget.engine import entry
    from sbs_widget.load.readers import load_exported_program

    failures, checked, overheads = 0, 0, []
    for dtype_name in a.dtypes:
        for i, name in enumerate(a.models):
            if name == "llama_cache" and dtype_name != "float32":
                continue
            optimize, dynamic = i % 2 == 1, i % 4 >= 2
            label = f"{name} ({dtype_name}, optimize={optimize}, dynamic={dynamic})"
            try:
                with contextlib.redirect_stderr(io.StringIO()), contextlib.redirect_stdout(io.StringIO()):
                    if name == "llama_cache":
                        ep, prog, args, kwargs = _llama_with_cache()
                    else:
                        ep, prog, args, kwargs = zoo.export(name, optimize=optimize, dynamic=dynamic,
                                                            dtype=getattr(torch, dtype_name))
            except Exception as e:  # an export torch cannot do is not ours to judge
                print(f"{label}: not exported ({type(e).__name__}: {str(e).splitlines()[0][:100]})", flush=True)
                continue
            folder = tempfile.mkdtemp(prefix="sbs_untrusted_")
            pt2, onx, inputs = (os.path.join(folder, f) for f in ("m.pt2", "m.onnx", "inputs.pt"))
            torch.export.save(ep, pt2)
            onnx.save_model(prog.model_proto, onx)
            torch.save((args, kwargs), inputs)
            checked += 1
            try:
                started = time.perf_counter()
                torch.export.load(pt2)
                plain = time.perf_counter() - started
                started = time.perf_counter()
                load_exported_program(pt2)
                overheads.append((time.perf_counter() - started) / plain)
                entry._PREPARED.clear()
                trusted = torch.export.load(pt2)
                from_objects = _records(sbs_widget.run_aligned(trusted, onx, inputs))
                entry._PREPARED.clear()
                from_files = _records(sbs_widget.run_aligned(pt2, onx, inputs))
            except sbs_widget.SbsError as e:
                failures += 1
                print(f"{label}: REFUSED: {e}", flush=True)
                continue
            same = from_objects == from_files
            failures += not same
            print(f"{label}: loads, {len(from_files)} records, same records as torch.export.load's: {same}",
                  flush=True)
    print(f"\n{checked} exports checked, {failures} refused or different; our load / torch.export.load alone: "
          f"median {statistics.median(overheads or [float('nan')]):.2f}x")
    return 1 if failures or not checked else 0


if __name__ == "__main__":
    raise SystemExit(main())
