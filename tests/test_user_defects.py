"""Defects users reported (issue 51): dumps of transformers models (#13), a script ending while a widget
run is in progress (#10), a model/program mismatch found only after decomposing (#11)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import sbs_widget
from sbs_widget import steal_forward
from sbs_widget.dumps.steal import flatten_tensors
from sbs_widget.errors import LoadError, ModelMismatchError

transformers = pytest.importorskip("transformers")


def run_python(code: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=timeout)


def bits(t: torch.Tensor) -> bytes:
    return t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes()


# -------------------------------------------------------------- #13: dumps of transformers models

# A fresh interpreter where nothing of transformers was imported nor registered: it loads the dumps,
# writes their tensors (flattened) and the types of their values, and compares the gpt2 dump with the
# gpt2 ONNX export.
_LOAD = """
import json, sys, torch
assert "transformers" not in sys.modules
from sbs_widget import compare_dump, load_dump
from sbs_widget.dumps.steal import flatten_tensors
d = sys.argv[1] if len(sys.argv) > 1 else {d!r}
out = {{}}
for name in ("gpt2", "llama", "llama_registered"):
    dump = load_dump(f"{{d}}/{{name}}.onnx")
    out[name] = {{"keys": [list(k) for k in dump],
                 "types": {{f"{{k[0]}}.{{k[1]}}.{{k[2]}}": type(v).__name__ for k, v in dump.items()}},
                 "cache": type(getattr(dump[next(k for k in dump if k[2] == "O")], "past_key_values", None)).__name__}}
    torch.save({{"|".join(map(str, k)): flatten_tensors(v) for k, v in dump.items()}}, f"{{d}}/{{name}}.loaded.pt")
records = list(compare_dump(f"{{d}}/gpt2.onnx", f"{{d}}/gpt2.model.onnx"))
out["compare"] = [[r.ep_name, r.status, r.err_abs] for r in records]
print("RESULT" + json.dumps(out))
"""

# A process where transformers' exporter registered DynamicCache with torch pytree (as exporting a model
# with a cache does): the cache is stored as that pytree node.
_REGISTERED = """
import torch, transformers
from transformers.cache_utils import DynamicCache
from transformers.exporters.exporter_dynamo import register_pytree_node
from sbs_widget import steal_forward
from sbs_widget.dumps.steal import flatten_tensors
register_pytree_node(DynamicCache)
torch.manual_seed(0)
cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                               num_attention_heads=4, num_key_value_heads=2, use_cache=True)
model = transformers.LlamaForCausalLM(cfg).eval()
with steal_forward([model, model.model], dump_file={path!r}) as stolen:
    model(torch.randint(0, 100, (1, 5)), use_cache=True)
