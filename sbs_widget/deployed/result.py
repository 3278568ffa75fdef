"""What ``check_deployed`` returns: the verdict, the errors of both runs, the cause, the sessions used."""

from __future__ import annotations

import dataclasses
from typing import Callable

import numpy as np
import torch

from sbs_widget.engine.noise import epsilon, judge, largest

VERDICTS = ("same", "optimizer", "session-option", "provider", "export")
MARGIN = 2.0  # a deployed run is worse only when its error is over twice the as-written one's

RULE = ("the deployed run is at fault when some output's error, measured in tolerances "
        "(max |diff| / (atol + rtol * |torch|)), is over 1, over 2x the as-written run's, and beyond rounding "
        "(the lockstep's noise rule, engine/noise.py: its distance to the program run in float64 exceeds what "
        "torch's own rounding explains); the as-written run is at fault (verdict export) when beyond tolerance "
        "and beyond rounding. Rounding is not a bug")


@dataclasses.dataclass
class OutputError:
    """One output of one run against torch."""

    name: str
    max_abs: float
    max_rel: float
    ratio: float  # max |diff| / (atol + rtol * |torch|): 1 is the tolerance
    # beyond tolerance: whether rounding explains it (engine/noise.py against the program in float64);
    # None: within tolerance, or no float64 reference
    noise: bool | None = None

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class Step:
    """One attribution session: what it ran and whether the difference was still there."""

    what: str
    setting: str
    differs: bool
    ratio: float


@dataclasses.dataclass
class FusedNode:
    """A node the guilty transformer created, and the original nodes it replaced."""

    name: str
    op_type: str
    replaced: list[str]


@dataclasses.dataclass
class Location:
    """Where in the deployed graph the difference starts (``locate.py``)."""

    value: str | None  # the first surviving value beyond tolerance and rounding (ONNX name as written)
    fx_name: str | None  # its FX twin
    node: str | None  # the deployed graph's node computing it
    op_type: str | None
    ratio: float  # its error against torch, in tolerances
    inputs: list[str]  # that node's inputs in the deployed graph
    survivors: int  # values as written that the deployed graph still computes (and were compared)
    vanished: int  # values with an FX twin that the deployed graph no longer computes
    vanished_names: list[str]  # the first of them
    note: str = ""

    def describe(self) -> str:
        if self.value is None:
            return self.note
        return (f"{self.value} (FX {self.fx_name}), computed by {self.op_type} '{self.node}' in the deployed graph: "
                f"{self.note}; {self.survivors} surviving values compared, {self.vanished} vanished into fused nodes")


@dataclasses.dataclass
class Cause:
    kind: str  # one of VERDICTS past "same"
    level: str | None = None  # first optimization level showing the difference
    transformers: list[str] = dataclasses.field(default_factory=list)  # the smallest set found
    config: list[tuple[str, str]] = dataclasses.field(default_factory=list)
    provider: str | None = None
    note: str = ""

    def describe(self) -> str:
        if self.kind == "optimizer":
            named = f"transformer(s) {', '.join(self.transformers)}" if self.transformers else "its transformers"
            return f"optimization level {self.level}: {named}" + (f" ({self.note})" if self.note else "")
        if self.kind == "session-option":
            entries = ", ".join(f"{k}={v}" for k, v in self.config)
            return f"session config {entries}" if entries else self.note
        if self.kind == "provider":
            return f"provider {self.provider}"
        return self.note


