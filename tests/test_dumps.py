"""steal_forward, the dump file, load_dump and the module-level comparison, on real torch/onnx/onnxruntime."""

from __future__ import annotations

import pathlib

import numpy as np
import onnx
import onnxruntime
import pytest
import torch
from onnx.reference import ReferenceEvaluator

import sbs_widget
from sbs_widget import compare_dump, load_dump, steal_forward, string_type
from sbs_widget.cli.main import main as cli_main
from sbs_widget.dumps.compare import _from_ort, scope_outputs
from sbs_widget.dumps.steal import flatten_tensors
from sbs_widget.errors import InputError, LoadError, SbsWidgetWarning

ROOT = pathlib.Path(__file__).resolve().parents[1]


def bits(t: torch.Tensor) -> bytes:
    return t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


def same_bits(a, b) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and bits(a) == bits(b)


def all_modules(model):
    return [model] + [m for _, m in model.named_modules() if m is not model]


@pytest.fixture(scope="module")
def llm_files(tmp_path_factory):
    """dummy_llm stolen on every module into a dump, and its ONNX export (exported once: it takes seconds)."""
    d = tmp_path_factory.mktemp("llm")
    model, inputs = sbs_widget.dummy_llm()
    with steal_forward(all_modules(model), dump_file=d / "dump.onnx"):
        model(*inputs)
    torch.onnx.export(model, inputs, d / "model.onnx", dynamo=True, verbose=False)
    return d / "dump.onnx", d / "model.onnx"


def test_nested_modules_named_by_path():
    model, inputs = sbs_widget.dummy_llm()
    with steal_forward([model, model.decoder, model.decoder.attention, model.lm_head]) as stolen:
        expected = model(*inputs)
    st = stolen.storage
    assert list(st) == [
        ("DummyLLM", 0, "I"), ("decoder", 0, "I"), ("decoder.attention", 0, "I"), ("decoder.attention", 0, "O"),
        ("decoder", 0, "O"), ("lm_head", 0, "I"), ("lm_head", 0, "O"), ("DummyLLM", 0, "O"),
    ]
    assert st["DummyLLM", 0, "I"][0][0] is not inputs[0] and torch.equal(st["DummyLLM", 0, "I"][0][0], inputs[0])
    assert st["DummyLLM", 0, "I"][1] == {}
    assert torch.equal(st["DummyLLM", 0, "O"], expected)
    assert torch.equal(st["lm_head", 0, "I"][0][0], st["decoder", 0, "O"])
    assert "forward" not in model.decoder.__dict__  # the class forward is back


def test_repeated_calls_and_named_pairs(tmp_path):
    model, _ = sbs_widget.dummy_llm()
    runs = [torch.randint(0, 1024, (1, n)) for n in (3, 5, 7)]
    with steal_forward([("llm", model), ("ff", model.decoder.feed_forward)], dump_file=tmp_path / "d.onnx") as s:
        outs = [model(x) for x in runs]
    dump = load_dump(tmp_path / "d.onnx")
    assert [k for k in dump if k[0] == "llm"] == [("llm", i, k) for i in range(3) for k in "IO"]
    for i, (x, y) in enumerate(zip(runs, outs)):
        assert torch.equal(dump["llm", i, "I"][0][0], x)
        assert torch.equal(dump["llm", i, "O"], y)
        assert dump["ff", i, "O"].shape == (1, x.shape[1], 16)
    assert s.stored_bytes == sum(t.numel() * t.element_size() for v in s.storage.values() for t in flatten_tensors(v))


class KwModel(torch.nn.Module):
    def forward(self, x, *rest, cache=None, scale: float = 1.0, flags=None, mask=None, name="n"):
        x.add_(1)  # in place: the stored input must be the value before the call
        cache.update(x[None, None], x[None, None] * 2, 0)
        return {"y": x * scale, "pair": (x.sum(), None), "items": [x.shape[0], 2.5, True], "cache": cache}


