"""Two ONNX models of one program (issue 47): the export ``a`` and a copy ``b`` transformed by the real tools
(onnxruntime's offline optimizer, onnxslim, float16 conversion, dynamic and static QDQ quantization), both
against the torch program in one run; faults placed in ``b`` named at the node of ``b`` that holds them."""

from __future__ import annotations

import functools
import json

import pytest

import sbs_widget
from sbs_widget.samples import zoo
from sbs_widget.samples.transforms import B_FAULTS, TRANSFORMS, feeds_for
from sbs_widget.twomodels import verdicts as V


@functools.lru_cache(maxsize=None)
def _export(name: str):
    ep, prog, args, kwargs = zoo.export(name)
    return prog, prog.model_proto, args, kwargs


@functools.lru_cache(maxsize=None)
def _transformed(name: str, transform: str):
    prog, a, args, kwargs = _export(name)
    return TRANSFORMS[transform](a, [feeds_for(a, args, kwargs)])


@pytest.mark.parametrize("name", ["bert", "resnet"])
@pytest.mark.parametrize("transform", ["ort_extended", "onnxslim", "float16", "quant_static_qdq"])
def test_a_correct_transformation_departs_nowhere(name, transform):
    """Every value of b is paired (names, structure, values) and none is called a departure: rounding of a
    lower precision is told from a bug."""
    prog, a, args, kwargs = _export(name)
    found = sbs_widget.compare_models(prog, a, _transformed(name, transform), args, kwargs)
    assert found.matching.coverage >= 0.9, found.matching.b_only
    assert not found.culprits and not [r for r in found.records if r.b_status == V.DEPARTS]
    paired = [r for r in found.records if r.b_name is not None]
    assert paired and all(r.b_err_abs is not None for r in paired if r.b_comment == "")
    if transform in ("float16", "quant_static_qdq"):  # b rounds more than a: said so, not a bug
        assert any(r.b_status == V.ROUNDING for r in found.records)
    else:
        assert all(r.b_status == V.SAME for r in paired if r.b_status is not None)
    frame = found.to_dataframe()
    assert {"b_name", "b_err_abs", "b_status", "b_paired_by", "b_err_local"} <= set(frame.columns)


@pytest.mark.parametrize("name", ["bert", "resnet"])
@pytest.mark.parametrize("fault, transform", [("wrong_rewrite", "ort_extended"), ("bad_float16_cast", "float16"),
                                              ("quant_scale_2x", "quant_static_qdq"),
                                              ("fused_wrong_constant", "ort_extended")])
def test_a_fault_placed_in_b_is_named_first(name, fault, transform):
    prog, a, args, kwargs = _export(name)
    bad, edited = B_FAULTS[fault](_transformed(name, transform))
    found = sbs_widget.compare_models(prog, a, bad, args, kwargs)
    assert found.culprits and found.culprits[0].onnx_node in edited, (found.culprits[:3], edited)
    said = {"wrong_rewrite": ("rewritten: a's",), "bad_float16_cast": ("converted to float16", "rewritten: a's"),
            "quant_scale_2x": ("quantized",), "fused_wrong_constant": ("fused: ",)}[fault]
    assert found.culprits[0].transformation.startswith(said), found.culprits[0].transformation
    if fault == "bad_float16_cast":  # (the cast the fault inserted, named as such)
        assert found.culprits[0].op_type == "Cast"
    assert any(r.b_status == V.DEPARTS for r in found.records) or found.culprits[0].b_value not in \
        {r.b_name for r in found.records}


def test_values_b_no_longer_has_say_what_they_became():
    """onnxruntime's optimizer fuses a's MatMul + Add into Gemm, LayerNormalization + Add into
    SkipLayerNormalization: a's values inside are one-sided, each naming the node of b they went into."""
    prog, a, args, kwargs = _export("bert")
    found = sbs_widget.compare_models(prog, a, _transformed("bert", "ort_extended"), args, kwargs)
    assert found.a_only and all(why for why in found.a_only.values())
    assert any("fused into" in why for why in found.a_only.values())
    fused = [r for r in found.records if r.b_name is None and r.b_comment.startswith("fused into")]
    assert fused, "the records of a's values without a twin carry why"


