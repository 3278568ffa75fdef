"""A big ``.pt2``'s weights mapped from the file (``load/mapped_weights.py``), tested small: the mapping
is forced on (``SBS_WIDGET_MAP_WEIGHTS=1``) so the suite's small programs go the way a LLaMA's do
(benchmarks/big_memory.py measures the big ones). The records are those of the program held in memory,
a fault is still found, the pages read are handed back, and a file changed under a live program is
refused rather than read (one deleted or replaced under its name is still the file mapped)."""

from __future__ import annotations

import dataclasses
import os
import shutil

import numpy as np
import onnx
import pytest
import torch
from engine_models import exported
from onnx import numpy_helper

import sbs_widget
from sbs_widget.engine import entry
from sbs_widget.errors import LoadError
from sbs_widget.load import mapped_weights
from sbs_widget.load.mapped_weights import MAP_ENV, weight_files


@pytest.fixture(autouse=True)
def fresh_cache():
    entry._PREPARED.clear()  # a path prepared one way is not served to the other
    yield
    entry._PREPARED.clear()


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """dummy_llm saved as files: (.pt2 path, .onnx path, args)."""
    ep, prog, args, kwargs = exported("dummy_llm", True)
    folder = tmp_path_factory.mktemp("mapped")
    pt2 = os.fspath(folder / "user.pt2")
    torch.export.save(ep, pt2)
    onx = os.fspath(folder / "model.onnx")
    onnx.save_model(prog.model_proto, onx)
    return pt2, onx, args


def _records(pt2, onx, args, mapped: bool, monkeypatch) -> list[dict]:
    monkeypatch.setenv(MAP_ENV, "1" if mapped else "0")
    entry._PREPARED.clear()
    return [{k: v for k, v in dataclasses.asdict(r).items() if "time" not in k}
            for r in sbs_widget.run_aligned(pt2, onx, args)]


def _resident_bytes(mapped) -> int:
    """Bytes of ``mapped`` (a WeightFile) resident in this process (its mapping's Rss in smaps)."""
    with open("/proc/self/smaps") as f:
        lines = f.read().splitlines()
    rss, inside = 0, False
    for line in lines:
        head = line.split()[0]
        if "-" in head and not head.endswith(":"):
            start, end = (int(x, 16) for x in head.split("-"))
            inside = start <= mapped.base < end
        elif inside and head == "Rss:":
            rss += int(line.split()[1]) * 1024
    return rss


def test_a_mapped_program_gives_the_records_of_one_held_in_memory(saved, monkeypatch):
    pt2, onx, args = saved
    held = _records(pt2, onx, args, mapped=False, monkeypatch=monkeypatch)
    assert not entry.prepare(pt2, onx).weight_files  # (held: nothing mapped)
    mapped = _records(pt2, onx, args, mapped=True, monkeypatch=monkeypatch)
    prepared = entry.prepare(pt2, onx)
    assert len(prepared.weight_files) == 1
    (f,) = prepared.weight_files
    params = list(prepared.decomposed_ep.state_dict.values())
    assert params and all(f.base <= t.data_ptr() < f.base + len(f) for t in params)  # views, not copies
    assert mapped == held
    assert sum(r["kind"] == "weight" for r in mapped) >= 4


def test_a_changed_weight_is_found_in_a_mapped_program(saved, tmp_path, monkeypatch):
    pt2, onx, args = saved
    model = onnx.load(onx)
    init = max(model.graph.initializer, key=lambda t: int(np.prod(t.dims)))  # the biggest weight
    arr = numpy_helper.to_array(init).copy()
    where = tuple(d // 2 for d in arr.shape)
    arr[where] += 0.25
    init.CopyFrom(numpy_helper.from_array(arr, init.name))
    bad = os.fspath(tmp_path / "bad.onnx")
    onnx.save_model(model, bad)
    held = _records(pt2, bad, args, mapped=False, monkeypatch=monkeypatch)
    mapped = _records(pt2, bad, args, mapped=True, monkeypatch=monkeypatch)
    assert mapped == held
    rec = next(r for r in mapped if r["kind"] == "weight" and r["onnx_name"] == init.name)
    assert rec["status"] == "mismatch"
    assert rec["err_abs"] == pytest.approx(0.25, rel=1e-2)
    assert all(str(i) in rec["err_where"] for i in where)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux only")
def test_the_pages_read_are_handed_back(saved, monkeypatch):
    pt2, onx, args = saved
    monkeypatch.setenv(MAP_ENV, "1")
    prepared = entry.prepare(pt2, onx)
    (f,) = prepared.weight_files
    weights = sum(t.nbytes for t in prepared.decomposed_ep.state_dict.values())
    f.release()
    assert _resident_bytes(f) == 0
    total = sum(float(t.detach().double().sum()) for t in prepared.decomposed_ep.state_dict.values())
    assert np.isfinite(total)
    assert _resident_bytes(f) >= 0.9 * weights  # read: mapped into the process
    records = list(prepared.run(args))
    assert any(r.kind == "weight" for r in records)
    assert _resident_bytes(f) == 0  # handed back after the run (the file's pages stay in the page cache)


def test_a_file_changed_under_a_live_program_is_refused_and_a_new_call_loads_it_again(saved, tmp_path, monkeypatch):
    pt2, onx, args = saved
    monkeypatch.setenv(MAP_ENV, "1")
    copy = shutil.copyfile(pt2, os.fspath(tmp_path / "copy.pt2"))
    prepared = entry.prepare(copy, onx)
    first = [r.status for r in prepared.run(args)]
    stat = os.stat(copy)
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))  # written to (same bytes)
    with pytest.raises(LoadError, match="was written to after it was loaded"):
        list(prepared.run(args))
    again = entry.prepare(copy, onx)  # same bytes, so the same cache key: prepared again all the same
    assert again is not prepared and again.weight_files[0].unchanged()
    assert [r.status for r in again.run(args)] == first


def test_small_files_are_held_in_memory_unless_asked(saved, monkeypatch):
    pt2, onx, args = saved
    monkeypatch.delenv(MAP_ENV, raising=False)
    assert os.path.getsize(pt2) < mapped_weights.MAP_FROM_BYTES
    assert not entry.prepare(pt2, onx).weight_files
    monkeypatch.setattr(mapped_weights, "MAP_FROM_BYTES", 1)
    entry._PREPARED.clear()
    prepared = entry.prepare(pt2, onx)
    assert weight_files(prepared.decomposed_ep.state_dict.values()) == prepared.weight_files != []


def test_a_file_deleted_or_replaced_under_its_name_still_runs(saved, tmp_path, monkeypatch):
    """The file mapped stays while its program lives: deleting it, or saving another under its name
    (a new file, as a copy or a rename makes), changes nothing for the program loaded."""
    pt2, onx, args = saved
    monkeypatch.setenv(MAP_ENV, "1")
    copy = shutil.copyfile(pt2, os.fspath(tmp_path / "gone.pt2"))
    prepared = entry.prepare(copy, onx)
    first = [(r.status, r.err_abs) for r in prepared.run(args)]
    os.remove(copy)
    assert [(r.status, r.err_abs) for r in prepared.run(args)] == first
    with open(copy + ".new", "wb") as dst:
        dst.write(b"another file")
    os.replace(copy + ".new", copy)
    assert [(r.status, r.err_abs) for r in prepared.run(args)] == first
