"""Compact one-line descriptions of nested values: ``T1s2x30x16``, ``((T7s2x30,),{})``.

The letters follow onnx-diagnostic's ``string_type`` so that its users read them at once:
``T`` + ONNX element type + ``s`` + shape for a tensor, ``(a,b)`` a tuple, ``#2[a,b]`` a list,
``dict(k:v)`` a dict, ``ClassName(...)`` any other container.
"""

from __future__ import annotations

import numpy as np
import onnx
import torch

TORCH_TO_ONNX = {
    torch.float32: onnx.TensorProto.FLOAT,
    torch.uint8: onnx.TensorProto.UINT8,
    torch.int8: onnx.TensorProto.INT8,
    torch.uint16: onnx.TensorProto.UINT16,
    torch.int16: onnx.TensorProto.INT16,
    torch.int32: onnx.TensorProto.INT32,
    torch.int64: onnx.TensorProto.INT64,
    torch.bool: onnx.TensorProto.BOOL,
    torch.float16: onnx.TensorProto.FLOAT16,
    torch.float64: onnx.TensorProto.DOUBLE,
    torch.uint32: onnx.TensorProto.UINT32,
    torch.uint64: onnx.TensorProto.UINT64,
    torch.complex64: onnx.TensorProto.COMPLEX64,
    torch.complex128: onnx.TensorProto.COMPLEX128,
    torch.bfloat16: onnx.TensorProto.BFLOAT16,
    torch.float8_e4m3fn: onnx.TensorProto.FLOAT8E4M3FN,
    torch.float8_e4m3fnuz: onnx.TensorProto.FLOAT8E4M3FNUZ,
    torch.float8_e5m2: onnx.TensorProto.FLOAT8E5M2,
    torch.float8_e5m2fnuz: onnx.TensorProto.FLOAT8E5M2FNUZ,
}
_ONNX_TO_TORCH = {v: k for k, v in TORCH_TO_ONNX.items()}


def onnx_elem_type(dtype: torch.dtype) -> int:
    """ONNX element type (``onnx.TensorProto.FLOAT`` = 1, ...) of a torch dtype.

    >>> onnx_elem_type(torch.bfloat16)
    16
    """
    try:
        return TORCH_TO_ONNX[dtype]
    except KeyError:
        raise TypeError(f"no ONNX element type for torch dtype {dtype}") from None


def torch_dtype(elem_type: int) -> torch.dtype:
    """Inverse of ``onnx_elem_type``.

    >>> torch_dtype(7)
    torch.int64
    """
    try:
        return _ONNX_TO_TORCH[elem_type]
    except KeyError:
        raise TypeError(f"no torch dtype for ONNX element type {elem_type}") from None


def _shape(dims, with_shape: bool) -> str:
    if not with_shape:
        return f"r{len(dims)}"
    return "s" + "x".join(str(d) for d in dims)


def _min_max(t: torch.Tensor) -> str:
    if t.numel() == 0 or t.is_meta:
        return "[empty]"
    try:
        v = t.detach().to(torch.float64) if not t.dtype.is_complex else t.detach().abs().to(torch.float64)
        return f"[{float(v.min()):g},{float(v.max()):g}:A{float(v.mean()):g}]"
    except Exception:  # fake tensors and symbolic values have no data
        return ""


def _device(t: torch.Tensor) -> str:
    if t.device.type == "cpu":
        return "C"
    if t.device.type == "cuda":
        return f"G{t.device.index or 0}"
    return f"{t.device.type}:"


def string_type(obj, with_shape: bool = True, with_min_max: bool = False, with_device: bool = False) -> str:
    """One-line description of ``obj``: tensors, numpy arrays, scalars and any nesting of them.

    >>> import torch
    >>> string_type(torch.zeros((2, 30, 16)))
    'T1s2x30x16'
    >>> string_type(((torch.zeros((2, 30), dtype=torch.int64),), {}))
    '((T7s2x30,),{})'
    >>> string_type({"input_ids": torch.zeros((2, 30), dtype=torch.int64)})
    'dict(input_ids:T7s2x30)'
    >>> string_type([1, 2.5, None], with_min_max=True)
    '#3[int=1,float=2.5,None]'
    """

    def rec(o) -> str:
        if o is None:
            return "None"
        if isinstance(o, torch.Tensor):
            try:
                itype = str(onnx_elem_type(o.dtype))
            except TypeError:
                itype = str(o.dtype).removeprefix("torch.")
            s = f"T{itype}{_shape(o.shape, with_shape)}"
            if with_device:
                s = _device(o) + s
            return s + (_min_max(o) if with_min_max else "")
        if isinstance(o, np.ndarray):
            try:
                itype = str(onnx.helper.np_dtype_to_tensor_dtype(o.dtype))
            except Exception:
                itype = str(o.dtype)
            s = f"A{itype}{_shape(o.shape, with_shape)}"
            if with_min_max and o.size and o.dtype.kind in "biuf":
                s += f"[{o.min():g},{o.max():g}:A{o.astype(np.float64).mean():g}]"
            return s
        if isinstance(o, (bool, int, float, str, torch.SymInt, torch.SymFloat, torch.SymBool)):
            name = type(o).__name__
            return f"{name}={o!r}" if with_min_max else name
        if isinstance(o, torch.Size):
            return "Size(" + ",".join(str(d) for d in o) + ")"
        if isinstance(o, (torch.dtype, torch.device)):
            return str(o)
        if type(o) is tuple:
            inner = ",".join(rec(x) for x in o)
            return f"({inner},)" if len(o) == 1 else f"({inner})"
        if type(o) is list:
            return f"#{len(o)}[" + ",".join(rec(x) for x in o) + "]"
        if type(o) is dict:
            if not o:
                return "{}"
            return "dict(" + ",".join(f"{k}:{rec(v)}" for k, v in o.items()) + ")"
        cls = type(o).__name__
        if isinstance(o, (tuple, list)):  # namedtuple, list subclasses
            return f"{cls}(" + ",".join(rec(x) for x in o) + ")"
        if isinstance(o, dict):  # ModelOutput, OrderedDict, ...
            return f"{cls}(" + ",".join(f"{k}:{rec(v)}" for k, v in o.items()) + ")"
        if isinstance(o, type):
            return "type"
        if hasattr(o, "__dict__"):
            # Caches and other state holders: only the attributes that carry tensors say something.
            items = [(k, v) for k, v in vars(o).items() if _has_tensor(v)]
            return f"{cls}(" + ",".join(f"{k}:{rec(v)}" for k, v in items) + ")"
        return cls

    return rec(obj)


def _has_tensor(o, depth: int = 0) -> bool:
    if isinstance(o, torch.Tensor):
        return True
    if depth > 8:
        return False
    if isinstance(o, (list, tuple)):
        return any(_has_tensor(x, depth + 1) for x in o)
    if isinstance(o, dict):
        return any(_has_tensor(x, depth + 1) for x in o.values())
    if hasattr(o, "__dict__") and not isinstance(o, type):
        return any(_has_tensor(x, depth + 1) for x in vars(o).values())
    return False