def test_the_cli_names_the_node_of_b(tmp_path, capsys):
    import onnx
    import torch

    from sbs_widget.cli.main import main

    prog, a, args, kwargs = _export("resnet")
    bad, edited = B_FAULTS["quant_scale_2x"](_transformed("resnet", "quant_static_qdq"))
    torch.export.save(prog.exported_program, tmp_path / "p.pt2")
    onnx.save(a, tmp_path / "a.onnx")
    onnx.save(bad, tmp_path / "b.onnx")
    torch.save(dict(zip(["pixel_values"], args)) if not kwargs else kwargs, tmp_path / "inputs.pt")
    files = ["--ep", str(tmp_path / "p.pt2"), "--onnx", str(tmp_path / "a.onnx"), "--onnx-b", str(tmp_path / "b.onnx"),
             "--inputs", str(tmp_path / "inputs.pt")]
    assert main(["culprits", *files, "--json"]) == 0
    culprits = json.loads(capsys.readouterr().out)
    assert culprits[0]["onnx_node"] in edited and culprits[0]["model"] == "b"
    assert main(["compare", *files, "-o", str(tmp_path / "out.csv"), "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "b departs at" in out and "float values paired" in out
    import pandas

    frame = pandas.read_csv(tmp_path / "out.csv")
    assert {"departs", "inherits"} & set(frame["b_status"].dropna()), "downstream of the doubled scale"


def test_b_must_be_a_model():
    prog, a, args, kwargs = _export("resnet")
    with pytest.raises(sbs_widget.InputError, match="no such file"):
        sbs_widget.compare_models(prog, a, "/nonexistent/b.onnx", args, kwargs)


def test_the_nodes_to_leave_out_of_quantization_are_found_and_proven():
    """The quantized nodes ranked by their own error; the fewest of the most sensitive whose exclusion
    brings the outputs within the tolerance given, proven by quantizing again and comparing again."""
    from sbs_widget.twomodels.quantization import advise_exclusions, ort_static

    prog, a, args, kwargs = _export("bert")
    quantize = ort_static(a, [feeds_for(a, args, kwargs)])
    full = sbs_widget.compare_models(prog, a, quantize([]), args, kwargs)
    worst = max(r.b_err_abs for r in full.records if r.kind == "output" and r.b_err_abs is not None)
    advice = advise_exclusions(prog, a, quantize, args, kwargs, atol=worst / 2, rtol=0.0)
    assert advice.sensitive and all(x[1] >= y[1] for x, y in zip(advice.sensitive, advice.sensitive[1:]))
    assert advice.exclude and len(advice.exclude) < len(advice.sensitive), advice.tried
    assert advice.outputs_error[0] > worst / 2 >= advice.outputs_error[1]
    assert len(advice.tried) <= 12 and advice.tried[-1] == (len(advice.exclude), True) or \
        (len(advice.exclude), True) in advice.tried
    again = sbs_widget.compare_models(prog, a, advice.model, args, kwargs, atol=worst / 2, rtol=0.0)
    outputs = [r for r in again.records if r.kind == "output" and r.b_name is not None]
    assert outputs and all(r.b_within_tolerance for r in outputs)
    quantized = {n.name for n in advice.model.graph.node}
    assert all(name in quantized for name in advice.exclude), "the excluded nodes stay, in float"


def test_the_same_model_on_another_provider():
    """``providers_b``: b is the model as another execution provider runs it. CI has the CPU only: the
    CPU against itself agrees everywhere; a provider this build lacks is refused by name (onnxruntime
    would fall back to the CPU without saying so)."""
    prog, a, args, kwargs = _export("resnet")
    found = sbs_widget.compare_models(prog, a, a, args, kwargs, providers_b=["CPUExecutionProvider"])
    assert found.matching.coverage == 1.0 and not found.culprits
    assert {r.b_status for r in found.records if r.b_name is not None} == {V.SAME}
    with pytest.raises(sbs_widget.InputError, match="not in this onnxruntime build"):
        sbs_widget.compare_models(prog, a, a, args, kwargs, providers_b=["NoSuchExecutionProvider"])


def test_the_exporters_optimizer_against_its_own_translation():
    from sbs_widget.samples.transforms import exporter_optimize_pair

    ep, a, b, args, kwargs = exporter_optimize_pair("llama")
    found = sbs_widget.compare_models(ep, a, b, args, kwargs)
    assert found.matching.coverage >= 0.9 and not found.culprits


def test_b_from_a_file_goes_through_the_untrusted_file_checks(tmp_path):
    """b read from a path is loaded as every model from anyone is (``load/readers.load_onnx_model``): an
    initializer whose external data points outside the model's folder is refused, nothing is read there."""
    import onnx

    prog, a, args, kwargs = _export("resnet")
    b = _transformed("resnet", "ort_extended")
    onnx.save_model(b, tmp_path / "b.onnx", save_as_external_data=True, all_tensors_to_one_file=True,
                    location="b.onnx.data", size_threshold=0)
    lean = onnx.load(tmp_path / "b.onnx", load_external_data=False)
    t = next(t for t in lean.graph.initializer if t.external_data)
    next(e for e in t.external_data if e.key == "location").value = "../" + tmp_path.name + "/b.onnx.data"
    onnx.save_model(lean, tmp_path / "escape.onnx")
    with pytest.raises(sbs_widget.LoadError):
        sbs_widget.compare_models(prog, a, str(tmp_path / "escape.onnx"), args, kwargs)
    found = sbs_widget.compare_models(prog, a, str(tmp_path / "b.onnx"), args, kwargs)  # the file as saved: fine
    assert found.matching.coverage == 1.0 and not found.culprits
