"""What a run amounts to: pairs compared, coverage of the user's program, worst pair, first pair
beyond tolerance. Used by the CLI (``compare``, ``demo``) and the benchmarks; the widget keeps its own
per-run counts as records arrive (``views/runs.py``, ``Run.summary``)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch

from sbs_widget import records as R
from sbs_widget.align.fx_graph import dead_nodes
from sbs_widget.align.user_program import value_holder
from sbs_widget.records import Record
from sbs_widget.safe_text import clipped, visible

if TYPE_CHECKING:
    from sbs_widget.engine.prepared import PreparedPair

_COMPARED = (R.OK, R.NOISE, R.MISMATCH, R.RESET)


@dataclass
class Summary:
    n_records: int = 0
    n_compared: int = 0
    by_status: dict = field(default_factory=dict)
    coverage: float | None = None          # share of the user program's nodes compared
    covered: int = 0
    coverable: int = 0
    uncovered: list = field(default_factory=list)
    explained: int = 0                     # uncovered, with a record saying why (one-sided, its reason)
    folded: int = 0                        # uncovered because constant-folded: absent from the ONNX graph
    fused: int = 0                         # uncovered because fused into a rewritten node: absent too
                                           # (taken in whole, or its end: ``Alignment.absorbed``; or empty)
    worst: Record | None = None
    first_beyond: Record | None = None     # the first pair beyond tolerance and beyond rounding
    n_noise: int = 0                       # pairs beyond tolerance by rounding alone
    exactness: list = field(default_factory=list)  # output records measured against a float64 run
    no_kernel: dict = field(default_factory=dict)  # op type -> nodes the runtime has no kernel for
    notes: list = field(default_factory=list)      # what limits the comparison (Prepared.notes)
    n_nothing_finite: int = 0              # pairs with elements, none of them finite on both sides
    nothing_judged: str | None = None      # said first: the verdicts judged (next to) nothing (records.py)
    program_mismatch: str | None = None    # said first: the ONNX model comes from another program
    first_noise: Record | None = None      # the first pair beyond tolerance by rounding (execution order)
    n_mismatch: int = 0                    # pairs beyond tolerance and beyond rounding (weights included)
    n_error: int = 0                       # values one side failed to produce
    output_err: float | None = None        # the largest error of the outputs beyond tolerance by rounding

    @property
    def verdict(self) -> str | None:
        """One line saying what the run amounts to (None where a warning says it cannot be trusted):
        ``verdict_line(...)`` on this summary's counts."""
        if self.program_mismatch or self.nothing_judged:
            return None
        return verdict_line(self)

    @property
    def coverage_of_present(self) -> float | None:
        """Coverage of the nodes whose value exists in the ONNX graph (neither constant-folded nor
        fused into a node the optimizer rewrote)."""
        denominator = self.coverable - self.folded - self.fused
        return self.covered / denominator if denominator > 0 else None

    def lines(self) -> list[str]:
        """The summary as printable lines (control and bidi characters in names shown escaped)."""
        out = [f"WARNING: {text}" for text in (self.program_mismatch, self.nothing_judged) if text]
        out.extend([self.verdict] if self.verdict else [])  # first: what the run amounts to
        out.append(f"records: {self.n_records}, pairs compared: {self.n_compared} "
                   f"({', '.join(f'{k} {v}' for k, v in sorted(self.by_status.items()))})")
        if self.n_nothing_finite and not self.nothing_judged:
            out.append(f"{self.n_nothing_finite} pair(s) compared no finite value (NaN/Inf on both sides at every "
                       "position): their status says the NaN/Inf agree, nothing more")
        if self.coverage is not None:
            unaccounted = self.coverable - self.covered - self.explained
            line = (f"coverage: {self.coverage:.1%} of the program's {self.coverable} value-producing "
                    f"call_function nodes compared ({self.covered})")
            if self.explained:
                line += (f"; {self.explained} explained without a comparison ({self.folded} constant-folded, "
                         f"{self.fused} fused into other nodes or dropped (empty) by the ONNX optimizer, the others "
                         "no-ops or values the exporter's decomposition removed: see their one-sided records)")
            out.append(line + (f"; {unaccounted} unaccounted" if unaccounted else ""))
        if self.worst is not None:
            w = self.worst
            out.append(f"worst pair: {_n(w.ep_name)} / {_n(w.onnx_name)} ({w.onnx_op_type}) err_abs={w.err_abs:.3g}")
        if self.first_beyond is not None:
            f = self.first_beyond
            out.append(f"first pair beyond tolerance: {_n(f.ep_name)} / {_n(f.onnx_name)} ({f.onnx_op_type}, "
                       f"module {_n(f.module) or '-'}) err_abs={f.err_abs:.3g}"
                       + (f", beyond tolerance at {f.err_where}" if f.err_where else ""))
        elif self.n_noise:
            out.append("no pair beyond tolerance but by rounding")
        else:
            out.append("no pair beyond tolerance")
        if self.n_noise:
            out.append(f"{self.n_noise} pair(s) differ by rounding alone (status noise: onnxruntime as close to "
                       "exact, a float64 rerun, as torch)")
        for r in self.exactness:
            closer = "onnxruntime" if r.err_onnx < r.err_torch else "torch" if r.err_torch < r.err_onnx else "neither"
            out.append(f"{_n(r.ep_name)} against the program run in float64: torch {r.err_torch:.3g}, onnxruntime "
                       f"{r.err_onnx:.3g} ({closer} closer to exact; scale {r.ref_scale:.3g})")
        if self.no_kernel:
            ops = ", ".join(f"{op} ({n})" for op, n in sorted(self.no_kernel.items(), key=lambda kv: -kv[1]))
            out.append(f"the runtime has no kernel for {sum(self.no_kernel.values())} node(s): {ops}; their "
                       "downstream nodes read the torch values. onnxruntime's CPU provider lacks most "
                       "bfloat16 kernels: compare on CUDA inputs or with runtime 'onnx.reference' "
                       "(CLI: --runtime onnx.reference)")
        out.extend(f"note: {n}" for n in self.notes if n != self.program_mismatch)
        return [visible(line) for line in out]  # lines for a terminal: names may hold ESC or bidi codes


