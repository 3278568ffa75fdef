"""``SbsWidget``: the live notebook view of a comparison (progress, diff table, reset panel, export).

The comparison runs in a background thread so the cell returns at once. Everything a view needs to
redraw itself lives in the model: small state in traits, rows served on request (``get_rows``) and
pushed in batches while a run streams. A view opened later, or after a page reload, asks for the rows
it lacks; nothing depends on a message sent before it existed.
"""

from __future__ import annotations

import pathlib
import threading
import time
import warnings
from typing import TYPE_CHECKING

import anywidget
import traitlets

from sbs_widget.engine.cancel import check_time_limit
from sbs_widget.engine.tolerance import DEFAULT_ATOL, DEFAULT_RTOL, checked, valid_tolerance
from sbs_widget.errors import SbsError, SbsWidgetWarning
from sbs_widget.records import metric_names, to_dataframe
from sbs_widget.shared_rules import MESSAGES
from sbs_widget.views.deployed_check import CHECK_DEPLOYED, DeployedCheck, setting_of
from sbs_widget.views.fallback import StaticFallback
from sbs_widget.views.models_view import TwoModelsView
from sbs_widget.views.rows import ROW_COLUMNS, columns_of, run_metrics
from sbs_widget.views.runs import FAILED, RUNNING, Run, Runner
from sbs_widget.views.sets_view import INPUT_MESSAGE, InputSetsView
from sbs_widget.views.steps_view import STEP_MESSAGE, DecodeSteps
from sbs_widget.views.view_state import compare_state, finished_run, progress_state

if TYPE_CHECKING:
    from sbs_widget.engine.entry import Prepared

_STATIC = pathlib.Path(__file__).parent.parent / "static"
PAGE_ROWS = 25_000  # most rows per get_rows answer (about 5 MB): a 50,000-row run arrives in a few messages


def _names_to_json(value, widget):
    return sorted(value)


def _names_from_json(value, widget):
    return set(value or ())


