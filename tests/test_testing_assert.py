"""sbs_widget.testing.assert_aligned: silent on a correct export; on a fault, an AssertionError naming
the culprit node and saying whether it is rounding; pytest shows it as any failed assertion."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import warnings

import pytest
from engine_models import exported
from gate_pairs import fault_models, loud, save_pair

import sbs_widget
from sbs_widget.errors import InputError
from sbs_widget.samples.demo import demo_pair
from sbs_widget.testing import AlignmentError, assert_aligned


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)
        yield


@pytest.fixture(scope="module")
def llm():
    return exported("dummy_llm", False)


def _message(*args, **kwargs) -> tuple[str, AlignmentError]:
    with pytest.raises(AssertionError) as info:
        assert_aligned(*args, **kwargs)
    assert isinstance(info.value, AlignmentError)
    return str(info.value), info.value


def test_the_demo_fault_is_named_and_not_rounding():
    ep, bad, inputs, fault = demo_pair()
    text, err = _message(ep, bad, inputs)
    culprit = next(line for line in text.splitlines() if line.startswith("first culprit:"))
    assert "'node_add_2'" in culprit and "Sub" in culprit and "module 'decoder'" in culprit
    assert "not rounding (mismatch)" in text
    assert "does not match the program" in text.splitlines()[0]
    assert "atol=0.0001, rtol=0.0001 (the default for float32)" in text
    assert "worst outputs:" in text and "max abs err" in text
    assert "sbs_widget.SbsWidget(ep, onx, inputs, atol=0.0001, rtol=0.0001)" in text
    assert err.verdict.outcome == "mismatch" and err.culprits[0].onnx_node == "node_add_2" and err.records


@pytest.mark.parametrize("kind", ["op", "attribute", "gelu"])
def test_three_real_faults_name_their_node(llm, kind):
    ep, prog, args, kwargs = llm
    bad, node = fault_models(prog.model_proto).get(kind, (None, None))
    if bad is None:
        pytest.skip(f"no {kind} site in this export")
    text, err = _message(ep, bad, args, kwargs=kwargs)
    culprit = next(line for line in text.splitlines() if line.startswith("first culprit:"))
    assert f"node {node!r}" in culprit, text
    assert "not rounding (mismatch)" in text


def test_a_correct_export_passes_silently(llm):
    ep, prog, args, kwargs = llm
    assert assert_aligned(ep, prog.model_proto, args, kwargs=kwargs) is None
    assert assert_aligned(prog, None, args, kwargs=kwargs) is None  # the ONNXProgram alone


def test_a_module_is_exported_and_compared():
    model, inputs = sbs_widget.dummy_llm()
    assert_aligned(model, None, inputs)
    onx = sbs_widget.export_module(model, inputs).model_proto  # the module with its saved ONNX model
    assert_aligned(model, onx, inputs)
    _, bad, _, _ = demo_pair()
    text, _ = _message(model, bad, inputs)
    assert "'node_add_2'" in text and "sbs_widget.SbsWidget(torch.export.export(model, inputs), onx" in text


def test_rounding_only_says_so_and_passes_with_fail_on_mismatch():
    ep, model, args = loud()
    text, err = _message(ep, model, args)
    assert "by rounding only (noise)" in text.splitlines()[0]
    assert "no culprit: every pair beyond tolerance is rounding" in text and "first culprit" not in text
    assert "rounding (noise): onnxruntime is about as close to a float64 rerun as torch" in text
    assert err.verdict.outcome == "noise" and not err.culprits
    assert_aligned(ep, model, args, fail_on="mismatch")  # rounding accepted
    assert_aligned(ep, model, args, atol=err.verdict.max_min_atol * 1.01)  # the atol the message gives


def test_files_report_and_reopen(tmp_path, llm):
    ep, prog, args, kwargs = llm
    bad, node = fault_models(prog.model_proto)["op"]
    paths = save_pair(str(tmp_path), prog.exported_program, bad, args)
    report = tmp_path / "failure.json"
    text, err = _message(paths["ep"], paths["onnx"], paths["inputs"], report=report)
    assert f"sbs_widget.load_report({str(report)!r}).widget()" in text
    assert f"python -m sbs_widget compare --ep {paths['ep']} --onnx {paths['onnx']}" in text
    rep = sbs_widget.load_report(report)
    assert rep.verdict.outcome == "mismatch" and rep.culprits[0].onnx_node == node and rep.message == text
    assert len(rep.records) == len(err.records)
    w = rep.widget()
    assert len(w.records) == len(err.records)


def test_report_dir_from_the_environment(tmp_path, monkeypatch, llm):
    ep, prog, args, kwargs = llm
    bad, _ = fault_models(prog.model_proto)["attribute"]
    monkeypatch.setenv("SBS_WIDGET_REPORT_DIR", str(tmp_path / "reports"))
    text, err = _message(ep, bad, args, kwargs=kwargs)
    assert err.report_path and os.path.exists(err.report_path) and err.report_path.endswith(".json")
    assert "test_report_dir_from_the_environment" in os.path.basename(err.report_path)


def test_bad_input_is_not_an_assertion(llm):
    ep, prog, args, kwargs = llm
    with pytest.raises(InputError):
        assert_aligned(ep, prog.model_proto, args, fail_on="everything")
    with pytest.raises(sbs_widget.LoadError):
        assert_aligned(ep, "/nonexistent/model.onnx", args)


def test_under_pytest_with_x(tmp_path, llm):
    """Run by pytest -x: the first failing test stops the session, its report shows the message (culprit,
    rounding, the code to reopen it) and hides assert_aligned's own frame."""
    ep, prog, args, kwargs = llm
    bad, node = fault_models(prog.model_proto)["op"]
    paths = save_pair(str(tmp_path / "pair"), prog.exported_program, bad, args)
    good = save_pair(str(tmp_path / "pair"), prog.exported_program, prog.model_proto, args, onnx_name="good.onnx")
    test = tmp_path / "test_user.py"
    test.write_text(textwrap.dedent(f"""
        from sbs_widget.testing import assert_aligned

        def test_good():
            assert_aligned({good['ep']!r}, {good['onnx']!r}, {good['inputs']!r})

        def test_bad():
            assert_aligned({paths['ep']!r}, {paths['onnx']!r}, {paths['inputs']!r})

        def test_never_run():
            assert False
    """))
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    run = subprocess.run([sys.executable, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", "-p", "no:playwright",
                          "-W", "ignore", str(test)], capture_output=True, text=True, cwd=tmp_path, env=env,
                         timeout=600)
    out = run.stdout
    assert run.returncode == 1, out + run.stderr
    assert "1 failed, 1 passed" in out, out
    assert "AlignmentError" in out and f"node {node!r}" in out and "not rounding (mismatch)" in out
    assert "python -m sbs_widget compare --ep" in out
    assert "def assert_aligned" not in out  # __tracebackhide__: the failure points at the test's line
