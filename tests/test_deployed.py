"""check_deployed on real exports and real onnxruntime sessions (each in its own process)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import onnxruntime
import pytest
import torch

import sbs_widget
from sbs_widget.cli.main import main
from sbs_widget.deployed.attribute import smallest
from sbs_widget.deployed.settings import deployment, parse_config
from sbs_widget.errors import InputError, SbsError
from tests.engine_models import export_module, exported, node_named

DENORMAL = "session.set_denormal_as_zero"


class Denormal(torch.nn.Module):
    """Values of ~1e-39 (float32 denormals) scaled back to ~0.1: flushed to zero, they become 0."""

    def forward(self, x):
        return (x * 1e-39) * 1e38


@pytest.fixture(scope="module")
def denormal():
    x = torch.rand(16, 16) + 0.5
    ep, prog = export_module(Denormal(), (x,))
    return ep, prog.model_proto, (x,)


@pytest.mark.parametrize("name,optimize", [("dummy_llm", False), ("dummy_llm", True), ("mlp", True),
                                           ("convnet", True)])
def test_correct_exports_are_same_as_deployed(name, optimize):
    ep, prog, args, kwargs = exported(name, optimize)
    result = sbs_widget.check_deployed(ep, prog.model_proto, args, kwargs)
    assert result.verdict == "same", result.summary()
    assert result.sessions == 2 and not result.steps  # as written, as deployed: nothing to attribute
    assert all(e.ratio <= 1 for e in result.deployed_errors)


def test_denormal_as_zero_is_a_session_option(denormal):
    ep, onx, args = denormal
    options = {"config": {DENORMAL: "1", "session.intra_op.allow_spinning": "0"}}
    result = sbs_widget.check_deployed(ep, onx, args, session_options=options)
    assert result.verdict == "session-option", result.summary()
    assert result.cause.config == [(DENORMAL, "1")]
    assert max(e.ratio for e in result.deployed_errors) > 100  # ~0.1 flushed to 0
    assert max(e.ratio for e in result.written_errors) == 0
    # as written + as deployed + steps: without the entries, one bisection step and its check, and
    # the localization (the deployed graph with its surviving values as outputs)
    assert result.sessions == len(result.steps) + 2 <= 6
    assert result.located.op_type == "Mul" and result.located.ratio > 100  # ~1e-39 * 1e38 flushed to 0


def test_denormal_read_from_session_options(denormal):
    """A SessionOptions object: its level and the config entries onnxruntime lets one read back."""
    ep, onx, args = denormal
    opts = onnxruntime.SessionOptions()
    opts.add_session_config_entry(DENORMAL, "1")
    result = sbs_widget.check_deployed(ep, onx, args, session_options=opts)
    assert result.verdict == "session-option"
    assert result.cause.config == [(DENORMAL, "1")]
    assert result.sessions == 4  # one entry: removing it is the only step; then the localization


def test_denormal_entry_off_is_same(denormal):
    ep, onx, args = denormal
    result = sbs_widget.check_deployed(ep, onx, args, session_options={"level": "basic", "config": {DENORMAL: "0"}})
    assert result.verdict == "same" and result.sessions == 2


def test_provider_path_with_what_this_build_has(denormal):
    """No GPU here: the providers this build lists that compute nothing themselves (Azure) are left
    out of the comparison; a provider not in the build is refused before any session."""
    ep, onx, args = denormal
    if "AzureExecutionProvider" in onnxruntime.get_available_providers():
        result = sbs_widget.check_deployed(ep, onx, args, providers=["AzureExecutionProvider"])
        assert result.verdict == "same"
    with pytest.raises(InputError, match="not in this onnxruntime build"):
        sbs_widget.check_deployed(ep, onx, args, providers=["NoSuchExecutionProvider"])


def test_smallest_set_is_found_in_logarithmic_steps():
    """The bisection alone, on a known answer: 2 culprits among 32 candidates."""
    calls = []

    def fixed_by(removed):
        calls.append(tuple(removed))
        return {"t7", "t20"} <= set(removed)

    found = smallest([f"t{i}" for i in range(32)], fixed_by)
    assert sorted(found) == ["t20", "t7"]
    assert len(calls) <= 2 * (5 + 1)


def test_bad_settings_name_the_fix():
    with pytest.raises(InputError, match="unknown optimization level"):
        deployment({"level": "max"})
    with pytest.raises(InputError, match="KEY=VALUE"):
        parse_config(["session.set_denormal_as_zero"])
    with pytest.raises(InputError, match="unknown deployment option"):
        deployment({"threads": 3})
    assert issubclass(InputError, SbsError)


def test_cli_names_the_config_entry(denormal, tmp_path, capsys):
    ep, onx, args = denormal
    torch.export.save(ep, os.fspath(tmp_path / "m.pt2"))
    with open(tmp_path / "m.onnx", "wb") as f:
        f.write(onx.SerializeToString())
    torch.save(args, tmp_path / "inputs.pt")
    files = ["--ep", str(tmp_path / "m.pt2"), "--onnx", str(tmp_path / "m.onnx"),
             "--inputs", str(tmp_path / "inputs.pt")]
    assert main(["deployed", *files, "--config", f"{DENORMAL}=1", "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["verdict"] == "session-option" and data["cause"]["config"] == [[DENORMAL, "1"]]
    assert data["sessions"] == 4 and data["located"]["op_type"] == "Mul"
    assert main(["deployed", *files, "--opt-level", "extended"]) == 0
    out = capsys.readouterr().out
    assert "verdict: same" in out and "sessions: 2" in out


class ConvBN(torch.nn.Module):
    """A float16 conv net whose BatchNormalization has near-dead channels (running_var 1e-4) after a
    conv with large weights: folding the BN's scale into the float16 weights (ConvBNFusion) overflows
    them to inf, while the conv and the BN computed one after the other stay finite."""

    def __init__(self):
        super().__init__()
        self.c = torch.nn.Conv2d(4, 8, 3, padding=1)
        self.bn = torch.nn.BatchNorm2d(8)

    def forward(self, x):
        return torch.relu(self.bn(self.c(x)))


@pytest.fixture(scope="module")
def conv_bn_fp16():
    torch.manual_seed(0)
    model = ConvBN().eval()
    with torch.no_grad():
        model.c.weight.mul_(4000.0)
        model.bn.running_var.fill_(1e-4)
        model.bn.running_mean.normal_()
        model.bn.weight.fill_(2.0)
    model = model.half()
    x = torch.rand(1, 4, 8, 8).half() * 0.01
    ep, prog = export_module(model, (x,))
    return ep, prog.model_proto, (x,)


def test_conv_bn_fusion_in_float16_is_the_optimizer(conv_bn_fp16, tmp_path):
    ep, onx, args = conv_bn_fp16
    result = sbs_widget.check_deployed(ep, onx, args, repro=tmp_path / "repro")
    assert result.verdict == "optimizer", result.summary()
    # as written: beyond the float16 tolerance by rounding only, which is not called an export fault
    assert result.written_errors[0].ratio > 1 and result.written_errors[0].noise is True
    assert result.deployed_errors[0].noise is False
    assert result.cause.level == "ORT_ENABLE_BASIC" and result.cause.transformers == ["ConvBNFusion"]
    bn = node_named(onx, "BatchNormalization", 0).name
    conv = node_named(onx, "Conv", 0)
    assert [f.op_type for f in result.fused] == ["Conv"] and bn in result.fused[0].replaced
    # where it starts: the BN's value, computed in the deployed graph by the Conv that absorbed it
    located = result.located
    assert located.op_type == "Conv" and located.node == conv.name
    assert located.value == node_named(onx, "BatchNormalization", 0).output[0]
    assert "ConvBnFusion_W" in located.note  # the weights the optimizer made
    assert result.sessions == len(result.steps) + 2 <= 8
    replay = subprocess.run([sys.executable, os.path.join(result.repro, "replay.py")], capture_output=True,
                            text=True, timeout=120)
    lines = replay.stdout.splitlines()
    assert replay.returncode == 0 and "= inf" in lines[2] and lines[3].endswith("= 0"), replay.stdout


def test_the_lockstep_as_deployed_says_what_vanished(conv_bn_fp16):
    """run_aligned with a DeployedRuntime: segments built at the deployed level with their weights in
    (a weight fed as an input is no constant to fold), the values the deployed graph no longer
    computes reported one-sided with the fused node, the rest compared as deployed."""
    ep, onx, args = conv_bn_fp16
    conv = node_named(onx, "Conv", 0)
    bn_value = node_named(onx, "BatchNormalization", 0).output[0]
    plain = {r.onnx_name: r for r in sbs_widget.run_aligned(ep, onx, args) if r.kind == "node"}
    assert plain[bn_value].status == "noise" and not plain[bn_value].err_nan
    runtime = sbs_widget.DeployedRuntime({"level": "basic"})
    deployed = {r.onnx_name: r for r in sbs_widget.run_aligned(ep, onx, args, runtime=runtime) if r.kind == "node"}
    vanished = deployed[conv.output[0]]
    assert vanished.status == "one-sided" and f"fused into Conv '{conv.name}'" in vanished.comment
    assert "ORT_ENABLE_BASIC" in vanished.comment
    assert deployed[bn_value].status == "mismatch" and deployed[bn_value].err_nan > 0  # inf weights
    # without the guilty fusion the lockstep as deployed agrees again
    fixed = sbs_widget.DeployedRuntime({"level": "basic", "disabled": ["ConvBNFusion"]})
    again = {r.onnx_name: r for r in sbs_widget.run_aligned(ep, onx, args, runtime=fixed) if r.kind == "node"}
    assert again[bn_value].status in ("ok", "noise") and again[conv.output[0]].status in ("ok", "noise")
