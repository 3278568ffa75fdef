"""A lockstep run is made of parts, each owning one thing: the FX side its torch values, the ONNX side
its values and sessions, the measurer the comparison, the judge the verdicts, the node-local runs and
the inner values their extra ONNX runs. ``RunState`` (``run_state.py``) holds what they know between
two records. ``build_parts`` wires them for one run; ``lockstep.py`` steps them."""

from __future__ import annotations

import dataclasses
from typing import Callable

import torch

from sbs_widget.engine.cancel import Cancel
from sbs_widget.engine.fx_side import FxSide
from sbs_widget.engine.inner_run import InnerValues
from sbs_widget.engine.local_runs import LocalRuns
from sbs_widget.engine.measure import Measurer
from sbs_widget.engine.onnx_side import OnnxSide
from sbs_widget.engine.prepared import SEGMENT_NODES, PreparedPair
from sbs_widget.engine.run_state import JudgeState, OnnxState, RunState
from sbs_widget.engine.runtimes import Runtime, capabilities
from sbs_widget.engine.second_model import SecondModel
from sbs_widget.engine.tolerance import Tolerance
from sbs_widget.engine.user_metrics import Figure
from sbs_widget.engine.verdicts import Judge

Progress = Callable[[int, int, str], None]


@dataclasses.dataclass(frozen=True)
class RunOptions:
    """What a run is asked to do (``run_aligned`` documents each)."""

    tolerance: Tolerance
    reset: frozenset[str] = frozenset()  # ONNX values downstream nodes read from torch
    node_local: bool = False
    exc: bool = False
    progress: Progress | None = None
    histogram: bool = True
    reference: bool = True  # pairs beyond tolerance judged noise or mismatch (verdicts.py)
    segment_nodes: int = SEGMENT_NODES
    keep_sessions: bool = True
    keep_cuts: int | None = None  # bytes kept for a rerun to restart from (restart.py)
    figures: tuple[Figure, ...] = ()  # metrics beside the verdict (user_metrics.py)
    second: SecondModel | None = None  # a second ONNX model measured beside the first (second_model.py)

    def restart_key(self) -> tuple:
        """The options a rerun must share with a run to restart from its cuts (the reset set aside)."""
        return (self.tolerance.atol, self.tolerance.rtol, self.node_local, self.histogram, self.reference,
                self.segment_nodes, self.exc, self.figures, self.second.token if self.second is not None else None)


@dataclasses.dataclass
class RunParts:
    p: PreparedPair
    flat: list  # the run's inputs, flattened as the program's placeholders
    options: RunOptions
    cancel: Cancel
    fx: FxSide
    onnx: OnnxSide
    measurer: Measurer
    judge: Judge
    local: LocalRuns
    inner: InnerValues
    state: RunState


def build_parts(p: PreparedPair, flat: list, runtime: Runtime, options: RunOptions, device: torch.device,
                cancel: Cancel) -> RunParts:
    fx = FxSide(p, device, cancel)
    state = RunState(fx.state, OnnxState(), JudgeState())
    onnx = OnnxSide(p, runtime, capabilities(runtime), cancel, state.onnx, fx.env)
    measurer = Measurer(options.tolerance, options.histogram, options.figures, options.exc, options.second)
    judge = Judge(p, flat, state.judged, fx.env, state.onnx.env, options.reset)
    local = LocalRuns(p, onnx, fx.env, measurer)
    inner = InnerValues(p, onnx, local, measurer, judge)
    return RunParts(p, flat, options, cancel, fx, onnx, measurer, judge, local, inner, state)