def _n(name) -> str:
    # a name in a terminal line: a 100k-character one would bury the summary
    return clipped(name) if isinstance(name, str) else str(name)


def verdict_line(s: Summary) -> str | None:
    """The one-line verdict: a clean run says so ("outputs agree within tolerance; 0 culprits"); one
    whose pairs beyond tolerance all differ by rounding says by how much and where it starts."""
    if s.n_mismatch or not s.n_compared:
        return None  # the culprits (and the first pair beyond tolerance) say where it starts
    failed = f"; {s.n_error} value(s) could not be computed on one side (status error)" if s.n_error else ""
    first_noise = s.first_noise
    if first_noise is None:
        return "outputs agree within tolerance; 0 culprits" + failed
    where = f"node {_n(first_noise.ep_name or first_noise.onnx_name)}"
    if first_noise.onnx_node_name:
        where += f" ({first_noise.onnx_op_type} {_n(first_noise.onnx_node_name)})"
    head = f"outputs differ by {s.output_err:.3g} beyond tolerance" if s.output_err is not None else \
        f"outputs agree within tolerance; {s.n_noise} value(s) inside differ beyond it"
    return (f"{head}, by rounding only (float64 reference: torch and onnxruntime equally close), starting at "
            f"{where}; 0 culprits" + failed)


def run_verdict(records) -> str | None:
    """``verdict_line`` for a list of records (None: pairs beyond rounding, or nothing compared)."""
    return summarize(list(records)).verdict


def coverable_nodes(program: torch.export.ExportedProgram) -> list[str]:
    """call_function nodes whose value is a tensor or a number and reaches an output (tuple-valued
    nodes are covered through their getitem nodes). A dead node, one no output depends on (an
    LSTM's unused final states), is left out: the exporter writes no ONNX node for it."""
    from sbs_widget.align.pairs import is_scalar

    dead = dead_nodes(program.graph)
    out = []
    for n in program.graph.nodes:
        if n.op != "call_function" or n.name in dead:
            continue
        val = n.meta.get("val")
        if isinstance(val, torch.Tensor) or is_scalar(val):
            out.append(n.name)
    return out


