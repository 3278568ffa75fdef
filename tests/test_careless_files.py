"""Careless input: edited models, broken ONNX graphs, inputs that do not fit. Each gets an SbsError
naming what is wrong and what to do, never a stale or silently wrong answer."""

from __future__ import annotations

import os

import onnx
import pytest
import torch
from engine_models import export_module, exported

import sbs_widget
from sbs_widget.cli.main import main as cli_main
from sbs_widget.engine.entry import prepare


class Small(torch.nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.linear = torch.nn.Linear(4, 3)

    def forward(self, x):
        return torch.relu(self.linear(x)) * 2


@pytest.fixture(scope="module")
def small():
    x = torch.randn(2, 4)
    ep, prog = export_module(Small().eval(), (x,))
    return ep, prog.model_proto, x


def weight(model) -> onnx.TensorProto:
    return next(t for t in model.graph.initializer if t.name == "linear.weight")


def statuses(ep, onx, x):
    return [r.status for r in sbs_widget.run_aligned(ep, onx, (x,))]


def test_model_edited_in_place_is_prepared_again(small):
    """The cache is keyed by content: an initializer changed in place is seen by the next run."""
    ep, model, x = small
    onx = onnx.ModelProto()
    onx.CopyFrom(model)
    assert "mismatch" not in statuses(ep, onx, x)
    first = prepare(ep, onx)
    w = weight(onx)
    values = onnx.numpy_helper.to_array(w) + 1.0
    w.CopyFrom(onnx.numpy_helper.from_array(values, "linear.weight"))
    assert prepare(ep, onx) is not first
    assert "mismatch" in statuses(ep, onx, x)
    assert prepare(ep, onx) is prepare(ep, onx), "same content: the preparation is reused"


def test_file_rewritten_with_the_same_mtime_is_read_again(small, tmp_path):
    ep, model, x = small
    path = tmp_path / "m.onnx"
    onnx.save(model, path)
    stat = os.stat(path)
    assert "mismatch" not in statuses(ep, path, x)
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    w = weight(bad)
    w.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(w) * 3, "linear.weight"))
    onnx.save(bad, path)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert "mismatch" in statuses(ep, path, x)


def test_program_weight_changed_in_place_is_prepared_again(small):
    ep, model, x = small
    first = prepare(ep, model)
    with torch.no_grad():
        ep.state_dict["linear.weight"].add_(0.0)  # an in-place write, even of nothing, bumps the version
    assert prepare(ep, model) is not first


@pytest.mark.parametrize("delta", [-4, 4])
def test_initializer_bytes_that_do_not_fit_its_shape(small, tmp_path, delta):
    ep, model, x = small
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    w = weight(bad)
    w.raw_data = w.raw_data[:delta] if delta < 0 else w.raw_data + b"\0" * delta
    with pytest.raises(sbs_widget.LoadError, match=r"initializer 'linear.weight' \(FLOAT, shape \[3, 4\]\) "
                                                   r"holds \d+ bytes of data where its shape needs 48"):
        list(sbs_widget.run_aligned(ep, bad, (x,)))
    # the CLI says so in one line, before any work, and writes nothing
    onnx.save(bad, tmp_path / "bad.onnx")
    torch.export.save(ep, tmp_path / "m.pt2")
    torch.save((x,), tmp_path / "in.pt")
    out = tmp_path / "out.csv"
    rc = cli_main(["compare", "--ep", str(tmp_path / "m.pt2"), "--onnx", str(tmp_path / "bad.onnx"),
                   "--inputs", str(tmp_path / "in.pt"), "-o", str(out)])
    assert rc != 0 and not out.exists()


def test_empty_onnx_file(small, tmp_path):
    ep, _, x = small
    (tmp_path / "empty.onnx").write_bytes(b"")
    with pytest.raises(sbs_widget.LoadError, match="empty \\(0 bytes\\)"):
        list(sbs_widget.run_aligned(ep, tmp_path / "empty.onnx", (x,)))
    with pytest.raises(sbs_widget.LoadError, match="empty"):
        list(sbs_widget.run_aligned(ep, onnx.ModelProto(), (x,)))
    with pytest.raises(sbs_widget.LoadError, match="not a file"):
        list(sbs_widget.run_aligned(ep, tmp_path, (x,)))


