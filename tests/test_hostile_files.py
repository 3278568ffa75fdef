"""Crafted ``.pt2`` files: real archives written by ``torch.export.save``, then edited inside the zip
as a hostile user would. Each must be refused with a LoadError naming the member, and a marker file
proves that none of their code ran."""

from __future__ import annotations

import json
import os
import pickle
import zipfile

import pytest
import torch
from engine_models import export_module

import sbs_widget
from sbs_widget.load.pt2_checks import check_expression


class WithConstant(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)
        self.offset = torch.randn(4)  # a tensor constant: the constants config has an entry

    def forward(self, x):
        return self.linear(x) + self.offset


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A program with a dynamic batch (symbolic sizes in its JSON), saved, and its ONNX export."""
    folder = tmp_path_factory.mktemp("pt2")
    x = torch.randn(3, 4)
    model = WithConstant().eval()
    ep = torch.export.export(model, (x,), dynamic_shapes=({0: torch.export.Dim("batch", min=2)},))
    torch.export.save(ep, folder / "model.pt2")
    _, prog = export_module(model, (x,))
    return folder / "model.pt2", prog.model_proto, x


def edit(src, dst, change):
    """Copy the archive ``src`` to ``dst``, replacing members as ``change(name, data)`` says (a dict of
    new or replaced members is returned by it for the whole archive when called with name None)."""
    with zipfile.ZipFile(src) as a, zipfile.ZipFile(dst, "w", zipfile.ZIP_STORED) as b:
        names = a.namelist()
        root = names[0].split("/", 1)[0] + "/"
        for name in names:
            data = change(name[len(root):], a.read(name))
            if data is not None:
                b.writestr(name, data)
        for name, data in (change(None, None) or {}).items():
            b.writestr(root + name, data)
    return dst


def edit_json(member, f):
    def change(name, data):
        if name is None:
            return None
        if name == member:
            doc = json.loads(data)
            f(doc)
            return json.dumps(doc)
        return data
    return change


class Marker:
    """Pickles to a call creating ``path``: whatever unpickles it runs code."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (os.mkdir, (self.path,))


def torch_alone_runs_it(path, marker):
    """The crafted file is a real exploit: torch's own reader runs its code."""
    try:
        torch.export.load(path)
    except Exception:
        pass
    assert marker.exists()


def refused(path, onx, x, member_words, marker):
    with pytest.raises(sbs_widget.LoadError, match=member_words) as e:
        list(sbs_widget.run_aligned(path, onx, (x,)))
    assert not os.path.exists(marker), "code from the file ran"
    return str(e.value)


def test_h1_opaque_object_constant_is_refused(saved, tmp_path):
    pt2, onx, x = saved
    marker = tmp_path / "ran"

    def change(name, data):
        if name is None:
            return {"data/constants/opaque_obj_0": pickle.dumps(Marker(marker))}
        if name == "data/constants/model_constants_config.json":
            doc = json.loads(data)
            doc["config"]["offset"] = {"path_name": "opaque_obj_0", "is_param": False, "use_pickle": True,
                                       "tensor_meta": None}
            return json.dumps(doc)
        return data

    crafted = edit(pt2, tmp_path / "h1.pt2", change)
    message = refused(crafted, onx, x, "model_constants_config.json.*pickle.loads", marker)
    assert "'offset'" in message
    torch_alone_runs_it(crafted, marker)


def test_custom_object_constant_is_refused(saved, tmp_path):
    pt2, onx, x = saved

    def change(name, data):
        if name is None:
            return {"data/constants/custom_obj_0": b"\x80\x02N."}
        if name == "data/constants/model_constants_config.json":
            doc = json.loads(data)
            doc["config"]["offset"]["path_name"] = "custom_obj_0"
            return json.dumps(doc)
        return data

    refused(edit(pt2, tmp_path / "obj.pt2", change), onx, x, "TorchScript object", tmp_path / "ran")


def test_h2_expression_is_refused(saved, tmp_path):
    pt2, onx, x = saved
    marker = tmp_path / "ran"

    def f(doc):
        meta = doc["graph_module"]["graph"]["tensor_values"]["x"]
        meta["sizes"][1] = {"as_expr": {"expr_str": f"__import__('os').mkdir({str(marker)!r}) or 4",
                                        "hint": {"as_int": 4}}}

    crafted = edit(pt2, tmp_path / "h2.pt2", edit_json("models/model.json", f))
    refused(crafted, onx, x, "models/model.json.*symbolic expression", marker)
    torch_alone_runs_it(crafted, marker)


def test_h3_guards_code_never_runs(saved, tmp_path):
    """Guards are Python that ``ep.module()`` execs; the decomposition sbs_widget runs calls it."""
    pt2, onx, x = saved
    marker = tmp_path / "ran"

    def f(doc):
        doc["guards_code"] = [f"__import__('os').mkdir({str(marker)!r})"]

    crafted = edit(pt2, tmp_path / "h3.pt2", edit_json("models/model.json", f))
    records = list(sbs_widget.run_aligned(crafted, onx, (x,)))
    assert records[-1].status == "ok"
    assert not marker.exists(), "the guards code ran"
    program = torch.export.load(crafted)  # torch alone execs it when the program becomes a module
    with pytest.raises(Exception):  # noqa: B017 - torch's own error, whatever it is: the guard ran first
        program.module()(x)
    assert marker.exists()


