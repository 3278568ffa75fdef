"""The state a view of comparison runs shows (progress, runs, the comparison of the last two, the
culprits), worked out from the runs alone: the live widget publishes it, the offline report writes it."""

from __future__ import annotations

import warnings
from typing import TYPE_CHECKING

from sbs_widget.errors import SbsWidgetWarning
from sbs_widget.records import metric_names
from sbs_widget.views.rows import columns_of, compare_runs
from sbs_widget.views.runs import DONE, RUNNING, Run

if TYPE_CHECKING:
    from sbs_widget.engine.entry import Prepared


def progress_state(run: Run, prepared: Prepared, n_rows: int) -> dict:
    """How far ``run`` is (``prepared`` gives the totals while the run has not counted them)."""
    fx_total = run.fx_total or getattr(prepared, "n_fx_nodes", 0) or 0
    fx_done = fx_total if run.status == DONE and fx_total else run.fx_done
    eta = None
    if run.status == RUNNING and fx_done and fx_total > fx_done:
        eta = run.elapsed * (fx_total - fx_done) / fx_done
    elapsed = None if run.elapsed is None else round(run.elapsed, 3)  # None: records computed elsewhere
    summary = run.summary()
    return {
        "run": run.id,
        "atol": run.atol,  # the run's own tolerances: the view recolors against them exactly
        "rtol": run.rtol,
        "n_rows": n_rows,
        "fx_done": fx_done,
        "fx_total": fx_total,
        "onnx_done": len(run.onnx_nodes_seen),
        "onnx_total": getattr(prepared, "n_onnx_nodes", 0) or 0,
        "current": run.current,
        "elapsed": elapsed,
        "eta": None if eta is None else round(eta, 2),
        "counts": dict(run.counts),
        "worst": summary["worst_err"],
        "worst_name": summary["worst_name"],
        "worst_i": run.worst_i,
        "finished": run.finished,
        "step": run.step,  # a decode step's lockstep (views/steps_view.py), else None
    }


def compare_state(runs: list[Run], atol: float, rtol: float) -> dict:
    """The latest run against the one before it; empty with fewer than two runs."""
    return compare_runs(runs[-2], runs[-1], atol, rtol) if len(runs) >= 2 else {}


def culprits_state(run: Run, prepared: Prepared, inputs=None, kwargs=None) -> list[dict]:
    """The culprits of ``run`` as the view lists them (each with ``i``, its record's index); with the
    run's ``inputs``, those inside a translation are located by torch's decomposition (``blame/finer``)."""
    from sbs_widget.blame.culprits import find_culprits
    from sbs_widget.blame.finer import refine_culprits

    try:
        found = find_culprits(run.records, prepared=prepared, atol=run.atol, rtol=run.rtol)
        if inputs is not None and prepared is not None:
            found = refine_culprits(found, prepared, inputs, kwargs, run.atol, run.rtol)
    except Exception as e:  # a failed culprit search must not cost the comparison
        warnings.warn(f"culprits unavailable: {type(e).__name__}: {e}", SbsWidgetWarning, stacklevel=2)
        found = []
    return [dict(c.to_dict(), i=c.record) for c in found]


def finished_run(records, *, atol: float, rtol: float, reset_names=()) -> Run:
    """A ``Run`` holding records computed elsewhere (a saved run, the CLI): its time is the records'
    own (torch's and onnxruntime's), None when they hold none (never "0 ms")."""
    run = Run(id=0, reset_names=frozenset(reset_names), atol=atol, rtol=rtol)
    seconds = 0.0
    for r in records:
        run.add(r)
        seconds += sum(t for t in (r.ep_time_run, r.onnx_time_run) if t)
    run.status = DONE
    run.elapsed = seconds or None
    return run


def runs_metrics(runs: list[Run]) -> list[str]:
    """The metric names the records of ``runs`` carry, in the order they first appear (their columns)."""
    return metric_names(r for run in runs for r in run.records)


def view_state(runs: list[Run], *, title: str, atol: float, rtol: float, reset_names=(), fx_dot: str = "",
               onnx_dot: str = "", prepared: Prepared | None = None, message: str = "", deployed: dict | None = None,
               culprits: list[dict] | None = None, decoding: dict | None = None) -> dict:
    """Everything a view shows of ``runs`` once the last one ended (``deployed``: the as-deployed check's
    state, ``SbsWidget.deployed``; ``culprits``: as the widget listed them, else found from the last
    run's records; ``decoding``: the decode steps, ``SbsWidget.decoding``)."""
    last = runs[-1]
    if culprits is None:
        culprits = culprits_state(last, prepared) if last.status == DONE else []
    return {
        "title": title, "status": last.status, "message": message or last.error,
        "progress": progress_state(last, prepared, len(last.records)), "run_id": last.id,
        "runs_meta": [r.summary() for r in runs], "compare": compare_state(runs, atol, rtol),
        "columns": columns_of(runs_metrics(runs)), "atol": atol, "rtol": rtol, "reset_names": sorted(reset_names),
        "fx_dot": fx_dot, "onnx_dot": onnx_dot, "deployed": dict(deployed or {}), "culprits": list(culprits),
        "decoding": dict(decoding or {}),
    }
