"""Assertions for test suites, in the style of ``torch.testing.assert_close``.

>>> import sbs_widget.testing
>>> # sbs_widget.testing.assert_aligned(model, None, (x,))          # exports the model, then compares
>>> # sbs_widget.testing.assert_aligned("model.pt2", "model.onnx", "inputs.pt", atol=1e-4)

``assert_aligned`` passes silently when every aligned pair of the program and the ONNX model agrees
within tolerance; otherwise it raises ``AlignmentError`` (an ``AssertionError``) whose message holds
what a reviewer needs: the verdict, the worst outputs, the first culprit with its reason and whether
it is rounding, the tolerance used, and the code that opens the same comparison in the widget. Under
pytest the frames of this module are hidden from the traceback, and ``-x`` stops at the first failure
as for any assertion. Its cost over ``run_aligned`` on a passing run is one pass over the records
(``benchmarks/assert_cost.py``); a failing run adds the culprit finder over its records.
"""

from __future__ import annotations

import math
import os
import shlex
import warnings
from typing import TYPE_CHECKING, Sequence

import torch

from sbs_widget import records as R
from sbs_widget.gate.verdict import CANNOT_JUDGE, MISMATCH, NOISE, Verdict, check_fail_on, headline, judge
from sbs_widget.safe_text import clipped, visible

if TYPE_CHECKING:
    from sbs_widget.engine.entry import Prepared

__all__ = ["AlignmentError", "assert_aligned"]

REPORT_DIR_ENV = "SBS_WIDGET_REPORT_DIR"  # a folder: every failing assertion writes its JSON report there


class AlignmentError(AssertionError):
    """Raised by ``assert_aligned``. ``records``, ``culprits``, ``verdict`` (``gate.verdict.Verdict``),
    ``atol``, ``rtol``; ``report_path``: the JSON report written (``report=`` or ``SBS_WIDGET_REPORT_DIR``),
    else None; ``report()`` builds the ``Report`` (``.write("x.md")``, ``.widget()``)."""

    def __init__(self, message: str, *, records=(), culprits=(), verdict: Verdict | None = None,
                 atol: float = 1e-4, rtol: float = 1e-4, fail_on: str = "noise", report_path: str | None = None,
                 sources: dict | None = None):
        super().__init__(message)
        self.records = list(records)
        self.culprits = list(culprits)
        self.verdict = verdict
        self.atol, self.rtol, self.fail_on = atol, rtol, fail_on
        self.report_path = report_path
        self.sources = sources or {}

    def report(self):
        from sbs_widget.gate.report import build_report

        return build_report(self.records, culprits=self.culprits, atol=self.atol, rtol=self.rtol,
                            fail_on=self.fail_on, verdict=self.verdict, sources=self.sources, message=str(self))


def assert_aligned(model_or_ep, onx=None, inputs=(), *, kwargs: dict | None = None, atol: float | None = None,
                   rtol: float | None = None, fail_on: str = "noise", runtime="onnxruntime",
                   node_local: bool = False, reference: bool = True, time_limit: float | None = None,
                   report=None, top: int = 3, msg: str | None = None, export_options: dict | None = None,
                   refine: bool = False) -> None:
    """Assert that the ONNX model computes what the program computes, value by value.

    - ``model_or_ep``: a ``torch.nn.Module`` (exported here on ``inputs``: ``export_module`` with
      ``export_options``, or, given ``onx``, captured with ``torch.export.export`` and compared with
      ``onx``), an ``ExportedProgram``, a ``.pt2`` path, or the ``ONNXProgram`` / ``Exported`` (then ``onx``
      may be None);
    - ``onx``: the ONNX model (``ModelProto`` or path), or None as said above;
    - ``inputs``: the args tuple (a single tensor is taken as one argument), or a path to a
      ``torch.save``d inputs file; ``kwargs``: keyword inputs;
    - ``atol``/``rtol``: the tolerance (None: the program's default for its precision, as ``run_aligned``);
    - ``fail_on``: ``"noise"`` (default): any pair beyond tolerance fails, rounding included (the message
      says it is rounding); ``"mismatch"``: pairs beyond tolerance by rounding alone pass;
    - ``runtime``, ``node_local``, ``reference``, ``time_limit``: as for ``run_aligned``;
    - ``report``: a path (``.json`` or ``.md``) to write the report to when the assertion fails (the
      environment variable ``SBS_WIDGET_REPORT_DIR`` names a folder for them all);
    - ``top``: culprits quoted; ``msg``: a first line of your own;
    - ``refine``: on a failure, also look inside the ONNX translation of the culprit's FX node for the
      node where the difference starts (``blame/finer.py``: reruns part of the torch program, about the
      cost of a run; ``culprits()`` and ``check`` do). Off by default: a failure then costs the run and
      the culprit finder over its records, under a tenth of the run.

    Bad input (unreadable file, inputs that do not fit) raises the ``SbsError`` it raises in
    ``run_aligned``, not an ``AssertionError``.
    """
    __tracebackhide__ = True  # pytest: the failure points at the caller's line
    check_fail_on(fail_on)
    from sbs_widget.engine.entry import prepare

    args = _as_args(inputs)
    ep, onx_used = _programs(model_or_ep, onx, args, kwargs, export_options)
    prepared = prepare(ep, onx_used)
    atol, rtol = prepared.tolerance(atol, rtol)
    records = list(prepared.run(args, kwargs, runtime=runtime, atol=atol, rtol=rtol, node_local=node_local,
                                reference=reference, time_limit=time_limit))
    verdict = judge(records)
    if not verdict.fails(fail_on):
        return None
    # --- failing: the culprits and the message (the passing path above costs one pass over the records)
    culprits = (_culprits(records, prepared, args, kwargs, atol, rtol, top, refine) if verdict.outcome == MISMATCH
                else [])
    sources = {"ep": _source(model_or_ep), "onnx": _source(onx), "inputs": _source(inputs)}
    report_path = _report_path(report)
    message = failure_message(records, verdict, culprits, atol=atol, rtol=rtol, fail_on=fail_on,
                              precision=prepared.precision, top=top,
                              reopen=_reopen(model_or_ep, onx, inputs, kwargs, atol, rtol, report_path))
    if msg:
        message = f"{msg}\n{message}"
    error = AlignmentError(message, records=records, culprits=culprits, verdict=verdict, atol=atol, rtol=rtol,
                           fail_on=fail_on, report_path=report_path, sources=sources)
    if report_path:
        from sbs_widget.gate.report import build_report

        build_report(records, culprits=culprits, prepared=prepared, atol=atol, rtol=rtol, fail_on=fail_on,
                     runtime=runtime, node_local=node_local, sources=sources, verdict=verdict,
                     message=message).write(report_path)
    raise error