def test_call_target_outside_torch_operators_is_refused(saved, tmp_path):
    """A node's target resolves by getattr from torch: ``torch.os.system`` would be called on a run."""
    pt2, onx, x = saved
    marker = tmp_path / "ran"

    def f(doc):
        node = doc["graph_module"]["graph"]["nodes"][0]
        node["target"] = "torch.os.mkdir"
        node["inputs"] = [{"name": "path", "arg": {"as_string": str(marker)}, "kind": 1}]

    refused(edit(pt2, tmp_path / "call.pt2", edit_json("models/model.json", f)), onx, x,
            "'torch.os.mkdir', which is not a torch operator", marker)

    def g(doc):
        doc["graph_module"]["graph"]["nodes"][0]["target"] = "torch.ops.load_library"

    refused(edit(pt2, tmp_path / "lib.pt2", edit_json("models/model.json", g)), onx, x,
            "not a torch operator", marker)


def test_compiled_code_and_unknown_members_are_refused(saved, tmp_path):
    pt2, onx, x = saved

    def aoti(name, data):
        return {"data/aotinductor/model/evil.so": b"\x7fELF"} if name is None else data

    refused(edit(pt2, tmp_path / "aoti.pt2", aoti), onx, x, "aotinductor.*shared library", tmp_path / "ran")

    def extra(name, data):
        return {"other/thing.py": b"print(1)"} if name is None else data

    refused(edit(pt2, tmp_path / "extra.pt2", extra), onx, x, "other/thing.py.*does not write", tmp_path / "ran")


def test_legacy_layout_is_refused(saved, tmp_path):
    pt2, onx, x = saved
    with zipfile.ZipFile(tmp_path / "old.pt2", "w") as z:
        z.writestr("old/version", "8.0")
        z.writestr("old/serialized_exported_program.json", "{}")
    refused(tmp_path / "old.pt2", onx, x, "older than 2.7", tmp_path / "ran")


def test_weight_larger_than_its_data_is_refused(saved, tmp_path):
    pt2, onx, x = saved

    def f(doc):
        entry = next(iter(doc["config"].values()))
        entry["tensor_meta"]["sizes"] = [{"as_int": 1000}, {"as_int": 1000}]
        entry["tensor_meta"]["strides"] = [{"as_int": 1000}, {"as_int": 1}]

    message = refused(edit(pt2, tmp_path / "big.pt2", edit_json("data/weights/model_weights_config.json", f)),
                      onx, x, "model_weights_config.json.*truncated or edited", tmp_path / "ran")
    assert "4000000" in message

    def g(doc):
        next(iter(doc["config"].values()))["tensor_meta"]["device"] = {"type": "evil", "index": None}

    refused(edit(pt2, tmp_path / "dev.pt2", edit_json("data/weights/model_weights_config.json", g)),
            onx, x, "device 'evil'", tmp_path / "ran")


@pytest.mark.parametrize("text", [
    "__import__('os').system('x')",
    "s0.__class__",
    "(lambda: 1)()",
    "Symbol('s0; import os', integer=True)",
    "Pow(Integer(2), Integer(1000000000000))",
    "Integer(2)**Integer(10)**Integer(12)",
    "Mul(Pow(Symbol('s0'), Integer(64)), Pow(Symbol('s1'), Integer(64)))",
    "open(0)",
    "s0[0]",
    "'" + "a" * 30_000 + "'",
    "Integer(" + "9" * 40 + ")",
    "Symbol('s0', evil=True)",
])
def test_expression_grammar_refuses(text):
    with pytest.raises(sbs_widget.LoadError):
        check_expression(text, "models/model.json")


@pytest.mark.parametrize("text", [
    "Symbol('s77', positive=True, integer=True)",
    "Add(Mul(Integer(2), Symbol('s77', positive=True, integer=True)), Integer(1))",
    "Mod(Symbol('s77', positive=True, integer=True), Integer(3))",
    "FloorDiv(s0, 2) + Max(1, u3) - s1**2",
    "Equality(Mod(s0, Integer(2)), Integer(0))",
    "Float('1.5', precision=53)",
])
def test_expression_grammar_accepts_torchs_own(text):
    check_expression(text, "models/model.json")


def test_dynamic_program_from_file_still_compares(saved):
    pt2, onx, x = saved
    records = list(sbs_widget.run_aligned(pt2, onx, (x,)))
    assert records[-1].kind == "output" and records[-1].status == "ok"


def test_duplicate_members_are_refused(saved, tmp_path):
    """Two members of one name: torch's reader and Python's may read different ones, so the one
    checked need not be the one loaded."""
    import warnings

    pt2, onx, x = saved
    marker = tmp_path / "ran"
    with zipfile.ZipFile(pt2) as a:
        root = a.namelist()[0].split("/", 1)[0] + "/"
        members = [(n, a.read(n)) for n in a.namelist()]
    doc = json.loads(dict(members)[root + "models/model.json"])
    doc["graph_module"]["graph"]["tensor_values"]["x"]["sizes"][1] = {
        "as_expr": {"expr_str": f"__import__('os').mkdir({str(marker)!r}) or 4", "hint": {"as_int": 4}}}
    with warnings.catch_warnings(), zipfile.ZipFile(tmp_path / "dup.pt2", "w") as b:
        warnings.simplefilter("ignore")  # zipfile warns of the duplicate name: that is the point
        for name, data in members:
            if name == root + "models/model.json":
                b.writestr(name, json.dumps(doc))  # the hostile one first, the clean one after
            b.writestr(name, data)
    refused(tmp_path / "dup.pt2", onx, x, "two members of the same name", marker)


def test_not_a_zip(saved, tmp_path):
    _, onx, x = saved
    (tmp_path / "junk.pt2").write_bytes(b"not a zip at all")
    refused(tmp_path / "junk.pt2", onx, x, "not a .pt2 archive", tmp_path / "ran")