def test_kwargs_non_tensor_values_and_cache_round_trip(tmp_path):
    from transformers.cache_utils import DynamicCache

    model = KwModel()
    x = torch.arange(4, dtype=torch.float32)
    with steal_forward(model, dump_file=tmp_path / "d.onnx") as stolen:
        model(x, 7, cache=DynamicCache(), scale=0.5, flags={"a": [1, None], 3: (True, "s")}, mask=float("nan"))
    for dump in (stolen.storage, load_dump(tmp_path / "d.onnx")):
        args, kwargs = dump["KwModel", 0, "I"]
        assert torch.equal(args[0], torch.arange(4, dtype=torch.float32)) and args[1:] == (7,)
        assert kwargs["scale"] == 0.5 and kwargs["flags"] == {"a": [1, None], 3: (True, "s")}
        assert np.isnan(kwargs["mask"]) and type(kwargs["cache"]).__name__ == "DynamicCache"
        out = dump["KwModel", 0, "O"]
        assert torch.equal(out["y"], (torch.arange(4) + 1) * 0.5) and out["pair"][1] is None
        assert out["items"] == [4, 2.5, True]
        layer = out["cache"].layers[0]
        assert torch.equal(layer.values, (torch.arange(4.0) + 1)[None, None] * 2)
        assert string_type(out["cache"]) == "DynamicCache(layers:#1[DynamicLayer(keys:T1s1x1x4,values:T1s1x1x4)])"


class TakesAnything(torch.nn.Module):
    def forward(self, x, extra):
        return x


def test_unsupported_value_is_reported_by_name():
    model = TakesAnything()
    with pytest.warns(SbsWidgetWarning, match=r"could not store 1 value\(s\).*m\[0\]\.I\[0\]\[1\] \(object\)"):
        with steal_forward([("m", model)]) as stolen:
            model(torch.ones(2), object())
    assert stolen.storage["m", 0, "I"][0][1] == "<not stored: object>"
    assert stolen.unsupported == ["m[0].I[0][1] (object)"]


def test_storage_limit_stops_storing_with_warning():
    model, inputs = sbs_widget.dummy_llm()
    dropped = r"storage_limit=20000 bytes reached, dropped \d+ value\(s\) \(\d+ bytes\)"
    with pytest.warns(SbsWidgetWarning, match=dropped):
        with steal_forward(all_modules(model), storage_limit=20_000) as stolen:
            out = model(*inputs)
    assert torch.equal(out, model(*inputs))  # the model kept running
    assert 0 < stolen.stored_bytes <= 20_000 and stolen.dropped and stolen.dropped_bytes > 0
    assert not set(stolen.dropped) & set(stolen.storage)


def test_exception_restores_forward(tmp_path):
    model, inputs = sbs_widget.dummy_llm()
    patched = lambda x: x  # noqa: E731  a forward someone else set on the instance must come back too
    model.lm_head.forward = patched
    with pytest.raises(ZeroDivisionError):
        with steal_forward(all_modules(model), dump_file=tmp_path / "d.onnx"):
            model(*inputs)
            raise ZeroDivisionError  # the forward fails half-way
    assert all("forward" not in m.__dict__ for m in all_modules(model) if m is not model.lm_head)
    assert model.lm_head.forward is patched
    assert ("DummyLLM", 0, "O") in load_dump(tmp_path / "d.onnx")  # what was stolen is still written

    with pytest.raises(RuntimeError):  # an exception inside a stolen forward
        with steal_forward([("lin", model.decoder.feed_forward.fc1)]) as stolen:
            model.decoder.feed_forward.fc1(torch.ones(3))
    assert "forward" not in model.decoder.feed_forward.fc1.__dict__
    assert list(stolen.storage) == [("lin", 0, "I")]


DTYPES = [torch.float32, torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.int8,
          torch.uint8, torch.bool]


def sample(dtype):
    g = torch.Generator().manual_seed(1)
    if dtype == torch.bool:
        return torch.rand(3, 5, generator=g) > 0.5
    if dtype.is_floating_point:
        t = (torch.randn(3, 5, generator=g) * 1e3).to(dtype)
        t[0, :4] = torch.tensor([float("nan"), float("inf"), -float("inf"), -0.0], dtype=dtype)
        return t
    info = torch.iinfo(dtype)
    t = torch.randint(-100 if info.min < 0 else 0, 100, (3, 5), generator=g).to(dtype)
    t[0, 0], t[0, 1] = info.min, info.max
    return t


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_round_trip_every_dtype_is_bitwise(tmp_path, dtype):
    t, scalar = sample(dtype), sample(dtype)[1, 2]
    ident = torch.nn.Identity()
    with steal_forward([("id", ident)], dump_file=tmp_path / "d.onnx"):
        ident((t, scalar, t[:, :0]))
    (back, back0, empty), = load_dump(tmp_path / "d.onnx")["id", 0, "I"][0]
    assert same_bits(back, t) and same_bits(back0, scalar) and empty.shape == (3, 0) and empty.dtype == dtype


