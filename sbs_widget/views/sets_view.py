"""Input sets in an ``SbsWidget`` (project issue 50, item 4): ``SbsWidget.from_input_sets(ep, onx, sets)``
compares the pair on every input set (``steps.input_sets.compare_input_sets``) in the widget's background run,
then shows one row per aligned pair with its SPREAD across the inputs as columns of the table.

- The first run ("all inputs") is a ``Run`` whose records are, per pair in execution order, the record of its
  worst input (the largest ``err_abs``: the row's ``err_abs`` is the pair's max); each row carries the
  spread columns ``shared_rules.spread_columns()`` (``spread:err_abs_max``, ``spread:err_abs_median``,
  ``spread:n_beyond`` of ``spread:n_inputs``, ``spread:worst_input`` and its label, ``spread:input_dependent``)
  after the metrics in the encoded rows. The culprits panel lists the culprits grouped across the inputs
  (``count``: how many inputs name each, ``n_inputs``).
- ``show_input(k)`` (the view's input selector, or its "worst input" button on a selected row: message
  ``{"type": "input", "input": k}``) shows input ``k``'s own records as a new finished run (``Run.input``),
  its own culprits in the panel, the same spread columns on its rows; ``show_input(None)``: all inputs again.
- ``rerun()`` compares every input set again (with the reset set); ``w.input_sets`` is the ``InputSets``,
  ``w.spread_dataframe()`` its ``to_dataframe()``.

The ``input_spread`` trait (what js/sets.js draws, JSON-safe)::

    {"status": "running" | "done" | "error", "n_inputs": int, "labels": [str], "errors": [str | None],
     "n_input_dependent": int, "atol": float, "rtol": float}
"""

from __future__ import annotations

import os

from sbs_widget.errors import InputError, SbsError
from sbs_widget.shared_rules import MESSAGES, spread_columns
from sbs_widget.views.deployed_check import json_safe
from sbs_widget.views.rows import columns_of, encode_rows
from sbs_widget.views.view_state import culprits_state, finished_run

INPUT_MESSAGE = MESSAGES["input"]  # the view asks for an input's records: {"type": "input", "input": k | None}


def overview_records(sets) -> list:
    """Per pair of ``sets`` (execution order), the record of its worst input (else of the first input that
    compared it): the rows of the "all inputs" run."""
    by_input = [{(r.kind, r.ep_name, r.onnx_name): r for r in records} for records in sets.records]
    out = []
    for p in sets.pairs:
        order = ([p.worst_input] if p.worst_input is not None else []) + list(range(len(by_input)))
        rec = next((by_input[k][p.key] for k in order if p.key in by_input[k]), None)
        if rec is not None:
            out.append(rec)
    return out


def spread_values(sets):
    """``record -> [values of the spread columns]`` for the rows of any run of ``sets``."""
    pairs = {p.key: p for p in sets.pairs}

    def values(record) -> list:
        p = pairs.get((record.kind, record.ep_name, record.onnx_name))
        if p is None:
            return [None] * len(spread_columns())
        label = None if p.worst_input is None else sets.labels[p.worst_input]
        return [p.err_abs_max, p.err_abs_median, p.n_beyond, p.n_inputs, p.worst_input, label, p.input_dependent]

    return values


def sets_state(sets, status: str = "done", message: str = "") -> dict:
    """The ``input_spread`` trait of ``sets`` (None: still running)."""
    if sets is None:
        return {"status": status, "message": message}
    return json_safe({"status": status, "message": message, "n_inputs": len(sets), "labels": list(sets.labels),
                      "errors": list(sets.errors), "n_input_dependent": len(sets.input_dependent),
                      "atol": sets.atol, "rtol": sets.rtol})


