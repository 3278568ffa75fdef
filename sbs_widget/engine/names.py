"""Names a user gives (to reset, to look at) resolved to the ONNX values they stand for."""

from __future__ import annotations

import difflib
from typing import Iterable

from sbs_widget.align.pair import Pair
from sbs_widget.errors import InputError


def resolve_names(pair: Pair, names: Iterable[str]) -> dict[str, str]:
    """Map names given by a user (FX node names, ONNX value names, ``fx::finer`` names of inner values)
    to ONNX values; a name that is none of them, or names a value no node computes, raises
    ``InputError`` saying what to use instead."""
    index, alignment = pair.index, pair.alignment
    out: dict[str, str] = {}
    if isinstance(names, str):  # one name, not its characters
        names = (names,)
    fx_to_onnx = {k: p.onnx_value for k, p in alignment.pairs.items()}
    fx_to_onnx.update({f"{p.fx}::{p.finer}": v for v, p in pair.inner.pairs.items()})
    for name in names:
        if (name in alignment.onnx_to_fx or name in pair.inner.pairs) and name in index.producer:
            out[name] = name
        elif name in fx_to_onnx and fx_to_onnx[name] in index.producer:
            out[name] = fx_to_onnx[name]
        elif fx_to_onnx.get(name, name) in index.initializers or name in index.inputs:
            value = fx_to_onnx.get(name, name)
            readers = [index.node_outputs[i][0] for i in index.consumers.get(value, [])
                       if index.node_outputs[i] and index.node_outputs[i][0] in alignment.onnx_to_fx]
            hint = f"; reset what reads it instead: {', '.join(readers[:5])}" if readers else ""
            kind = "a model input" if name in index.inputs else "an initializer (a weight or a constant " \
                "the exporter folded)"
            raise InputError(f"cannot reset {name!r}: its ONNX value {value!r} is {kind}, not computed by a "
                             f"node{hint}")
        else:
            known = dict.fromkeys(list(alignment.onnx_to_fx) + list(fx_to_onnx))  # (each name once)
            close = difflib.get_close_matches(name, known, n=3)
            hint = f"; did you mean {', '.join(close)}?" if close else ""
            raise InputError(
                f"cannot reset {name!r}: it is neither an FX node nor an ONNX value computed by a node "
                f"with a torch twin or a finer torch reference{hint}"
            )
    return out