def summarize(records: list[Record], prepared: PreparedPair | None = None) -> Summary:
    s = Summary(n_records=len(records))
    for r in records:
        s.by_status[r.status] = s.by_status.get(r.status, 0) + 1
        if r.status in _COMPARED and r.err_abs is not None:
            s.n_compared += 1
            if r.status != R.RESET and (s.worst is None or r.err_abs > (s.worst.err_abs or 0)):
                s.worst = r
            if r.status == R.MISMATCH and s.first_beyond is None:
                s.first_beyond = r
            noise = r.status == R.NOISE or (r.status == R.RESET and r.noise is True)
            s.n_noise += noise
            if noise and s.first_noise is None and r.kind != R.KIND_WEIGHT:
                s.first_noise = r
            if noise and r.kind == R.KIND_OUTPUT and math.isfinite(r.err_abs):
                s.output_err = max(s.output_err or 0.0, r.err_abs)
            if r.kind == R.KIND_OUTPUT and r.err_torch is not None and r.err_onnx is not None:
                s.exactness.append(r)
        if r.status == R.MISMATCH or (r.status == R.RESET and r.within_tolerance is False and r.noise is not True):
            s.n_mismatch += 1
        s.n_error += r.status == R.ERROR
        if r.status == R.ERROR and "NOT_IMPLEMENTED" in (r.comment or ""):
            s.no_kernel[r.onnx_op_type] = s.no_kernel.get(r.onnx_op_type, 0) + 1
    s.n_nothing_finite = R.finite_counts(records)[0]
    s.nothing_judged = R.nothing_judged(records)
    if prepared is not None:
        s.notes = list(prepared.notes)
        s.program_mismatch = getattr(prepared, "program_mismatch", None)
        s.covered, s.coverable, s.uncovered = coverage(records, prepared)
        s.coverage = s.covered / s.coverable if s.coverable else None
        folded_fx = {r.ep_name for r in records if r.status == R.ONE_SIDED and "constant-folded" in (r.comment or "")}
        folded_into = prepared.index.folded_into()
        folded_fx |= {w.placeholder for w in prepared.alignment.weights if w.onnx_name is None and w.key in folded_into}
        al = prepared.alignment
        # (an empty value, a no-op on an input: nothing to compare)
        fused_fx = al.fused_into.keys() | al.absorbed.keys() | al.empty | al.of_input.keys()
        holder = value_holder(prepared)
        named = {r.ep_name for r in records} | {r.ep_origin for r in records}
        s.explained = sum(1 for n in s.uncovered if n in named or holder(n) in named)
        for n in s.uncovered:
            held_by = holder(n)
            if n in folded_fx or held_by in folded_fx:
                s.folded += 1
            elif n in fused_fx or held_by in fused_fx:
                s.fused += 1
    return s


def coverage(records: list[Record], prepared: PreparedPair) -> tuple[int, int, list[str]]:
    """Covered / coverable nodes of the user's program (the decomposed one when the user handed over
    the ONNXProgram). A user node is covered when the last decomposed node coming from it, the one that
    holds its value, was compared. Dead nodes (no path to an output) are not counted."""
    compared = {r.ep_name for r in records if r.status in _COMPARED and r.kind in (R.KIND_NODE, R.KIND_OUTPUT)}
    if prepared.user_ep is not None:
        compared |= {r.ep_name for r in records if r.status in _COMPARED and r.kind in (R.KIND_INPUT, R.KIND_WEIGHT)}
    holder = value_holder(prepared)
    names = coverable_nodes(prepared.user_ep if prepared.user_ep is not None else prepared.decomposed_ep)
    hit = [n for n in names if holder(n) in compared]
    return len(hit), len(names), [n for n in names if holder(n) not in compared]
