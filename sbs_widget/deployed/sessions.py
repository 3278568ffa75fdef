"""Whole-model sessions, each in its own process (``worker.py`` says why), counted."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import numpy as np
import onnx

from sbs_widget.deployed.settings import Setting
from sbs_widget.dtypes import NO_NUMPY_ORT_TYPES, numpy_dtype, numpy_elem_type
from sbs_widget.errors import SbsError

WORKER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "worker.py")
PROTO_LIMIT = (1 << 31) - (1 << 20)  # protobuf's 2 GB, with room for the graph


class SessionFailed(SbsError):
    """An onnxruntime session of the whole model could not be built or run."""


class Sessions:
    """The model written once to a temporary folder, the inputs once, and one worker process per
    session; ``count`` says how many sessions were built."""

    def __init__(self, model: onnx.ModelProto, feeds: dict[str, np.ndarray], timeout: float | None = None):
        self._dir = tempfile.TemporaryDirectory(prefix="sbs_deployed_")
        self.folder = self._dir.name
        self.model_path = os.path.join(self.folder, "model.onnx")
        if model.ByteSize() < PROTO_LIMIT:
            with open(self.model_path, "wb") as f:
                f.write(model.SerializeToString())
        else:  # external data rewrites the proto in place: a copy keeps the caller's model as it was
            copy = onnx.ModelProto()
            copy.CopyFrom(model)
            onnx.save_model(copy, self.model_path, save_as_external_data=True, location="model.data")
        self.feeds_path = os.path.join(self.folder, "feeds.npz")
        types, stored = {}, {}
        for name, array in feeds.items():
            exotic = array.dtype.kind == "V"  # bfloat16 / float8: bits plus their ONNX type
            types[name] = numpy_elem_type(array) if exotic else 0
            stored[name] = array.view(np.uint16 if array.itemsize == 2 else np.uint8) if exotic else array
        np.savez(self.feeds_path, **stored)
        self.feed_types = types
        self.timeout = timeout
        self.count = 0

    def run(self, setting: Setting, *, save_optimized: bool = False,
            model_path: str | None = None) -> tuple[list[np.ndarray], str | None]:
        """The outputs of one session built with ``setting`` (on the model as written, or on
        ``model_path``), and the path of its optimized model when asked for. Raises ``SessionFailed``
        with onnxruntime's message."""
        self.count += 1
        n = self.count
        out = os.path.join(self.folder, f"out{n}.npz")
        optimized = os.path.join(self.folder, f"optimized{n}.onnx") if save_optimized else None
        spec = {"model": model_path or self.model_path, "feeds": self.feeds_path, "feed_types": self.feed_types,
                "out": out,
                "level": setting.level, "config": dict(setting.config), "providers": list(setting.providers),
                "disabled": list(setting.disabled), "attributes": dict(setting.attributes), "optimized": optimized}
        spec_path = os.path.join(self.folder, f"spec{n}.json")
        with open(spec_path, "w") as f:
            json.dump(spec, f)
        try:
            done = subprocess.run([sys.executable, WORKER, spec_path], capture_output=True, text=True,
                                  timeout=self.timeout)
        except subprocess.TimeoutExpired:
            raise SessionFailed(f"the session ({setting.describe()}) ran past {self.timeout} s: pass a larger "
                                "timeout, or smaller inputs") from None
        if done.returncode != 0:
            tail = (done.stderr or done.stdout).strip().splitlines()[-3:]
            raise SessionFailed(f"onnxruntime failed with {setting.describe()} (exit {done.returncode}): "
                                f"{' '.join(tail)[-600:]}; the as-written run shows whether the model loads at all")
        with open(out + ".json") as f:
            meta = json.load(f)
        with np.load(out) as data:
            arrays = [_typed(data[f"out{i}"], t) for i, t in enumerate(meta["types"])]
        os.remove(out)
        return arrays, optimized

    def close(self) -> None:
        self._dir.cleanup()


def _typed(array: np.ndarray, type_info) -> np.ndarray:
    if not type_info:
        return array
    name, shape = type_info
    return array.view(numpy_dtype(NO_NUMPY_ORT_TYPES[name])).reshape(shape)
