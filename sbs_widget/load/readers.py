"""Turning what the user hands over (objects or paths) into the objects the engine runs.

- ExportedProgram or ``.pt2`` path; ``torch.onnx.ONNXProgram`` for both sides at once.
- ONNX ModelProto or path, external data included.
- Inputs as args/kwargs or a ``torch.save``d file (loaded with ``weights_only=True``: files are untrusted).
- The *decomposed* program: the user's ExportedProgram after the exporter's own decompositions, which
  is the program the ONNX model was translated from: values are aligned against it, never by name
  against the user's program, whose nodes the decompositions replaced. Computing it costs seconds, so
  it is cached per program object.
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
import weakref
from collections.abc import Mapping
from typing import Any

import onnx
import torch

from sbs_widget.errors import InputError, LoadError, ModelMismatchError
from sbs_widget.load.guards import drop_guards
from sbs_widget.load.lean_onnx import InitializerFile, Malformed, read_lean
from sbs_widget.load.onnx_checks import check_model
from sbs_widget.load.operators import check_operators
from sbs_widget.load.plain_files import check_regular_file, check_zip_stored
from sbs_widget.load.pt2_checks import check_pt2
from sbs_widget.load.untrusted import (
    load_data,
    load_program,
    refused_global,
    register_transformers_type,
    unregistered_type,
)


def is_onnx_program(obj) -> bool:
    return type(obj).__name__ == "ONNXProgram" and hasattr(obj, "exported_program")


def load_exported_program(ep) -> torch.export.ExportedProgram:
    if isinstance(ep, torch.export.ExportedProgram):
        return ep
    if isinstance(ep, (str, os.PathLike)):
        path = os.fspath(ep)
        if not os.path.exists(path):
            raise LoadError(f"ExportedProgram file not found: {path!r}")
        with contextlib.suppress(ImportError):  # registers transformers' ModelOutput pytree nodes
            import transformers.modeling_outputs  # noqa: F401
        check_pt2(path)  # nothing in it runs code: no pickled object, expression or call of the file's
        program, errors = load_program(path)  # and the pickled tensors are read as data only
        missing = next(filter(None, map(unregistered_type, errors)), None)
        if program is None and missing is not None and register_transformers_type(missing):
            program, errors = load_program(path)  # a KV cache, say
            missing = next(filter(None, map(unregistered_type, errors)), None)
        if program is not None:
            check_operators(program, repr(path))  # running it computes only (no file, print, write of its inputs)
            drop_guards(program)
            return program
        if missing is not None:
            raise LoadError(
                f"cannot load ExportedProgram {path!r}: its inputs or outputs hold the type {missing}, which "
                "is not registered with torch.utils._pytree in this process; register it before loading "
                f"(torch.utils._pytree.register_pytree_node(..., serialized_type_name={missing!r}), or import "
                "the module that does)")
        refused = next(filter(None, map(refused_global, errors)), None)
        if refused is not None:
            raise LoadError(
                f"cannot load ExportedProgram {path!r}: it holds a pickled {refused}, not plain data; pickles "
                "run code when loaded, so sbs_widget loads data only (weights_only=True). If you trust the "
                "file, load it yourself (torch.export.load) and pass the ExportedProgram")
        # zip errors, truncated files... (the first error says what, the last where)
        causes = [t for t in errors if not t.startswith("Ran into the following error")]
        raise LoadError(
            f"cannot load ExportedProgram {path!r} ({'; '.join(dict.fromkeys(causes[:1] + causes[-1:]))}); "
            "is it a file written by torch.export.save, and complete?"
        )
    raise InputError(
        f"ep must be a torch.export.ExportedProgram, a path to a .pt2 file or an ONNXProgram, "
        f"not {type(ep).__name__}"
    )


def load_onnx_model(onx) -> onnx.ModelProto:
    """The ONNX model ``onx`` (a ModelProto or a path), checked (``onnx_checks``) before it is run, with
    every initializer's bytes in the message (``load_onnx`` leaves the big ones in the file)."""
    if isinstance(onx, (str, os.PathLike)):
        return _load_onnx_file(onx, eager=True)[0]
    return load_onnx(onx)[0]


# Set to 1: paths are read by ``onnx.load`` with every initializer in memory (how they were read before
# the lean reader; benchmarks/big_memory.py measures both).
EAGER_ENV = "SBS_WIDGET_EAGER_ONNX"


def load_onnx(onx) -> tuple[onnx.ModelProto, InitializerFile | None]:
    """The ONNX model ``onx`` (a ModelProto or a path), checked (``onnx_checks``), and, for a path,
    where the bytes of its big initializers lie: they are left in the file (``lean_onnx``), described
    in the model as external data, and read through ``OnnxIndex.initializer_data``. A ModelProto is
    taken as it is (None)."""
    if isinstance(onx, onnx.ModelProto):
        check_model(onx)
        return onx, None
    return _load_onnx_file(onx, eager=os.environ.get(EAGER_ENV, "") not in ("", "0"))


