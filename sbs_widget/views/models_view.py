"""Two ONNX models of one program in an ``SbsWidget`` (issue 47): ``SbsWidget.from_models(ep, a, b, inputs)``
runs ``compare_models`` (``twomodels/compare.py``) in the widget's background run: the export ``a`` against
the torch program node by node as always, the transformed copy ``b`` (quantized, float16, optimized...)
against the same torch values in the same run.

- Each row is a record of a with its twin in b: the ``b_*`` fields travel with the rows (they are record
  fields, ``shared_rules.ROW_COLUMNS``); the view shows them as a third family of columns (b's value, its
  err_abs, err_local and verdict, ``b_comment`` where a value has no twin in b) and filters "b departs"
  (``b_status`` departs or inherits, ``shared_rules.B_DEPARTS``).
- The culprits panel lists b's culprits (``BCulprit``: the node of b, its op, the transformation, err_local),
  each with ``side: "b"`` and ``i``, the row of its value.
- ``onnx_b_dot``: b's graph (``graphs.dot.dot_source_b``), a third graph pane linked to the rows.
- ``w.models`` is the ``ModelsComparison`` of the last run that ended well, ``w.b_culprits`` its culprits;
  ``w.dataframe()``/``filtered_dataframe()`` carry the ``b_*`` columns like every record field.

The ``models_b`` trait (what js/models.js draws, JSON-safe)::

    {"status": "idle" | "running" | "done" | "error" | "stopped", "message": str, "n_paired": int,
     "n_records": int, "counts": {b_status: int}, "n_departs": int, "n_culprits": int, "a_only": int,
     "b_only": int, "coverage": float, "b_nodes": int}
"""

from __future__ import annotations

import warnings
from collections import Counter

from sbs_widget.engine.cancel import TIMEOUT
from sbs_widget.errors import InputError, RunCancelled, SbsWidgetWarning
from sbs_widget.shared_rules import B_DEPARTS
from sbs_widget.views.deployed_check import json_safe


def models_state(found, status: str = "done", message: str = "") -> dict:
    """The ``models_b`` trait of ``found`` (a ``ModelsComparison``; None: not there yet)."""
    if found is None:
        return {"status": status, "message": message}
    counts = Counter(r.b_status for r in found.records if r.b_status is not None)
    b_model = found.b_model
    return json_safe({"status": status, "message": message, "n_records": len(found.records),
                      "n_paired": sum(r.b_name is not None for r in found.records), "counts": dict(counts),
                      "n_departs": sum(counts[s] for s in B_DEPARTS), "n_culprits": len(found.culprits),
                      "a_only": len(found.a_only), "b_only": len(found.b_only),
                      "coverage": getattr(found.matching, "coverage", None),
                      "b_nodes": len(b_model.graph.node) if b_model is not None else None})


def records_state(records) -> dict | None:
    """The ``models_b`` state of records carrying b's fields computed elsewhere (the CLI's ``--onnx-b``), for
    the offline page; None when no record has a twin in b."""
    records = list(records)
    if not any(r.b_name is not None for r in records):
        return None
    counts = Counter(r.b_status for r in records if r.b_status is not None)
    return {"status": "done", "message": "", "n_records": len(records), "counts": dict(counts),
            "n_paired": sum(r.b_name is not None for r in records), "n_departs": sum(counts[s] for s in B_DEPARTS),
            "n_culprits": None}


def b_culprits_state(found) -> list[dict]:
    """b's culprits as the panel lists them: ``BCulprit.to_dict()`` with ``side: "b"``, ``onnx_op_type`` and
    ``i``, the row of the culprit's value of b (else of its node, else of the value of a it is paired with)."""
    by_b: dict[str, int] = {}
    by_node: dict[str, int] = {}
    by_a: dict[str, int] = {}
    for i, r in enumerate(found.records):
        if r.b_name:
            by_b.setdefault(r.b_name, i)
        if r.b_node_name:
            by_node.setdefault(r.b_node_name, i)
        if r.onnx_name:
            by_a.setdefault(r.onnx_name, i)
    out = []
    for c in found.culprits:
        i = by_b.get(c.b_value, by_node.get(c.onnx_node, by_a.get(c.a_value)))
        out.append(json_safe(dict(c.to_dict(), side="b", onnx_op_type=c.op_type, i=i)))
    return out


