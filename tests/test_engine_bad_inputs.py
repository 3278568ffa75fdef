"""Bad input gets a clear error or a clearly marked record; nothing already computed is lost."""

from __future__ import annotations

import contextlib
import io
import os
import warnings
import zipfile

import numpy as np
import onnx
import pytest
import torch
from engine_models import export_module, exported
from onnx import helper

import sbs_widget
from sbs_widget.engine.entry import prepare
from sbs_widget.engine.summary import summarize
from sbs_widget.samples import faults


def test_ep_and_onnx_from_different_models():
    ep, _, args, kwargs = exported("dummy_llm", False)
    _, other, _, _ = exported("mlp", False)
    with pytest.raises(sbs_widget.ModelMismatchError, match="not exported from this program|outputs"):
        sbs_widget.run_aligned(ep, other.model_proto, args, kwargs)


def test_onnx_model_without_exporter_metadata_is_said_so():
    """A model from the TorchScript exporter (dynamo=False) has no pkg.torch.onnx metadata: the run
    pairs what it can and says why the rest is one-sided, with the way out."""
    model, args = sbs_widget.dummy_llm()
    ep = torch.export.export(model, args)
    f = io.BytesIO()
    with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        torch.onnx.export(model, args, f, dynamo=False)
    legacy = onnx.load_from_string(f.getvalue())
    with pytest.warns(sbs_widget.SbsWidgetWarning, match="no pkg.torch.onnx metadata.*dynamo=True"):
        p = prepare(ep, legacy)
    records = list(p.run(args, {}))
    assert records[-1].kind == "output" and records[-1].status == "ok"
    assert any("dynamo=True" in line for line in summarize(records, p).lines())


def test_output_count_disagrees():
    class Two(torch.nn.Module):
        def forward(self, x):
            return x + 1, x * 2

    class One(torch.nn.Module):
        def forward(self, x):
            return x + 1

    x = torch.randn(2, 3)
    ep, _ = export_module(Two(), (x,))
    _, prog = export_module(One(), (x,))
    with pytest.raises(sbs_widget.ModelMismatchError, match="2 outputs and the ONNX model 1"):
        sbs_widget.run_aligned(ep, prog.model_proto, (x,))


def test_wrong_inputs():
    ep, prog, args, kwargs = exported("dummy_llm", False)
    onx = prog.model_proto
    with pytest.raises(sbs_widget.InputError, match="user inputs"):
        sbs_widget.run_aligned(ep, onx, (args[0], args[0]))
    with pytest.raises(sbs_widget.InputError, match="dtype torch.int32"):
        sbs_widget.run_aligned(ep, onx, (args[0].to(torch.int32),))
    with pytest.raises(sbs_widget.InputError, match="shape"):
        sbs_widget.run_aligned(ep, onx, (args[0][:, :5],))
    with pytest.raises(sbs_widget.InputError, match="to be a tensor"):
        sbs_widget.run_aligned(ep, onx, (np.zeros((2, 30), dtype=np.int64),))


