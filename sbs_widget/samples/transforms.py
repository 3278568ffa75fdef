"""Two ONNX models of one program (issue 47): ``a`` the export, ``b`` a copy rewritten by a real tool.

Users compare an export with what an optimizer, a converter or a quantizer made of it; the tools here are
the ones they run, called as they call them, so that ``b`` has the node names, fused operators and casts
such a tool really writes. ``B_FAULTS`` then place one known fault in ``b``, to check that a comparison of
``a`` and ``b`` finds it: each returns a faulty copy and the names of the nodes it edited, picks its node
deterministically (the middle candidate in graph order) and raises ``ValueError`` when ``b`` lacks the
pattern.

The tools are test dependencies (onnxconverter-common, onnxslim, onnxsim), imported when called.
"""

from __future__ import annotations

import contextlib
import io
import os
import tempfile
from typing import Callable

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

Feeds = dict[str, np.ndarray]


# -- transformations ---------------------------------------------------------------------------------------

def _ort(level_name: str):
    """onnxruntime's offline optimizer at one level on the CPU provider, as ``optimized_model_filepath``
    saves it. ``ORT_ENABLE_ALL`` writes layout nodes for this CPU (NCHWc): kept, as users keep them."""

    def transform(model: onnx.ModelProto, feeds: list[Feeds] | None = None) -> onnx.ModelProto:
        import onnxruntime as ort

        options = ort.SessionOptions()
        options.graph_optimization_level = getattr(ort.GraphOptimizationLevel, level_name)
        with tempfile.TemporaryDirectory() as tmp:
            options.optimized_model_filepath = os.path.join(tmp, "optimized.onnx")
            ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
            return onnx.load(options.optimized_model_filepath)

    return transform


def onnxslim_transform(model: onnx.ModelProto, feeds: list[Feeds] | None = None) -> onnx.ModelProto:
    """onnxslim's default passes (constant folding, dead code, fusions); it prints a summary: silenced."""
    import onnxslim

    with contextlib.redirect_stdout(io.StringIO()):
        return onnxslim.slim(model)


def onnxsim_transform(model: onnx.ModelProto, feeds: list[Feeds] | None = None) -> onnx.ModelProto:
    """onnx-simplifier (``pip install onnxsim``, a wheel): constant folding checked by running both models;
    its own check failing is an error, not a silently wrong ``b``."""
    import onnxsim

    with contextlib.redirect_stdout(io.StringIO()):
        simplified, ok = onnxsim.simplify(model)
    if not ok:
        raise RuntimeError("onnxsim: the simplified model does not match the original")
    return simplified


def float16_transform(model: onnx.ModelProto, feeds: list[Feeds] | None = None) -> onnx.ModelProto:
    """onnxconverter-common's float16 conversion keeping float32 inputs and outputs (casts at the edges and
    around the operators it blocks), the usual way to halve a model.

    onnxconverter-common 1.16 mistypes a graph output that other nodes also read (the last hidden state
    the pooler reads, in most zoo models): onnxruntime rejects the result. Such an output is first copied
    by an Identity of its own, the usual workaround, so that the converter's output cast reads a value no
    other node reads."""
    from onnxconverter_common import float16

    model = _copy(model)
    read = {i for n in model.graph.node for i in n.input}
    for k, output in enumerate(model.graph.output):
        if output.name in read:
            inner = f"{output.name}_inner"
            for n in model.graph.node:
                n.output[:] = [inner if o == output.name else o for o in n.output]
                n.input[:] = [inner if i == output.name else i for i in n.input]
            model.graph.node.append(helper.make_node("Identity", [inner], [output.name], name=f"output_{k}_copy"))
    return float16.convert_float_to_float16(model, keep_io_types=True)


def _pre_processed(model: onnx.ModelProto, tmp: str) -> onnx.ModelProto | str:
    """``quant_pre_process`` (shape inference, optimization) as onnxruntime recommends before quantizing;
    when it fails (symbolic shape inference does on some graphs) the model is quantized as it is."""
    from onnxruntime.quantization import quant_pre_process

    path = os.path.join(tmp, "pre.onnx")
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            quant_pre_process(model, path)
    except Exception:  # any failure of this optional step: quantize without it
        return model
    return path