torch.save({{"|".join(map(str, k)): flatten_tensors(v) for k, v in stolen.storage.items()}}, {path!r} + ".pt")
"""


def _llama_with_cache():
    torch.manual_seed(0)
    cfg = transformers.LlamaConfig(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, use_cache=True)
    return transformers.LlamaForCausalLM(cfg).eval()


def test_transformers_dumps_load_in_a_fresh_process(tmp_path):
    from sbs_widget.samples import zoo

    model, args, kwargs = zoo.gpt2(seq=8)
    with steal_forward([model, model.transformer, model.lm_head], dump_file=tmp_path / "gpt2.onnx") as gpt2:
        model(*args, **kwargs)
    assert type(gpt2.storage["transformer", 0, "O"]).__name__ == "BaseModelOutputWithPastAndCrossAttentions"
    torch.onnx.export(model, args, tmp_path / "gpt2.model.onnx", dynamo=True, verbose=False)

    llama = _llama_with_cache()
    with steal_forward([llama, llama.model], dump_file=tmp_path / "llama.onnx") as stolen:
        out = llama(torch.randint(0, 100, (1, 5)), use_cache=True)
    assert type(out.past_key_values).__name__ == "DynamicCache"

    made = run_python(_REGISTERED.format(path=str(tmp_path / "llama_registered.onnx")))
    assert made.returncode == 0, made.stderr[-3000:]

    loaded = run_python(_LOAD.format(d=str(tmp_path)))
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    result = json.loads(loaded.stdout.split("RESULT", 1)[1])

    expected = {
        "gpt2": {"|".join(map(str, k)): flatten_tensors(v) for k, v in gpt2.storage.items()},
        "llama": {"|".join(map(str, k)): flatten_tensors(v) for k, v in stolen.storage.items()},
        "llama_registered": torch.load(tmp_path / "llama_registered.onnx.pt"),
    }
    for name, want in expected.items():
        got = torch.load(tmp_path / f"{name}.loaded.pt")
        assert list(got) == list(want), name
        for key in want:  # bitwise round trip
            assert [(t.dtype, t.shape, bits(t)) for t in got[key]] == \
                [(t.dtype, t.shape, bits(t)) for t in want[key]], (name, key)
    assert result["gpt2"]["types"]["GPT2LMHeadModel.0.O"] == "CausalLMOutputWithCrossAttentions"
    assert result["gpt2"]["types"]["transformer.0.O"] == "BaseModelOutputWithPastAndCrossAttentions"
    for name in ("llama", "llama_registered"):
        assert result[name]["types"]["LlamaForCausalLM.0.O"] == "CausalLMOutputWithPast", name
        assert result[name]["cache"] == "DynamicCache", name

    compared = {n: (status, err) for n, status, err in result["compare"]}
    assert set(compared) == {"GPT2LMHeadModel[0]", "transformer[0]", "lm_head[0]"}
    assert all(status == "ok" for status, _ in compared.values()), compared


def test_dump_naming_other_classes_is_refused_without_importing_them(tmp_path):
    """Only transformers' known output and cache classes are registered: a dump naming anything else
    (another module, a class that is no ModelOutput) is refused, and nothing it names is imported."""
    import onnx

    from sbs_widget import load_dump
    from sbs_widget.dumps.steal import METADATA_KEY

    lin = torch.nn.Linear(2, 3)
    with steal_forward([("lin", lin)], dump_file=tmp_path / "d.onnx"):
        lin(torch.ones(1, 2))
    model = onnx.load(tmp_path / "d.onnx")
    doc = json.loads(model.metadata_props[0].value)
    for name in ("transformers.modeling_outputs.ModelOutputNotThere", "transformers.modeling_outputs.OrderedDict",
                 "transformers.cache_utils:os", "json.decoder:JSONDecoder", "this_module_does_not_exist.X",
                 "transformers.models.llama.modeling_llama.LlamaModel"):
        doc["entries"][1]["value"] = {"_t": "pytree", "type": name, "ctx": ["a"], "v": [{"_t": "tensor", "i": 0}]}
        onnx.helper.set_model_props(model, {METADATA_KEY: json.dumps(doc)})
        onnx.save(model, tmp_path / "bad.onnx")
        with pytest.raises(LoadError, match="is refused"):
            load_dump(tmp_path / "bad.onnx")
    assert "this_module_does_not_exist" not in sys.modules


def test_cache_context_naming_other_classes_is_refused(tmp_path):
    """A cache registered by transformers' exporter is rebuilt by its unflatten function, which imports
    the classes its context names: a context naming anything but a cache class is refused first."""
    import onnx

    from sbs_widget import load_dump
    from sbs_widget.dumps.steal import METADATA_KEY

    lin = torch.nn.Linear(2, 3)
    with steal_forward([("lin", lin)], dump_file=tmp_path / "d.onnx"):
        lin(torch.ones(1, 2))
    model = onnx.load(tmp_path / "d.onnx")
    doc = json.loads(model.metadata_props[0].value)
    for ctx in ({"_t": "obj", "p": "subprocess:Popen", "s": {}},
                {"_t": "obj", "p": "transformers.cache_utils:DynamicCache",
                 "s": {"x": {"_t": "type", "p": "os:system"}}},
                {"_t": "seq", "p": "collections:deque", "v": []},
                {"_t": "tensor", "i": 7}):
        doc["entries"][1]["value"] = {"_t": "pytree", "type": "transformers.cache_utils:DynamicCache", "ctx": ctx,
                                      "v": [{"_t": "tensor", "i": 0}]}
        onnx.helper.set_model_props(model, {METADATA_KEY: json.dumps(doc)})
        onnx.save(model, tmp_path / "bad.onnx")
        with pytest.raises(LoadError, match="refused"):
            load_dump(tmp_path / "bad.onnx")


# -------------------------------------------------------------- #10: a script ending during a run

_ENDS_DURING_RUN = """
import sys, time, torch, sbs_widget