def test_corrupt_and_truncated_files(tmp_path):
    ep, prog, args, kwargs = exported("dummy_llm", False)
    prog.save(str(tmp_path / "m.onnx"))
    data = (tmp_path / "m.onnx").read_bytes()
    (tmp_path / "cut.onnx").write_bytes(data[: len(data) // 3])
    with pytest.raises(sbs_widget.LoadError, match="truncated"):
        sbs_widget.run_aligned(ep, tmp_path / "cut.onnx", args)
    torch.export.save(ep, tmp_path / "m.pt2")
    pt2 = (tmp_path / "m.pt2").read_bytes()
    (tmp_path / "cut.pt2").write_bytes(pt2[: len(pt2) // 2])
    with pytest.raises(sbs_widget.LoadError, match="cannot load ExportedProgram"):
        sbs_widget.run_aligned(tmp_path / "cut.pt2", tmp_path / "m.onnx", args)
    with pytest.raises(sbs_widget.LoadError, match="not found"):
        sbs_widget.run_aligned(tmp_path / "missing.pt2", tmp_path / "m.onnx", args)

    class Evil:  # a pickle that would run code if loaded without weights_only
        def __reduce__(self):
            return (os.system, ("echo pwned > " + str(tmp_path / "pwned"),))

    torch.save({"x": Evil()}, tmp_path / "evil.pt")
    with pytest.raises(sbs_widget.LoadError, match="weights_only"):
        sbs_widget.run_aligned(ep, tmp_path / "m.onnx", tmp_path / "evil.pt")
    assert not (tmp_path / "pwned").exists()


def test_a_pt2_file_cannot_run_code_when_loaded(tmp_path):
    """torch.export.load falls back to weights_only=False for the pickles inside a .pt2 (its sample
    inputs here): loading one through sbs_widget unpickles data only."""
    class Evil:
        def __reduce__(self):
            return (os.mkdir, (str(tmp_path / "pwned"),))

    class AddOne(torch.nn.Module):
        def forward(self, x):
            return x + 1

    x = torch.randn(3)
    ep, prog = export_module(AddOne(), (x,))
    torch.export.save(ep, tmp_path / "ok.pt2")
    evil = io.BytesIO()
    torch.save((Evil(),), evil)
    with zipfile.ZipFile(tmp_path / "ok.pt2") as src, \
            zipfile.ZipFile(tmp_path / "evil.pt2", "w", zipfile.ZIP_STORED) as dst:
        for info in src.infolist():
            data = src.read(info.filename)
            dst.writestr(info.filename, evil.getvalue() if info.filename.endswith("sample_inputs/model.pt") else data)
    with pytest.raises(sbs_widget.LoadError, match="pickled posix.mkdir, not plain data"):
        sbs_widget.run_aligned(tmp_path / "evil.pt2", prog.model_proto, (x,))
    assert not (tmp_path / "pwned").exists()
    assert torch.load is torch.serialization.load, "torch.load is restored after loading"
    records = list(sbs_widget.run_aligned(tmp_path / "ok.pt2", prog.model_proto, (x,)))
    assert records[-1].status == "ok"


def test_llm_with_kv_cache_from_files(tmp_path):
    """An LLM exported with its DynamicCache, saved, and compared from the files: the cache type is
    registered for loading the .pt2 and allowed in the inputs file (data only)."""
    transformers = pytest.importorskip("transformers")
    from transformers.cache_utils import DynamicCache
    from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                                   num_attention_heads=4, num_key_value_heads=2, use_cache=True,
                                   attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).eval()
    register_cache_pytrees_for_model(model)
    cache = DynamicCache(config=cfg)
    cache.update(torch.randn(1, 2, 3, 8), torch.randn(1, 2, 3, 8), 0)
    ids = torch.randint(0, 100, (1, 2))
    kwargs = {"attention_mask": torch.ones(1, 5, dtype=torch.int64), "past_key_values": cache}
    ep, prog = export_module(model, (ids,), kwargs, strict=False)
    torch.export.save(ep, tmp_path / "llm.pt2")
    prog.save(str(tmp_path / "llm.onnx"))
    torch.save(((ids,), kwargs), tmp_path / "inputs.pt")
    torch.utils._pytree._deregister_pytree_node(DynamicCache)  # as in a fresh process
    try:
        records = list(sbs_widget.run_aligned(tmp_path / "llm.pt2", tmp_path / "llm.onnx", tmp_path / "inputs.pt"))
    finally:
        register_cache_pytrees_for_model(model)
    inputs = [r for r in records if r.kind == "input"]
    assert len(inputs) == 4, "ids, mask, and the cache's key and value"
    assert {r.status for r in records} <= {"ok", "one-sided"}
    assert records[-1].kind == "output" and records[-1].status == "ok"


def test_op_the_runtime_cannot_run_marks_its_record_and_the_run_continues():
    ep, prog, args, kwargs = exported("dummy_llm", False)
    model = prog.model_proto
    target = next(n for n in model.graph.node if n.op_type == "Gelu")
    bad = faults.replace_op(model, target.name, "Gelu")
    for node in bad.graph.node:
        if node.name == target.name:
            node.domain = "sbs.test.unknown"
    bad.opset_import.append(helper.make_opsetid("sbs.test.unknown", 1))
    records = list(sbs_widget.run_aligned(ep, bad, args, kwargs))
    rec = next(r for r in records if r.onnx_name == target.output[0])
    assert rec.status == "error" and "Gelu" in rec.comment and "torch value" in rec.comment
    after = records[records.index(rec) + 1:]
    assert any(r.status == "ok" and r.kind == "node" for r in after), "downstream continues from torch values"
    assert next(r for r in records if r.kind == "output").status == "ok"


def test_an_fx_node_that_fails_is_named_and_earlier_records_are_kept():
    class Small(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x * 2.0) + 1.0

    x = torch.randn(3, 4)
    _, prog = export_module(Small(), (x,))
    program = prog.exported_program
    relu = next(n for n in program.graph.nodes if n.op == "call_function" and "relu" in str(n.target))

    def broken(*args, **kwargs):
        raise RuntimeError("kernel exploded")

    relu.target = broken
    records = list(sbs_widget.run_aligned(prog, None, (x,)))
    failed = next(r for r in records if r.ep_name == relu.name and r.status == "error")
    assert "while executing FX node 'relu'" in failed.comment and "kernel exploded" in failed.comment
    mul = next(r for r in records if r.ep_target == "aten.mul.Tensor")
    assert mul.status == "ok" and mul.err_abs == 0.0, "the value computed before the failure is compared"
    downstream = [r for r in records if r.ep_target == "aten.add.Tensor" or r.kind == "output"]
    assert downstream and all(r.status == "error" and "torch value unavailable" in r.comment for r in downstream)


def test_nan_and_inf_are_counted_not_raised():
    class Nan(torch.nn.Module):
        def forward(self, x):
            y = torch.log(x)           # NaN for negative inputs, -inf at 0, on both sides
            return torch.nan_to_num(y, nan=0.0, neginf=-1.0) + y * 0 + x

    x = torch.tensor([[-1.0, 0.0, 1.0, 2.0]])
    ep, prog = export_module(Nan(), (x,))
    records = list(sbs_widget.run_aligned(ep, prog.model_proto, (x,)))
    log = next(r for r in records if r.onnx_op_type == "Log")
    assert log.status == "ok" and log.err_nan == 0  # same NaN/-inf pattern on both sides
    # now make ONNX produce NaN where torch does not
    model = prog.model_proto
    add = next(n for n in model.graph.node if n.op_type == "Add")
    nan_const = helper.make_tensor("sbs_nan", onnx.TensorProto.FLOAT, [], [float("nan")])
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    bad.graph.initializer.append(nan_const)
    for n in bad.graph.node:
        if n.name == add.name:
            n.input[1] = "sbs_nan"
    records = list(sbs_widget.run_aligned(ep, bad, (x,)))
    rec = next(r for r in records if r.onnx_name == add.output[0])
    assert rec.status == "mismatch" and rec.err_nan == 2  # torch is already NaN at the other two


def test_int_bool_symint_none_outputs():
    class Outs(torch.nn.Module):
        def forward(self, x, n):
            return (x * 2).to(torch.int64), x.shape[0], None, n > 0, x.sum()

    x, n = torch.randn(4, 3), torch.tensor([1, -2, 3])
    ep, prog = export_module(Outs(), (x, n), dynamic_shapes=({0: torch.export.Dim("b")}, None))
    records = list(sbs_widget.run_aligned(ep, prog.model_proto, (x, n)))
    outs = [r for r in records if r.kind == "output"]
    assert len(outs) == 4 and all(r.status == "ok" for r in outs)
    assert outs[0].ep_shape_type.startswith("T7") and outs[2].ep_shape_type.startswith("T9")
    # other shapes than at export time (dynamic dimension)
    x2 = torch.randn(7, 3)
    outs2 = [r for r in sbs_widget.run_aligned(ep, prog.model_proto, (x2, n)) if r.kind == "output"]
    assert all(r.status == "ok" for r in outs2)


def test_bfloat16_model_runs_with_its_kernels_and_names_the_missing_ones():
    """bfloat16 values reach onnxruntime as their bits (numpy has no bfloat16); nodes onnxruntime's CPU
    provider has no bfloat16 kernel for are marked and named in the summary, and onnx.reference runs
    every node."""
    class Half(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.emb = torch.nn.Embedding(50, 8)
            self.lin = torch.nn.Linear(8, 8)

        def forward(self, ids):
            h = self.emb(ids).transpose(0, 1)
            return self.lin(h).float().sum(-1)

    torch.manual_seed(0)
    model = Half().to(torch.bfloat16).eval()
    ids = torch.randint(0, 50, (2, 5))
    ep, prog = export_module(model, (ids,))
    records = list(sbs_widget.run_aligned(ep, prog.model_proto, (ids,)))
    by_name = {r.ep_name: r for r in records if r.kind == "node"}
    # Gather and Transpose have bfloat16 kernels: compared bit for bit with torch
    assert by_name["embedding"].status == "ok" and by_name["embedding"].err_abs == 0
    assert by_name["transpose"].status == "ok" and by_name["transpose"].err_abs == 0
    errors = [r for r in records if r.status == "error"]
    assert any("NOT_IMPLEMENTED" in r.comment and "MatMul" in r.comment for r in errors)
    assert all("NOT_IMPLEMENTED" in r.comment or "upstream node failed" in r.comment for r in errors)
    out = next(r for r in records if r.kind == "output")
    assert out.status == "ok", "the float32 tail runs from the torch values of the nodes without a kernel"
    summary = summarize(records)
    assert summary.no_kernel and any("onnx.reference" in line for line in summary.lines())

    reference = list(sbs_widget.run_aligned(ep, prog.model_proto, (ids,), runtime="onnx.reference",
                                            atol=1e-2, rtol=1e-2))
    assert {r.status for r in reference} <= {"ok", "one-sided"}
    assert sum(r.status == "ok" and r.kind == "node" for r in reference) > sum(
        r.status == "ok" and r.kind == "node" for r in records)


@pytest.mark.parametrize("runtime", ["onnxruntime", "onnx.reference"])
def test_float8_values_are_compared_and_fed_back(runtime):
    """A float8 value (numpy has no float8) is paired and compared, and a reset feeds torch's float8
    bits to the downstream ONNX node."""
    class Quantize(torch.nn.Module):
        def forward(self, x):
            return (x * 4).to(torch.float8_e4m3fn).to(torch.float32) / 4

    x = torch.randn(3, 5)
    ep, prog = export_module(Quantize(), (x,))
    for reset in ((), ("_to_copy",)):
        records = list(sbs_widget.run_aligned(ep, prog.model_proto, (x,), runtime=runtime, reset_names=reset))
        q = next(r for r in records if r.ep_name == "_to_copy")
        assert q.status == ("reset" if reset else "ok") and q.err_abs == 0
        assert q.ep_shape_type == q.onnx_shape_type == "T17s3x5" and "dtypes differ" not in q.comment
        assert records[-1].kind == "output" and records[-1].status == "ok" and records[-1].err_abs == 0


def test_if_node_compared_at_its_outputs():
    class Cond(torch.nn.Module):
        def forward(self, x):
            return torch.cond(x.sum() > 0, lambda t: t.sin() + 1, lambda t: t.cos() - 1, (x,)) * 2

    x = torch.randn(3, 4)
    ep, prog = export_module(Cond(), (x,))
    assert any(n.op_type == "If" for n in prog.model_proto.graph.node)
    records = list(sbs_widget.run_aligned(ep, prog.model_proto, (x,)))
    assert any(r.onnx_op_type == "If" and r.status == "ok" for r in records)
    assert next(r for r in records if r.kind == "output").status == "ok"


def test_onnx_local_functions():
    """A node moved into a model-local function still runs and is compared at its output."""
    ep, prog, args, kwargs = exported("dummy_llm", False)
    model = onnx.ModelProto()
    model.CopyFrom(prog.model_proto)
    gelu = next(n for n in model.graph.node if n.op_type == "Gelu")
    body = helper.make_node("Gelu", ["x"], ["y"], approximate="none")
    fn = helper.make_function("sbs.local", "MyGelu", ["x"], ["y"], [body],
                              [helper.make_opsetid("", 20)])
    model.functions.append(fn)
    model.opset_import.append(helper.make_opsetid("sbs.local", 1))
    gelu.op_type, gelu.domain = "MyGelu", "sbs.local"
    del gelu.attribute[:]
    records = list(sbs_widget.run_aligned(ep, model, args, kwargs, node_local=True))
    rec = next(r for r in records if r.onnx_name == gelu.output[0])
    assert rec.onnx_op_type == "MyGelu" and rec.status == "ok" and rec.err_local is not None
    assert not [r for r in records if r.status in ("mismatch", "error")]


def test_external_data(tmp_path):
    ep, prog, args, kwargs = exported("dummy_llm", False)
    prog.save(str(tmp_path / "m.onnx"), external_data=True)
    assert any(p.name.endswith(".data") for p in tmp_path.iterdir())
    records = list(sbs_widget.run_aligned(ep, tmp_path / "m.onnx", args))
    assert not [r for r in records if r.status in ("mismatch", "error")]
    assert any(r.kind == "weight" and r.status == "ok" for r in records)


@pytest.mark.slow
def test_model_over_2gb_with_external_data(tmp_path):
    """Weights above protobuf's 2 GB limit: segments feed them as inputs and never serialize them."""

    class Big(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.table = torch.nn.Embedding(4_200_000, 128)  # 2.15 GB of float32
            self.head = torch.nn.Linear(128, 8)

        def forward(self, ids):
            return self.head(self.table(ids))

    torch.manual_seed(0)
    with torch.no_grad():
        model = Big().eval()
    ids = torch.tensor([[0, 4_199_999, 1234567]])
    ep, prog = export_module(model, (ids,))
    path = tmp_path / "big.onnx"
    prog.save(str(path), external_data=True)
    del prog
    size = sum(p.stat().st_size for p in tmp_path.iterdir())
    assert size > 2**31
    records = list(sbs_widget.run_aligned(ep, path, (ids,)))
    assert next(r for r in records if r.kind == "output").status == "ok"
    table = next(r for r in records if r.kind == "weight" and r.onnx_name == "table.weight")
    assert table.status == "ok" and table.n_elements == 4_200_000 * 128
    assert np.isfinite(table.err_abs)


def test_inputs_as_a_dict_are_keyword_inputs_bound_by_name():
    """A tokenizer's dict (``model(**inputs)``) names inputs the model was exported with positionally."""
    ep, prog, args, kwargs = exported("bert", False)
    as_dict = {"input_ids": args[0], **kwargs}
    by_dict = list(sbs_widget.run_aligned(ep, prog.model_proto, as_dict))
    by_args = list(sbs_widget.run_aligned(ep, prog.model_proto, args, kwargs))
    assert [(r.ep_name, r.status, r.err_abs) for r in by_dict] == [(r.ep_name, r.status, r.err_abs) for r in by_args]
    with pytest.raises(sbs_widget.InputError, match="given twice"):
        list(sbs_widget.run_aligned(ep, prog.model_proto, as_dict, {"attention_mask": kwargs["attention_mask"]}))
