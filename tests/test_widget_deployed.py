"""The widget's as-deployed check (issue 33) on real exports and real onnxruntime sessions: the
``deployed`` trait, ``deployed_result``, the view's message, errors that land in the trait, the
constructor's ``deployed=``, the offline report and the static fallback."""

from __future__ import annotations

import json
import math

import pytest
import torch

from sbs_widget.deployed.result import DeployedResult
from sbs_widget.errors import InputError
from sbs_widget.records import Record
from sbs_widget.views.deployed_check import json_safe
from sbs_widget.views.fallback import deployed_html
from sbs_widget.views.widget import SbsWidget
from tests.engine_models import export_module
from tests.test_deployed import DENORMAL, Denormal


@pytest.fixture(scope="module")
def denormal():
    x = torch.rand(16, 16) + 0.5
    ep, prog = export_module(Denormal(), (x,))
    return ep, prog.model_proto, (x,)

def _json(state: dict) -> dict:
    """What the view receives: strict JSON (no NaN / Infinity literals)."""
    return json.loads(json.dumps(state, allow_nan=False))


def test_denormal_session_option_in_the_trait(denormal, tmp_path):
    ep, onx, args = denormal
    w = SbsWidget(ep, onx, args).wait(60)
    assert w.deployed == {} and w.deployed_result is None
    w.check_deployed(session_options={"config": {DENORMAL: "1"}})
    assert w.deployed["status"] == "running"  # returned at once; the check runs in its thread
    w._deployed_check.join(120)
    state = _json(w.deployed)
    assert state["status"] == "done" and state["message"] == "", state
    result = state["result"]
    assert result["verdict"] == "session-option"
    assert DENORMAL in result["deployed"] and DENORMAL in result["cause_text"]
    assert result["cause"]["config"] == [[DENORMAL, "1"]]
    assert result["summary"].startswith("verdict: session-option")
    assert result["sessions"] >= 3 and result["seconds"] > 0  # as written, as deployed, attribution
    assert max(e["ratio"] for e in result["deployed_errors"]) > 100
    assert isinstance(w.deployed_result, DeployedResult) and w.deployed_result.verdict == "session-option"
    assert w.status == "done" and w.records, "the table stays"

    # the static copies show it too
    fallback = w._repr_mimebundle_()[0]["text/html"]
    assert "As deployed: session-option" in fallback and DENORMAL in fallback
    page = w.save_html(tmp_path / "r.html").read_text()
    assert "session-option" in page and '"deployed":{"status":"done"' in page


def test_correct_model_is_same_and_view_message_starts_a_check(denormal):
    ep, onx, args = denormal
    w = SbsWidget(ep, onx, args).wait(60)
    w._on_msg(w, {"type": "check_deployed"}, [])  # the view's "Check as deployed" button
    w.check_deployed(wait=True)  # the check in flight is kept; wait for it
    state = _json(w.deployed)
    assert state["status"] == "done", state
    assert state["result"]["verdict"] == "same" and state["result"]["cause_text"] == ""
    assert state["result"]["sessions"] == 2
    assert state["setting"]["session_options"] == "onnxruntime's defaults"


def test_constructor_deployed_checks_after_the_first_run():
    """from_module exports in its first run; deployed=True then checks with onnxruntime's defaults."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4)).eval()
    w = SbsWidget.from_module(model, (torch.randn(3, 8),), deployed=True)
    assert w.deployed["status"] == "running"
    w.wait(240)  # waits for the check started with the run too
    assert w.deployed["status"] == "done", w.deployed
    assert w.deployed["result"]["verdict"] == "same" and w.deployed_result.sessions == 2
    assert w.status == "done" and w.records


def test_errors_land_in_the_trait(denormal):
    ep, onx, args = denormal
    w = SbsWidget(ep, onx, args, deployed={"session_options": {"level": "max"}}).wait(60)
    assert w._deployed_check.join(120)
    assert w.deployed["status"] == "error" and "unknown optimization level" in w.deployed["message"]
    assert w.deployed_result is None and w.status == "done" and w.records, "the table stays"
    assert "the check failed" in w._repr_mimebundle_()[0]["text/html"]
    w.check_deployed(providers=["NoSuchExecutionProvider"], wait=True)
    assert w.deployed["status"] == "error" and "not in this onnxruntime build" in w.deployed["message"]
    saved = SbsWidget.from_records([Record(ep_name="x", err_abs=0.0)])
    saved.check_deployed(wait=True)
    assert saved.deployed["status"] == "error" and "saved records" in saved.deployed["message"]
    with pytest.raises(InputError, match="takes the keys"):
        SbsWidget(ep, onx, args, autostart=False, deployed={"options": {}})
    with pytest.raises(InputError, match="give True"):
        SbsWidget(ep, onx, args, autostart=False, deployed="all")


def test_state_is_json_safe_and_fallback_escapes():
    assert json_safe({"r": math.inf, "n": math.nan, "t": (1, -math.inf), 2: {"x"}}) == \
        {"r": "Infinity", "n": "NaN", "t": [1, "-Infinity"], "2": ["x"]}
    state = {"status": "done", "message": "", "result": {
        "verdict": "optimizer", "deployed": "ORT_ENABLE_ALL <script>", "located": {"future": "key"},
        "summary": "verdict: optimizer\ncause: transformer <b>X</b>\nfused node <i>f</i> (Gelu) replaced a, b"}}
    text = deployed_html(state)
    assert "<script>" not in text and "<b>X" not in text and "&lt;b&gt;X&lt;/b&gt;" in text
    assert "As deployed: optimizer" in text and "fused node" in text
    assert "lockstep" in deployed_html({"status": "done", "result": {"verdict": "export", "summary": ""}})
    assert deployed_html({}) == "" and "had not ended" in deployed_html({"status": "running"})