def _as_args(inputs):
    if isinstance(inputs, (str, os.PathLike)):
        return os.fspath(inputs)
    if isinstance(inputs, torch.Tensor):
        return (inputs,)
    if isinstance(inputs, list):
        return tuple(inputs)
    return inputs


def _programs(model_or_ep, onx, args, kwargs, export_options):
    """(ep, onx) for ``prepare``: a module exported here."""
    if not isinstance(model_or_ep, torch.nn.Module):
        return model_or_ep, onx
    from sbs_widget.load.export import export_module
    from sbs_widget.load.readers import load_inputs

    args, kwargs = load_inputs(args, kwargs)
    if onx is None:
        return export_module(model_or_ep, args, kwargs, **(export_options or {})), None
    from sbs_widget.errors import ExportError

    options = {k: v for k, v in (export_options or {}).items() if k in ("dynamic_shapes", "strict")}
    try:
        return torch.export.export(model_or_ep, args, kwargs=kwargs, **options), onx
    except Exception as e:
        raise ExportError(f"torch.export.export failed on the model given with its ONNX model: {e}",
                          stage=0) from e


def _culprits(records, prepared: Prepared, args, kwargs, atol, rtol, top, refine):
    from sbs_widget.blame.culprits import Culprits, find_culprits
    from sbs_widget.blame.finer import refine_culprits

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        found = find_culprits(records, top=max(top, 1), prepared=prepared, atol=atol, rtol=rtol)
        if not refine:
            return list(found)
        try:
            refined = Culprits(refine_culprits(found, prepared, args, kwargs, atol, rtol))
        except Exception:  # the culprits as found are still an answer
            refined = found
    return list(refined)


def _source(x):
    from sbs_widget.gate.report import describe_source

    return describe_source(x)


def _report_path(report) -> str | None:
    if report:
        return os.fspath(report)
    folder = os.environ.get(REPORT_DIR_ENV)
    if not folder:
        return None
    os.makedirs(folder, exist_ok=True)
    import datetime

    test = os.environ.get("PYTEST_CURRENT_TEST", "").split(" ")[0]
    stem = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in test)[-80:] or "assert_aligned"
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S-%f")
    return os.path.join(folder, f"{stem}-{stamp}.json")


def _q(name) -> str:
    """A model name in the message: quoted, cut when huge, hidden characters made visible."""
    return "-" if name is None else clipped(repr(name), 120)


def _g(x) -> str:
    if x is None:
        return "?"
    try:
        x = float(x)
    except (TypeError, ValueError):
        return "?"
    return f"{x:.3g}" if math.isfinite(x) else str(x)


def rounding_of(rec) -> str:
    """Whether the difference of ``rec`` is rounding, in words."""
    if rec is None:
        return "rounding: not judged"
    if rec.noise is True:
        return ("rounding (noise): onnxruntime is about as close to a float64 rerun as torch "
                f"(torch {_g(rec.err_torch)}, onnxruntime {_g(rec.err_onnx)} from it)")
    if rec.noise is False:
        if rec.local_noise is True:
            return ("not rounding (mismatch): inherited, the node itself only rounds on torch's inputs; the "
                    "difference comes from upstream")
        figures = (f" (torch {_g(rec.err_torch)}, onnxruntime {_g(rec.err_onnx)} from a float64 rerun)"
                   if rec.err_torch is not None and rec.err_onnx is not None else "")
        return f"not rounding (mismatch): beyond what rounding explains{figures}"
    if rec.status == R.ERROR:
        return "not judged: a side failed to compute the value (status error)"
    return "rounding not judged (no float64 reference for this pair: see its comment)"


