"""string_type: the compact descriptions used in verbose output, records and the widget."""

from __future__ import annotations

import collections

import numpy as np
import onnx
import pytest
import torch

from sbs_widget import string_type
from sbs_widget.dtypes import numpy_dtype, numpy_elem_type, onnx_elem_type, torch_dtype


@pytest.mark.parametrize(
    "obj, expected",
    [
        (torch.zeros((2, 30, 16)), "T1s2x30x16"),
        (((torch.zeros((2, 30), dtype=torch.int64),), {}), "((T7s2x30,),{})"),
        ({"input_ids": torch.zeros((2, 30), dtype=torch.int64)}, "dict(input_ids:T7s2x30)"),
        ([torch.zeros(3, dtype=torch.bfloat16), torch.zeros((), dtype=torch.bool)], "#2[T16s3,T9s]"),
        ((None, 1, 2.0, True, "s"), "(None,int,float,bool,str)"),
        ((), "()"),
        (np.zeros((2, 3), dtype=np.float16), "A10s2x3"),
        (torch.Size([2, 3]), "Size(2,3)"),
        (collections.namedtuple("Pair", "a b")(torch.ones(1), 2), "Pair(T1s1,int)"),
    ],
)
def test_string_type(obj, expected):
    assert string_type(obj) == expected


def test_string_type_options():
    t = torch.tensor([[1.0, 3.0]])
    assert string_type(t, with_shape=False) == "T1r2"
    assert string_type(t, with_min_max=True) == "T1s1x2[1,3:A2]"
    assert string_type(t, with_device=True) == "CT1s1x2"
    assert string_type([3, None], with_min_max=True) == "#2[int=3,None]"


def test_string_type_cache():
    from transformers.cache_utils import DynamicCache

    cache = DynamicCache()
    cache.update(torch.ones(1, 2, 3, 4), torch.ones(1, 2, 3, 4), 0)
    assert string_type(cache) == "DynamicCache(layers:#1[DynamicLayer(keys:T1s1x2x3x4,values:T1s1x2x3x4)])"


def test_dtype_maps_are_inverse():
    for dtype in (torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32,
                  torch.int8, torch.uint8, torch.bool):
        assert torch_dtype(onnx_elem_type(dtype)) is dtype
    # one answer for a type the other side lacks, in every direction: None
    assert onnx_elem_type(torch.quint8) is None
    assert torch_dtype(onnx.TensorProto.STRING) is None
    assert numpy_elem_type([1.0]) is None
    assert numpy_dtype(onnx.TensorProto.UNDEFINED) is None
    assert numpy_elem_type(numpy_dtype(onnx.TensorProto.BFLOAT16).type(0)) == onnx.TensorProto.BFLOAT16