def test_unsorted_graph_and_cycle(small):
    ep, model, x = small
    unsorted = onnx.ModelProto()
    unsorted.CopyFrom(model)
    nodes = list(unsorted.graph.node)
    del unsorted.graph.node[:]
    unsorted.graph.node.extend(reversed(nodes))
    with pytest.raises(sbs_widget.LoadError, match="not in topological order"):
        list(sbs_widget.run_aligned(ep, unsorted, (x,)))

    cyclic = onnx.ModelProto()
    cyclic.CopyFrom(model)
    first, last = cyclic.graph.node[0], cyclic.graph.node[len(cyclic.graph.node) - 1]
    first.input[0] = last.output[0]  # the first node now reads the last one's output
    with pytest.raises(sbs_widget.LoadError, match="cycle"):
        list(sbs_widget.run_aligned(ep, cyclic, (x,)))


def test_meta_device_input(small):
    ep, model, x = small
    with pytest.raises(sbs_widget.InputError, match="meta device"):
        list(sbs_widget.run_aligned(ep, model, (torch.empty(2, 4, device="meta"),)))


@pytest.mark.parametrize("data", [3, "hello", 2.5, None])
def test_inputs_file_holding_no_inputs(small, tmp_path, data):
    ep, model, x = small
    torch.save(data, tmp_path / "in.pt")
    with pytest.raises(sbs_widget.InputError, match=f"holds a {type(data).__name__}, not inputs"):
        list(sbs_widget.run_aligned(ep, model, tmp_path / "in.pt"))


@pytest.mark.parametrize("value", [3, "hello"])
def test_inputs_file_with_a_number_or_string_for_a_tensor(small, tmp_path, value):
    ep, model, x = small
    torch.save((value,), tmp_path / "in.pt")
    got = f"to be a tensor, but got <class .{type(value).__name__}.>.*expects 1 user inputs"
    with pytest.raises(sbs_widget.InputError, match=got):
        list(sbs_widget.run_aligned(ep, model, tmp_path / "in.pt"))


def test_two_files_exported_at_different_batches(small):
    ep, _, x = small
    _, other = export_module(Small().eval(), (torch.randn(4, 4),))
    with pytest.raises(sbs_widget.ModelMismatchError, match=r"input 'x' has the fixed shape \(4, 4\).*\(2, 4\)"):
        list(sbs_widget.run_aligned(ep, other.model_proto, (x,)))


def test_reset_names_given_as_one_string():
    ep, prog, args, kwargs = exported("dummy_llm", False)
    p = prepare(ep, prog.model_proto)
    fx = next(r.ep_name for r in p.run(args, kwargs) if r.kind == "node" and r.ep_name)
    one = [(r.ep_name, r.status) for r in p.run(args, kwargs, reset_names=fx)]
    listed = [(r.ep_name, r.status) for r in p.run(args, kwargs, reset_names=[fx])]
    assert one == listed


def test_dump_with_an_unknown_device(tmp_path):
    import json

    from sbs_widget.dumps.steal import METADATA_KEY

    model = Small().eval()
    with sbs_widget.steal_forward(model, dump_file=tmp_path / "d.onnx"):
        model(torch.randn(2, 4))
    dump = onnx.load(tmp_path / "d.onnx")
    prop = next(p for p in dump.metadata_props if p.key == METADATA_KEY)
    doc = json.loads(prop.value)
    doc["entries"][0]["value"] = {"_t": "device", "v": "evil:0"}
    prop.value = json.dumps(doc)
    onnx.save(dump, tmp_path / "d2.onnx")
    with pytest.raises(sbs_widget.LoadError, match="unknown device 'evil:0'"):
        sbs_widget.load_dump(tmp_path / "d2.onnx")