def quant_dynamic(model: onnx.ModelProto, feeds: list[Feeds] | None = None) -> onnx.ModelProto:
    """Dynamic quantization (int8 weights, activations quantized at run time): no calibration."""
    from onnxruntime.quantization import QuantType, quantize_dynamic

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "quantized.onnx")
        quantize_dynamic(_pre_processed(model, tmp), out, weight_type=QuantType.QInt8)
        return onnx.load(out)


def quant_static_qdq(model: onnx.ModelProto, feeds: list[Feeds] | None = None) -> onnx.ModelProto:
    """Static quantization to QuantizeLinear/DequantizeLinear pairs, calibrated (min-max) on ``feeds``."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    if not feeds:
        raise ValueError("quant_static_qdq needs calibration feeds (a list of ONNX input name -> array)")

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.rest = iter(feeds)

        def get_next(self):
            return next(self.rest, None)

    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "quantized.onnx")
        quantize_static(_pre_processed(model, tmp), out, Reader(), quant_format=QuantFormat.QDQ)
        return onnx.load(out)


TRANSFORMS: dict[str, Callable[[onnx.ModelProto, list[Feeds]], onnx.ModelProto]] = {
    "ort_basic": _ort("ORT_ENABLE_BASIC"),
    "ort_extended": _ort("ORT_ENABLE_EXTENDED"),
    "ort_all": _ort("ORT_ENABLE_ALL"),
    "onnxslim": onnxslim_transform,
    "onnxsim": onnxsim_transform,
    "float16": float16_transform,
    "quant_dynamic": quant_dynamic,
    "quant_static_qdq": quant_static_qdq,
}


def families() -> list[str]:
    """Zoo models every transformation above handles (onnxruntime 1.32, onnxslim 0.1.98, onnxsim 0.8.1,
    onnxconverter-common 1.16, torch 2.13: each ran, and agreed with the export within its tolerance).
    float16 needs its workaround (below) on those with an output read inside the graph (bert, resnet...)."""
    return ["bert", "vit", "resnet", "gpt2", "llama", "convnext", "distilbert", "mobilevit", "qwen2"]


# -- the pair made by the exporter itself, and inputs ------------------------------------------------------

def exporter_optimize_pair(name: str):
    """``(ep, a, b, args, kwargs)``: zoo model ``name`` exported once without the exporter's optimizer
    (``a``), then optimized in place as ``torch.onnx.export(optimize=True)`` does (``b``): one
    ExportedProgram, one translation, so that the two differ only by that optimization."""
    from sbs_widget.samples import zoo

    ep, program, args, kwargs = zoo.export(name, optimize=False)
    a = onnx.ModelProto()
    a.CopyFrom(program.model_proto)
    with contextlib.redirect_stdout(io.StringIO()):
        program.optimize()
    return ep, a, program.model_proto, args, kwargs


def feeds_for(model: onnx.ModelProto, args, kwargs) -> Feeds:
    """ONNX feeds for torch inputs: the graph inputs (less initializers, which older graphs list as
    inputs) in order against the tensors of the flattened ``(args, kwargs)``, as the exporter lays them."""
    import torch

    tensors = [t for t in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
    weights = {i.name for i in model.graph.initializer}
    names = [i.name for i in model.graph.input if i.name not in weights]
    if len(names) != len(tensors):
        raise ValueError(f"{len(names)} ONNX inputs {names} for {len(tensors)} torch tensors")
    return {n: t.detach().cpu().numpy() for n, t in zip(names, tensors)}


# -- faults placed in b ------------------------------------------------------------------------------------

def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    out = onnx.ModelProto()
    out.CopyFrom(model)
    return out


def _middle(candidates: list, what: str, model: onnx.ModelProto):
    if not candidates:
        raise ValueError(f"no {what} in this model (graph {model.graph.name!r}, {len(model.graph.node)} nodes)")
    return candidates[len(candidates) // 2]


def _named(model: onnx.ModelProto, node: onnx.NodeProto) -> str:
    """The node's name, given one (unique) if the tool left it empty: a fault must name what it edited."""
    if not node.name:
        taken = {n.name for n in model.graph.node}
        i = 0
        while f"{node.op_type}_{i}" in taken:
            i += 1
        node.name = f"{node.op_type}_{i}"
    return node.name