def failure_message(records: Sequence, verdict: Verdict, culprits: Sequence, *, atol: float, rtol: float,
                    fail_on: str = "noise", precision=None, top: int = 3, reopen: Sequence[str] = ()) -> str:
    """The assertion's message: what a reviewer needs, plain text, names made visible and cut."""
    lines = [headline(verdict, atol, rtol, fail_on)]
    default = f" (the default for {str(precision).replace('torch.', '')})" if precision is not None else ""
    lines.append(f"tolerance: atol={atol:g}, rtol={rtol:g}{default}; a pair fails where some "
                 "|torch - onnx| > atol + rtol * |torch|")
    if verdict.outcome == CANNOT_JUDGE:
        pass
    elif verdict.worst_outputs:
        lines.append("worst outputs:")
        for k in verdict.worst_outputs:
            r = records[k]
            where = f", beyond tolerance at {r.err_where}" if r.err_where else ""
            lines.append(f"  {_q(r.ep_name)} (ONNX {_q(r.onnx_name)}): {r.status}, max abs err {_g(r.err_abs)}, "
                         f"max rel err {_g(r.err_rel)}, passes at atol >= {_g(r.min_atol)}{where}")
    if verdict.outcome == MISMATCH:
        if culprits:
            c = culprits[0]
            rec = records[c.record] if c.record is not None and 0 <= c.record < len(records) else None
            lines.append(f"first culprit: {c.onnx_op_type} node {_q(c.onnx_node)} (value {_q(c.onnx_name)}, FX "
                         f"{_q(c.ep_name)}, module {_q(c.module or None)}): {clipped(c.reason, 600)}")
            lines.append(f"  {rounding_of(rec)}")
            for k, c in enumerate(culprits[1:top], 2):
                lines.append(f"culprit {k}: {c.onnx_op_type} node {_q(c.onnx_node)} (FX {_q(c.ep_name)}), "
                             f"score {_g(c.score)}")
        elif verdict.first_mismatch is not None:
            r = records[verdict.first_mismatch]
            lines.append(f"no culprit named; first pair beyond tolerance: {_q(r.ep_name)} / {_q(r.onnx_name)} "
                         f"({r.onnx_op_type}), max abs err {_g(r.err_abs)}; {rounding_of(r)}")
        elif verdict.n_error:
            first = next(r for r in records if r.status == R.ERROR)
            lines.append(f"a side failed to compute {_q(first.ep_name or first.onnx_name)}: "
                         f"{clipped(first.comment or '', 400)}")
    elif verdict.outcome == NOISE:
        if verdict.worst_pair is not None:
            r = records[verdict.worst_pair]
            lines.append(f"worst pair: {_q(r.ep_name)} / {_q(r.onnx_name)} ({r.onnx_op_type}): {r.status}, max abs err "
                         f"{_g(r.err_abs)}; {rounding_of(r)}")
        lines.append(f"no culprit: every pair beyond tolerance is rounding; to accept it, fail_on='mismatch' "
                     f"(CLI --fail-on mismatch), or atol >= {_g(verdict.max_min_atol)} (every pair passes there)")
    if reopen:
        lines.append("open the same comparison in the widget:")
        lines.extend(f"  {line}" for line in reopen)
    return "\n".join(visible(line) for line in lines)


def _literal(x, fallback: str) -> str:
    return repr(os.fspath(x)) if isinstance(x, (str, os.PathLike)) else fallback


def _reopen(model_or_ep, onx, inputs, kwargs, atol, rtol, report_path) -> list[str]:
    tol = f"atol={atol:g}, rtol={rtol:g}"
    lines = []
    if report_path and report_path.lower().endswith(".json"):
        lines.append(f"sbs_widget.load_report({report_path!r}).widget()  # the records of this run, no rerun")
    kw = ", kwargs=kwargs" if kwargs else ""
    ins = _literal(inputs, "inputs")
    if isinstance(model_or_ep, torch.nn.Module) and onx is None:
        lines.append(f"sbs_widget.SbsWidget.from_module(model, {ins}{kw}, {tol})")
    else:
        ep = _literal(model_or_ep, "torch.export.export(model, inputs)" if isinstance(model_or_ep, torch.nn.Module)
                      else "ep")
        lines.append(f"sbs_widget.SbsWidget({ep}, {_literal(onx, 'onx') if onx is not None else 'None'}, {ins}"
                     f"{kw}, {tol})")
        paths = all(isinstance(x, (str, os.PathLike)) for x in (model_or_ep, onx, inputs))
        if paths:
            ep, onx, ins = (shlex.quote(os.fspath(x)) for x in (model_or_ep, onx, inputs))
            lines.append(f"python -m sbs_widget compare --ep {ep} --onnx {onx} --inputs {ins} --atol {atol:g} "
                         f"--rtol {rtol:g} -o comparison.html")
    return lines
