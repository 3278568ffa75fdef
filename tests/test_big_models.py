"""Big models, tested small: the lean ONNX reader (a path's big initializers stay in the file) gives the
same initializers and the same records as ``onnx.load``; a weight that differs in one element is still
found, with where; external data works; segments that embed weights get their real bytes.

The threshold above which an initializer is left in the file is lowered here, so that the small
models of the suite go through the same code as a LLaMA's weights (benchmarks/big_memory.py runs
the big ones)."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys

import numpy as np
import onnx
import pytest
import torch
from engine_models import export_module, exported
from onnx import numpy_helper

import sbs_widget
from sbs_widget.engine import entry
from sbs_widget.engine.segments import describe_segment, segment_model
from sbs_widget.load import lean_onnx
from sbs_widget.load.onnx_index import OnnxIndex
from sbs_widget.load.readers import EAGER_ENV, load_onnx


@pytest.fixture(autouse=True)
def small_threshold(monkeypatch):
    monkeypatch.setattr(lean_onnx, "BIG", 256)
    entry._PREPARED.clear()  # a path prepared by one reader is not served to the other
    yield
    entry._PREPARED.clear()


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(32, 64)  # 2,048 elements: big enough to be served from torch's memory
        self.down = torch.nn.Linear(64, 40)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


@pytest.fixture(scope="module")
def mlp():
    torch.manual_seed(0)
    model = Mlp().eval()
    x = torch.randn(2, 32)
    ep, prog = export_module(model, (x,))
    return ep, prog.model_proto, x


def _save(model: onnx.ModelProto, folder, external: bool) -> str:
    path = os.fspath(folder / ("ext.onnx" if external else "single.onnx"))
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    if external:
        onnx.save_model(copy, path, save_as_external_data=True, location="ext.onnx.data", size_threshold=0)
    else:
        onnx.save_model(copy, path)
    return path


def _records(ep, onx, args, eager: bool, monkeypatch) -> list[dict]:
    monkeypatch.setenv(EAGER_ENV, "1" if eager else "0")
    entry._PREPARED.clear()
    out = []
    for r in sbs_widget.run_aligned(ep, onx, args):
        out.append({k: v for k, v in dataclasses.asdict(r).items() if "time" not in k})
    return out


@pytest.mark.parametrize("external", [False, True])
def test_lean_reader_gives_the_initializers_of_onnx_load(mlp, tmp_path, external):
    _, model, _ = mlp
    path = _save(model, tmp_path, external)
    lean, data = lean_onnx.read_lean(path)
    full = onnx.load(path)
    assert len(data.refs) >= 2  # the weights were left in the file
    index = OnnxIndex.build(lean, data)
    assert [t.name for t in lean.graph.initializer] == [t.name for t in full.graph.initializer]
    for t in full.graph.initializer:
        expected = numpy_helper.to_array(t)
        got, _ = index.initializer_data(t.name)
        assert got.dtype == expected.dtype and got.shape == expected.shape
        assert got.tobytes() == expected.tobytes()
        assert numpy_helper.to_array(index.initializer_proto(t.name)).tobytes() == expected.tobytes()
        if index.in_file(t.name):
            assert not got.flags.writeable  # mapped read-only: never written back to the file
            assert lean.graph.initializer[[i.name for i in lean.graph.initializer].index(t.name)].raw_data == b""
    # everything else of the model is what onnx.load reads
    for a, b in zip(lean.graph.node, full.graph.node):
        assert a == b
    # a model left in the file still runs in onnxruntime from its folder (references are relative)
    if not external:
        import onnxruntime as ort

        lean_path = tmp_path / "lean_copy.onnx"
        for t in lean.graph.initializer:
            for e in t.external_data:
                if e.key == "location":
                    assert e.value == os.path.basename(path)
        onnx.save_model(lean, lean_path)
        x = np.random.default_rng(0).standard_normal((2, 32)).astype(np.float32)
        s1 = ort.InferenceSession(os.fspath(lean_path), providers=["CPUExecutionProvider"])
        s2 = ort.InferenceSession(path, providers=["CPUExecutionProvider"])
        feed = {s1.get_inputs()[0].name: x}
        np.testing.assert_array_equal(s1.run(None, feed)[0], s2.run(None, feed)[0])


def test_lean_model_is_small(mlp, tmp_path):
    _, model, _ = mlp
    path = _save(model, tmp_path, external=False)
    lean, data = lean_onnx.read_lean(path)
    weights = sum(data.size(n) for n in data.refs)
    assert lean.ByteSize() + weights >= os.path.getsize(path) - 1024
    assert lean.ByteSize() < os.path.getsize(path) - weights + 1024


@pytest.mark.parametrize("external", [False, True])
def test_mapped_feeds_give_the_records_of_onnx_load(tmp_path, monkeypatch, external):
    ep, prog, args, kwargs = exported("dummy_llm", True)
    path = _save(prog.model_proto, tmp_path, external)
    before = _records(ep, path, args, eager=True, monkeypatch=monkeypatch)
    after = _records(ep, path, args, eager=False, monkeypatch=monkeypatch)
    prepared = entry.prepare(ep, path)
    assert prepared.index.data is not None and len(prepared.index.data.refs) > 3
    assert prepared.weights().shared > 0  # bitwise-equal weights served from torch's memory
    assert [r["status"] for r in after] == [r["status"] for r in before]
    assert after == before
    # and the same as from the ModelProto in memory (today's path for objects)
    entry._PREPARED.clear()
    in_memory = [{k: v for k, v in dataclasses.asdict(r).items() if "time" not in k}
                 for r in sbs_widget.run_aligned(ep, prog.model_proto, args)]
    assert in_memory == after


@pytest.mark.parametrize("external", [False, True])
def test_a_changed_element_of_a_big_initializer_is_found_with_where(mlp, tmp_path, monkeypatch, external):
    ep, model, x = mlp
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    init = next(t for t in bad.graph.initializer if t.name == "up.weight")
    arr = numpy_helper.to_array(init).copy()
    arr[37, 5] += 0.5
    init.CopyFrom(numpy_helper.from_array(arr, init.name))
    path = _save(bad, tmp_path, external)
    after = _records(ep, path, (x,), eager=False, monkeypatch=monkeypatch)
    before = _records(ep, path, (x,), eager=True, monkeypatch=monkeypatch)
    assert after == before
    rec = next(r for r in after if r["kind"] == "weight" and r["onnx_name"] == "up.weight")
    assert rec["status"] == "mismatch"
    assert rec["err_abs"] == pytest.approx(0.5, rel=1e-3)
    assert rec["err_where"] and "37" in rec["err_where"] and "5" in rec["err_where"]
    prepared = entry.prepare(ep, path)
    weights = prepared.weights()
    assert weights.shared >= 1  # the other weights still come from torch
    assert not weights["up.weight"].flags.writeable  # the file's values, mapped
    assert weights["up.weight"][37, 5] == arr[37, 5]


def test_chunked_comparison_finds_a_difference_in_any_chunk(mlp, tmp_path, monkeypatch):
    _, model, _ = mlp
    path = _save(model, tmp_path, external=False)
    lean, data = lean_onnx.read_lean(path)
    monkeypatch.setattr(lean_onnx.InitializerFile, "CHUNK", 64)  # many chunks, and rows split across none
    values = numpy_helper.to_array(next(t for t in model.graph.initializer if t.name == "up.weight"))
    assert data.equals("up.weight", values)
    assert data.equals("up.weight", np.asfortranarray(values))  # any layout, compared in C order
    assert not data.equals("up.weight", values.T.copy().T[:, :-1])
    for i in (0, values.size // 2, values.size - 1):
        changed = values.copy().reshape(-1)
        changed[i] = np.nextafter(changed[i], np.float32(np.inf))
        assert not data.equals("up.weight", changed.reshape(values.shape))
    negative_zero = values.copy()
    negative_zero[0, 0] = -0.0 if values[0, 0] == 0 else values[0, 0]
    assert data.equals("up.weight", negative_zero) == (negative_zero.tobytes() == values.tobytes())


def test_segments_that_embed_every_weight_get_their_bytes(tmp_path):
    ep, prog, args, kwargs = exported("dummy_llm", True)
    path = _save(prog.model_proto, tmp_path, external=True)
    lean, data = load_onnx(path)
    index = OnnxIndex.build(lean, data)
    full = OnnxIndex.build(onnx.load(path))
    n = len(index.nodes)
    last = {o: n for o in index.outputs}
    seg = describe_segment(index, 0, n, set(index.outputs), last, weights_in=True)
    assert any(index.in_file(x) for x in seg.embedded)
    types = {x: 7 for x in index.inputs}
    made = segment_model(index, seg, types)
    expected = segment_model(full, describe_segment(full, 0, n, set(full.outputs), last, weights_in=True), types)
    assert [t.name for t in made.graph.initializer] == [t.name for t in expected.graph.initializer]
    for a, b in zip(made.graph.initializer, expected.graph.initializer):
        assert a.data_location == onnx.TensorProto.DEFAULT and not a.external_data
        assert numpy_helper.to_array(a).tobytes() == numpy_helper.to_array(b).tobytes()


def test_external_data_out_of_the_folder_or_too_short_is_refused(mlp, tmp_path):
    _, model, _ = mlp
    path = _save(model, tmp_path, external=True)
    lean = onnx.load(path, load_external_data=False)
    t = next(t for t in lean.graph.initializer if t.name == "up.weight")
    entries = {e.key: e for e in t.external_data}
    entries["length"].value = str(int(entries["length"].value) - 4)
    onnx.save_model(lean, tmp_path / "short.onnx")
    with pytest.raises(sbs_widget.LoadError, match="up.weight.*bytes of data where its shape needs"):
        load_onnx(tmp_path / "short.onnx")
    entries["length"].value = str(int(entries["length"].value) + 4)
    entries["offset"].value = str(10**9)
    onnx.save_model(lean, tmp_path / "far.onnx")
    with pytest.raises(sbs_widget.LoadError, match="up.weight"):
        load_onnx(tmp_path / "far.onnx")
    entries["offset"].value = "0"
    entries["location"].value = "../" + tmp_path.name + "/ext.onnx.data"
    onnx.save_model(lean, tmp_path / "escape.onnx")
    with pytest.raises(sbs_widget.LoadError):
        load_onnx(tmp_path / "escape.onnx")


def test_a_truncated_file_gets_the_loader_error(mlp, tmp_path):
    _, model, _ = mlp
    path = _save(model, tmp_path, external=False)
    data = open(path, "rb").read()
    cut = tmp_path / "cut.onnx"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(sbs_widget.LoadError, match="cannot load ONNX model"):
        load_onnx(cut)


def test_check_deployed_from_a_path_with_weights_left_in_the_file(mlp, tmp_path):
    ep, model, x = mlp
    path = _save(model, tmp_path, external=False)
    result = sbs_widget.check_deployed(ep, path, (x,))
    assert result.verdict == "same"


def test_full_model_holds_every_byte(mlp, tmp_path):
    _, model, _ = mlp
    path = _save(model, tmp_path, external=False)
    lean, data = load_onnx(path)
    full = OnnxIndex.build(lean, data).full_model()
    assert full is not lean and all(t.data_location == onnx.TensorProto.DEFAULT for t in full.graph.initializer)
    assert [numpy_helper.to_array(t).tobytes() for t in full.graph.initializer] == \
        [numpy_helper.to_array(t).tobytes() for t in model.graph.initializer]


def test_the_lockstep_as_deployed_from_a_path_with_weights_left_in_the_file(mlp, tmp_path):
    """DeployedRuntime optimizes the whole model once to find what vanishes, and copies every weight into
    its segments: both from a path whose big weights stayed in the file."""
    ep, model, x = mlp
    path = _save(model, tmp_path, external=False)
    records = list(sbs_widget.run_aligned(ep, path, (x,), runtime=sbs_widget.DeployedRuntime()))
    assert records and not [r for r in records if r.status in ("mismatch", "error")]



_BIG_BLOCKS = """
import ctypes, os, sys
from sbs_widget.engine.weights import BIG_BLOCK, big_blocks_apart

