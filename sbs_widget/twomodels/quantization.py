"""Which nodes to leave out of quantization: the quantized nodes ranked by their own error (each fed a's
float values, ``local.py``), and the fewest of the most sensitive whose exclusion brings every output within
the tolerance the user gives, proven by quantizing again without them and comparing again.

``quantize(exclude) -> model`` is the user's own recipe (their calibration data, their options) taking the
node names to leave in float (``nodes_to_exclude`` of ``onnxruntime.quantization``); ``ort_static`` and
``ort_dynamic`` make one from onnxruntime's. The search: the k most sensitive excluded, k = 1, 2, 4, ...
until the outputs pass, then halving between the last two k: at most ``max_reruns`` quantizations.
"""

from __future__ import annotations

import dataclasses
import os
import tempfile
from typing import Callable

import onnx

from sbs_widget.twomodels import verdicts as V
from sbs_widget.twomodels.compare import ModelsComparison, compare_models

Quantize = Callable[[list[str]], onnx.ModelProto]


@dataclasses.dataclass
class QuantizationAdvice:
    """``sensitive``: (node, its local error relative to the value's magnitude), most sensitive first;
    ``exclude``: the fewest found whose exclusion brings the outputs within tolerance (None: even all of
    them do not); ``proof``: the comparison of the model quantized without them; ``tried``: each k tried
    and whether the outputs passed; ``outputs_error``: the outputs' largest absolute error against torch,
    before and after."""

    sensitive: list[tuple[str, float]]
    exclude: list[str] | None
    proof: ModelsComparison | None
    tried: list[tuple[int, bool]]
    outputs_error: tuple[float, float | None]
    model: onnx.ModelProto | None = None  # the model quantized without ``exclude``


def advise_exclusions(ep, a, quantize: Quantize, args=(), kwargs=None, *, atol: float, rtol: float,
                      max_reruns: int = 12) -> QuantizationAdvice:
    """See the module's docstring. ``atol``/``rtol``: the tolerance the quantized model's outputs must meet
    against torch (the values inside are judged by it too)."""
    first = compare_models(ep, a, quantize([]), args, kwargs, atol=atol, rtol=rtol)
    sensitive = sensitive_nodes(first)
    before = _outputs_error(first)
    tried: list[tuple[int, bool]] = []
    if _outputs_pass(first):
        return QuantizationAdvice(sensitive, [], first, tried, (before, before))
    names = [n for n, _ in sensitive]
    results: dict[int, tuple[bool, ModelsComparison, onnx.ModelProto]] = {}

    def probe(k: int) -> bool:
        model = quantize(names[:k])
        found = compare_models(ep, a, model, args, kwargs, atol=atol, rtol=rtol)
        results[k] = (_outputs_pass(found), found, model)
        tried.append((k, results[k][0]))
        return results[k][0]

    low, high, k = 0, None, 1
    while len(tried) < max_reruns and k <= len(names):  # 1, 2, 4, ... until the outputs pass
        if probe(k):
            high = k
            break
        low, k = k, min(2 * k, len(names)) if k < len(names) else k + 1
    if high is None:
        return QuantizationAdvice(sensitive, None, None, tried, (before, None))
    while high - low > 1 and len(tried) < max_reruns:  # the fewest between the last failing and passing k
        mid = (low + high) // 2
        if probe(mid):
            high = mid
        else:
            low = mid
    _, proof, model = results[high]
    return QuantizationAdvice(sensitive, names[:high], proof, tried, (before, _outputs_error(proof)), model)


def sensitive_nodes(found: ModelsComparison) -> list[tuple[str, float]]:
    """The nodes of b a quantizer quantizes (MatMul, Conv, Gather, Add... fed dequantized values), by the
    local error they compute with, largest first: a compute node's own, and the error of each activation
    it reads quantized (a ``DequantizeLinear`` fed a's value: the quantization of that input)."""
    consumers: dict[str, list] = {}
    for n in found.b_model.graph.node:
        for i in n.input:
            consumers.setdefault(i, []).append(n)
    worst: dict[str, float] = {}
    for lv in found.local:
        if lv.precision != "quantized":
            continue
        if lv.op_type not in V.QUANT_OPS:
            worst[lv.node] = max(worst.get(lv.node, 0.0), lv.err_local)
            continue
        for n in consumers.get(lv.b_value, ()):  # an input quantized: the nodes reading it
            if n.op_type not in V.QUANT_OPS and n.name:
                worst[n.name] = max(worst.get(n.name, 0.0), lv.err_local)
    return sorted(worst.items(), key=lambda kv: -kv[1])


def _output_records(found: ModelsComparison) -> list:
    return [r for r in found.records if r.kind == "output" and r.b_name is not None] or \
        [r for r in found.records if r.b_name is not None][-1:]


def _outputs_pass(found: ModelsComparison) -> bool:
    return all(r.b_within_tolerance for r in _output_records(found))


def _outputs_error(found: ModelsComparison) -> float:
    return max((r.b_err_abs or 0.0 for r in _output_records(found)), default=0.0)


def ort_static(model: onnx.ModelProto, calibration: list[dict], **options) -> Quantize:
    """``quantize(exclude)`` of ``model`` with ``onnxruntime.quantization.quantize_static`` (QDQ unless
    ``quant_format`` says otherwise), calibrated on ``calibration`` (ONNX input name -> array dicts)."""
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, quantize_static

    options.setdefault("quant_format", QuantFormat.QDQ)

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.rest = iter(calibration)

        def get_next(self):
            return next(self.rest, None)

    def quantize(exclude: list[str]) -> onnx.ModelProto:
        return _quantized(model, lambda src, out: quantize_static(src, out, Reader(), nodes_to_exclude=list(exclude),
                                                                  **options))

    return quantize


def ort_dynamic(model: onnx.ModelProto, **options) -> Quantize:
    """``quantize(exclude)`` of ``model`` with ``onnxruntime.quantization.quantize_dynamic``."""
    from onnxruntime.quantization import quantize_dynamic

    def quantize(exclude: list[str]) -> onnx.ModelProto:
        return _quantized(model, lambda src, out: quantize_dynamic(src, out, nodes_to_exclude=list(exclude), **options))

    return quantize


def _quantized(model: onnx.ModelProto, run: Callable[[str, str], None]) -> onnx.ModelProto:
    with tempfile.TemporaryDirectory() as tmp:
        src, out = os.path.join(tmp, "float.onnx"), os.path.join(tmp, "quantized.onnx")
        onnx.save(model, src)
        run(src, out)
        return onnx.load(out)
