"""Output folders that someone else can write to, and runs stopped by SIGTERM.

- A symbolic link planted in an output folder under the name of an output file is replaced by the
  new file, never written through: the file it points to (outside the folder) is left as it was.
- SIGTERM (``kill``, a job scheduler, a container stopping) ends a CLI comparison as Ctrl-C does:
  the records computed so far are written, and the exit code is the interruption's (130).
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import onnx
import pandas as pd
import pytest
import torch
from engine_models import export_module
from test_run_bounds import Chain, with_endless_loop

import sbs_widget
from sbs_widget.blame.repro import BUNDLE_FILES
from sbs_widget.cli.main import main

SECRET = "the file the link points to: it must stay as it is\n"


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.linear(x)) * 2


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pair")
    x = torch.randn(2, 4)
    ep, prog = export_module(Small().eval(), (x,))
    torch.export.save(ep, folder / "model.pt2")
    onnx.save(prog.model_proto, folder / "model.onnx")
    torch.save((x,), folder / "inputs.pt")
    common = ["--ep", str(folder / "model.pt2"), "--onnx", str(folder / "model.onnx"), "--inputs",
              str(folder / "inputs.pt")]
    return folder, common, prog.model_proto, x


def _plant(folder, names, outside):
    """A link named like each output file in ``folder``, pointing to a file in ``outside``; the
    targets of the first half exist (holding SECRET), the others do not (dangling links)."""
    outside.mkdir(exist_ok=True)
    targets = {}
    for k, name in enumerate(names):
        target = outside / f"target_{k}"
        if k % 2 == 0:
            target.write_text(SECRET)
        path = folder / name
        if os.path.lexists(path):
            os.remove(path)
        os.symlink(target, path)
        targets[name] = target
    return targets


def _untouched(folder, targets):
    for k, (name, target) in enumerate(targets.items()):
        if k % 2 == 0:
            assert target.read_text() == SECRET, f"written through the link {name}"
        else:
            assert not os.path.lexists(target), f"created through the dangling link {name}"
        path = folder / name
        assert not os.path.islink(path) and path.is_file(), f"{name} is not a regular file"


def test_repro_force_replaces_links_planted_in_the_folder(files, tmp_path, capsys):
    _, common, _, _ = files
    out = tmp_path / "bundle"
    out.mkdir()
    targets = _plant(out, BUNDLE_FILES, tmp_path / "outside")
    assert main(["repro", *common, "--name", "relu", "-o", str(out)]) == 1  # links count as files there
    assert "--force" in capsys.readouterr().err
    assert main(["repro", *common, "--name", "relu", "-o", str(out), "--force"]) == 0, capsys.readouterr().err
    _untouched(out, targets)
    assert onnx.load(out / "model.onnx").graph.node  # the bundle itself is complete
    assert sorted(os.listdir(out)) == sorted(BUNDLE_FILES)  # no temporary file left behind


def test_repro_force_refuses_a_folder_named_like_a_bundle_file(files, tmp_path, capsys):
    _, common, _, _ = files
    out = tmp_path / "bundle"
    (out / "model.onnx").mkdir(parents=True)
    assert main(["repro", *common, "--name", "relu", "-o", str(out), "--force"]) == 1
    assert "a folder has that name" in capsys.readouterr().err


def test_compare_output_link_is_replaced(files, tmp_path):
    _, common, _, _ = files
    targets = _plant(tmp_path, ["out.csv", "out.html"], tmp_path / "outside")
    for name in targets:
        assert main(["compare", *common, "-o", str(tmp_path / name), "--quiet"]) == 0
    _untouched(tmp_path, targets)
    assert len(pd.read_csv(tmp_path / "out.csv")) > 1


def test_graphs_page_link_is_replaced(files, tmp_path):
    from sbs_widget.graphs.page import write_graphs_html

    folder, _, onx, _ = files
    targets = _plant(tmp_path, ["graphs.html", "dangling.html"], tmp_path / "outside")
    prepared = sbs_widget.prepare(str(folder / "model.pt2"), onx)
    for name in targets:
        write_graphs_html(tmp_path / name, prepared)
    _untouched(tmp_path, targets)


def test_dump_file_link_is_replaced(tmp_path):
    targets = _plant(tmp_path, ["dump.onnx", "dangling.onnx"], tmp_path / "outside")
    model = Small()
    for name in targets:
        with sbs_widget.steal_forward(model, dump_file=tmp_path / name):
            model(torch.ones(1, 4))
    _untouched(tmp_path, targets)
    assert ("Small", 0, "O") in sbs_widget.load_dump(tmp_path / "dump.onnx")


def test_deployed_repro_replaces_links(files, tmp_path):
    from sbs_widget.deployed.repro import write_repro
    from sbs_widget.deployed.settings import Setting

    _, _, model, x = files
    out = tmp_path / "deployed"
    out.mkdir()
    targets = _plant(out, ["subgraph.onnx", "inputs.npz", "setting.json", "replay.py"], tmp_path / "outside")
    written = write_repro(out, model, "relu", {"x": x.numpy()}, Setting(), [])
    assert written == os.fspath(out)
    _untouched(out, targets)
    assert list(np.load(out / "inputs.npz")) == ["x"]


# -- SIGTERM ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def endless(tmp_path_factory):
    """A real export whose ONNX model holds a Loop of 10**12 iterations: a run that never ends."""
    x = torch.randn(4, 8)
    ep, prog = export_module(Chain(), (x,))
    bad, _ = with_endless_loop(prog.model_proto)
    folder = tmp_path_factory.mktemp("sigterm")
    torch.export.save(ep, folder / "model.pt2")
    onnx.save(bad, folder / "endless.onnx")
    torch.save((x,), folder / "inputs.pt")
    return folder


# the progress bar past 0 nodes: the FX side has run, and the input records, yielded before it, are kept
_PROGRESS = re.compile(rb"comparing:[^\r\n]*?\b([1-9]\d*)/\d+")


def test_cli_sigterm_writes_the_partial_output(endless):
    folder = endless
    out = folder / "terminated.csv"
    argv = [sys.executable, "-m", "sbs_widget", "compare", "--ep", str(folder / "model.pt2"), "--onnx",
            str(folder / "endless.onnx"), "--inputs", str(folder / "inputs.pt"), "-o", str(out)]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    chunks: list[bytes] = []

    def read():
        for chunk in iter(lambda: proc.stderr.read1(4096), b""):
            chunks.append(chunk)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        end = time.monotonic() + 400  # a busy 2-core machine: the export's decomposition takes a while
        while not _PROGRESS.search(b"".join(chunks)) and proc.poll() is None:
            assert time.monotonic() < end, b"".join(chunks).decode(errors="replace")[-2000:]
            time.sleep(0.05)
        assert proc.poll() is None, b"".join(chunks).decode(errors="replace")[-2000:]
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    stderr = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 130, (proc.returncode, stderr[-2000:])
    assert "interrupted (SIGTERM)" in stderr, stderr[-2000:]
    assert out.exists(), stderr[-2000:]
    df = pd.read_csv(out)
    assert len(df) >= 1 and df.kind.iloc[0] == "input"
