"""ONNX runtimes behind one small protocol, so that others can be plugged in.

A runtime turns an ONNX model into a callable ``feeds -> list of outputs``. The engine compiles a few
models per comparison (one per segment of the graph, see ``segments.py``), never one per node.

>>> rt = get_runtime("onnxruntime")
>>> rt.name
'onnxruntime'
"""

from __future__ import annotations

import ctypes
import dataclasses
import os
from typing import Callable, Protocol, runtime_checkable

import numpy as np
import onnx
import torch

from sbs_widget.dtypes import NO_NUMPY_DTYPES, NO_NUMPY_ORT_TYPES, TORCH_TO_ONNX, numpy_dtype, numpy_elem_type
from sbs_widget.engine.cancel import current_run_options
from sbs_widget.errors import InputError

Compiled = Callable[[dict[str, np.ndarray], list[str]], list[np.ndarray]]


@runtime_checkable
class Runtime(Protocol):
    """What the engine needs from a runtime: a ``name`` and ``compile``. A runtime may also declare the
    capabilities of ``Capabilities`` as attributes of the same names; ``capabilities`` reads them once
    per run, each missing one at its default."""

    name: str

    def compile(self, model: onnx.ModelProto) -> Compiled:
        """Prepare ``model``; the result is called with feeds and the output names wanted."""
        ...


@dataclasses.dataclass(frozen=True)
class Capabilities:
    """Every optional capability of a runtime the engine uses, with its default."""

    # the engine may compile the coming segments in a background thread (``compile`` is thread-safe)
    compiles_in_background: bool = False
    # ``compile`` also takes the model as serialized bytes (segments are built as bytes; otherwise
    # they are parsed into a ``ModelProto`` first)
    accepts_serialized: bool = False
    # threads per session (0: the runtime's default); 1 lets a segment run alongside the FX side
    intra_op_num_threads: int = 0
    # every weight is fed as an input of the segments (a deployed runtime: a weight seen as a constant
    # would be folded, asking for a value keeps it from a fusion: ``deployed/runtime.py``)
    weights_in_segments: bool = False
    # ``vanished_values(model) -> {value: why}``: the values the runtime's optimized graph no longer
    # computes (reported one-sided with why, never asked for); None: all are computed
    vanished_values: Callable[[onnx.ModelProto], dict[str, str]] | None = None


def capabilities(runtime: Runtime) -> Capabilities:
    """The capabilities ``runtime`` declares (see ``Capabilities``)."""
    defaults = Capabilities()
    return Capabilities(**{f.name: getattr(runtime, f.name, getattr(defaults, f.name))
                           for f in dataclasses.fields(Capabilities)})


class OnnxruntimeRuntime:
    """onnxruntime with graph optimizations off, so that every intermediate value the exporter wrote
    is the one computed (ORT fusions would otherwise remove them)."""

    name = "onnxruntime"
    compiles_in_background = True  # InferenceSession releases the GIL for most of its building
    # (parsing the model holds it: about a third)
    accepts_serialized = True
    disabled_optimizers: tuple[str, ...] = ()

    def __init__(self, providers: list[str] | None = None, intra_op_num_threads: int = 1):
        import onnxruntime

        self._ort = onnxruntime
        available = onnxruntime.get_available_providers()
        self.providers = [p for p in (providers or ["CPUExecutionProvider"]) if p in available] \
            or ["CPUExecutionProvider"]
        self.intra_op_num_threads = intra_op_num_threads

    def session_options(self):
        """The options every segment's session is built with (a subclass may deploy others)."""
        opts = self._ort.SessionOptions()
        opts.graph_optimization_level = self._ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        # Fatal only: a node that fails is reported by its record, onnxruntime would print it again.
        opts.log_severity_level = 4
        # Each segment has its own session; arenas would keep every segment's peak allocated.
        opts.enable_cpu_mem_arena = False
        # Memory patterns pre-plan one block for every value of a run and keep it with the session.
        opts.enable_mem_pattern = False
        # No spinning threads after a run: the FX side runs next, and the coming sessions compile.
        opts.add_session_config_entry("session.intra_op.allow_spinning", "0")
        opts.intra_op_num_threads = self.intra_op_num_threads or cores()
        return opts

    def compile(self, model: onnx.ModelProto | bytes) -> Compiled:
        data = model if isinstance(model, bytes) else model.SerializeToString()
        session = self._ort.InferenceSession(data, self.session_options(), providers=self.providers,
                                             disabled_optimizers=list(self.disabled_optimizers))
        ort = self._ort
        # The run's RunOptions (cancel.py): stopping the run or its time limit terminates the call.
        if not any(v.type in NO_NUMPY_ORT_TYPES for v in session.get_inputs() + session.get_outputs()):
            def run(feeds: dict[str, np.ndarray], outputs: list[str]) -> list[np.ndarray]:
                return session.run(outputs, feeds, current_run_options(ort))

            return run

        def run_exotic(feeds: dict[str, np.ndarray], outputs: list[str]) -> list[np.ndarray]:
            # session.run reads and returns numpy types only: bfloat16 / float8 go through OrtValues.
            values = session.run_with_ort_values(outputs, {k: ort_value(ort, v) for k, v in feeds.items()},
                                                 current_run_options(ort))
            return [ort_array(v) for v in values]

        return run_exotic


