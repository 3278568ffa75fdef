"""The widget's "as deployed" check (issue 33): ``check_deployed`` on the widget's program, ONNX model
and inputs, in a background thread, its state published in the widget's ``deployed`` trait:

    {"status": "running" | "done" | "error", "message": str, "setting": {...},
     "result": DeployedResult.to_dict() + {"cause_text", "summary"}}   (``result`` once done)

Errors (bad options, a session that fails, a widget with nothing to check) end in status "error" with
their message: they never reach the kernel's caller through the view, and the table stays.
"""

from __future__ import annotations

import math
import threading
import traceback

from sbs_widget.engine.shutdown import track
from sbs_widget.errors import InputError
from sbs_widget.shared_rules import NON_FINITE

RUNNING, DONE, FAILED = "running", "done", "error"
CHECK_DEPLOYED = "check_deployed"  # the view's message asking for a check (js/deployed.js), content["type"]
_SETTING_KEYS = ("session_options", "providers")


def json_safe(value):
    """``value`` as a trait can send it: non-finite floats as ``NON_FINITE`` strings, tuples as lists,
    keys as strings, anything else that JSON cannot hold as its text."""
    if isinstance(value, dict):
        return {str(k): json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple, set, frozenset)):
        return [json_safe(v) for v in value]
    if isinstance(value, bool) or value is None or isinstance(value, (int, str)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        return NON_FINITE["nan"] if math.isnan(value) else NON_FINITE["inf" if value > 0 else "-inf"]
    if hasattr(value, "item"):  # numpy scalars
        try:
            return json_safe(value.item())
        except (TypeError, ValueError):
            pass
    return str(value)


def result_state(result) -> dict:
    """``result.to_dict()`` (JSON-safe) with the cause in words and the summary the CLI prints."""
    data = json_safe(result.to_dict())
    cause = getattr(result, "cause", None)
    data["cause_text"] = cause.describe() if cause is not None else ""
    data["summary"] = result.summary()
    return data


def setting_of(deployed) -> dict | None:
    """The constructor's ``deployed=``: False/None (no check), True (onnxruntime's defaults) or a dict
    ``{"session_options": ..., "providers": ...}``; anything else is an ``InputError``."""
    if deployed is None or deployed is False:
        return None
    if deployed is True:
        return {}
    if isinstance(deployed, dict):
        unknown = sorted(set(map(str, deployed)) - set(_SETTING_KEYS))
        if unknown:
            raise InputError(f"deployed={{...}} takes the keys {list(_SETTING_KEYS)}, not {unknown}: e.g. "
                             "deployed={'session_options': {'level': 'all'}, 'providers': ['CPUExecutionProvider']}")
        return dict(deployed)
    raise InputError(f"deployed={deployed!r}: give True (onnxruntime's defaults), False, or a dict with "
                     f"the keys {list(_SETTING_KEYS)}")


def _describe_setting(session_options, providers) -> dict:
    """What the view shows while the check runs (the result then names the setting in its own words)."""
    if session_options is None:
        options = "onnxruntime's defaults"
    elif isinstance(session_options, dict):
        options = ", ".join(f"{k}={v}" for k, v in session_options.items()) or "onnxruntime's defaults"
    else:
        options = type(session_options).__name__
    return {"session_options": options, "providers": [str(p) for p in providers] if providers else []}


class DeployedCheck:
    """One as-deployed check at a time for ``widget`` (an ``SbsWidget``); the latest result is kept."""

    def __init__(self, widget):
        self._widget = widget
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()
        self.result = None  # the last DeployedResult
        self._working = False  # the thread is in the check (not reporting its end): interrupted at exit

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self, session_options=None, providers=None, *, after=None) -> threading.Thread:
        """Start a check (``after``: a callable the thread calls first, e.g. waiting for a run); a check
        already running is kept and returned (one at a time)."""
        with self._lock:
            if self.running:
                return self._thread
            setting = _describe_setting(session_options, providers)
            self._publish(RUNNING, "waiting for the run to end" if after else "starting", setting=setting)
            self._thread = threading.Thread(target=self._work, args=(session_options, providers, after, setting),
                                            name="sbs-deployed-check", daemon=True)
            self._working = True
            self._thread.start()
            track(self._thread, None, lambda: self._working)  # a script ending mid-check ends cleanly
            return self._thread

    def join(self, timeout: float | None = None) -> bool:
        thread = self._thread
        if thread is None or thread is threading.current_thread():
            return True
        thread.join(timeout)
        return not thread.is_alive()

    def _publish(self, status: str, message: str, **extra) -> None:
        state = {"status": status, "message": message}
        old = self._widget.deployed or {}
        if "setting" in old and "setting" not in extra:
            state["setting"] = old["setting"]
        state.update(extra)
        self._widget.deployed = state

    def _work(self, session_options, providers, after, setting) -> None:
        from sbs_widget.deployed.check import check_deployed

        w = self._widget
        try:
            if after is not None:
                after()
            if w._ep is None and w._to_export is None:
                raise InputError("nothing to check as deployed: this widget shows saved records (build it "
                                 "from the programs: SbsWidget(ep, onx, inputs))")
            self._publish(RUNNING, "preparing the programs")
            w._prepare()  # from_module: exports once; otherwise a cache hit of the run's preparation
            self._publish(RUNNING, "running the model as written and as deployed")
            auto_atol, auto_rtol = w._default_tolerance
            result = check_deployed(w._ep, w._onx, w._args, w._kwargs, session_options=session_options,
                                    providers=providers, atol=None if auto_atol else w.atol,
                                    rtol=None if auto_rtol else w.rtol)
            state = result_state(result)
        except Exception as e:  # lands in the banner; the table is untouched
            self._working = False
            message = f"{type(e).__name__}: {e}" if str(e) else type(e).__name__
            self._publish(FAILED, message, trace=traceback.format_exc(limit=8))
            return
        self._working = False
        self.result = result
        self._publish(DONE, "", result=state)