def test_dump_file_runs_in_onnxruntime_and_reference_evaluator(tmp_path):
    ident = torch.nn.Identity()
    values = [sample(dt) for dt in DTYPES]
    with steal_forward([("id", ident)], dump_file=tmp_path / "d.onnx"):
        ident(values)
    onnx.checker.check_model(onnx.load(tmp_path / "d.onnx"), full_check=True)
    sess = onnxruntime.InferenceSession(str(tmp_path / "d.onnx"), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    # numpy has no bfloat16: ORT runs it, read it as an OrtValue (sess.run would fail to convert it).
    from_ort = [_from_ort(v) for v in sess.run_with_ort_values(None, {})]
    from_ref = ReferenceEvaluator(str(tmp_path / "d.onnx")).run(None, {})
    stored = values + values  # the inputs, then the same values as outputs
    assert len(names) == len(stored) == 2 * len(DTYPES)
    for t, a, r in zip(stored, from_ort, from_ref):
        assert same_bits(a, t)
        r = torch.from_numpy(np.ascontiguousarray(r).view(np.int16)).view(torch.bfloat16) \
            if t.dtype == torch.bfloat16 else torch.from_numpy(np.array(r))
        assert same_bits(r, t)


def test_load_dump_rejects_foreign_and_corrupt_files(tmp_path, llm_files):
    _, model_path = llm_files
    with pytest.raises(LoadError, match="not a sbs_widget dump"):
        load_dump(model_path)
    (tmp_path / "junk.onnx").write_bytes(b"not a protobuf at all")
    with pytest.raises(LoadError):
        load_dump(tmp_path / "junk.onnx")
    lin = torch.nn.Linear(2, 2)
    with steal_forward([("lin", lin)], dump_file=tmp_path / "d.onnx"):
        lin(torch.ones(1, 2))
    m = onnx.load(tmp_path / "d.onnx")
    m.metadata_props[0].value = m.metadata_props[0].value.replace('"tuple"', '"__import__"', 1)
    onnx.save(m, tmp_path / "bad.onnx")
    with pytest.raises(LoadError, match="unknown tag"):
        load_dump(tmp_path / "bad.onnx")


def test_verbose_prints_one_line_per_call(capsys):
    model, inputs = sbs_widget.dummy_llm()
    with steal_forward([model, model.decoder, model.decoder.feed_forward], verbose=1):
        model(*inputs)
    lines = capsys.readouterr().out.splitlines()
    assert lines == [
        "    decoder.feed_forward[0] ((T1s2x30x16,),{}) -> T1s2x30x16",
        "  decoder[0] ((T1s2x30x16,),{}) -> T1s2x30x16",
        "DummyLLM[0] ((T7s2x30,),{}) -> T1s2x30x1024",
        "steal_forward: 6 value(s), 261600 bytes",
    ]


def test_compare_dump_all_ok(llm_files):
    dump_path, model_path = llm_files
    records = list(compare_dump(dump_path, model_path))
    by_name = {r.ep_name: r for r in records}
    assert len(records) == 15 and records[-1].ep_name == "DummyLLM[0]" and records[-1].kind == "output"
    # The exporter folds the position embedding (its input is constant) into an initializer.
    assert by_name["position_embedding[0]"].status == "one-sided"
    assert all(r.status == "ok" for r in records if r.ep_name != "position_embedding[0]")
    fc1 = by_name["decoder.feed_forward.fc1[0]"]
    assert (fc1.onnx_op_type, fc1.module, fc1.ep_shape_type, fc1.onnx_shape_type) == \
        ("Add", "decoder.feed_forward.fc1", "T1s2x30x64", "T1s2x30x64")
    assert fc1.err_abs < 1e-5 and fc1.n_elements == 2 * 30 * 64
    assert scope_outputs(onnx.load(model_path), "decoder")[-1][2] == by_name["decoder[0]"].onnx_name


def test_compare_dump_default_tolerance_follows_the_dumps_precision(tmp_path):
    """A float16 model: its module outputs differ from the export's by float16 rounding, beyond the
    float32 default; with no tolerance given, the float16 default applies."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.GELU(), torch.nn.Linear(256, 64),
                                torch.nn.LayerNorm(64)).half().eval()
    x = torch.randn(16, 64).half()
    with steal_forward([("model", model), ("model.0", model[0]), ("model.2", model[2])],
                       dump_file=tmp_path / "dump.onnx"):
        model(x)
    torch.onnx.export(model, (x,), tmp_path / "m.onnx", dynamo=True, verbose=False)
    records = list(compare_dump(tmp_path / "dump.onnx", tmp_path / "m.onnx"))
    assert records and all(r.status == "ok" for r in records if r.err_abs is not None)
    strict = list(compare_dump(tmp_path / "dump.onnx", tmp_path / "m.onnx", atol=1e-4, rtol=1e-4))
    assert any(r.status == "mismatch" for r in strict)


def corrupt_fc2_weight(model_path, out_path):
    """Scale the weight initializer the fc2 MatMul reads (the exporter stores it transposed, as val_*)."""
    m = onnx.load(model_path)
    inits = {i.name: i for i in m.graph.initializer}
    node = next(n for n in m.graph.node if n.op_type == "MatMul"
                and "decoder.feed_forward.fc2" in dict((p.key, p.value) for p in n.metadata_props)
                ["pkg.torch.onnx.name_scopes"])
    init = inits[next(i for i in node.input if i in inits)]
    init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init) * 1.5, init.name))
    onnx.save(m, out_path)


def test_compare_dump_finds_corrupted_module(llm_files, tmp_path):
    dump_path, model_path = llm_files
    corrupt_fc2_weight(model_path, tmp_path / "bad.onnx")
    records = list(compare_dump(load_dump(dump_path), onnx.load(tmp_path / "bad.onnx")))
    first = next(i for i, r in enumerate(records) if r.status == "mismatch")
    assert records[first].module == "decoder.feed_forward.fc2" and records[first].err_abs > 0.01
    assert all(r.status in ("ok", "one-sided") for r in records[:first])
    assert {r.module for r in records[first:] if r.status == "mismatch"} == \
        {"decoder.feed_forward.fc2", "decoder.feed_forward", "decoder", "lm_head", ""}


def test_cli_steal_compare(llm_files, tmp_path, capsys):
    dump_path, model_path = llm_files
    assert cli_main(["steal-compare", "--dump", str(dump_path), "--onnx", str(model_path)]) == 0
    corrupt_fc2_weight(model_path, tmp_path / "bad.onnx")
    rc = cli_main(["steal-compare", "--dump", str(dump_path), "--onnx", str(tmp_path / "bad.onnx"),
                   "-o", str(tmp_path / "out.csv"), "--atol", "1e-3"])
    out = capsys.readouterr().out
    assert rc == 1 and "first mismatch: decoder.feed_forward.fc2[0]" in out
    import pandas

    assert len(pandas.read_csv(tmp_path / "out.csv")) == 15


def test_compare_dump_rejects_inputs_that_do_not_fit(llm_files):
    _, model_path = llm_files
    dump = {("x", 0, "I"): ((torch.ones(1), torch.ones(1)), {}), ("x", 0, "O"): torch.ones(1)}
    with pytest.raises(InputError, match="holds 2 tensor"):
        list(compare_dump(dump, model_path))


def test_notebook_runs(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", str(ROOT))  # the kernel imports this checkout of sbs_widget
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nb = nbformat.read(ROOT / "notebooks" / "dump_intermediate_results.ipynb", as_version=4)
    nbclient.NotebookClient(nb, timeout=120, kernel_name="python3",
                            resources={"metadata": {"path": str(ROOT / "notebooks")}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "first mismatch: decoder.feed_forward.fc2[0]" in text
