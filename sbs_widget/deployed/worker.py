"""One whole-model onnxruntime session in a fresh process, run as a script (never imported by the
package: it loads numpy and onnxruntime only, so it starts in ~0.3 s instead of torch's seconds).

Why a process per session: some settings are process state, not session state. onnxruntime applies
``session.set_denormal_as_zero`` to the calling thread once per process, with the first session's value
(measured on 1.32: a session asking for it after one that did not still keeps denormals, and the reverse),
so two sessions in one process cannot be compared. A fresh process is also how a user runs a deployment,
and an optimizer that crashes the process is reported instead of taking the caller down.

    python worker.py SPEC.json   (SPEC: model, feeds, out, level, config, providers, disabled, optimized)
"""

import ctypes
import json
import sys

import numpy as np
import onnxruntime as ort


def main(spec_path: str) -> int:
    with open(spec_path) as f:
        spec = json.load(f)
    opts = ort.SessionOptions()
    if spec.get("level"):
        opts.graph_optimization_level = getattr(ort.GraphOptimizationLevel, spec["level"])
    for key, value in spec.get("config", {}).items():
        opts.add_session_config_entry(key, value)
    for name, value in spec.get("attributes", {}).items():
        if name == "execution_mode":
            value = getattr(ort.ExecutionMode, value)
        setattr(opts, name, value)
    if spec.get("optimized"):
        opts.optimized_model_filepath = spec["optimized"]
    opts.log_severity_level = 3
    session = ort.InferenceSession(spec["model"], opts, providers=spec["providers"],
                                   disabled_optimizers=spec.get("disabled") or [])
    stored = np.load(spec["feeds"])
    feeds = {}
    for name, code in spec["feed_types"].items():
        bits = stored[name]
        feeds[name] = ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, code) if code else \
            ort.OrtValue.ortvalue_from_numpy(np.ascontiguousarray(bits))
    values = session.run_with_ort_values(None, feeds)
    arrays, types = {}, []
    for i, v in enumerate(values):
        try:
            arrays[f"out{i}"] = v.numpy()
            types.append(0)
        except Exception:  # bfloat16 / float8: their bytes, typed by the caller
            raw = ctypes.string_at(v.data_ptr(), v.tensor_size_in_bytes())
            arrays[f"out{i}"] = np.frombuffer(raw, dtype=np.uint8)
            types.append([v.data_type(), list(v.shape())])
    np.savez(spec["out"], **arrays)
    with open(spec["out"] + ".json", "w") as f:
        json.dump({"types": types, "providers": session.get_providers()}, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
