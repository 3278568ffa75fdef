"""Element types across torch, ONNX and numpy: the one home of their tables and conversions.

Unknown types: every lookup returns ``None`` for a type the other side has no type for (``torch.quint8``
in ONNX, ONNX ``STRING`` in torch, an array without a dtype); the caller says what that means (a record's
comment, an "unsupported" entry in a dump, a ``LoadError``). ONNX's own "no type", ``0``
(``TensorProto.UNDEFINED``), is what ``ValueType.elem_type`` holds for a value the model does not type;
a caller that needs an int writes ``onnx_elem_type(d) or 0``.

>>> onnx_elem_type(torch.bfloat16), torch_dtype(7), onnx_elem_type(torch.quint8)
(16, torch.int64, None)
"""

from __future__ import annotations

import numpy as np
import onnx
import torch

TORCH_TO_ONNX: dict[torch.dtype, int] = {
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
ONNX_TO_TORCH: dict[int, torch.dtype] = {v: k for k, v in TORCH_TO_ONNX.items()}

# The ONNX types numpy holds natively: an initializer's raw bytes are read in place as these, and a
# torch value fed to the ONNX side is cast to them. bfloat16 / float8 are left out on purpose (numpy
# reads them only through ml_dtypes: see ``numpy_dtype``).
ONNX_TO_NUMPY: dict[int, type] = {
    onnx.TensorProto.FLOAT: np.float32, onnx.TensorProto.DOUBLE: np.float64,
    onnx.TensorProto.FLOAT16: np.float16, onnx.TensorProto.INT64: np.int64,
    onnx.TensorProto.INT32: np.int32, onnx.TensorProto.INT16: np.int16, onnx.TensorProto.INT8: np.int8,
    onnx.TensorProto.UINT8: np.uint8, onnx.TensorProto.UINT16: np.uint16,
    onnx.TensorProto.UINT32: np.uint32, onnx.TensorProto.UINT64: np.uint64,
    onnx.TensorProto.BOOL: np.bool_,
}

# numpy dtype -> ONNX type, looked up before onnx's helper (a dict lookup per fed array, not a call).
_NUMPY_TO_ONNX: dict[np.dtype, int] = {np.dtype(k): v for k, v in {
    np.float32: 1, np.uint8: 2, np.int8: 3, np.uint16: 4, np.int16: 5, np.int32: 6, np.int64: 7,
    np.bool_: 9, np.float16: 10, np.float64: 11, np.uint32: 12, np.uint64: 13, np.complex64: 14,
    np.complex128: 15}.items()}

# Types numpy has no dtype for (ml_dtypes, onnx's dependency, has them): torch's ``.numpy()`` refuses
# them and onnxruntime's ``session.run`` neither reads nor returns them.
NO_NUMPY_DTYPES = (torch.bfloat16, torch.float8_e4m3fn, torch.float8_e4m3fnuz, torch.float8_e5m2,
                   torch.float8_e5m2fnuz)
# onnxruntime's names of those types (``OrtValue.data_type()``, ``NodeArg.type``) -> ONNX type.
NO_NUMPY_ORT_TYPES: dict[str, int] = {
    f"tensor({onnx.TensorProto.DataType.Name(TORCH_TO_ONNX[t]).lower()})": TORCH_TO_ONNX[t] for t in NO_NUMPY_DTYPES}


def onnx_elem_type(dtype: torch.dtype) -> int | None:
    """ONNX element type (``onnx.TensorProto.FLOAT`` = 1, ...) of a torch dtype; None if ONNX has none.

    >>> onnx_elem_type(torch.float16)
    10
    """
    return TORCH_TO_ONNX.get(dtype)


def torch_dtype(elem_type: int) -> torch.dtype | None:
    """Inverse of ``onnx_elem_type``; None for an ONNX type torch has no dtype for.

    >>> torch_dtype(1)
    torch.float32
    """
    return ONNX_TO_TORCH.get(elem_type)


def numpy_elem_type(array) -> int | None:
    """ONNX element type of a numpy array (or anything with a numpy ``dtype``); None when it has no
    dtype or ONNX has no type for it. ml_dtypes arrays (bfloat16, float8) are read as onnx reads them.

    >>> numpy_elem_type(np.zeros(2, np.int64)), numpy_elem_type([1.0])
    (7, None)
    """
    dt = getattr(array, "dtype", None)
    if dt is None:
        return None
    code = _NUMPY_TO_ONNX.get(dt)
    if code is not None:
        return code
    try:
        return onnx.helper.np_dtype_to_tensor_dtype(dt)
    except (KeyError, ValueError, TypeError):
        return None


def numpy_dtype(elem_type: int) -> np.dtype | None:
    """The numpy dtype holding ONNX type ``elem_type`` bit for bit (ml_dtypes for bfloat16 / float8);
    None for a type numpy cannot hold.

    >>> numpy_dtype(16).name, numpy_dtype(0)
    ('bfloat16', None)
    """
    try:
        return np.dtype(onnx.helper.tensor_dtype_to_np_dtype(elem_type))
    except (KeyError, ValueError, TypeError):
        return None


_ITEMSIZE = {1: 4, 2: 1, 3: 1, 4: 2, 5: 2, 6: 4, 7: 8, 9: 1, 10: 2, 11: 8, 12: 4, 13: 8, 16: 2}


def onnx_itemsize(elem_type: int) -> int:
    """Bytes per element of ONNX element type ``elem_type`` (4 for the unknown)."""
    return _ITEMSIZE.get(elem_type, 4)


def onnx_value_bytes(vt) -> int:
    """Bytes of an ONNX value of type ``vt`` (``OnnxIndex.types``), a symbolic dimension counted as 16."""
    if vt is None or vt.shape is None:
        return 0
    n = 1
    for d in vt.shape:
        n *= d if isinstance(d, int) and d > 0 else 16
    return n * _ITEMSIZE.get(vt.elem_type, 4)