class SbsWidget(TwoModelsView, InputSetsView, DecodeSteps, StaticFallback, anywidget.AnyWidget):
    """Compare ``ep`` (torch.export program or .pt2 path) with ``onx`` (ONNX model or path) live.

    ``inputs``: tuple of positional arguments, or a path to a ``torch.save``'d file.
    ``onx=None`` when ``ep`` is a ``torch.onnx.ONNXProgram`` (it holds both sides).
    ``atol``/``rtol``: ``None`` for the default of the precision the program computes in (1e-4 for
    float32, 1e-3 for float16), set on the widget once the first run has prepared the program.
    ``time_limit``: seconds each run may take; past it the run ends with status "error" and a message
    naming the node it was at (the records so far are kept).
    ``steps``: decode that many tokens after the prompt on both sides first, shown as a strip of steps
    above the table (``views/steps_view.py``: ``w.steps``, ``w.step_records(k)``, ``w.show_step(k)``).
    ``SbsWidget.from_input_sets(ep, onx, [set1, set2, ...])``: every input set compared, the spread of each pair
    as columns (``views/sets_view.py``: ``w.input_sets``, ``w.spread_dataframe()``, ``w.show_input(k)``).
    ``metrics``: figures measured beside the verdict on every pair (``"cosine"``, ``"sqnr_db"``, ``"top5"``,
    callables, a dict name -> either: ``engine/user_metrics.py``), each a sortable column of the table, the
    DataFrame and the CSV; a bad one raises ``InputError``. An ``atol`` edit re-judges the rows element-wise
    (``min_atol``); an ``rtol`` edit reruns the comparison: a run's figures are measured at its own rtol.

    Example (in a notebook; ``w.wait()`` blocks until the run ends)::

        import torch, sbs_widget
        model, inputs = sbs_widget.dummy_llm()
        onnx_program = torch.onnx.export(model, inputs, dynamo=True)
        w = sbs_widget.SbsWidget(onnx_program.exported_program, onnx_program.model_proto, inputs)
        w                       # shows the view; the run streams into it
        w.wait().to_dataframe()  # the records as a DataFrame
        w.reset_names = {"linear"}; w.rerun()
    """

    _esm = _STATIC / "widget.js"

    title = traitlets.Unicode("").tag(sync=True)
    status = traitlets.Unicode("idle").tag(sync=True)  # idle, preparing, running, done, stopped, error
    message = traitlets.Unicode("").tag(sync=True)  # why the last run failed
    progress = traitlets.Dict().tag(sync=True)
    run_id = traitlets.Int(-1).tag(sync=True)  # the latest run, whose rows stream
    runs_meta = traitlets.List().tag(sync=True)
    compare = traitlets.Dict().tag(sync=True)  # latest run vs the one before (widget_rows.compare_runs)
    columns = traitlets.List(list(ROW_COLUMNS)).tag(sync=True)
    atol = traitlets.Float(1e-4).tag(sync=True)
    rtol = traitlets.Float(1e-4).tag(sync=True)
    reset_names = traitlets.Set(traitlets.Unicode()).tag(
        sync=True, to_json=_names_to_json, from_json=_names_from_json
    )
    fx_dot = traitlets.Unicode("").tag(sync=True)
    onnx_dot = traitlets.Unicode("").tag(sync=True)
    culprits = traitlets.List().tag(sync=True)  # of the latest finished run: Culprit dicts + "i" (record)
    # Set by the view (read them through ``selected`` and ``filtered_dataframe()``): positions, in the
    # current run's records, of the rows selected in the table, and of the rows on screen in screen
    # order (after the filters and the sort). Observable like any trait.
    selected_rows = traitlets.List(traitlets.Int()).tag(sync=True)
    view_rows = traitlets.List(traitlets.Int()).tag(sync=True)
    # the as-deployed check (check_deployed, views/deployed_check.py): status, message, result
    deployed = traitlets.Dict().tag(sync=True)
    decoding = traitlets.Dict().tag(sync=True)  # the decode steps (steps=, decode(): views/steps_view.py)
    input_spread = traitlets.Dict().tag(sync=True)  # input sets (from_input_sets: views/sets_view.py)
    models_b = traitlets.Dict().tag(sync=True)  # two ONNX models (from_models: views/models_view.py)
    onnx_b_dot = traitlets.Unicode("").tag(sync=True)  # the graph of b (from_models)

    def __init__(self, ep=None, onx=None, inputs=None, *, kwargs=None, atol: float | None = None,
                 rtol: float | None = None, runtime=None, node_local: bool = False, autostart: bool = True,
                 title: str = "", time_limit: float | None = None, deployed: bool | dict = False,
                 metrics=None, steps: int | None = None, **widget_kwargs):
        # None: the default for the precision the program computes in, known once it is prepared
        checked(atol, rtol)  # InputError for a bad one (a str or bool too, which the traits would coerce)
        self._metrics, self._metric_names = run_metrics(metrics)  # InputError for a bad one, before any work
        self._default_tolerance = (atol is None, rtol is None)
        self.time_limit = check_time_limit(time_limit)
        self._deployed_pending = setting_of(deployed)  # checked once the first run starts
        super().__init__(atol=DEFAULT_ATOL if atol is None else atol, rtol=DEFAULT_RTOL if rtol is None else rtol,
                         title=title, columns=columns_of(self._metric_names), **widget_kwargs)
        self._ep, self._onx = ep, onx
        self._args = inputs if inputs is not None else ()
        self._kwargs = kwargs
        self._runtime = runtime
        self.node_local = node_local
        self._prepared = None
        self._prepare_lock = threading.Lock()
        self._runs: list[Run] = []
        self._runner: Runner | None = None
        self._rerun_lock = threading.RLock()  # reruns from several threads start one run at a time
        self._sent: dict[int, int] = {}  # run id -> rows already pushed to the views
        self._report_lock = threading.Lock()
        self._view_drawn = False  # a view has reported the rows on its screen (view_rows)
        self._to_export: dict | None = None  # from_module: the model and options, until exported
        self._deployed_check = DeployedCheck(self)
        self._init_steps(steps)
        self.on_msg(self._on_msg)
        if autostart and ep is not None:
            self._autostart()

    # --- construction from existing results -------------------------------------------------

    @classmethod
    def from_records(cls, records, *, atol: float = 1e-4, rtol: float = 1e-4, title: str = "",
                     reset_names=()) -> "SbsWidget":
        """A view of records computed elsewhere (a saved run, the CLI); Rerun is not available."""
        w = cls(autostart=False, atol=atol, rtol=rtol, title=title)
        run = finished_run(records, atol=atol, rtol=rtol, reset_names=reset_names)
        w._metric_names = metric_names(run.records)  # the metrics the records carry: columns of the table
        w.columns = columns_of(w._metric_names)
        w._runs.append(run)
        w.run_id = run.id
        w._publish(run, final=True)
        return w

    @classmethod
    def from_module(cls, model, args=(), kwargs=None, *, dynamic_shapes=None, optimize: bool = True,
                    strict: bool = False, opset_version: int | None = None, **options) -> "SbsWidget":
        """A view of ``model`` on ``args``/``kwargs``: exported by the first run (``torch.export.export``,
        then ``torch.onnx.export`` with ``dynamo=True`` and ``optimize``; the progress line says which
        stage runs), then compared. Both programs are kept (``w.exported``: the ``ONNXProgram`` and the
        user's ExportedProgram), so no decomposition is repeated. An export that fails ends the run with
        status "error" and a message naming the stage (``w.wait()`` raises it). ``options``: as for
        ``SbsWidget`` (``atol``, ``rtol``, ``title``, ``time_limit``...)."""
        autostart = options.pop("autostart", True)
        w = cls(None, None, args, kwargs=kwargs, autostart=False, **options)
        w._to_export = dict(model=model, dynamic_shapes=dynamic_shapes, optimize=optimize, strict=strict,
                            opset_version=opset_version)
        if autostart:
            w._autostart()
        return w

    @property
    def exported(self):
        """What ``from_module`` exported (``Exported``: ``onnx_program``, ``user_ep``), else None."""
        from sbs_widget.load.export import Exported

        return self._ep if isinstance(self._ep, Exported) else None

    def _export(self) -> None:
        """Export the model given to ``from_module`` (once), showing each stage in the progress line."""
        from sbs_widget.load.export import export_module
        from sbs_widget.load.readers import load_inputs

        spec = self._to_export
        args, kwargs = load_inputs(self._args, self._kwargs)

        def report(stage: int, text: str) -> None:
            self.progress = {"run": self.run_id, "current": f"exporting ({stage + 1}/2): {text}", "n_rows": 0}

        self._ep = export_module(spec["model"], args, kwargs, dynamic_shapes=spec["dynamic_shapes"],
                                 optimize=spec["optimize"], strict=spec["strict"],
                                 opset_version=spec["opset_version"], report=report)
        self._onx = None
        self._to_export = None

    # --- public API --------------------------------------------------------------------------

    @property
    def runs(self) -> list[Run]:
        """Every run so far, oldest first (``runs[-1]`` is the current one)."""
        return list(self._runs)

    @property
    def records(self) -> list:
        """Records of the current run (so far, while it runs)."""
        return list(self._runs[-1].records) if self._runs else []

    @property
    def running(self) -> bool:
        return self._runner is not None and not self._runner.ended.is_set()

    def to_dataframe(self, run: int = -1):
        """Records of run ``run`` (index into ``runs``; default the current one) as a DataFrame."""
        if not self._runs:
            return to_dataframe([])
        n = len(self._runs)
        if isinstance(run, bool) or not hasattr(run, "__index__") or not -n <= run < n:
            from sbs_widget.errors import InputError

            raise InputError(f"run={run!r} does not exist: this widget has {n} run(s), give 0 to {n - 1} "
                             "(or -1, the current one)")
        return to_dataframe(self._runs[run].records)

    @property
    def selected(self) -> list:
        """Records of the rows selected in the table (current run), in the order they were selected."""
        records = self._runs[-1].records if self._runs else []
        return [records[i] for i in self.selected_rows if 0 <= i < len(records)]

    def filtered_dataframe(self):
        """The rows on screen (filters and search applied), in screen order, as a DataFrame (the inner
        values folded under a row included, after it); every row of the current run before a view has
        drawn the table."""
        records = self._runs[-1].records if self._runs else []
        if not self.view_rows and records and not self._view_drawn:
            return to_dataframe(records)
        return to_dataframe([records[i] for i in self.view_rows if 0 <= i < len(records)])

    @traitlets.observe("view_rows")
    def _on_view_rows(self, change) -> None:
        self._view_drawn = True

    def rerun(self, reset_names=None) -> "SbsWidget":
        """Start a new run with ``reset_names`` (default: ``self.reset_names``); earlier runs are kept.

        A run in progress is stopped first. Returns at once; ``wait()`` blocks until the run ends. After a
        step's lockstep (``show_step``) it reruns that step.
        """
        return self._begin(reset_names, self._runs[-1].step if self._runs else None)

    def _begin(self, reset_names, step: int | None) -> "SbsWidget":
        if self._ep is None and self._to_export is None:
            raise RuntimeError("this widget shows saved records; there is nothing to rerun")
        with self._rerun_lock:
            if reset_names is not None:
                self.reset_names = {reset_names} if isinstance(reset_names, str) else set(reset_names)
            self.stop()
            run = Run(id=len(self._runs), reset_names=frozenset(self.reset_names), atol=self.atol,
                      rtol=self.rtol, node_local=self.node_local or step is not None, step=step)
            self._runs.append(run)
            self._runner = Runner(run, self._start_run, self._publish, self.time_limit)
            self.run_id = run.id
            self.status = RUNNING if self._prepared is not None else "preparing"
            self.message = ""
            self._runner.begin()
            if self._deployed_pending is not None:  # deployed=...: checked after the first run
                setting, self._deployed_pending = self._deployed_pending, None
                self._deployed_check.start(after=self._runner.join, **setting)
        return self

    def check_deployed(self, session_options=None, providers=None, *, wait: bool = False) -> "SbsWidget":
        """Run the whole ONNX model as written and as deployed (``sbs_widget.check_deployed``: the given
        ``session_options`` and ``providers``, onnxruntime's defaults when None) in a background thread,
        once the run in progress (if any) has ended; the view shows its verdict above the table. Returns at
        once (``wait=True``: when the check has ended). The state is in ``w.deployed`` (status "running",
        "done" or "error" with its message: an error never raises here), the result in
        ``w.deployed_result``. A check already running is kept: one at a time."""
        runner = self._runner
        after = runner.join if runner is not None and not runner.ended.is_set() else None
        self._deployed_check.start(session_options, providers, after=after)
        if wait:
            self._deployed_check.join()
        return self

    @property
    def deployed_result(self):
        """The ``DeployedResult`` of the last as-deployed check that ended well (None before)."""
        return self._deployed_check.result

    def stop(self, timeout: float = 10.0) -> "SbsWidget":
        """End the current run at the next record; the records so far are kept (status "stopped").
        A runtime call in flight is terminated; one that ignores it is abandoned after ``timeout``
        seconds (the run ends "stopped" and says so; later runs do not wait for it)."""
        runner = self._runner
        if runner is None:
            return self
        runner.stop()
        if threading.current_thread() is not runner.thread and not runner.join(timeout):  # (the run may stop itself)
            runner.abandon()
        return self

    def wait(self, timeout: float | None = None) -> "SbsWidget":
        """Block until the current run ends, and the as-deployed check started with it or after it;
        re-raise the run's error as it was raised (``ExportError``, ``InputError``, ``RunTimeout``...)
        if it failed. Returns ``self``."""
        deadline = None if timeout is None else time.monotonic() + timeout
        self._wait_decoding(timeout)  # the decoding starts a run when it ends: waited for first
        runner = self._runner
        if runner is not None and not runner.join(None if deadline is None else max(0.0, deadline - time.monotonic())):
            raise TimeoutError(f"run {runner.run.id} still running after {timeout} s")
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not self._deployed_check.join(left):
            raise TimeoutError(f"the as-deployed check is still running after {timeout} s")
        if self._runs and self._runs[-1].status == FAILED:
            run = self._runs[-1]
            if run.exception is not None:
                raise run.exception
            raise SbsError(f"run {run.id} failed: {run.error}")
        return self

    def save_html(self, path, *, title: str | None = None) -> pathlib.Path:
        """Write the current run as a self-contained offline HTML page (see ``report.write_html_report``)."""
        from sbs_widget.views.report import write_html_report

        runs = self.runs
        if not runs:
            raise SbsError("nothing to save yet: start a run first (w.rerun())")
        return write_html_report(runs, path, title=title or self.title or "sbs_widget report", atol=self.atol,
                                 rtol=self.rtol, reset_names=self.reset_names, fx_dot=self.fx_dot,
                                 onnx_dot=self.onnx_dot, prepared=self._prepared, deployed=dict(self.deployed),
                                 culprits=list(self.culprits) if self.status == "done" else None,
                                 decoding=dict(self.decoding), input_sets=self.input_sets, **self._models_html())

    # --- the run -----------------------------------------------------------------------------

    def _prepare(self):
        with self._prepare_lock:
            from sbs_widget.engine.entry import prepare

            if self._to_export is not None:
                self._export()
            prepared = prepare(self._ep, self._onx)  # cached by content: an edited model is prepared again
            if prepared is not self._prepared:
                self._prepared = prepared
                self._fill_dot(prepared)
            return prepared

    def _fill_dot(self, prepared: Prepared) -> None:
        from sbs_widget.graphs.dot import dot_sources

        try:
            self.fx_dot, self.onnx_dot = dot_sources(prepared, records=None)
        except Exception as e:  # a graph that cannot be drawn must not cost the comparison
            warnings.warn(f"graphs unavailable: {type(e).__name__}: {e}", SbsWidgetWarning, stacklevel=2)

    def _start_run(self, run: Run, progress, cancel):
        if self._sets_options is not None:  # from_input_sets: every input set (views/sets_view.py)
            return self._start_sets_run(run, progress, cancel)
        prepared = self._prepare()
        if any(self._default_tolerance):  # the first run settles them; the user's edits stand after
            auto_atol, auto_rtol = self._default_tolerance
            self._default_tolerance = (False, False)
            run.atol, run.rtol = prepared.tolerance(None if auto_atol else run.atol, None if auto_rtol else run.rtol)
            self.atol, self.rtol = run.atol, run.rtol
        if run is self._runs[-1] and self.status == "preparing":
            self.status = RUNNING
        run.fx_total = getattr(prepared, "n_fx_nodes", 0)
        extra = {} if self._runtime is None else {"runtime": self._runtime}
        args, kwargs = self._inputs_of(run)
        run_with = prepared.run if self._models_options is None else self._models_run(prepared, run)  # a and b
        return run_with(args, kwargs, atol=run.atol, rtol=run.rtol,
                            reset_names=tuple(sorted(run.reset_names)), node_local=run.node_local,
                            progress=progress, cancel=cancel, metrics=self._metrics, **extra)

    def _publish(self, run: Run, final: bool) -> None:
        """Push new rows, then the progress that counts them (so a view never asks for rows in flight)."""
        with self._report_lock:
            start = self._sent.get(run.id, 0)
            n = len(run.records)
            if n > start:
                self.send({"type": MESSAGES["rows"], "run": run.id, "start": start},
                          [self._encode_rows(run, run.records[start:n])])
                self._sent[run.id] = n
            current = bool(self._runs) and run is self._runs[-1]
            if current:
                self.progress = self._progress_of(run, n)
            if final:
                try:
                    self.runs_meta = [r.summary() for r in self._runs]
                    if current:
                        self._update_compare()
                        self._update_culprits(run)
                finally:  # whatever fails above, the run's end is shown
                    if current:
                        self.message = run.error
                        self.status = run.status

    def _progress_of(self, run: Run, n_rows: int) -> dict:
        return progress_state(run, self._prepared, n_rows)

    @traitlets.validate("atol", "rtol")
    def _valid_tolerance(self, proposal) -> float:
        return valid_tolerance(proposal["trait"].name, proposal["value"])  # NaN, inf, < 0: InputError

    @traitlets.observe("atol", "rtol")
    def _tolerance_changed(self, change) -> None:
        runs = getattr(self, "_runs", None)  # (none during __init__: the first run takes them)
        if runs and change["name"] == "rtol" and change["new"] != runs[-1].rtol and \
                (self._ep is not None or self._to_export is not None):  # (not a view of saved records)
            self._default_tolerance = (self._default_tolerance[0], False)  # a run's figures are at its rtol
            self.rerun()
        elif runs and runs[-1].finished:
            self._update_compare()

    def export_repro(self, name, folder):
        """Write a repro bundle of ``name`` (a culprit's ONNX value, an ONNX node or FX node name, or a
        ``Culprit``) into ``folder``; see ``sbs_widget.export_repro``."""
        from sbs_widget.blame.repro import export_repro

        return export_repro(self._prepare(), self._args, name, folder, kwargs=self._kwargs,
                            atol=self.atol, rtol=self.rtol)

    def _update_compare(self) -> None:
        self.compare = compare_state(self._runs, self.atol, self.rtol)

    # --- messages from the view --------------------------------------------------------------

    def _on_msg(self, widget, content, buffers) -> None:
        kind = content.get("type") if isinstance(content, dict) else None
        if kind == MESSAGES["get_rows"]:
            limit = max(1, min(int(content.get("limit", PAGE_ROWS)), PAGE_ROWS))
            self._send_page(int(content.get("run", -1)), int(content.get("start", 0)), limit)
        elif kind == MESSAGES["rerun"] and self._ep is not None:
            self.rerun()
        elif kind == MESSAGES["stop"]:
            self.stop()
        elif kind == CHECK_DEPLOYED:
            self.check_deployed()
        elif kind == STEP_MESSAGE:
            self._on_step_message(content)
        elif kind == INPUT_MESSAGE:
            self._on_input_message(content)

    def _send_page(self, run_id: int, start: int, limit: int = PAGE_ROWS) -> None:
        if not 0 <= run_id < len(self._runs):
            return
        records = self._runs[run_id].records
        stop = min(len(records), start + limit)
        self.send({"type": MESSAGES["rows"], "run": run_id, "start": start, "reply": True},
                  [self._encode_rows(self._runs[run_id], records[start:stop])])