libc = ctypes.CDLL("libc.so.6")
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]

def rss():  # anonymous memory only: a shared library's pages read meanwhile are not the heap's
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("RssAnon:")) * 1024

raised = libc.malloc(30 << 20)  # a 30 MB mapped block freed: glibc's own threshold would rise to 30 MB
ctypes.memset(raised, 1, 30 << 20)
libc.free(raised)
if sys.argv[1] == "apart":
    big_blocks_apart()  # (what a run on a model of BIG_MODEL_BYTES of weights or more does)
before = rss()
big, small = [], []
for _ in range(8):  # 64 MB in blocks of 2 x BIG_BLOCK, every page touched, small blocks between them
    big.append(libc.malloc(2 * BIG_BLOCK))
    ctypes.memset(big[-1], 1, 2 * BIG_BLOCK)
    small.append(libc.malloc(300 << 10))
assert rss() - before > 48 << 20
for b in big:
    libc.free(b)
print(rss() - before)
"""


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="Linux (glibc) only")
def test_big_blocks_freed_are_handed_back():
    """The runtime's float32 casts of float16 weights (big blocks, allocated and freed by every segment,
    between small blocks that stay) leave nothing resident once freed, even after glibc raised its mmap
    threshold: it is fixed when the weights of a big model (``BIG_MODEL_BYTES``) are served. In a fresh
    process: a heap with free chunks left by other tests would serve some blocks from them."""
    def kept(mode: str) -> int:
        out = subprocess.run([sys.executable, "-c", _BIG_BLOCKS, mode], capture_output=True, text=True, timeout=120)
        assert out.returncode == 0, out.stderr
        return int(out.stdout.split()[-1])

    assert kept("apart") < 8 << 20  # handed back
    assert kept("glibc") > 48 << 20  # glibc's own threshold: the freed blocks stay (what the fix is for)