def _load_onnx_file(onx, eager: bool) -> tuple[onnx.ModelProto, InitializerFile | None]:
    if isinstance(onx, (str, os.PathLike)):
        path = os.fspath(onx)
        if not os.path.isfile(path):
            raise LoadError(f"ONNX file not found: {path!r}" if not os.path.exists(path) else
                            f"{path!r} is not a file: pass the path of the .onnx file")
        if os.path.getsize(path) == 0:
            raise LoadError(f"ONNX file {path!r} is empty (0 bytes): the export or the copy did not finish; "
                            "export the model again")
        data = None
        try:
            model, data = read_lean(path) if not eager else (None, None)
        except Malformed:  # onnx.load says what is wrong with the file
            model = None
        try:
            if model is None:
                model = onnx.load(path, load_external_data=True)
        except Exception as e:
            raise LoadError(
                f"cannot load ONNX model {path!r} ({type(e).__name__}: {e}); the file is truncated, "
                "corrupt, or its external data files are not next to it"
            ) from e
        check_model(model, f"ONNX model {path!r}")
        return model, data
    raise InputError(f"onx must be an onnx.ModelProto or a path to a .onnx file, not {type(onx).__name__}")


def load_inputs(args, kwargs) -> tuple[tuple, dict]:
    """Normalize inputs; ``args`` may be a path to a file saved with ``torch.save``, or a dict of
    keyword inputs (a tokenizer's output, say).

    The file may hold a tuple/list of args, a dict of kwargs, a single tensor, or a pair
    ``(args, kwargs)``.
    """
    if isinstance(args, (str, os.PathLike)):
        path = os.fspath(args)
        check_regular_file(path, "inputs file")  # a FIFO would block the first read
        check_zip_stored(path, "the inputs file")  # a deflated member may inflate to gigabytes
        try:  # data only (transformers' KV caches allowed): any other class is refused
            data = load_data(path, map_location="cpu")
        except Exception as e:
            refused = refused_global(str(e))
            why = f"it holds a pickled {refused}, not plain data" if refused else f"{type(e).__name__}: {e}"
            raise LoadError(
                f"cannot load inputs from {path!r} ({why}); inputs files are read with "
                "torch.load(weights_only=True), since pickles run code when loaded: save tensors, tuples, "
                "lists and dicts (and transformers' KV caches) only"
            ) from e
        if isinstance(data, dict):
            args, kwargs = (), {**data, **(kwargs or {})}
        elif isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[1], dict) \
                and isinstance(data[0], (tuple, list)):
            args, kwargs = tuple(data[0]), {**data[1], **(kwargs or {})}
        elif isinstance(data, torch.Tensor):
            args = (data,)
        elif isinstance(data, (tuple, list)):
            args = tuple(data)
        else:
            raise InputError(
                f"inputs file {path!r} holds a {type(data).__name__}, not inputs: save a tuple or list of the "
                "model's positional inputs, a dict of its keyword inputs, a pair (args, kwargs) or one tensor")
    elif args is None:
        args = ()
    elif isinstance(args, Mapping):  # keyword inputs, as transformers users pass them (model(**inputs))
        overlap = sorted(set(args) & set(kwargs or {}))
        if overlap:
            raise InputError(f"inputs {overlap} are given twice: in the dict of inputs and in kwargs")
        args, kwargs = (), {**args, **(kwargs or {})}
    elif isinstance(args, torch.Tensor):
        args = (args,)
    elif isinstance(args, list):
        args = tuple(args)
    elif not isinstance(args, tuple):
        raise InputError(f"args must be a tuple of inputs or a path to a torch.save'd file, not {type(args).__name__}")
    return args, dict(kwargs or {})


# id(program) -> (weakref to program, decomposed program)
_DECOMPOSED: dict[int, tuple[Any, torch.export.ExportedProgram]] = {}


def decompose_as_exporter(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """The program ``torch.onnx.export(ep, dynamo=True)`` translates: ``ep`` after the exporter's
    decompositions, type promotion and assertion removal. Cached per program object.

    Relies on torch's private exporter module; a torch release that moves it gets a clear error.
    """
    key = id(ep)
    hit = _DECOMPOSED.get(key)
    if hit is not None and hit[0]() is ep:
        return hit[1]
    try:
        from torch.onnx._internal.exporter import _core, _registration
    except ImportError as e:  # pragma: no cover - depends on torch version
        raise ModelMismatchError(
            f"this torch ({torch.__version__}) has no torch.onnx._internal.exporter; pass the ONNXProgram "
            "returned by torch.onnx.export (it holds the decomposed program) instead of the ExportedProgram"
        ) from e
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        import logging

        logger = logging.getLogger("torch.onnx._internal.exporter._registration")
        level = logger.level
        logger.setLevel(logging.ERROR)  # "torchvision is not installed" noise
        try:
            registry = _registration.ONNXRegistry.from_torchlib()
            decomposed = _core._prepare_exported_program_for_export(ep, registry=registry)
        finally:
            logger.setLevel(level)
    try:
        ref = weakref.ref(ep)
    except TypeError:  # pragma: no cover
        return decomposed
    _DECOMPOSED[key] = (ref, decomposed)
    weakref.finalize(ep, _DECOMPOSED.pop, key, None)
    return decomposed
