"""What the culprit finder answers: a ``Culprit`` (a place where an error originates, with one sentence
saying why) and ``Culprits``, the list of them (most likely first) that says when nothing could be
judged."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass


@dataclass
class Culprit:
    """A place where an error originates, with one sentence saying why.

    ``onnx_node``/``onnx_op_type``: the ONNX node to look at (for a weight: its first consumer, op
    type ``initializer``); ``onnx_name``: the ONNX value (or initializer); ``ep_*``/``module``: its
    torch twin. ``score`` in [0, 1]: how strongly the signals say the error starts here.
    ``record``: index of the record in the list given to ``find_culprits``.
    """

    onnx_node: str | None
    onnx_name: str | None
    onnx_op_type: str | None
    ep_name: str | None
    ep_target: str | None
    module: str
    score: float
    reason: str
    kind: str = "node"          # node, weight, cast, first-divergence
    record: int | None = None
    err_abs: float | None = None
    err_local: float | None = None
    value: str | None = None    # the compared ONNX value whose node (or group) reproduces it: see repro

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Culprits(list):
    """The culprits found (a list, most likely first). ``cannot_judge``: a sentence when none was found
    because nothing could be judged (the pairs compared no finite element: all-NaN inputs), None
    otherwise: then an empty list means no node creates a difference."""

    cannot_judge: str | None = None
