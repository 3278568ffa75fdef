"""Crafted ``.pt2`` and inputs files, round 2: real archives written by ``torch.export.save`` (or
``torch.save``) and then edited as an attacker would. Nothing in a file may choose what Python imports
(call specs), nor cost unbounded time or memory (compressed members, JSON of many values, sympy
expressions), nor block the reader (a FIFO). Each case fails without its check: a marker module's import
creates a file, or the load succeeds where it must be refused."""

from __future__ import annotations

import json
import os
import threading
import zipfile

import pytest
import torch
from engine_models import export_module
from test_hostile_files import edit, edit_json

import sbs_widget
from sbs_widget.load.pt2_checks import MAX_JSON_ELEMENTS, check_expression


class Nested(torch.nn.Module):
    """Outputs a dict: the out spec has a dict node whose context is JSON."""

    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        return {"y": self.linear(x).relu()}


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    folder = tmp_path_factory.mktemp("pt2")
    x = torch.randn(3, 4)
    model = Nested().eval()
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch", min=2)},))
    torch.export.save(ep, folder / "model.pt2")
    _, prog = export_module(model, (x,))
    return folder / "model.pt2", prog.model_proto, x


@pytest.fixture
def evil_module(tmp_path, monkeypatch):
    """A module ``sbs_evil_marker`` first on ``sys.path`` whose import creates a marker file, the way
    a ``.py`` shipped beside a model runs under ``python -m`` or in a notebook."""
    folder = tmp_path / "beside_the_model"
    folder.mkdir()
    marker = tmp_path / "imported"
    (folder / "sbs_evil_marker.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('ran')\nfactory = list\n"
        "import enum\nclass E(enum.Enum):\n    A = 1\n")
    monkeypatch.syspath_prepend(str(folder))
    yield marker
    import sys

    sys.modules.pop("sbs_evil_marker", None)


def _spec(doc, key="out_spec"):
    return doc["graph_module"]["module_call_graph"][0]["signature"], key


def _set_spec(crafted_root):
    def change(doc):
        signature, key = _spec(doc)
        signature[key] = json.dumps([1, crafted_root])
    return change


def _refused(path, onx, x, words, marker=None):
    with pytest.raises(sbs_widget.LoadError, match=words) as e:
        list(sbs_widget.run_aligned(path, onx, (x,)))
    if marker is not None:
        assert not marker.exists(), "a module named by the file was imported"
    return str(e.value)


LEAF = {"type": None, "context": None, "children_spec": []}


def test_defaultdict_factory_module_is_never_imported(saved, tmp_path, evil_module):
    pt2, onx, x = saved
    crafted = _set_spec({"type": "collections.defaultdict",
                         "context": {"default_factory_module": "sbs_evil_marker", "default_factory_name": "factory",
                                     "dict_context": ["y"]},
                         "children_spec": [LEAF]})
    path = edit(pt2, tmp_path / "dd.pt2", edit_json("models/model.json", crafted))
    message = _refused(path, onx, x, "defaultdict whose factory is sbs_evil_marker.factory", evil_module)
    assert "out_spec" in message
    try:  # torch alone imports it: the file is a real exploit
        torch.export.load(path)
    except Exception:
        pass
    assert evil_module.exists()


def test_enum_in_a_context_is_never_imported(saved, tmp_path, evil_module):
    pt2, onx, x = saved
    context = json.dumps([{"__enum__": True, "fqn": "sbs_evil_marker:E", "name": "A"}])
    crafted = _set_spec({"type": "builtins.dict", "context": context, "children_spec": [LEAF]})
    path = edit(pt2, tmp_path / "enum.pt2", edit_json("models/model.json", crafted))
    _refused(path, onx, x, "enum", evil_module)


def test_unknown_container_type_is_refused(saved, tmp_path):
    pt2, onx, x = saved
    crafted = _set_spec({"type": "os.system", "context": "null", "children_spec": [LEAF]})
    path = edit(pt2, tmp_path / "type.pt2", edit_json("models/model.json", crafted))
    _refused(path, onx, x, "'os.system'.*neither a container")


def test_a_model_class_named_in_the_spec_is_not_registered(saved, tmp_path):
    """transformers' names are read only for caches and model outputs: a model class named in a spec
    would otherwise become a pytree node for the whole process."""
    pytest.importorskip("transformers")
    from torch.utils import _pytree

    pt2, onx, x = saved
    name = "transformers.models.llama.modeling_llama:LlamaModel"
    crafted = _set_spec({"type": name, "context": "null", "children_spec": [LEAF]})
    path = edit(pt2, tmp_path / "module.pt2", edit_json("models/model.json", crafted))
    with pytest.raises(sbs_widget.LoadError, match="LlamaModel"):
        list(sbs_widget.run_aligned(path, onx, (x,)))
    assert name not in _pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE
    from transformers.models.llama.modeling_llama import LlamaModel

    assert LlamaModel not in _pytree.SUPPORTED_NODES


def test_spec_nesting_is_bounded(saved, tmp_path):
    pt2, onx, x = saved
    root = LEAF
    for _ in range(200):
        root = {"type": "builtins.tuple", "context": "null", "children_spec": [root]}
    path = edit(pt2, tmp_path / "deep.pt2", edit_json("models/model.json", _set_spec(root)))
    _refused(path, onx, x, "nests deeper")