class Slow(torch.nn.Module):  # each step a big matmul: the run is inside torch most of the time
    def forward(self, x):
        y = x
        for _ in range(12):
            y = (y @ x) * 0.01
        return y

t0 = time.time()
w = sbs_widget.SbsWidget.from_module(Slow(), (torch.randn(1500, 1500),))
while not (w.runs and w.runs[-1].fx_done >= 1) and time.time() - t0 < 300:
    time.sleep(0.05)
print("ENDING", w.runs[-1].status, w.runs[-1].fx_done, w.runs[-1].fx_total, flush=True)
"""


def test_script_ending_during_a_widget_run_ends_cleanly():
    done = run_python(_ENDS_DURING_RUN)
    assert "ENDING running" in done.stdout, (done.stdout[-2000:], done.stderr[-3000:])
    assert "terminate called" not in done.stderr, done.stderr[-3000:]
    assert done.returncode == 0, done.stderr[-3000:]


# -------------------------------------------------------------- #11: mismatch found before decomposing


class Two(torch.nn.Module):
    def forward(self, x, y):
        return torch.nn.functional.gelu(x) + y


class One(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(4, 4)

    def forward(self, x):
        return torch.nn.functional.gelu(self.lin(x))


class AddOne(torch.nn.Module):
    def forward(self, x):
        return x + 1


class Outputs(torch.nn.Module):
    def forward(self, x):
        return x + 1, x * 2


@pytest.fixture(scope="module")
def exported():
    x = torch.randn(2, 4)
    pairs = {}
    for name, model, args in (("one", One(), (x,)), ("two", Two(), (x, x)), ("outputs", Outputs(), (x,)),
                              ("int", AddOne(), (torch.ones(2, 4, dtype=torch.int64),)),
                              ("shape", One(), (torch.randn(3, 4),)), ("rank", One(), (torch.randn(1, 2, 4),))):
        ep = torch.export.export(model, args)
        pairs[name] = (ep, torch.onnx.export(ep, args, dynamo=True, verbose=False).model_proto)
    return pairs


def _no_decomposition(*args, **kwargs):
    raise AssertionError("decomposed before checking what can be checked")


@pytest.mark.parametrize("other,what", [("two", "2 inputs"), ("outputs", "ONNX model 2 "), ("int", "INT64"),
                                        ("shape", r"shape \(3, 4\)"), ("rank", r"shape \(1, 2, 4\)")])
def test_mismatch_is_told_before_decomposing(exported, monkeypatch, other, what):
    import sbs_widget.engine.entry as entry

    monkeypatch.setattr(entry, "decompose_as_exporter", _no_decomposition)
    ep = exported["one"][0]
    with pytest.raises(ModelMismatchError, match=what):
        sbs_widget.prepare(ep, exported[other][1])


def test_matching_pair_still_prepares(exported, monkeypatch):
    import sbs_widget.engine.entry as entry

    calls = []
    real = entry.decompose_as_exporter

    def counting(ep):
        calls.append(ep)
        return real(ep)

    monkeypatch.setattr(entry, "decompose_as_exporter", counting)
    x = torch.randn(2, 4)
    ep = torch.export.export(One(), (x,))
    onx = torch.onnx.export(ep, (x,), dynamo=True, verbose=False).model_proto
    prepared = sbs_widget.prepare(ep, onx)
    assert prepared is not None
    records = list(prepared.run((x,)))
    assert records and all(r.status == "ok" for r in records), [(r.ep_name, r.status) for r in records]
