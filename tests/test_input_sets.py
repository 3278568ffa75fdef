"""compare_input_sets: one program and its ONNX export on several input sets, on real exports and real
onnxruntime; in this process, in a process pool, on a real dask.distributed cluster, from a steal_forward dump.

The fault: every consumer of the first Linear's ReLU reads it with the positions from 8 on zeroed
(``faults.zero_beyond``): sequences of 8 or fewer agree, longer ones differ from the second Linear on."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile

import onnx
import pandas as pd
import pytest
import torch
from sets_models import LENGTHS, Net, length_fault

from sbs_widget.steps.input_sets import compare_input_sets, dump_calls, normalize_input_set


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    """(ep, faulty ModelProto, folder with program.pt2, bad.onnx and good.onnx, the input sets)."""
    folder = tmp_path_factory.mktemp("input_sets")
    ep, prog, bad, sets = length_fault()
    onnx.checker.check_model(bad)
    torch.export.save(ep, folder / "program.pt2")
    onnx.save(bad, folder / "bad.onnx")
    onnx.save(prog.model_proto, folder / "good.onnx")
    return ep, bad, folder, sets


def check_fault_found(result, long_inputs=(2, 3)):
    """The pair that reads the zeroed positions first is the first input-dependent one; the pairs before it
    agree on every input; the culprit across inputs is its node, named on the long inputs only."""
    assert len(result) == len(LENGTHS) and result.failed == []
    dependent = result.input_dependent
    assert dependent and dependent[0].onnx_name == "linear_1" and dependent[0].onnx_node_name == "node_linear_1"
    first = dependent[0]
    assert first.beyond_inputs == list(long_inputs) and first.n_mismatch == len(long_inputs) == first.n_beyond
    assert first.worst_input in long_inputs and first.err_abs_max > 0.1 and first.err_abs_median > 0
    before = [p for p in result.pairs if p.order < first.order and p.n_inputs]
    assert {p.onnx_name for p in before} >= {"x", "linear", "relu"}
    assert all(p.n_beyond == 0 and not p.input_dependent for p in before)
    # the downstream pairs inherit it: input-dependent too, after it in execution order
    assert [p.order for p in dependent] == sorted(p.order for p in dependent)
    top = result.culprits[0]
    assert top.onnx_node == "node_linear_1" and top.inputs == list(long_inputs) and top.best_rank == 1
    assert result.statuses[0].get("mismatch", 0) == 0 and result.statuses[3]["mismatch"] >= 3
    assert all(r.status != "mismatch" for r in result.records[1])
    df = result.to_dataframe()
    row = df[df.onnx_name == "linear_1"].iloc[0]
    assert bool(row.input_dependent) and row.worst_input in long_inputs
    assert row.worst_label == result.labels[int(row.worst_input)]
    assert {"err_abs_max", "err_abs_median", "n_beyond", "beyond_inputs"} <= set(df.columns)
    assert len(df) == len(result.pairs)


def test_in_process(pair):
    ep, bad, _, sets = pair
    result = compare_input_sets(ep, bad, sets, max_workers=0)
    check_fault_found(result)
    assert result.labels[0] == "((T1s2x4x16,),{})"
    assert result.atol == 1e-4 and len(result.culprits_per_input[3]) >= 1 and result.culprits_per_input[0] == []
    text = "\n".join(result.lines())
    assert "input-dependent pairs (mismatch on some inputs only), first in execution order" in text
    assert "linear_1 / linear_1 (Add): mismatch on 2 of 4 inputs [2, 3]" in text
    # the clean export: nothing input-dependent, nothing beyond tolerance
    clean = compare_input_sets(ep, onnx.load(pair[2] / "good.onnx"), sets, max_workers=0)
    assert clean.input_dependent == [] and clean.culprits == [] and all(p.n_beyond == 0 for p in clean.pairs)


def test_input_forms_and_a_failing_input(pair):
    """dicts of keyword inputs, (args, kwargs) pairs, a DataLoader; an input that does not fit is recorded with
    its error, the others are kept."""
    ep, bad, _, sets = pair
    forms = [{"x": sets[0][0]}, ((sets[3][0],), {}), (torch.randn(2, 5, 7),), sets[2]]
    result = compare_input_sets(ep, bad, forms, max_workers=0)
    assert result.failed == [2] and "x" in result.errors[2] and result.records[2] == []
    assert result.statuses[2] == {"error": 1}
    assert [p.beyond_inputs for p in result.input_dependent][:1] == [[1, 3]]
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(4, 12, 16)), batch_size=2)
    from_loader = compare_input_sets(ep, bad, loader, max_workers=0)
    assert len(from_loader) == 2 and from_loader.failed == [] and from_loader.input_dependent == []
    assert all(p.n_mismatch == 2 for p in from_loader.pairs if p.onnx_name == "linear_1")  # 12 > 8: both
    assert normalize_input_set(torch.ones(1))[1] == {}
    with pytest.raises(Exception, match="input set"):
        normalize_input_set(3)


def test_process_pool(pair):
    """The default executor (a spawned process pool), two workers, the models given in memory: saved into a
    temporary folder removed after."""
    ep, bad, _, sets = pair
    before = set(os.listdir(tempfile.gettempdir()))
    result = compare_input_sets(ep, bad, sets + [(torch.randn(2, 5, 7),)], max_workers=2)
    assert result.failed == [4] and result.records[4] == []
    result.records.pop(), result.errors.pop()  # the input that does not fit aside, the fault is found
    here = compare_input_sets(ep, bad, sets, max_workers=0)
    assert [(p.key, p.n_mismatch, p.err_abs_max) for p in result.pairs] == \
        [(p.key, p.n_mismatch, p.err_abs_max) for p in here.pairs]
    assert [p.onnx_name for p in result.input_dependent] == [p.onnx_name for p in here.input_dependent]
    assert result.culprits[0].onnx_node == "node_linear_1" and result.culprits[0].inputs == [2, 3]
    left = {n for n in set(os.listdir(tempfile.gettempdir())) - before if n.startswith("sbs_input_sets_")}
    assert left == set()


def test_dask_distributed(pair):
    """A real dask.distributed LocalCluster (worker processes), through Client.get_executor(); the models as
    paths."""
    distributed = pytest.importorskip("distributed")
    _, _, folder, sets = pair
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cl, \
            distributed.Client(cl) as client:
        result = compare_input_sets(folder / "program.pt2", folder / "bad.onnx", sets,
                                    executor=client.get_executor())
    check_fault_found(result)


def test_steal_forward_dump(pair, tmp_path):
    """Each call of the top module stolen into a dump is one input set."""
    from sbs_widget.dumps.steal import load_dump, steal_forward

    ep, bad, _, sets = pair
    model = Net().eval()
    with steal_forward([model, model.fc2], dump_file=tmp_path / "calls.onnx"), torch.no_grad():
        for (x,) in sets:
            model(x)
    calls = dump_calls(load_dump(tmp_path / "calls.onnx"))
    assert [label for label, _ in calls] == ["Net[0]", "Net[1]", "Net[2]", "Net[3]"]
    result = compare_input_sets(ep, bad, tmp_path / "calls.onnx", max_workers=0)
    check_fault_found(result)
    assert result.labels == ["Net[0]", "Net[1]", "Net[2]", "Net[3]"]
    with pytest.raises(Exception, match="no call of 'nope'"):
        compare_input_sets(ep, bad, tmp_path / "calls.onnx", max_workers=0, dump_module="nope")


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "sbs_widget", *map(str, args)], capture_output=True, text=True,
                          timeout=300)


def test_cli_compare_several_inputs(pair, tmp_path):
    """``compare`` with several --inputs files: the spread summary, the input-dependent pairs first, -o one row
    per pair with its worst input; with one file, the comparison as before."""
    _, _, folder, sets = pair
    for s, (x,) in zip(LENGTHS, sets):
        torch.save((x,), tmp_path / f"len{s}.pt")
    files = [tmp_path / f"len{s}.pt" for s in LENGTHS]
    res = _cli("compare", "--ep", folder / "program.pt2", "--onnx", folder / "bad.onnx", "--inputs", *files,
               "-o", tmp_path / "spread.csv")
    assert res.returncode == 0, res.stderr
    out = res.stdout
    assert "input sets: 4 compared, 4 ran to the end" in out and "#3 len16.pt:" in out
    assert out.index("input-dependent pairs (mismatch on some inputs only)") < out.index("culprit Add node")
    assert "linear_1 / linear_1 (Add): mismatch on 2 of 4 inputs [2, 3]" in out
    assert "input sets: 4/4 compared" in res.stderr
    df = pd.read_csv(tmp_path / "spread.csv")
    row = df[df.onnx_name == "linear_1"].iloc[0]
    assert row.input_dependent and row.worst_label in ("len12.pt", "len16.pt") and row.n_mismatch == 2
    res = _cli("compare", "--ep", folder / "program.pt2", "--onnx", folder / "bad.onnx", "--inputs", files[0],
               files[1], "--workers", "0", "--quiet", "-o", tmp_path / "spread.json")
    assert res.returncode == 1 and "use one of .csv, .xlsx, .parquet" in res.stderr
    res = _cli("compare", "--ep", folder / "program.pt2", "--onnx", folder / "bad.onnx", "--inputs", files[0],
               tmp_path / "missing.pt", "--workers", "0")
    assert res.returncode == 1 and "inputs file not found" in res.stderr


def test_bounded_in_flight(pair):
    """Any Executor (a one-thread pool here): an iterable of sets is read as tasks are submitted, at most
    ``2 * workers`` ahead of those done; the answer is the same as in this process."""
    from concurrent.futures import ThreadPoolExecutor

    _, _, folder, sets = pair
    done, ahead = [0], []

    def generated():
        for i in range(6):
            ahead.append(i - done[0])
            yield sets[i % len(sets)]

    with ThreadPoolExecutor(1) as pool:
        result = compare_input_sets(folder / "program.pt2", folder / "bad.onnx", generated(), executor=pool,
                                    progress=lambda n, total: done.__setitem__(0, n))
    assert len(result) == 6 and result.failed == [] and max(ahead) <= 2
    assert [p.beyond_inputs for p in result.input_dependent][0] == [2, 3]