def test_correct_specs_still_load(saved):
    """A dict output and a dynamic batch: the allow-list reads what torch.export writes."""
    pt2, onx, x = saved
    records = list(sbs_widget.run_aligned(pt2, onx, (x,)))
    assert records[-1].status == "ok"


def test_deflated_member_is_refused_before_it_inflates(saved, tmp_path):
    """A deflated member inflates to what its header says (2 GiB from 2 MB): torch writes every member
    stored, so a compressed one is refused without reading it."""
    pt2, onx, x = saved
    with zipfile.ZipFile(pt2) as a, zipfile.ZipFile(tmp_path / "deflated.pt2", "w", zipfile.ZIP_DEFLATED) as b:
        for info in a.infolist():
            b.writestr(info.filename, a.read(info.filename))
    _refused(tmp_path / "deflated.pt2", onx, x, "compressed")


def test_deflated_inputs_file_is_refused(tmp_path):
    from sbs_widget.load.readers import load_inputs

    torch.save((torch.zeros(1 << 16),), tmp_path / "inputs.pt")
    with zipfile.ZipFile(tmp_path / "inputs.pt") as a, \
            zipfile.ZipFile(tmp_path / "bomb.pt", "w", zipfile.ZIP_DEFLATED) as b:
        for info in a.infolist():
            b.writestr(info.filename, a.read(info.filename))
    assert os.path.getsize(tmp_path / "bomb.pt") < 8192  # 256 KB of zeros, deflated
    with pytest.raises(sbs_widget.LoadError, match="compressed"):
        load_inputs(str(tmp_path / "bomb.pt"), None)
    assert load_inputs(str(tmp_path / "inputs.pt"), None)[0][0].shape == (1 << 16,)


def test_json_of_many_values_is_refused_before_parsing(saved, tmp_path):
    """``[0,0,...]``: two bytes a value, a hundred once parsed; bounded by values, not only bytes."""
    pt2, onx, x = saved

    def change(name, data):
        if name == "models/model.json":
            doc = data.decode()
            assert doc.endswith("}")
            many = b"0," * (MAX_JSON_ELEMENTS + 10) + b"0"
            return doc[:-1].encode() + b', "padding": [' + many + b"]}"
        return data

    path = edit(pt2, tmp_path / "many.pt2", change)
    _refused(path, onx, x, "more than 10000000 values")


@pytest.mark.parametrize("text, words", [
    ("Max(" + ", ".join(f"s{i}" for i in range(2800)) + ")", "more than 16 arguments"),
    ("Max(Max(" + ", ".join(f"s{i}" for i in range(12)) + "), Max(" + ", ".join(f"s{i}" for i in range(12, 24))
     + "))", "more than 16 arguments"),
    ("Float('1.5', precision=30000000)", "precision"),
    ("Float('" + "1" * 5000 + "')", "at most 64 characters"),
    ("Add(" * 100 + "s0" + ", 1)" * 100, "nests calls deeper"),
])
def test_expressions_that_take_sympy_minutes_are_refused(text, words):
    with pytest.raises(sbs_widget.LoadError, match=words):
        check_expression(text, "models/model.json")


def test_many_costly_expressions_exhaust_the_files_budget(saved, tmp_path):
    pt2, onx, x = saved
    expression = "Max(" + ", ".join(f"Symbol('s{i}', positive=True, integer=True)" for i in range(16)) + ")"

    def change(doc):
        values = doc["graph_module"]["graph"]["tensor_values"]
        meta = values["x"]
        for i in range(200):
            copy = json.loads(json.dumps(meta))
            copy["sizes"][0] = {"as_expr": {"expr_str": expression, "hint": {"as_int": 3}}}
            values[f"extra_{i}"] = copy

    path = edit(pt2, tmp_path / "budget.pt2", edit_json("models/model.json", change))
    _refused(path, onx, x, "sum of squares")


def test_weight_on_the_meta_device_is_refused(saved, tmp_path):
    pt2, onx, x = saved

    def change(doc):
        for meta in doc["config"].values():
            meta["tensor_meta"]["device"] = {"type": "meta", "index": None}

    path = edit(pt2, tmp_path / "meta.pt2", edit_json("data/weights/model_weights_config.json", change))
    _refused(path, onx, x, "meta device")


def _reads_in_time(load, fifo) -> BaseException | None:
    """Run ``load`` in a thread; if it blocks on the FIFO, open the FIFO's other end to release it."""
    outcome: list = []

    def target():
        try:
            load()
            outcome.append(None)
        except BaseException as e:  # noqa: BLE001 - handed to the test
            outcome.append(e)

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(60)
    if thread.is_alive():
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
        os.close(fd)
        thread.join(10)
        pytest.fail("reading the FIFO blocked")
    return outcome[0]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_fifo_given_as_program_or_inputs_is_refused(saved, tmp_path):
    from sbs_widget.load.readers import load_exported_program, load_inputs

    fifo = tmp_path / "model.pt2"
    os.mkfifo(fifo)
    error = _reads_in_time(lambda: load_exported_program(str(fifo)), fifo)
    assert isinstance(error, sbs_widget.LoadError) and "FIFO" in str(error)
    error = _reads_in_time(lambda: load_inputs(str(fifo), None), fifo)
    assert isinstance(error, sbs_widget.LoadError) and "FIFO" in str(error)