@dataclasses.dataclass
class DeployedResult:
    verdict: str
    deployed: str  # the deployed setting, in words
    written_errors: list[OutputError]
    deployed_errors: list[OutputError]
    sessions: int
    cause: Cause | None = None
    steps: list[Step] = dataclasses.field(default_factory=list)
    fused: list[FusedNode] = dataclasses.field(default_factory=list)
    located: Location | None = None
    repro: str | None = None  # the folder of the repro bundle, when one was written
    atol: float = 0.0
    rtol: float = 0.0
    seconds: float = 0.0
    rule: str = RULE

    def summary(self) -> str:
        lines = [f"verdict: {self.verdict} (deployed as {self.deployed})"]
        for title, errors in (("as written", self.written_errors), ("as deployed", self.deployed_errors)):
            worst = max(errors, key=lambda e: e.ratio, default=None)
            if worst is not None:
                lines.append(f"{title}: worst output {worst.name}: max abs {worst.max_abs:.3g}, max rel "
                             f"{worst.max_rel:.3g}, {worst.ratio:.3g} x tolerance"
                             + {True: " (rounding: as close to the float64 program as torch)",
                                False: " (beyond rounding)"}.get(worst.noise, ""))
        if self.cause is not None:
            lines.append(f"cause: {self.cause.describe()}")
        for f in self.fused[:10]:
            lines.append(f"fused node {f.name} ({f.op_type}) replaced {', '.join(f.replaced) or '?'}")
        if self.located is not None:
            lines.append(f"starts at: {self.located.describe()}")
        if self.repro:
            lines.append(f"repro: {self.repro} (python {self.repro}/replay.py)")
        lines.append(f"sessions: {self.sessions} whole-model sessions ({len(self.steps)} attribution steps), "
                     f"{self.seconds:.1f} s; atol={self.atol:g}, rtol={self.rtol:g}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def output_errors(names: list[str], expected: list[torch.Tensor], got: list[np.ndarray], atol: float,
                  rtol: float, references: Callable[[], list] | None = None) -> list[OutputError]:
    """Each output against torch; NaN on one side only, or another shape, counts as infinitely far.
    ``references()``: the outputs of the program run in float64 (asked for only when an output is beyond
    tolerance), for the noise verdict of those."""
    errors = _errors(names, expected, got, atol, rtol)
    if references is not None and any(e.ratio > 1.0 for e in errors):
        exact = references()
        for i, e in enumerate(errors):
            if e.ratio > 1.0 and i < len(exact) and exact[i] is not None:
                e.noise = rounding(expected[i], got[i], exact[i])
    return errors


def rounding(t: torch.Tensor, a: np.ndarray, exact: torch.Tensor) -> bool | None:
    """Whether ``a`` is as close to ``exact`` as torch's ``t`` is, by the lockstep's rule."""
    if not t.dtype.is_floating_point or tuple(a.shape) != tuple(t.shape) or a.dtype.kind == "V":
        return None
    return bool(judge(t.detach().cpu(), a, exact, epsilon(t), largest(t)).noise)


def _errors(names, expected, got, atol, rtol) -> list[OutputError]:
    errors = []
    for name, t, a in zip(names, expected, got):
        t = t.detach().cpu()
        if a.dtype.kind == "V":  # bfloat16 / float8: float32 holds them exactly
            a = a.astype(np.float32)
        o = torch.from_numpy(np.ascontiguousarray(a)).to(torch.float64)
        t = t.to(torch.float64)
        if o.shape != t.shape:
            errors.append(OutputError(name, float("inf"), float("inf"), float("inf")))
            continue
        if t.numel() == 0:
            errors.append(OutputError(name, 0.0, 0.0, 0.0))
            continue
        nan_t, nan_o = torch.isnan(t), torch.isnan(o)
        diff = (o - t).abs()
        same_inf = torch.isinf(t) & (o == t)
        diff = torch.where(nan_t & nan_o, 0.0, torch.where(nan_t ^ nan_o, float("inf"), diff))
        diff = torch.where(same_inf, 0.0, diff)
        scale = t.abs().nan_to_num(0.0, posinf=0.0)
        # relative to nonzero torch values only: a zero one says nothing relative (atol covers it)
        rel = torch.where(scale > 0, diff / scale.clamp_min(torch.finfo(torch.float64).tiny), 0.0)
        ratio = diff / (atol + rtol * scale) if atol + rtol > 0 else torch.where(diff > 0, float("inf"), 0.0)
        errors.append(OutputError(name, float(diff.max()), float(rel.max()), float(ratio.max())))
    return errors


def worst(errors: list[OutputError]) -> float:
    return max((e.ratio for e in errors), default=0.0)


def worse(errors: list[OutputError], written: list[OutputError]) -> bool:
    """The rule (``RULE``): per output, beyond tolerance, beyond ``MARGIN`` x the as-written error, and
    not rounding."""
    return any(e.ratio > 1.0 and e.ratio > MARGIN * w.ratio and not e.noise for e, w in zip(errors, written))


def wrong_as_written(written: list[OutputError]) -> bool:
    """The export itself differs: an output beyond tolerance that rounding does not explain."""
    return any(e.ratio > 1.0 and not e.noise for e in written)
