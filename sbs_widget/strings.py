"""Compact one-line descriptions of nested values: ``T1s2x30x16``, ``((T7s2x30,),{})``.

The letters follow onnx-diagnostic's ``string_type`` so that its users read them at once:
``T`` + ONNX element type + ``s`` + shape for a tensor, ``(a,b)`` a tuple, ``#2[a,b]`` a list,
``dict(k:v)`` a dict, ``ClassName(...)`` any other container.
"""

from __future__ import annotations

import numpy as np
import torch

from sbs_widget.dtypes import numpy_elem_type, onnx_elem_type


def shape_type(code, shape, letter: str = "T") -> str:
    """``T1s2x16x64``: ``T`` + element type + ``s`` + the dims joined by ``x`` (``?`` for an unknown
    rank). The one spelling of a tensor's type in records, the alignment, the ONNX index and
    ``string_type`` (which writes ``A`` for a numpy array).

    >>> shape_type(1, (2, 16)), shape_type(7, ()), shape_type(1, None)
    ('T1s2x16', 'T7s', 'T1s?')
    """
    dims = "?" if shape is None else "x".join(map(str, shape))
    return f"{letter}{code}s{dims}"


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
            code = onnx_elem_type(o.dtype)
            itype = str(o.dtype).removeprefix("torch.") if code is None else code
            s = shape_type(itype, o.shape) if with_shape else f"T{itype}r{o.dim()}"
            if with_device:
                s = _device(o) + s
            return s + (_min_max(o) if with_min_max else "")
        if isinstance(o, np.ndarray):
            code = numpy_elem_type(o)
            itype = str(o.dtype) if code is None else code
            s = shape_type(itype, o.shape, "A") if with_shape else f"A{itype}r{o.ndim}"
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
