"""Runs are bounded and can always be stopped: a real ONNX export with a Loop of 10**12 iterations
inserted on the path of a value (it never ends), run with a time limit, stopped from the widget,
interrupted with Ctrl-C in the CLI; one stuck run never blocks the next comparison."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import onnx
import pandas as pd
import pytest
import torch
from engine_models import export_module
from onnx import TensorProto as T
from onnx import helper

import sbs_widget
from sbs_widget.engine.entry import prepare
from sbs_widget.errors import InputError, RunCancelled, RunTimeout

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


class Chain(torch.nn.Module):
    """A few ops before and after the value the Loop is inserted on."""

    def forward(self, x):
        a = torch.relu(x * 2.0)
        b = torch.sigmoid(a) + 1.0
        return torch.tanh(b) * 3.0 - x


def with_endless_loop(model: onnx.ModelProto) -> tuple[onnx.ModelProto, str]:
    """``model`` with a Loop of 10**12 identity iterations on the output of its Sigmoid node (the
    readers of that value read the Loop's output: same values, were it ever to end)."""
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    g = bad.graph
    pos, node = next((i, n) for i, n in enumerate(g.node) if n.op_type == "Sigmoid")
    value, looped = node.output[0], node.output[0] + "_looped"
    for n in g.node:
        for k, x in enumerate(n.input):
            if x == value:
                n.input[k] = looped
    body = helper.make_graph(
        [helper.make_node("Identity", ["cond_in"], ["cond_out"]), helper.make_node("Identity", ["v_in"], ["v_out"])],
        "endless_body",
        [helper.make_tensor_value_info("i", T.INT64, []), helper.make_tensor_value_info("cond_in", T.BOOL, []),
         helper.make_tensor_value_info("v_in", T.FLOAT, None)],
        [helper.make_tensor_value_info("cond_out", T.BOOL, []), helper.make_tensor_value_info("v_out", T.FLOAT, None)])
    g.initializer.extend([helper.make_tensor("sbs_trip_count", T.INT64, [], [10 ** 12]),
                          helper.make_tensor("sbs_keep_going", T.BOOL, [], [True])])
    g.node.insert(pos + 1, helper.make_node("Loop", ["sbs_trip_count", "sbs_keep_going", value], [looped],
                                            name="endless_loop", body=body))
    return bad, value


@pytest.fixture(scope="module")
def endless(tmp_path_factory):
    x = torch.randn(4, 8)
    ep, prog = export_module(Chain(), (x,))
    bad, value = with_endless_loop(prog.model_proto)
    folder = tmp_path_factory.mktemp("bounds")
    torch.export.save(ep, folder / "model.pt2")
    onnx.save(bad, folder / "endless.onnx")
    torch.save((x,), folder / "inputs.pt")
    return ep, prog, bad, (x,), folder


def _consume(iterator, records):
    """Collect records until the run ends; the error it ends with, or None."""
    try:
        for r in iterator:
            records.append(r)
    except RunCancelled as e:
        return e
    return None


def test_time_limit_ends_a_loop_that_never_ends_and_keeps_the_records(endless):
    ep, _, bad, args, _ = endless
    records: list = []
    begin = time.monotonic()
    # segment_nodes=2: the nodes before the Loop run (and are compared) in segments of their own
    error = _consume(sbs_widget.run_aligned(ep, bad, args, time_limit=2, segment_nodes=2), records)
    elapsed = time.monotonic() - begin
    assert isinstance(error, RunTimeout) and error.reason == "time limit"
    assert elapsed < 2 + 8, elapsed
    assert "time limit of 2 s reached" in str(error) and "endless_loop" in str(error), str(error)
    assert "time_limit" in str(error)  # the fix is named
    kinds = {r.kind for r in records}
    assert "input" in kinds and any(r.kind == "node" and r.status == "ok" for r in records), \
        "the values compared before the Loop are kept"


def test_time_limit_whole_model_in_one_segment(endless):
    ep, _, bad, args, _ = endless
    records: list = []
    begin = time.monotonic()
    error = _consume(prepare(ep, bad).run(args, time_limit=1.5), records)
    assert isinstance(error, RunTimeout) and time.monotonic() - begin < 8
    assert records and records[0].kind == "input"


def test_time_limit_is_validated(endless):
    ep, _, bad, args, _ = endless
    for wrong in (0, -1, float("nan"), float("inf"), "soon"):
        with pytest.raises(InputError, match="time_limit"):
            prepare(ep, bad).run(args, time_limit=wrong)


def test_a_run_within_its_time_limit_is_unchanged(endless):
    ep, prog, _, args, _ = endless
    plain = list(sbs_widget.run_aligned(ep, prog.model_proto, args))
    bounded = list(sbs_widget.run_aligned(ep, prog.model_proto, args, time_limit=60))
    assert [(r.ep_name, r.onnx_name, r.status) for r in plain] == [(r.ep_name, r.onnx_name, r.status) for r in bounded]
    assert all(r.status in ("ok", "one-sided") for r in bounded)


# -- the notebook widget -------------------------------------------------------------------------

def _wait_for(predicate, seconds=60.0):
    end = time.monotonic() + seconds
    while not predicate():
        assert time.monotonic() < end, "timed out waiting"
        time.sleep(0.05)


def test_widget_stop_ends_a_stuck_run_and_the_next_comparisons_run(endless):
    from sbs_widget.views.widget import SbsWidget

    ep, prog, bad, args, _ = endless
    w = SbsWidget(ep, bad, args)
    _wait_for(lambda: w.status == "running" and len(w.records) >= 1)
    time.sleep(1.0)  # inside the Loop by now
    assert w.running and w.status == "running"
    begin = time.monotonic()
    w.stop()
    assert time.monotonic() - begin < 5
    assert not w.running and w.status == "stopped" and w.runs[-1].status == "stopped"
    assert "endless_loop" in w.message, w.message
    assert w.records and w.records[0].kind == "input", "the records so far are kept"
    w.wait(1)  # a stopped run is not an error
    # the same kernel compares on: another widget, the engine, and the stuck widget's rerun
    good = SbsWidget(ep, prog.model_proto, args).wait(60)
    assert good.status == "done" and good.records[-1].kind == "output"
    assert all(r.status in ("ok", "one-sided") for r in sbs_widget.run_aligned(ep, prog.model_proto, args))
    w.rerun()
    time.sleep(0.5)
    w.stop()
    assert w.status == "stopped" and len(w.runs) == 2


def test_widget_time_limit(endless):
    from sbs_widget.views.widget import SbsWidget

    ep, _, bad, args, _ = endless
    w = SbsWidget(ep, bad, args, time_limit=1)
    with pytest.raises(sbs_widget.errors.SbsError, match="time limit of 1 s reached"):
        w.wait(30)
    assert w.status == "error" and not w.running and "endless_loop" in w.message
    assert w.records, "the records so far are kept"
    with pytest.raises(InputError, match="time_limit"):
        SbsWidget(ep, bad, args, time_limit=-1)


def test_rerun_from_several_threads_leaves_no_run_running(endless):
    from sbs_widget.views.widget import SbsWidget

    ep, prog, _, args, _ = endless
    w = SbsWidget(ep, prog.model_proto, args).wait(60)
    barrier = threading.Barrier(4)

    def rerun():
        barrier.wait()
        w.rerun()

    threads = [threading.Thread(target=rerun) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    w.wait(60)
    assert len(w.runs) == 5 and w.status == "done" and not w.running
    assert all(r.status in ("done", "stopped") for r in w.runs)
    assert w.runs[-1].status == "done" and w.run_id == w.runs[-1].id


class InterruptingRuntime:
    """A runtime plug-in whose sessions raise KeyboardInterrupt (as Ctrl-C reaching that thread would)."""

    name = "interrupting"

    def compile(self, model):
        def run(feeds, outputs):
            raise KeyboardInterrupt

        return run


def test_keyboard_interrupt_in_the_run_thread_sets_a_final_status(endless):
    from sbs_widget.views.widget import SbsWidget

    ep, prog, _, args, _ = endless
    w = SbsWidget(ep, prog.model_proto, args, runtime=InterruptingRuntime())
    w.wait(60)
    assert w.status == "stopped" and not w.running and "KeyboardInterrupt" in w.message
    assert w.runs[-1].status == "stopped"


# -- runtimes that cannot be terminated are abandoned (in a subprocess: the stuck thread spins on) --

ABANDON_SCRIPT = r"""
import json, sys, time, warnings
warnings.simplefilter("ignore")
import onnx, torch, sbs_widget
from onnx.reference import ReferenceEvaluator
from sbs_widget.errors import RunTimeout
from sbs_widget.views.widget import SbsWidget
folder = sys.argv[1]
ep = torch.export.load(folder + "/model.pt2")
bad = onnx.load(folder + "/endless.onnx")
args = torch.load(folder + "/inputs.pt")
out = {}

# 1. the widget's run thread stuck in onnx.reference (pure Python, no terminate): stop() abandons it
w = SbsWidget(ep, bad, args, runtime="onnx.reference")
while not w.records:
    time.sleep(0.05)
time.sleep(1.0)
t = time.monotonic()
w.stop(timeout=2)
out["stop_s"] = time.monotonic() - t
out["status"], out["message"], out["running"] = w.status, w.message, w.running

class BackgroundReference:  # runs its segments on the shared runner thread, cannot be terminated
    name = "background-reference"
    compiles_in_background = True
    intra_op_num_threads = 1
    def compile(self, model):
        ev = ReferenceEvaluator(model)
        return lambda feeds, outputs: ev.run(outputs, feeds)

# 2. the shared runner thread stuck: the run ends at its time limit, the thread is abandoned
# (segments run on that thread with 2 cores or more; on one, in the caller's, which cannot be freed)
if sbs_widget.engine.runtimes.cores() >= 2:
    t = time.monotonic()
    records = []
    try:
        for r in sbs_widget.run_aligned(ep, bad, args, runtime=BackgroundReference(), time_limit=1):
            records.append(r)
    except RunTimeout as e:
        out["timeout"] = str(e)
    out["timeout_s"] = time.monotonic() - t
    out["timeout_records"] = len(records)

# 3. later comparisons run (on fresh threads) and complete
t = time.monotonic()
w2 = SbsWidget(ep, folder + "/good.onnx", args).wait(120)
out["next_status"], out["next_s"] = w2.status, time.monotonic() - t
print(json.dumps(out))
sys.stdout.flush()
"""


def test_a_call_that_cannot_be_terminated_is_abandoned_and_blocks_nothing(endless):
    ep, prog, _, _, folder = endless
    onnx.save(prog.model_proto, folder / "good.onnx")
    res = subprocess.run([sys.executable, "-c", ABANDON_SCRIPT, str(folder)], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 0, res.stderr[-3000:]
    out = __import__("json").loads(res.stdout.strip().splitlines()[-1])
    assert out["status"] == "stopped" and not out["running"] and "abandoned" in out["message"], out
    assert out["stop_s"] < 6, out
    if "timeout_s" in out:
        assert "time limit of 1 s reached" in out["timeout"] and "abandoned" in out["timeout"], out
        assert out["timeout_s"] < 10 and out["timeout_records"] >= 1, out
    assert out["next_status"] == "done", out


# -- the command line ----------------------------------------------------------------------------

def _cli_args(folder, out):
    return [sys.executable, "-m", "sbs_widget", "compare", "--ep", str(folder / "model.pt2"), "--onnx",
            str(folder / "endless.onnx"), "--inputs", str(folder / "inputs.pt"), "-o", str(out)]


def test_cli_time_limit_writes_partial_output_and_fails(endless):
    folder = endless[4]
    out = folder / "timeout.csv"
    res = subprocess.run(_cli_args(folder, out) + ["--time-limit", "2"], capture_output=True, text=True,
                         timeout=300)
    assert res.returncode == 1, res.stderr[-2000:]
    assert "time limit of 2 s reached" in res.stderr and "endless_loop" in res.stderr
    df = pd.read_csv(out)
    assert len(df) >= 1 and df.kind.iloc[0] == "input"
    bad = subprocess.run(_cli_args(folder, out) + ["--time-limit", "-3"], capture_output=True, text=True,
                         timeout=300)
    assert bad.returncode == 2 and "--time-limit" in bad.stderr


@pytest.mark.parametrize("one_core", [False, True], ids=["runner-thread", "main-thread"])
def test_cli_ctrl_c_exits_at_once_with_the_partial_output(endless, one_core):
    # one core: segments run in the main thread, inside the runtime call when Ctrl-C comes
    folder = endless[4]
    out = folder / f"interrupted_{one_core}.csv"
    proc = subprocess.Popen(_cli_args(folder, out), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            preexec_fn=(lambda: os.sched_setaffinity(0, {min(os.sched_getaffinity(0))}))
                            if one_core else None)
    chunks: list[bytes] = []

    def read():
        for line in iter(lambda: proc.stderr.read1(4096), b""):
            chunks.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        _wait_for(lambda: b"comparing" in b"".join(chunks) or proc.poll() is not None, 240)
        assert proc.poll() is None, b"".join(chunks).decode()[-2000:]
        time.sleep(1.5)  # the run is inside the Loop
        begin = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=30)
        elapsed = time.monotonic() - begin
    finally:
        if proc.poll() is None:
            proc.kill()
    reader.join(5)
    stderr = b"".join(chunks).decode(errors="replace")
    assert proc.returncode == 130, stderr[-2000:]
    assert elapsed < 5, elapsed
    assert "interrupted" in stderr and "endless_loop" in stderr
    assert out.exists() and pd.read_csv(out).kind.iloc[0] == "input"
