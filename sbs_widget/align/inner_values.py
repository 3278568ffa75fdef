"""Why an ONNX value has no FX twin, said on its one-sided record.

Most ONNX-only values lie inside the translation of one FX node (``Alignment.fx_group``, from the
exporter's metadata): the exporter wrote several ONNX nodes for it and only the last has an FX twin.
Their records name that FX node and what kind of value they are, so that a reader of the table knows
they are compared through the translation's value (and, when it differs, searched by the culprit
finder's finer reference, ``blame/finer.py``), not forgotten.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:  # (pair.py imports the inner plan, which does not import this module)
    from sbs_widget.align.pair import Pair

# ONNX ops that only move, reshape or retype values: the value is the node's input rearranged
_LAYOUT = {"Transpose", "Reshape", "Cast", "CastLike", "Expand", "Unsqueeze", "Squeeze", "Concat", "Slice",
           "Gather", "Identity", "Flatten", "Split", "Shape", "Size", "Range", "ConstantOfShape", "Tile", "Pad"}


def onnx_only_reasons(pair: Pair) -> dict[int, str]:
    """ONNX node index -> the reason its values have no FX twin, for the nodes inside a translation
    (the engine keeps it per pair: ``engine/record_plan.only_onnx_reasons``)."""
    index, al = pair.index, pair.alignment
    targets = {n.name: n.target for n in pair.fx_nodes}
    reasons: dict[int, str] = {}
    for fx, nodes in al.fx_group.items():
        target = targets.get(fx)
        what = getattr(target, "__name__", None) or str(target or "")
        for i in nodes:
            op = index.op_types[i]
            kind = "a layout or type step" if op in _LAYOUT else "a partial value"
            reasons.setdefault(i, f"ONNX only: {kind} ({op}) inside the translation of FX node {fx!r} ({what}), "
                                  "compared through that node's value")
    return reasons