def _constants(model: onnx.ModelProto) -> set[str]:
    return {i.name for i in model.graph.initializer} | {
        o for n in model.graph.node if n.op_type == "Constant" for o in n.output}


def _private_initializer(model: onnx.ModelProto, node: onnx.NodeProto, index: int) -> onnx.TensorProto:
    """The initializer feeding ``node.input[index]``, copied under a new name if another input reads it,
    so that editing it changes this node only."""
    name = node.input[index]
    init = next(i for i in model.graph.initializer if i.name == name)
    readers = sum(list(n.input).count(name) for n in model.graph.node)
    if readers == 1 and name not in {o.name for o in model.graph.output}:
        return init
    copy = model.graph.initializer.add()
    copy.CopyFrom(init)
    copy.name = f"{name}_fault_{_named(model, node)}"
    node.input[index] = copy.name
    return copy


def _value_types(model: onnx.ModelProto) -> dict[str, onnx.TypeProto]:
    """Types of every value (ONNX shape inference, then the graph's own declarations)."""
    graph = onnx.shape_inference.infer_shapes(model).graph
    types = {v.name: v.type for v in [*graph.value_info, *graph.input, *graph.output]}
    types.update({i.name: helper.make_tensor_type_proto(i.data_type, i.dims) for i in graph.initializer})
    return types


def _shape(t: onnx.TypeProto | None) -> tuple | None:
    if t is None or not t.tensor_type.HasField("shape"):
        return None
    dims = tuple(d.dim_value if d.HasField("dim_value") else d.dim_param for d in t.tensor_type.shape.dim)
    return dims if all(dims) else None