def exact_numpy(t: torch.Tensor) -> np.ndarray:
    """A CPU tensor as numpy with the same bits: bfloat16 and float8 as their ml_dtypes types (torch's
    ``.numpy()`` refuses them), for a runtime to compute with exactly torch's values."""
    t = t.detach().cpu()
    if t.dtype not in NO_NUMPY_DTYPES:
        return t.numpy()
    bits = t.contiguous().view(torch.int16 if t.element_size() == 2 else torch.uint8).numpy()
    return bits.view(numpy_dtype(TORCH_TO_ONNX[t.dtype]))


def ort_value(ort, array: np.ndarray):
    """An onnxruntime OrtValue of ``array``; ml_dtypes arrays (bfloat16, float8) hand over their bits
    with their ONNX type."""
    array = np.ascontiguousarray(array)
    if array.dtype.kind == "V":
        bits = array.view(np.uint16 if array.itemsize == 2 else np.uint8)
        return ort.OrtValue.ortvalue_from_numpy_with_onnx_type(bits, numpy_elem_type(array))
    return ort.OrtValue.ortvalue_from_numpy(array)


def ort_array(value) -> np.ndarray:
    """A numpy array of an OrtValue; bfloat16 / float8 as their ml_dtypes types (a copy of the bytes)."""
    code = NO_NUMPY_ORT_TYPES.get(value.data_type())
    if code is None:
        return value.numpy()
    raw = ctypes.string_at(value.data_ptr(), value.tensor_size_in_bytes())
    return np.frombuffer(bytearray(raw), dtype=numpy_dtype(code)).reshape(value.shape())


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        return os.cpu_count() or 1


class ReferenceRuntime:
    """``onnx.reference.ReferenceEvaluator``: slow, pure numpy, the ONNX specification's own reading."""

    name = "onnx.reference"

    def compile(self, model: onnx.ModelProto) -> Compiled:
        from onnx.reference import ReferenceEvaluator

        evaluator = ReferenceEvaluator(model)

        def run(feeds: dict[str, np.ndarray], outputs: list[str]) -> list[np.ndarray]:
            results = evaluator.run(outputs, feeds)
            return [np.asarray(r) if not isinstance(r, (list, np.ndarray)) else r for r in results]

        return run


RUNTIMES = {
    "onnxruntime": OnnxruntimeRuntime,
    "ort": OnnxruntimeRuntime,
    "onnx.reference": ReferenceRuntime,
    "reference": ReferenceRuntime,
}


_SHARED: dict = {}


def get_runtime(runtime: str | Runtime = "onnxruntime", *, cuda: bool = False, threads: int = 1) -> Runtime:
    """A runtime by name (``onnxruntime``, ``onnx.reference``) or a ``Runtime`` object as is.

    With ``cuda=True`` onnxruntime uses its CUDA provider when the installed build has it;
    ``threads``: onnxruntime's threads per session (0: one per core).
    """
    if isinstance(runtime, str):
        try:
            cls = RUNTIMES[runtime]
        except KeyError:
            raise InputError(f"unknown runtime {runtime!r}; choose one of {sorted(set(RUNTIMES))} "
                             "or pass an object with .name and .compile(model)") from None
        ort = cls is OnnxruntimeRuntime
        key = (cls, cuda and ort, threads if ort else None)
        if key not in _SHARED:  # one instance per kind: compiled sessions are cached per instance
            providers = ["CUDAExecutionProvider", "CPUExecutionProvider"] if key[1] else None
            _SHARED[key] = OnnxruntimeRuntime(providers, threads) if ort else cls()
        return _SHARED[key]
    if isinstance(runtime, Runtime):
        return runtime
    raise InputError("runtime must be a name or an object with .name and .compile(model), not "
                     f"{type(runtime).__name__}")