def grouped_culprits_state(sets, records) -> list[dict]:
    """The culprits grouped across the inputs, as the panel lists them: each with ``i`` (its pair's row in
    ``records``, the "all inputs" run), ``count`` (inputs naming it), ``n_inputs`` and ``inputs``."""
    rows = {(r.kind, r.ep_name, r.onnx_name): i for i, r in enumerate(records)}
    by_value = {r.onnx_name: i for i, r in enumerate(records) if r.onnx_name}
    out = []
    for g in sets.culprits:
        base = g.culprit.to_dict() if hasattr(g.culprit, "to_dict") else {}
        i = rows.get((g.kind, g.ep_name, g.onnx_name), by_value.get(g.onnx_name))
        out.append(json_safe(dict(base, onnx_node=g.onnx_node, onnx_name=g.onnx_name, ep_name=g.ep_name,
                                  onnx_op_type=g.onnx_op_type, reason=g.reason, score=g.best_score, i=i,
                                  count=g.count, n_inputs=len(sets), inputs=list(g.inputs[:50]),
                                  best_rank=g.best_rank)))
    return out


def _reusable(input_sets):
    """Input sets a rerun can read again: a one-shot iterator (a generator) is read into a list."""
    if isinstance(input_sets, (str, os.PathLike)) or hasattr(input_sets, "__len__"):
        return input_sets
    if iter(input_sets) is input_sets:
        return list(input_sets)
    return input_sets


