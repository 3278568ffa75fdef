"""``python -m sbs_widget compare`` and ``demo`` in a real subprocess, on real files."""

from __future__ import annotations

import subprocess
import sys

import onnx
import pandas as pd
import pytest
import torch
from engine_models import exported

from sbs_widget.samples import faults


def _cli(*args, cwd=None):
    return subprocess.run([sys.executable, "-m", "sbs_widget", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, timeout=300)


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cli")
    ep, prog, args, kwargs = exported("dummy_llm", False)
    torch.export.save(ep, folder / "model.pt2")
    target = next(n for n in prog.model_proto.graph.node if n.op_type == "Gelu")
    onnx.save(faults.swap_gelu_approximation(prog.model_proto, target.name), folder / "bad.onnx")
    prog.save(str(folder / "good.onnx"))
    torch.export.save(prog.exported_program, folder / "decomposed.pt2")
    torch.save(args, folder / "inputs.pt")
    return folder, target.output[0]


def test_compare_writes_every_format_and_summarizes(files):
    folder, culprit = files
    res = _cli("compare", "--ep", folder / "model.pt2", "--onnx", folder / "bad.onnx", "--inputs",
               folder / "inputs.pt", "-o", folder / "out.csv")
    assert res.returncode == 0, res.stderr
    assert "coverage: 100.0%" in res.stdout
    assert f"first pair beyond tolerance: {culprit} / {culprit} (Gelu" in res.stdout
    assert "tolerance: atol=0.0001, rtol=0.0001 (both: the default for a program computing in float32)" in res.stdout
    assert "comparing" in res.stderr  # the progress bar
    assert "decomposing the program as torch.onnx.export does" in res.stderr  # the one-time cost, and the way round
    res = _cli("compare", "--ep", folder / "decomposed.pt2", "--onnx", folder / "bad.onnx", "--inputs",
               folder / "inputs.pt")
    assert res.returncode == 0 and "decomposing" not in res.stderr, res.stderr
    assert f"first pair beyond tolerance: {culprit} / {culprit} (Gelu" in res.stdout
    df = pd.read_csv(folder / "out.csv")
    assert (df.status == "mismatch").sum() > 0 and "err_abs" in df.columns
    for ext in ("xlsx", "parquet", "html"):
        res = _cli("compare", "--ep", folder / "model.pt2", "--onnx", folder / "bad.onnx", "--inputs",
                   folder / "inputs.pt", "-o", folder / f"out.{ext}", "--quiet")
        assert res.returncode == 0, res.stderr
        assert (folder / f"out.{ext}").stat().st_size > 1000
    assert len(pd.read_parquet(folder / "out.parquet")) == len(df)
    assert len(pd.read_excel(folder / "out.xlsx")) == len(df)


def test_compare_options(files):
    folder, culprit = files
    res = _cli("compare", "--ep", folder / "model.pt2", "--onnx", folder / "bad.onnx", "--inputs",
               folder / "inputs.pt", "--reset", culprit, "--node-local", "--quiet", "-o", folder / "r.csv")
    assert res.returncode == 0, res.stderr
    df = pd.read_csv(folder / "r.csv")
    row = df[df.onnx_name == culprit].iloc[0]
    assert row.status == "reset" and row.err_local > 1e-4  # tanh vs erf GELU: ~2e-4
    assert (df.status == "mismatch").sum() == 0
    res = _cli("compare", "--ep", folder / "model.pt2", "--onnx", folder / "good.onnx", "--inputs",
               folder / "inputs.pt", "--quiet", "--runtime", "onnx.reference", "--atol", "1e-3")
    assert res.returncode == 0 and "no pair beyond tolerance" in res.stdout
    assert "tolerance: atol=0.001, rtol=0.0001 (rtol: the default for a program computing in float32)" in res.stdout


def test_compare_bad_input_is_a_clear_error(files):
    folder, _ = files
    res = _cli("compare", "--ep", folder / "model.pt2", "--onnx", folder / "missing.onnx", "--inputs",
               folder / "inputs.pt")
    assert res.returncode == 1 and "ONNX file not found" in res.stderr and "Traceback" not in res.stderr
    res = _cli("compare", "--ep", folder / "model.pt2", "--onnx", folder / "good.onnx", "--inputs",
               folder / "inputs.pt", "-o", folder / "x.txt")
    assert res.returncode == 1 and "use one of .csv" in res.stderr


def test_demo(tmp_path):
    res = _cli("demo", "--quiet", "-o", tmp_path / "demo.csv")
    assert res.returncode == 0, res.stderr
    assert "injected fault" in res.stdout and "first pair beyond tolerance: add_2" in res.stdout
    assert "culprit 1: Sub node 'node_add_2'" in res.stdout
    res = _cli("demo", "--quiet", "--no-fault")
    assert res.returncode == 0 and "no pair beyond tolerance" in res.stdout
    assert "culprits: none" in res.stdout