class TwoModelsView:
    """Mixin of ``SbsWidget``: ``from_models`` and the runs of a widget comparing two ONNX models."""

    _models_options: dict | None = None  # set by from_models: the widget compares a and b
    _models = None  # the ModelsComparison of the last run that ended well
    _b_drawn = None  # the model of b whose graph onnx_b_dot holds

    @classmethod
    def from_models(cls, ep, a=None, b=None, inputs=None, *, kwargs=None, providers_b: list[str] | None = None,
                    **options):
        """A view of ``ep``, its export ``a`` and a transformed copy ``b`` (ModelProto or path: quantized,
        float16, optimized...) compared in one run (``sbs_widget.compare_models``; ``providers_b``: the
        execution providers b runs on). The table shows b's value, its error and verdict beside each row, a
        filter keeps the rows where b departs, the culprits panel names nodes of b, and b's graph is a third
        pane. ``options``: as for ``SbsWidget`` (``atol``, ``rtol``, ``title``, ``time_limit``, ``autostart``...);
        ``a=None`` when ``ep`` is an ``ONNXProgram``."""
        if b is None:
            raise InputError("from_models needs b, the transformed copy of a to compare (a ModelProto or a path)")
        autostart = options.pop("autostart", True)
        for name in ("steps", "deployed"):
            if options.get(name):
                raise InputError(f"{name}= and two models do not mix: compare a and b, or use SbsWidget(ep, a)")
        w = cls(ep, a, inputs, kwargs=kwargs, autostart=False, **options)
        w._models_options = dict(b=b, providers_b=providers_b)
        w._run_models = {}
        w.models_b = models_state(None, "idle")
        if autostart:
            w.rerun()
        return w

    # --- public API ------------------------------------------------------------------------------

    @property
    def models(self):
        """The ``ModelsComparison`` of the last comparison of a and b that ended well (None before, or for a
        widget not built by ``from_models``)."""
        return self._models

    @property
    def b_culprits(self) -> list:
        """The culprits in b of that comparison (``BCulprit``, most likely first)."""
        return list(self._models.culprits) if self._models is not None else []

    def _models_html(self) -> dict:
        """What ``save_html`` adds for two models: ``models=`` of ``write_html_report`` (else nothing)."""
        if self._models_options is None:
            return {}
        return {"models": {"models_b": dict(self.models_b), "onnx_b_dot": self.onnx_b_dot}}

    # --- the run ---------------------------------------------------------------------------------

    def _models_run(self, prepared, run):
        """What the widget's run calls instead of ``prepared.run``: ``compare_models`` with the same options,
        its records returned as the run's."""
        def compare(args, kwargs, *, progress, cancel, atol, rtol, **options):
            from sbs_widget.twomodels.compare import compare_models

            self.models_b = models_state(None, "running", "pairing the values of b with a's")
            progress(0, run.fx_total, "pairing the values of b with a's")
            try:
                found = compare_models(prepared, None, self._models_options["b"], args, kwargs, atol=atol, rtol=rtol,
                                       providers_b=self._models_options["providers_b"], progress=progress,
                                       cancel=cancel, **options)
            except RunCancelled as e:  # Stop, or past time_limit (an error, as for the run)
                self.models_b = models_state(None, "error" if e.reason == TIMEOUT else "stopped", str(e))
                raise
            except Exception as e:
                self.models_b = models_state(None, "error", f"{type(e).__name__}: {e}")
                raise
            self._run_models[run.id] = found
            self._models = found
            self._fill_b_dot(found)
            self.models_b = models_state(found)
            return iter(found.records)

        return compare

    def _fill_b_dot(self, found) -> None:
        from sbs_widget.graphs.dot import dot_source_b

        if found.b_model is None:
            return
        try:
            self.onnx_b_dot = dot_source_b(found.b_model, found.records)
            self._b_drawn = found.b_model
        except Exception as e:  # a graph that cannot be drawn must not cost the comparison
            warnings.warn(f"graph of b unavailable: {type(e).__name__}: {e}", SbsWidgetWarning, stacklevel=2)

    def _update_culprits(self, run) -> None:
        if self._models_options is None:
            return super()._update_culprits(run)
        found = self._run_models.get(run.id)
        self.culprits = b_culprits_state(found) if found is not None else []
