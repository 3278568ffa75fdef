"""A transformed model ``b`` made ready against a prepared pair (the program and its export ``a``), once:
b's values paired with a's (``match.py``), what each paired value is (``verdicts.plan_values``), b rewired
to be fed a's values (``local.py``). Like ``prepare``, the pairing is made on the first inputs compared
and kept for the pair: a rerun on other inputs pays the runs, not the pairing. The last few are kept."""

from __future__ import annotations

import collections
import dataclasses
import os
import threading

import numpy as np
import onnx

from sbs_widget.engine.entry import Prepared
from sbs_widget.errors import InputError
from sbs_widget.load.readers import load_onnx_model
from sbs_widget.twomodels.local import Rewired, rewire
from sbs_widget.twomodels.match import Matching, _Graph, match_models
from sbs_widget.twomodels.values import all_values
from sbs_widget.twomodels.verdicts import ValuePlan, plan_values

KEPT = 4
_PAIRED: collections.OrderedDict = collections.OrderedDict()
_LOCK = threading.Lock()


@dataclasses.dataclass(frozen=True)
class PairedModels:
    prepared: Prepared
    a_model: onnx.ModelProto
    b_model: onnx.ModelProto
    b_key: tuple
    providers_b: tuple[str, ...] | None
    matching: Matching
    plans: list[ValuePlan]
    rewired: Rewired
    a_shapes: dict = dataclasses.field(default_factory=dict)  # each value of a's shape (on the first inputs)

    def values_a(self, feeds: dict) -> dict:
        return all_values(self.a_model, feeds, key=("a", id(self.prepared)), owner=self.prepared)

    def values_b(self, feeds: dict) -> dict:
        return all_values(self.b_model, feeds, self.providers_b, key=("b", *self.b_key), owner=self.b_model)


def paired_models(prepared: Prepared, b, feeds: dict, providers_b=None) -> tuple[PairedModels, tuple | None]:
    """The pair made ready: from the cache (then ``None``), or built on ``feeds`` (then a's and b's values
    on ``feeds``, computed to pair them)."""
    model, b_key = _load(b)
    key = (id(prepared), b_key, tuple(providers_b) if providers_b else None)
    with _LOCK:
        hit = _PAIRED.get(key)
        if hit is not None and hit.prepared is prepared:
            _PAIRED.move_to_end(key)
    if hit is not None and hit.prepared is prepared:
        return hit, None
    a_model = prepared.index.full_model()
    made = PairedModels(prepared, a_model, model, b_key, tuple(providers_b) if providers_b else None,
                        None, [], None)
    values_a, values_b = made.values_a(feeds), made.values_b(feeds)
    matching = match_models(a_model, model, values_a, values_b)
    plans = plan_values(_Graph(model), matching, values_a, values_b, _ops(a_model))
    rewired = rewire(model, matching, values_a, values_b)
    made = dataclasses.replace(made, matching=matching, plans=plans, rewired=rewired,
                               a_shapes={k: np.shape(v) for k, v in values_a.items()})
    with _LOCK:
        _PAIRED[key] = made
        while len(_PAIRED) > KEPT:
            _PAIRED.popitem(last=False)
    return made, (values_a, values_b)


def _ops(model: onnx.ModelProto) -> dict[str, str]:
    return {o: n.op_type for n in model.graph.node for o in n.output if o}


_LOADED: dict = {}


def _load(b) -> tuple[onnx.ModelProto, tuple]:
    """b as a ModelProto, and what identifies it: the file's path, size and time, or the object."""
    if isinstance(b, onnx.ModelProto):
        return load_onnx_model(b), (id(b),)  # (checked as every model from anyone: load/onnx_checks.py)
    if isinstance(b, (str, os.PathLike)):
        path = os.path.abspath(os.fspath(b))
        if not os.path.exists(path):
            raise InputError(f"b: no such file {os.fspath(b)!r}: pass the transformed ONNX model's path")
        st = os.stat(path)
        key = (path, st.st_size, st.st_mtime_ns)
        hit = _LOADED.get(path)
        if hit is None or hit[0] != key:
            hit = _LOADED[path] = (key, load_onnx_model(path))  # (checked; external data kept to its folder)
        return hit[1], key
    raise InputError(f"b: an onnx.ModelProto or a path to the transformed model, not {type(b).__name__}")