class InputSetsView:
    """Mixin of ``SbsWidget``: ``from_input_sets`` and the runs of an input-sets widget."""

    _sets_options: dict | None = None  # set by from_input_sets: the widget compares input sets
    _input_sets = None  # the InputSets of the last run that ended well

    @classmethod
    def from_input_sets(cls, ep, onx=None, input_sets=(), *, executor=None, max_workers: int | None = None,
                        culprits: bool = True, **options):
        """A view of ``ep`` and ``onx`` compared on every input set (``compare_input_sets``: ``input_sets``,
        ``executor``, ``max_workers`` (0: in this process), ``culprits`` as there), run in the background:
        one row per aligned pair with its spread across the inputs (max and median err_abs, how many inputs
        are beyond tolerance, the worst input), the input-dependent pairs marked, the culprits grouped.
        ``w.show_input(k)`` shows input ``k``'s own records as a run. ``options``: as for ``SbsWidget``
        (``atol``, ``rtol``, ``title``, ``runtime``, ``metrics``, ``node_local``, ``autostart``...)."""
        autostart = options.pop("autostart", True)
        if options.get("steps") is not None:
            raise InputError("steps= and input sets do not mix: decode one input, or compare many")
        w = cls(ep, onx, _reusable(input_sets), autostart=False, **options)
        w._sets_options = dict(executor=executor, max_workers=max_workers, culprits=culprits)
        w._run_sets = {}
        w.columns = columns_of(w._metric_names) + spread_columns()
        w.input_spread = sets_state(None, "idle")
        if autostart:
            w.rerun()
        return w

    # --- public API ------------------------------------------------------------------------------

    @property
    def input_sets(self):
        """The ``InputSets`` of the last comparison of the input sets that ended (None before, or for a
        widget not built by ``from_input_sets``)."""
        return self._input_sets

    def spread_dataframe(self):
        """One row per aligned pair with its spread across the inputs (``InputSets.to_dataframe``)."""
        if self._input_sets is None:
            import pandas

            return pandas.DataFrame()
        return self._input_sets.to_dataframe()

    def show_input(self, index: int | None):
        """Show input ``index``'s own records (and culprits) in the table as a new run (``None``: the rows of
        all inputs again); nothing new when the current run shows them already. Returns ``self``."""
        sets = self._input_sets
        if sets is None:
            raise InputError("no input sets compared yet: build the widget with SbsWidget.from_input_sets and "
                             "wait() for the run")
        if index is not None and (isinstance(index, bool) or not hasattr(index, "__index__")
                                  or not 0 <= index < len(sets)):
            raise InputError(f"input={index!r} does not exist: give 0 to {len(sets) - 1}, or None for all inputs")
        current = self._runs[-1] if self._runs else None
        if current is not None and current.finished and current.input == index and \
                self._run_sets.get(current.id) is sets:
            return self
        if self.running:
            self.stop()
        records = overview_records(sets) if index is None else sets.records[int(index)]
        run = finished_run(records, atol=sets.atol or self.atol, rtol=sets.rtol or self.rtol,
                           reset_names=current.reset_names if current is not None else ())
        run.id, run.input = len(self._runs), None if index is None else int(index)
        self._run_sets[run.id] = sets
        self._runs.append(run)
        self.run_id = run.id
        self._publish(run, final=True)
        return self

    # --- the run ---------------------------------------------------------------------------------

    def _start_sets_run(self, run, progress, cancel):
        """The "all inputs" run: every input set compared (``compare_input_sets``), then the worst record
        of each pair streamed as the run's records."""
        from sbs_widget.steps.input_sets import compare_input_sets

        opts = dict(self._sets_options)
        auto_atol, auto_rtol = self._default_tolerance
        extra = {} if self._runtime is None else {"runtime": self._runtime}
        if opts["executor"] is None and opts["max_workers"] == 0:
            extra["cancel"] = cancel  # in this process: Stop ends the input in flight and the rest at once
        if self._metrics is not None:
            extra["metrics"] = self._metrics
        self.input_spread = sets_state(None, "running", "comparing the input sets")
        if run is self._runs[-1] and self.status == "preparing":
            self.status = "running"

        def report(done: int, total: int | None) -> None:
            progress(done, total or 0, f"input set {done} of {total if total else '?'}")

        try:
            sets = compare_input_sets(self._ep, self._onx, self._args, atol=None if auto_atol else run.atol,
                                      rtol=None if auto_rtol else run.rtol, node_local=run.node_local,
                                      reset_names=tuple(sorted(run.reset_names)), progress=report, **opts, **extra)
        except Exception as e:
            self.input_spread = sets_state(None, "error", f"{type(e).__name__}: {e}")
            raise
        cancel.check("the input sets")
        if len(sets) and len(sets.failed) == len(sets):
            self.input_spread = sets_state(sets, "error", sets.errors[0] or "")
            raise SbsError(f"every input set failed; the first: {sets.errors[0]}")
        if sets.atol is not None:
            if any(self._default_tolerance):
                self._default_tolerance = (False, False)
                self.atol, self.rtol = sets.atol, sets.rtol
            run.atol, run.rtol = sets.atol, sets.rtol
        self._input_sets = sets
        self._run_sets[run.id] = sets
        self.input_spread = sets_state(sets)
        return iter(overview_records(sets))

    def _encode_rows(self, run, records) -> bytes:
        sets = self._run_sets.get(run.id) if self._sets_options is not None else None
        return encode_rows(records, self._metric_names, None if sets is None else spread_values(sets))

    def _update_culprits(self, run) -> None:
        sets = self._run_sets.get(run.id) if self._sets_options is not None else None
        if sets is not None:  # grouped across the inputs, or the input's own (found by its run already)
            self.culprits = grouped_culprits_state(sets, run.records) if run.input is None else \
                [dict(json_safe(c.to_dict()), i=c.record) for c in sets.culprits_per_input[run.input]]
            return
        if self._sets_options is not None:  # a failed or stopped comparison of the sets: none to show
            self.culprits = []
            return
        args, kwargs = self._inputs_of(run)
        self.culprits = culprits_state(run, self._prepared, None if self._ep is None else args, kwargs)

    def _on_input_message(self, content: dict) -> None:
        """The view's input selector: input ``k``'s records as a run (None: all inputs)."""
        if self._input_sets is None:
            return
        k = content.get("input")
        if k is None or (isinstance(k, int) and not isinstance(k, bool) and 0 <= k < len(self._input_sets)):
            self.show_input(k)  # anything else: a stale or malformed message, ignored