def wrong_rewrite(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A rewrite that picked a close but wrong operator: a residual Add (two computed values of one shape,
    so that neither is a broadcast mask or bias that may be zero) turned into a Sub; else a Gelu turned
    into a Relu; else a Softmax taken over another axis. The first kind the model has is used."""
    out = _copy(model)
    constants, types = _constants(out), _value_types(out)
    standard = [n for n in out.graph.node if n.domain in ("", "ai.onnx")]
    adds = [n for n in standard if n.op_type == "Add" and not constants & set(n.input) and n.input[0] != n.input[1]
            and _shape(types.get(n.input[0])) is not None
            and _shape(types.get(n.input[0])) == _shape(types.get(n.input[1]))]
    gelus = [n for n in standard if n.op_type == "Gelu"]
    softmaxes = [n for n in standard if n.op_type == "Softmax" and len(_shape(types.get(n.input[0])) or ()) >= 2]
    node = _middle(adds or gelus or softmaxes, "residual Add, Gelu nor Softmax", out)
    if node.op_type == "Softmax":
        axis = next((a.i for a in node.attribute if a.name == "axis"), -1)
        rank = len(_shape(types[node.input[0]]))
        del node.attribute[:]
        node.attribute.append(helper.make_attribute("axis", rank - 2 if axis in (-1, rank - 1) else -1))
    else:
        node.op_type = "Sub" if node.op_type == "Add" else "Relu"
        del node.attribute[:]
    return out, [_named(out, node)]


_FLOATS = (TensorProto.FLOAT, TensorProto.FLOAT16)


def bad_float16_cast(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A precision cast (float32 <-> float16, as the float16 converter inserts) that goes through int32:
    every value is truncated to an integer, as a cast with a wrong target type does."""
    out = _copy(model)
    types = _value_types(out)
    casts = [n for n in out.graph.node if n.op_type == "Cast" and n.input[0] in types
             and types[n.input[0]].tensor_type.elem_type in _FLOATS
             and next(a.i for a in n.attribute if a.name == "to") in _FLOATS]
    node = _middle(casts, "Cast between float32 and float16", out)
    name = _named(out, node)
    target = next(a for a in node.attribute if a.name == "to")
    to, target.i = target.i, TensorProto.INT32
    truncated = f"{node.output[0]}_truncated"
    back = helper.make_node("Cast", [truncated], [node.output[0]], name=f"{name}_back", to=to)
    node.output[0] = truncated
    position = list(out.graph.node).index(node)
    out.graph.node.insert(position + 1, back)
    return out, [name, back.name]


def quant_scale_2x(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """The scale of one DequantizeLinear of weights doubled (a scale computed or read wrongly): the weights
    it restores come out twice too large. Weights (not biases, in int32) rather than activations: a doubled
    activation often feeds attention scores, whose softmax hides it in a small random model."""
    out = _copy(model)
    types = {i.name: i.data_type for i in out.graph.initializer}
    dqs = [n for n in out.graph.node if n.op_type == "DequantizeLinear" and n.input[1] in types
           and types.get(n.input[0], TensorProto.INT32) != TensorProto.INT32]  # int32: a bias
    node = _middle(dqs, "DequantizeLinear of constant weights with a constant scale", out)
    init = _private_initializer(out, node, 1)
    init.CopyFrom(numpy_helper.from_array(numpy_helper.to_array(init) * 2, init.name))
    return out, [_named(out, node)]


# Fused operators (by preference: a norm's gamma, a convolution's weights, a matrix product's weights) and
# the index of their constant input that a wrong folding would get wrong.
_FUSED = {
    "SkipLayerNormalization": 2, "SkipSimplifiedLayerNormalization": 2, "LayerNormalization": 1,
    "SimplifiedLayerNormalization": 1, "FusedConv": 1, "NhwcFusedConv": 1, "Conv": 1, "Attention": 1,
    "BiasGelu": 1, "FusedGemm": 1, "Gemm": 1, "FusedMatMul": 1,
}
_ALPHA = ("FusedMatMul", "FusedGemm", "Gemm")


def fused_wrong_constant(model: onnx.ModelProto) -> tuple[onnx.ModelProto, list[str]]:
    """A constant of a fused operator gone wrong, as if the optimizer folded the wrong value: noise as
    large as the values themselves added to its gamma or weights (a uniform scale would be undone by the
    next normalization), or else its ``alpha`` doubled. Operators of onnxruntime's domains come first
    (SkipLayerNormalization, FusedConv, NCHWc Conv...), the standard ones it also writes (Gemm, Conv with a
    folded BatchNorm, LayerNormalization) after; among them the first kind of ``_FUSED`` present (the
    weights of a query or key projection barely move the near-uniform attention of a small random model)."""
    out = _copy(model)
    weights = {i.name for i in out.graph.initializer}

    def constant(n: onnx.NodeProto, op: str) -> bool:
        return n.op_type == op and _FUSED[op] < len(n.input) and n.input[_FUSED[op]] in weights

    contrib = [n for n in out.graph.node if n.domain.startswith("com.microsoft")]
    standard = [n for n in out.graph.node if n.domain in ("", "ai.onnx")]
    tiers = [[n for n in nodes if constant(n, op)] for nodes in (contrib, standard) for op in _FUSED]
    tiers += [[n for n in nodes if n.op_type in _ALPHA] for nodes in (contrib, standard)]
    node = _middle(next((t for t in tiers if t), []), f"fused operator with a constant ({', '.join(_FUSED)})", out)
    if node.op_type in _FUSED and constant(node, node.op_type):
        init = _private_initializer(out, node, _FUSED[node.op_type])
        array = numpy_helper.to_array(init)
        noise = np.random.default_rng(0).standard_normal(array.shape) * np.abs(array).mean()
        init.CopyFrom(numpy_helper.from_array((array + noise).astype(array.dtype), init.name))
    else:
        attr = next((a for a in node.attribute if a.name == "alpha"), None)
        if attr is None:
            node.attribute.append(helper.make_attribute("alpha", 2.0))
        else:
            attr.f *= 2.0
    return out, [_named(out, node)]


B_FAULTS: dict[str, Callable[[onnx.ModelProto], tuple[onnx.ModelProto, list[str]]]] = {
    "wrong_rewrite": wrong_rewrite,
    "bad_float16_cast": bad_float16_cast,
    "quant_scale_2x": quant_scale_2x,
    "fused_wrong_constant": fused_wrong_constant,
}
