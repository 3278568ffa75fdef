"""End-to-end peak memory of a comparison on big models, as a ratio to the weights (issue 37).

Builds LLaMA-like models from a transformers config with random init (seeded), exports them
(``torch.export`` + ``torch.onnx.export(dynamo=True)``) and saves ``user.pt2``, ``model.onnx`` and
``inputs.pt`` under /tmp/sbs_big/<model>/; then measures, each in a fresh process whose peak RSS is
the kernel's high-water mark (``ru_maxrss`` of the child):

- ``cli``: ``python -m sbs_widget compare --ep user.pt2 --onnx model.onnx --inputs inputs.pt -o diff.csv``
- ``run_aligned``: ``list(sbs_widget.run_aligned(pt2_path, onnx_path, inputs_path))`` from paths

in each mode of ``--modes`` (``MODES``: ``before``, the ONNX file read by ``onnx.load`` and the weights
held in memory; ``held``, the lean ONNX reader and the weights held; ``after``, today's default: the lean
reader and a big ``.pt2``'s weights mapped and read as needed), and checks that every mode gives the
same records (status and figures).

    python benchmarks/big_memory.py build --models llama_1g llama_1g2_f16     # ~2 min each
    python benchmarks/big_memory.py build --models llama_3g llama_3g5_f16     # ~10 min each
    python benchmarks/big_memory.py measure --models llama_1g llama_1g2_f16 llama_3g llama_3g5_f16
    python benchmarks/big_memory.py measure --models llama_1g --what cli --limit 1.3   # in a memory cgroup

``--limit X`` runs each child in a memory cgroup limited to X times the weights, page cache included
(root; a child the kernel kills for want of memory reports rc -9).

Every child runs under ``timeout``; the models stay in /tmp (``--folder``).
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import resource
import subprocess
import sys
import time

MODELS = {
    # ~1.2 GB of float32 weights, one file
    "llama_1g": dict(layers=8, hidden=2048, heads=16, intermediate=3072, vocab=4096, dtype="float32",
                     external=False),
    "llama_1g_f16": dict(layers=8, hidden=2048, heads=16, intermediate=3072, vocab=4096, dtype="float16",
                         external=False),
    # ~3.5 GB of float32 weights, external data
    "llama_3g": dict(layers=24, hidden=2048, heads=16, intermediate=3072, vocab=4096, dtype="float32",
                     external=True),
    "llama_3g_f16": dict(layers=24, hidden=2048, heads=16, intermediate=3072, vocab=4096, dtype="float16",
                         external=True),
    # the sizes in float16: ~1.2 GB of float16 weights in one file (twice llama_1g's layers),
    # ~3.5 GB with external data; initialized in float16 (a float32 model first would need 2x the memory)
    "llama_1g2_f16": dict(layers=16, hidden=2048, heads=16, intermediate=3072, vocab=4096, dtype="float16",
                          external=False, init_in_dtype=True),
    "llama_3g5_f16": dict(layers=48, hidden=2048, heads=16, intermediate=3072, vocab=4096, dtype="float16",
                          external=True, init_in_dtype=True),
    # a few MB: checks the script itself
    "llama_tiny": dict(layers=2, hidden=256, heads=4, intermediate=512, vocab=1024, dtype="float32",
                       external=True),
}
SEQ = 8
FOLDER = "/tmp/sbs_big"


def build(name: str, folder: str) -> None:
    import torch
    import transformers

    spec = MODELS[name]
    out = os.path.join(folder, name)
    os.makedirs(out, exist_ok=True)
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        num_hidden_layers=spec["layers"], hidden_size=spec["hidden"], num_attention_heads=spec["heads"],
        num_key_value_heads=spec["heads"], intermediate_size=spec["intermediate"], vocab_size=spec["vocab"],
        max_position_embeddings=256, tie_word_embeddings=False)
    dtype = getattr(torch, spec["dtype"])
    default = torch.get_default_dtype()
    if spec.get("init_in_dtype"):
        torch.set_default_dtype(dtype)
    try:
        with torch.device("cpu"):
            model = transformers.LlamaForCausalLM(config).to(dtype).eval()
    finally:
        torch.set_default_dtype(default)
    model.config.use_cache = False
    ids = torch.randint(0, spec["vocab"], (1, SEQ), generator=torch.Generator().manual_seed(1))

    class Logits(torch.nn.Module):
        def __init__(self, m):
            super().__init__()
            self.m = m

        def forward(self, input_ids):
            return self.m(input_ids=input_ids, use_cache=False).logits

    wrapped = Logits(model)
    with torch.no_grad():
        ep = torch.export.export(wrapped, (ids,))
        torch.export.save(ep, os.path.join(out, "user.pt2"))
        torch.save((ids,), os.path.join(out, "inputs.pt"))
        prog = torch.onnx.export(ep, (ids,), dynamo=True)
    prog.save(os.path.join(out, "model.onnx"), external_data=spec["external"])
    weights = sum(t.numel() * t.element_size() for t in ep.state_dict.values())
    with open(os.path.join(out, "meta.json"), "w") as f:
        json.dump({"weights": weights, **spec}, f)
    print(f"{name}: {weights / 1e9:.2f} GB of weights in {out}", flush=True)


# How each mode reads the files (environment of the child process).
MODES = {
    "before": {"SBS_WIDGET_EAGER_ONNX": "1", "SBS_WIDGET_MAP_WEIGHTS": "0"},  # onnx.load, weights held
    "held": {"SBS_WIDGET_EAGER_ONNX": "0", "SBS_WIDGET_MAP_WEIGHTS": "0"},  # lean ONNX reader, weights held
    "after": {"SBS_WIDGET_EAGER_ONNX": "0", "SBS_WIDGET_MAP_WEIGHTS": ""},  # lean reader, big weights mapped
}
CLI = ["-m", "sbs_widget", "compare", "--ep", "{d}/user.pt2", "--onnx", "{d}/model.onnx", "--inputs",
       "{d}/inputs.pt", "-o", "{out}"]
RUN_ALIGNED = """
import sys, time, csv
import sbs_widget
from sbs_widget.cli.compare import write_records
d, out = sys.argv[1], sys.argv[2]
records = list(sbs_widget.run_aligned(d + "/user.pt2", d + "/model.onnx", d + "/inputs.pt"))
write_records(records, out)
"""


class MemoryLimit:
    """A memory cgroup limiting a child to ``limit`` bytes, page cache included (the kernel reclaims
    the cgroup's cached file pages before it kills): cgroup v1 (``memory.limit_in_bytes``) or v2
    (``memory.max``), as root. Its own peak (``memory.max_usage_in_bytes``, v1) counts the cache too."""

    def __init__(self, limit: int):
        for root, knob, peak in (("/sys/fs/cgroup/memory", "memory.limit_in_bytes", "memory.max_usage_in_bytes"),
                                 ("/sys/fs/cgroup", "memory.max", "memory.peak")):
            if os.path.exists(os.path.join(root, knob if root.endswith("memory") else "cgroup.controllers")):
                self.path = os.path.join(root, f"sbs_big_{os.getpid()}")
                os.makedirs(self.path, exist_ok=True)
                with open(os.path.join(self.path, knob), "w") as f:
                    f.write(str(limit))
                self.peak_file = os.path.join(self.path, peak)
                return
        raise SystemExit("--limit needs a writable memory cgroup (cgroup v1 or v2, as root)")

    def enter(self) -> None:  # in the child, before exec
        with open(os.path.join(self.path, "cgroup.procs"), "w") as f:
            f.write(str(os.getpid()))

    def peak(self) -> int | None:
        try:
            with open(self.peak_file) as f:
                return int(f.read())
        except OSError:
            return None

    def close(self) -> None:
        try:
            os.rmdir(self.path)
        except OSError:
            pass


def _child(argv: list[str], env: dict, timeout: int, limit: int | None = None) -> tuple[float, int, int]:
    """(seconds, peak RSS in bytes, exit code) of one fresh process; ``limit``: bytes it may use, page
    cache included (a memory cgroup; exit code -9 when the kernel killed it for want of memory)."""
    cgroup = MemoryLimit(limit) if limit else None
    start = time.perf_counter()
    proc = subprocess.Popen(["timeout", str(timeout), sys.executable, *argv], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                            preexec_fn=cgroup.enter if cgroup else None)
    _, status, usage = os.wait4(proc.pid, 0)
    if cgroup:
        print(f"  cgroup limit {limit / 1e9:.2f} GB: its peak with page cache {(cgroup.peak() or 0) / 1e9:.2f} GB",
              flush=True)
        cgroup.close()
    seconds = time.perf_counter() - start
    err = proc.stderr.read()
    proc.stderr.close()
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        print(err[-2000:], file=sys.stderr)
    return seconds, usage.ru_maxrss * 1024, code


def _records(path: str) -> list[tuple]:
    """The records of a CSV, every field but times, sorted: a run cut in other segments yields the
    records of constants folded by the exporter at other places (each with its segment)."""
    with open(path, newline="") as f:
        rows = list(csv.DictReader(f))
    keep = [k for k in (rows[0] if rows else {}) if "time" not in k]
    return sorted(tuple(r[k] for k in keep) for r in rows)


def measure(name: str, folder: str, timeout: int, repeat: int, what=("cli", "run_aligned"),
            modes=("held", "after"), limit: float | None = None) -> list[dict]:
    d = os.path.join(folder, name)
    with open(os.path.join(d, "meta.json")) as f:
        weights = json.load(f)["weights"]
    rows = []
    for how in what:
        seen = {}
        for mode in modes:
            env = {**os.environ, **MODES[mode]}
            out = os.path.join(d, f"{how}_{mode}.csv")
            argv = [a.format(d=d, out=out) for a in CLI] if how == "cli" else ["-c", RUN_ALIGNED, d, out]
            runs = [_child(argv, env, timeout, int(limit * weights) if limit else None) for _ in range(repeat)]
            seconds = min(r[0] for r in runs)
            peak = min(r[1] for r in runs)
            code = max(r[2] for r in runs)
            seen[mode] = _records(out) if code == 0 and os.path.exists(out) else None
            rows.append(dict(model=name, what=how, mode=mode, limit=limit, weights_gb=round(weights / 1e9, 3),
                             peak_gb=round(peak / 1e9, 3), ratio=round(peak / weights, 2),
                             seconds=round(seconds, 1), rc=code))
            print(json.dumps(rows[-1]), flush=True)
        if len(modes) < 2:
            continue
        first = seen[modes[0]]
        same = first is not None and all(seen[m] == first for m in modes)
        for row in rows[-len(modes):]:
            row["same_records"] = same
        print(f"{name} {how}: records identical in modes {', '.join(modes)}: {same} ({len(first or [])} records)",
              flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("step", choices=["build", "measure"])
    ap.add_argument("--models", nargs="+", default=["llama_1g", "llama_1g_f16"], choices=sorted(MODELS))
    ap.add_argument("--folder", default=FOLDER)
    ap.add_argument("--timeout", type=int, default=3000, help="seconds per child process")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--json", help="append the rows to this file")
    ap.add_argument("--what", nargs="+", default=["cli", "run_aligned"], choices=["cli", "run_aligned"])
    ap.add_argument("--modes", nargs="+", default=["held", "after"], choices=sorted(MODES),
                    help="before: the ONNX file read by onnx.load, the weights held in memory; held: the lean "
                         "reader, the weights held in memory; after: the lean reader, a big .pt2's weights "
                         "mapped and read as needed (today's default)")
    ap.add_argument("--limit", type=float, help="run each child in a memory cgroup limited to this many times "
                                                "the weights, page cache included (root; rc -9: killed)")
    args = ap.parse_args(argv)
    for name in args.models:
        if args.step == "build":
            code = subprocess.call(["timeout", str(args.timeout), sys.executable, __file__, "_build", name,
                                    args.folder])
            if code:
                print(f"{name}: build failed (exit {code})", file=sys.stderr)
                return code
        else:
            rows = measure(name, args.folder, args.timeout, args.repeat, args.what, args.modes, args.limit)
            if args.json:
                with open(args.json, "a") as f:
                    f.writelines(json.dumps(r) + "\n" for r in rows)
    return 0


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "_build":
        resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
        build(sys.argv[2], sys.argv[3])
        sys.exit(0)
    sys.exit(main())
