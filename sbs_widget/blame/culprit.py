"""What the culprit finder answers: a ``Culprit`` (a place where an error originates, with one sentence
saying why) and ``Culprits``, the list of them (most likely first) that says when nothing could be
judged."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field


@dataclass
class Culprit:
    """A place where an error originates, with one sentence saying why.

    ``onnx_node``/``onnx_op_type``: the ONNX node to look at; ``onnx_name``: the ONNX value it
    computes; ``ep_*``/``module``: its torch twin. ``score`` in [0, 1]: how strongly the signals say
    the error starts here. ``record``: index of the record in the list given to ``find_culprits``.

    Some fields mean something else with ``kind``:

    - ``weight``: ``onnx_name`` is the initializer that differs, ``onnx_node`` its *first reader*
      (the first ONNX node reading it, None when nothing does), ``onnx_op_type`` is ``initializer``;
    - ``cast``: ``onnx_node`` is the precision-losing Cast node and ``onnx_name`` the value it *reads*
      (the one to keep in the wider type), not the value it writes;
    - ``node`` found inside a translation: ``onnx_node`` is the node computing the difference and
      ``onnx_name`` its output; ``value`` is always the compared value (``repro`` cuts its group).

    ``group``: the ONNX-only nodes computed with the culprit's value (its translation's other nodes,
    those that compute first), all of them: the reason names three at most.
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
    group: list[str] = field(default_factory=list)  # the ONNX-only nodes computed with it (all)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


class Culprits(list):
    """The culprits found (a list, most likely first). ``cannot_judge``: a sentence when none was found
    because nothing could be judged (the pairs compared no finite element: all-NaN inputs), None
    otherwise: then an empty list means no node creates a difference. ``verdict``: with no culprit,
    the run's one-line verdict (``engine.summary.verdict_line``): the outputs agree within tolerance,
    or they differ beyond it by rounding only, from the node named; None otherwise."""

    cannot_judge: str | None = None
    verdict: str | None = None
