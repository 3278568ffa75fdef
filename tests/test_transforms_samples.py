"""sbs_widget.samples.transforms: each real tool makes a ``b`` that onnxruntime runs and that agrees with the
export ``a`` within the tool's own tolerance; each fault pushes ``b`` beyond it, names nodes of ``b`` and
refuses, with a ValueError that says what is missing, a model without its pattern."""

from __future__ import annotations

import warnings

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

pytest.importorskip("transformers")
pytest.importorskip("onnxslim")
pytest.importorskip("onnxconverter_common")

import onnxruntime as ort

from sbs_widget.samples import transforms

# The largest relative difference (max |b - a| / max |a|, over the outputs) each tool may make: the
# optimizers only reorder float32 arithmetic; float16 keeps ~3 digits; int8 quantization of a small model
# ~1e-2 to 3e-2 here.
TOLERANCE = {"ort_basic": 1e-4, "ort_extended": 1e-4, "ort_all": 1e-4, "onnxslim": 1e-4, "onnxsim": 1e-4,
             "float16": 1e-2, "quant_dynamic": 0.1, "quant_static_qdq": 0.1}

# The transform whose output each fault is meant for.
FAULT_ON = {"wrong_rewrite": "ort_basic", "bad_float16_cast": "float16", "quant_scale_2x": "quant_static_qdq",
            "fused_wrong_constant": "ort_extended"}

FAMILIES = ["bert", "resnet"]


@pytest.fixture(scope="module")
def pairs():
    """Per family: the exporter's pair, its feeds, and a's outputs (exported once for the module)."""
    out = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for name in FAMILIES:
            ep, a, b, args, kwargs = transforms.exporter_optimize_pair(name)
            feeds = transforms.feeds_for(a, args, kwargs)
            out[name] = (a, b, feeds, run(a, feeds))
    return out


@pytest.fixture(scope="module")
def transformed(pairs):
    """(family, transform) -> the transformed b, made on first use."""
    cache = {}

    def get(name, transform):
        if (name, transform) not in cache:
            _, b, feeds, _ = pairs[name]
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                cache[name, transform] = transforms.TRANSFORMS[transform](b, [feeds])
        return cache[name, transform]

    return get


def run(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    options = ort.SessionOptions()
    options.log_severity_level = 3
    session = ort.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def difference(outputs: list[np.ndarray], reference: list[np.ndarray]) -> float:
    assert [o.shape for o in outputs] == [r.shape for r in reference]
    return max(float(np.max(np.abs(o.astype(np.float64) - r)) / np.max(np.abs(r))) for o, r in zip(outputs, reference))


def test_transform_names():
    assert set(transforms.TRANSFORMS) >= {"ort_basic", "ort_extended", "ort_all", "onnxslim", "float16",
                                          "quant_dynamic", "quant_static_qdq"}
    assert set(transforms.B_FAULTS) == set(FAULT_ON)
    assert set(transforms.families()) >= set(FAMILIES)


def test_exporter_pair_differs_in_graph_not_values(pairs):
    for a, b, feeds, reference in pairs.values():
        assert len(b.graph.node) < len(a.graph.node)
        assert difference(run(b, feeds), reference) < 1e-4


@pytest.mark.parametrize("transform", sorted(transforms.TRANSFORMS))
@pytest.mark.parametrize("name", FAMILIES)
def test_transform_runs_close_to_a(pairs, transformed, name, transform):
    if transform == "onnxsim":
        pytest.importorskip("onnxsim")
    a, b, feeds, reference = pairs[name]
    model = transformed(name, transform)
    assert model is not b
    assert difference(run(model, feeds), reference) <= TOLERANCE[transform]


def test_transforms_do_what_they_say(pairs, transformed):
    ops = {t: {(n.domain, n.op_type) for n in transformed("resnet", t).graph.node} for t in ("ort_all", "float16")}
    assert ("com.microsoft.nchwc", "Conv") in ops["ort_all"]  # kept as users keep it
    assert ("", "Cast") in ops["float16"]
    fp16 = transformed("bert", "float16")
    assert any(i.data_type == TensorProto.FLOAT16 for i in fp16.graph.initializer)
    assert [i.type.tensor_type.elem_type for i in fp16.graph.output] == [TensorProto.FLOAT] * len(fp16.graph.output)
    assert any(n.op_type == "DequantizeLinear" for n in transformed("bert", "quant_static_qdq").graph.node)
    assert any(n.domain == "com.microsoft" for n in transformed("bert", "ort_extended").graph.node)


@pytest.mark.parametrize("fault", sorted(FAULT_ON))
@pytest.mark.parametrize("name", FAMILIES)
def test_fault_changes_b_beyond_tolerance(pairs, transformed, name, fault):
    a, b, feeds, reference = pairs[name]
    model = transformed(name, FAULT_ON[fault])
    before = model.SerializeToString()
    faulty, edited = transforms.B_FAULTS[fault](model)
    assert model.SerializeToString() == before  # b itself untouched
    nodes = {n.name for n in faulty.graph.node}
    assert edited and set(edited) <= nodes
    assert difference(run(faulty, feeds), reference) > 2 * TOLERANCE[FAULT_ON[fault]]
    again, edited_again = transforms.B_FAULTS[fault](model)  # deterministic
    assert edited_again == edited and again.SerializeToString() == faulty.SerializeToString()


def test_faults_on_models_without_the_pattern(pairs):
    relu = helper.make_model(helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"], name="relu")], "tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 3])]))
    for fault in transforms.B_FAULTS.values():
        with pytest.raises(ValueError, match="^no .* in this model"):
            fault(relu)
    float32 = pairs["bert"][1]  # the exporter's float32, unquantized model
    with pytest.raises(ValueError, match="Cast between float32 and float16"):
        transforms.bad_float16_cast(float32)
    with pytest.raises(ValueError, match="DequantizeLinear"):
        transforms.quant_scale_2x(float32)


def test_quant_scale_copies_a_shared_scale(pairs, transformed):
    model = transformed("resnet", "quant_static_qdq")
    faulty, [name] = transforms.quant_scale_2x(model)
    node = next(n for n in faulty.graph.node if n.name == name)
    scale = {i.name: onnx.numpy_helper.to_array(i) for i in faulty.graph.initializer}[node.input[1]]
    readers = [n for n in faulty.graph.node if node.input[1] in n.input]
    assert readers == [node]
    original = {i.name: onnx.numpy_helper.to_array(i) for i in model.graph.initializer}
    old = next(n for n in model.graph.node if n.name == name).input[1]
    np.testing.assert_array_equal(scale, 2 * original[old])


def test_feeds_for_pairs_inputs_in_order(pairs):
    a, _, feeds, _ = pairs["bert"]
    assert list(feeds) == [i.name for i in a.graph.input]
    assert feeds["input_ids"].dtype == np.int64
    with pytest.raises(ValueError, match="ONNX inputs"):
        transforms.feeds_for(a, (), {})
