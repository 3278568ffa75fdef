"""The command-line defects of issue 51 (#12, #14, #15): an output format whose package is missing is
refused before the run; the help texts tell the true defaults and every command's exit codes; an unknown
--config key is refused; deployed says why --repro wrote nothing and what to do after "export"; --help
imports no torch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from sbs_widget.cli.main import main

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMMANDS = ("compare", "demo", "steal-compare", "graph", "culprits", "repro", "deployed", "check")


def _never(*args, **kwargs):
    raise AssertionError("the run started: the missing package must be said before it")


@pytest.fixture
def no_run(monkeypatch):
    """Every entry a command starts its work with raises: a test fails if the work starts."""
    monkeypatch.setattr("sbs_widget.engine.entry.prepare", _never)
    monkeypatch.setattr("sbs_widget.samples.demo.demo_pair", _never)
    monkeypatch.setattr("sbs_widget.dumps.compare.compare_dump", _never)


@pytest.mark.parametrize("ext, packages, install", [(".xlsx", ("openpyxl",), "pip install openpyxl"),
                                                     (".parquet", ("pyarrow", "fastparquet"), "pip install pyarrow")])
@pytest.mark.parametrize("command", ["compare", "demo", "check", "steal-compare"])
def test_an_output_format_without_its_package_fails_before_the_run(command, ext, packages, install, tmp_path,
                                                                    monkeypatch, capsys, no_run):
    for name in packages:  # ``import openpyxl`` raises ImportError, as on a plain install
        monkeypatch.setitem(sys.modules, name, None)
    out = str(tmp_path / f"out{ext}")
    files = ["--ep", "m.pt2", "--onnx", "m.onnx", "--inputs", "in.pt"]
    argv = {"compare": ["compare", *files, "-o", out, "--quiet"], "demo": ["demo", "-o", out, "--quiet"],
            "check": ["check", "m.pt2", "m.onnx", "in.pt", "-o", out],
            "steal-compare": ["steal-compare", "--dump", "d.onnx", "--onnx", "m.onnx", "-o", out]}[command]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert install in captured.err and f"out{ext}" in captured.err, captured.err
    assert "comparing" not in captured.err and "records" not in captured.out
    assert not os.path.exists(out)


def test_an_output_format_with_its_package_passes_the_check(tmp_path):
    from sbs_widget.cli.main import check_output_file

    pytest.importorskip("openpyxl")
    check_output_file(str(tmp_path / "out.xlsx"), (".csv", ".xlsx"))  # no error: the package is there


def _help(command: str, capsys) -> str:
    with pytest.raises(SystemExit) as stop:
        main([command, "--help"] if command else ["--help"])
    assert stop.value.code == 0
    return " ".join(capsys.readouterr().out.split())  # argparse's wrapping undone


def test_the_atol_help_tells_the_engines_defaults(capsys):
    import torch

    from sbs_widget.cli.options import short_number
    from sbs_widget.engine.tolerance import tolerance_for

    for command in ("compare", "demo", "graph", "culprits", "repro", "deployed", "check", "steal-compare"):
        text = _help(command, capsys)
        assert "3e-2" not in text and "0.03" not in text, command
        for name in ("float32", "float16", "bfloat16"):
            assert f"{short_number(tolerance_for(getattr(torch, name)))} for {name}" in text, (command, name)
    assert short_number(1e-3) == "1e-3" and short_number(8e-3) == "8e-3" and short_number(1e-4) == "1e-4"


@pytest.mark.parametrize("command", COMMANDS)
def test_every_command_tells_its_exit_codes_and_no_empty_default(command, capsys):
    text = _help(command, capsys)
    assert "exit codes: 0 " in text and "(default: None)" not in text and "(default: False)" not in text
    assert "2 " in text.split("exit codes:")[1]  # the usage error's code


def test_graph_help_keeps_the_defaults_there_are(capsys):
    text = _help("graph", capsys)
    assert "(default: graphs.html)" in text and "(default: None)" not in text


def test_the_top_help_and_the_report_commands_say_0_is_not_a_verdict(capsys):
    assert "check and deployed judge: 0 agree, 1 differ, 2 cannot judge" in _help("", capsys)
    for command in ("compare", "culprits"):
        assert "whatever the values say (a report, not a gate: for CI, use `check`" in _help(command, capsys)


def _deployed_files(tmp_path) -> list[str]:
    return ["--ep", str(tmp_path / "m.pt2"), "--onnx", str(tmp_path / "m.onnx"), "--inputs", str(tmp_path / "in.pt")]


def test_an_unknown_config_key_is_refused(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sbs_widget.deployed.check.check_deployed", _never)
    with pytest.raises(SystemExit) as stop:
        main(["deployed", *_deployed_files(tmp_path), "--config", "session.set_denormal_as_zer=1"])
    assert stop.value.code == 2
    err = " ".join(capsys.readouterr().err.split())
    assert "unknown session config key 'session.set_denormal_as_zer'" in err
    assert "did you mean session.set_denormal_as_zero?" in err and "session.disable_prepacking" in err


def test_a_known_config_key_passes(tmp_path, monkeypatch):
    seen = {}

    def fake(*args, session_options=None, **kwargs):
        seen.update(session_options)
        return _result("same")

    monkeypatch.setattr("sbs_widget.deployed.check.check_deployed", fake)
    assert main(["deployed", *_deployed_files(tmp_path), "--config", "session.set_denormal_as_zero=1"]) == 0
    assert seen["config"] == {"session.set_denormal_as_zero": "1"}


def test_deployed_bad_input_is_cannot_judge_not_a_verdict(tmp_path, capsys):
    """1 is "the deployment (or the export) differs": a missing file exits 2, as check does."""
    assert main(["deployed", *_deployed_files(tmp_path)]) == 2
    assert capsys.readouterr().err.startswith("error: ")


def _result(verdict: str):
    from sbs_widget.deployed.result import DeployedResult

    return DeployedResult(verdict=verdict, deployed="ORT_ENABLE_ALL on CPUExecutionProvider", written_errors=[],
                          deployed_errors=[], sessions=2, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("as_json", [False, True])
def test_repro_on_verdict_same_says_nothing_was_written(as_json, tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sbs_widget.deployed.check.check_deployed", lambda *a, **k: _result("same"))
    folder = tmp_path / "bundle"
    argv = ["deployed", *_deployed_files(tmp_path), "--repro", str(folder)] + (["--json"] if as_json else [])
    assert main(argv) == 0
    captured = capsys.readouterr()
    said = captured.err if as_json else captured.out
    assert f"--repro {folder}: nothing written (verdict same" in said, said
    if as_json:  # stdout stays one JSON document
        import json

        assert json.loads(captured.out)["verdict"] == "same"
    assert not folder.exists()


def test_verdict_export_prints_the_next_step(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sbs_widget.deployed.check.check_deployed", lambda *a, **k: _result("export"))
    assert main(["deployed", *_deployed_files(tmp_path), "--repro", str(tmp_path / "r")]) == 1
    out = capsys.readouterr().out
    assert "verdict: export" in out
    assert "next: the ONNX model as written already differs" in out and "python -m sbs_widget culprits --ep" in out
    assert "nothing written (the model as written already differs" in out


def test_verdict_same_prints_no_next_step(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr("sbs_widget.deployed.check.check_deployed", lambda *a, **k: _result("same"))
    assert main(["deployed", *_deployed_files(tmp_path)]) == 0
    assert "next:" not in capsys.readouterr().out


HEAVY = ("torch", "onnx", "onnxruntime")


def _imported(argv: list[str]) -> set[str]:
    """The top-level modules ``python -X importtime -m sbs_widget ARGV`` imports."""
    env = {**os.environ, "PYTHONPATH": REPO + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "sbs_widget", *argv], capture_output=True,
                          text=True, cwd=REPO, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: python -m sbs_widget" in done.stdout
    return {line.rsplit("|", 1)[1].strip().split(".")[0] for line in done.stderr.splitlines()
            if line.startswith("import time:") and "|" in line}


@pytest.mark.parametrize("command", ["", *COMMANDS])
def test_help_imports_no_torch(command):
    modules = _imported([command, "--help"] if command else ["--help"])
    assert "sbs_widget" in modules  # the list was read
    assert not modules & set(HEAVY), sorted(modules & set(HEAVY))


def test_the_package_imports_no_torch_until_a_name_needs_it():
    code = ("import sys, sbs_widget; heavy = [m for m in %r if m in sys.modules]; assert not heavy, heavy; "
            "names = [n for n in sbs_widget.__all__ if getattr(sbs_widget, n, None) is None]; assert not names, names; "
            "assert callable(sbs_widget.culprits) and sbs_widget.engine.entry.prepare is sbs_widget.prepare; "
            "from sbs_widget import *; assert SbsWidget is sbs_widget.SbsWidget; print('ok')") % (HEAVY,)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]
