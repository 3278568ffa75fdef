"""Crafted files, round 2: real ONNX exports and real dumps edited as a hostile (or careless) user
would. Every malformed tensor gets a LoadError naming it before anything runs; nothing in a dump
chooses what Python imports or calls (a marker module proves that it is never imported)."""

from __future__ import annotations

import collections
import json
import re

import onnx
import pytest
import torch
from engine_models import export_module
from onnx import TensorProto

import sbs_widget
from sbs_widget.dumps.steal import METADATA_KEY
from sbs_widget.errors import LoadError


class MatMulAdd(torch.nn.Module):
    """MatMul then Add on weights (initializers), and a scalar (a ``Constant`` node)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.w = torch.nn.Parameter(torch.randn(4, 3))
        self.b = torch.nn.Parameter(torch.randn(3))

    def forward(self, x):
        return torch.relu(x @ self.w + self.b) * 2


@pytest.fixture(scope="module")
def pair():
    x = torch.randn(2, 5, 4)
    ep, prog = export_module(MatMulAdd().eval(), (x,))
    model = prog.model_proto
    ops = [n.op_type for n in model.graph.node]
    assert "MatMul" in ops and "Add" in ops and "Constant" in ops, ops
    return ep, model, x


def _copy(model):
    bad = onnx.ModelProto()
    bad.CopyFrom(model)
    return bad


def _weight(model, name="w"):
    return next(t for t in model.graph.initializer if t.name == name)


def _constant(model):
    node = next(n for n in model.graph.node if n.op_type == "Constant")
    return node, next(a.t for a in node.attribute if a.name == "value")


def too_few_values(t):
    t.ClearField("raw_data")
    t.data_type = TensorProto.FLOAT
    if len(t.dims) < 2:  # the scalar of a Constant: a shape that needs 4 values
        del t.dims[:]
        t.dims.extend([2, 2])
    del t.float_data[:]
    t.float_data.append(1.0)


def huge_no_data(t):
    t.ClearField("raw_data")
    del t.dims[:]
    t.dims.extend([2 ** 31, 2 ** 31])


def strings(t):
    n = 1
    for d in t.dims:
        n *= d
    t.ClearField("raw_data")
    t.data_type = TensorProto.STRING
    t.string_data.extend([b"0.5"] * n)


def negative_dims(t):
    del t.dims[:]
    t.dims.extend([-3, 4])


DEFECTS = {
    "too_few_values": (too_few_values, r"holds \d+ values in float_data where its shape needs \d+"),
    "huge_no_data": (huge_no_data, r"shape \[2147483648, 2147483648\]\) holds no data"),
    "string": (strings, r"holds strings \(STRING"),
    "negative_dims": (negative_dims, r"has a negative dimension \[-3, 4\]"),
}


def _refused(ep, bad, x, tmp_path, as_path, words, name_words):
    onx = bad
    if as_path:
        onx = tmp_path / "bad.onnx"
        onnx.save(bad, onx)
    produced = []
    with pytest.raises(LoadError) as info:
        for r in sbs_widget.run_aligned(ep, onx, (x,)):
            produced.append(r)
    assert not produced, "refused before any run"
    message = str(info.value)
    assert name_words in message, message
    assert re.search(words, message), message


@pytest.mark.parametrize("as_path", [False, True], ids=["ModelProto", "path"])
@pytest.mark.parametrize("defect", list(DEFECTS))
def test_malformed_initializer(pair, tmp_path, defect, as_path):
    """A weight read by MatMul (``w``) or Add (``b``)."""
    ep, model, x = pair
    change, words = DEFECTS[defect]
    for name in ("w", "b"):
        bad = _copy(model)
        change(_weight(bad, name))
        _refused(ep, bad, x, tmp_path, as_path, words, f"initializer {name!r}")


@pytest.mark.parametrize("as_path", [False, True], ids=["ModelProto", "path"])
@pytest.mark.parametrize("defect", list(DEFECTS))
def test_malformed_constant_value(pair, tmp_path, defect, as_path):
    ep, model, x = pair
    change, words = DEFECTS[defect]
    bad = _copy(model)
    node, value = _constant(bad)
    change(value)
    _refused(ep, bad, x, tmp_path, as_path, words, f"node {node.name!r} attribute 'value'")


def test_typed_fields_of_every_field_kind_are_counted(pair):
    """int64_data, double_data: too few values is refused, the exact count accepted."""
    ep, model, x = pair
    bad = _copy(model)
    bad.graph.initializer.append(onnx.helper.make_tensor("extra_i64", TensorProto.INT64, [3], [1, 2, 3]))
    list(sbs_widget.run_aligned(ep, bad, (x,)))  # an unused, well-formed initializer is fine
    t = _weight(bad, "extra_i64")
    del t.int64_data[2:]
    with pytest.raises(LoadError, match=r"initializer 'extra_i64' \(INT64, shape \[3\]\) holds 2 values in int64_data"):
        list(sbs_widget.run_aligned(ep, bad, (x,)))


# -- dumps ---------------------------------------------------------------------------------------

class Takes(torch.nn.Module):
    def forward(self, x, extra):
        return x + 1


@pytest.fixture
def evilmod(tmp_path, monkeypatch):
    """A module on sys.path whose import creates a marker file: importing it is running the file's code."""
    folder = tmp_path / "mods"
    folder.mkdir()
    marker = tmp_path / "marker_imported"
    (folder / "evilmod.py").write_text(
        f"import pathlib\npathlib.Path({str(marker)!r}).write_text('imported')\n"
        "def factory():\n    return 'evil'\n"
        "import enum\nclass E(enum.Enum):\n    X = 1\n")
    monkeypatch.syspath_prepend(str(folder))
    return marker


def _dump_with(tmp_path, extra, name="d.onnx"):
    model = Takes()
    with sbs_widget.steal_forward([("m", model)], dump_file=tmp_path / name):
        model(torch.ones(2), extra)
    return tmp_path / name


def _edit_dump(path, out, change):
    dump = onnx.load(path)
    prop = next(p for p in dump.metadata_props if p.key == METADATA_KEY)
    doc = json.loads(prop.value)
    change(doc)
    prop.value = json.dumps(doc)
    onnx.save(dump, out)
    return out


def _pytree_nodes(doc):
    found = []

    def walk(node):
        if isinstance(node, dict):
            if node.get("_t") == "pytree":
                found.append(node)
            for v in node.values():
                walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    walk(doc)
    return found


def test_defaultdict_factory_from_the_file_is_never_imported(tmp_path, evilmod):
    path = _dump_with(tmp_path, collections.defaultdict(list, {"a": torch.ones(3)}))
    good = sbs_widget.load_dump(path)["m", 0, "I"][0][1]
    assert type(good) is collections.defaultdict and good.default_factory is list
    assert torch.equal(good["a"], torch.ones(3))

    def change(doc):
        (node,) = _pytree_nodes(doc)
        assert node["type"] == "collections.defaultdict"
        node["ctx"]["default_factory_module"] = "evilmod"
        node["ctx"]["default_factory_name"] = "factory"

    bad = _edit_dump(path, tmp_path / "bad.onnx", change)
    with pytest.raises(LoadError, match=r"entry 'm'\[0\]\.I: defaultdict with the factory evilmod\.factory is refused"):
        sbs_widget.load_dump(bad)
    assert not evilmod.exists(), "the dump made Python import a module it named"


@pytest.mark.parametrize("ctx", [
    {"__enum__": True, "fqn": "evilmod:E", "name": "X"},
    [{"__enum__": True, "fqn": "evilmod:E", "name": "X"}],
], ids=["context", "key"])
def test_enum_hook_in_a_context_imports_nothing(tmp_path, evilmod, ctx):
    path = _dump_with(tmp_path, collections.OrderedDict(a=torch.ones(3)))

    def change(doc):
        (node,) = _pytree_nodes(doc)
        node["ctx"] = ctx

    with pytest.raises(LoadError, match=r"entry 'm'\[0\]\.I"):
        sbs_widget.load_dump(_edit_dump(path, tmp_path / "bad.onnx", change))
    assert not evilmod.exists()


@pytest.mark.parametrize("type_name", ["torch.fx.immutable_collections.immutable_list", "builtins.dict",
                                       "collections.namedtuple", "evilmod.Thing", "NO_SERIALIZED_TYPE_NAME_FOUND"])
def test_pytree_type_outside_the_allow_list_is_refused(tmp_path, evilmod, type_name):
    path = _dump_with(tmp_path, collections.OrderedDict(a=torch.ones(3)))

    def change(doc):
        (node,) = _pytree_nodes(doc)
        node["type"] = type_name

    with pytest.raises(LoadError, match=rf"entry 'm'\[0\]\.I: container type '{type_name}' is refused"):
        sbs_widget.load_dump(_edit_dump(path, tmp_path / "bad.onnx", change))
    assert not evilmod.exists()


def test_allowed_containers_round_trip(tmp_path):
    value = {"o": collections.OrderedDict(b=torch.ones(1), a=torch.zeros(2)),
             "q": collections.deque([torch.ones(2)], maxlen=4),
             "d": collections.defaultdict(None, {"k": torch.ones(1)}),
             "r": torch.max(torch.arange(6.0).reshape(2, 3), dim=1)}  # torch.return_types: kept as a tuple
    got = sbs_widget.load_dump(_dump_with(tmp_path, value))["m", 0, "I"][0][1]
    assert list(got["o"]) == ["b", "a"] and type(got["o"]) is collections.OrderedDict
    assert type(got["q"]) is collections.deque and got["q"].maxlen == 4
    assert type(got["d"]) is collections.defaultdict and got["d"].default_factory is None
    assert torch.equal(got["r"][0], torch.tensor([2.0, 5.0]))


@pytest.mark.parametrize("type_name, fields", [
    ("Point", ["x", "class"]),
    ("Point", ["_x", "y"]),
    ("Po int", ["x", "y"]),
    ("__import__('os').system('true')", ["x", "y"]),
    ("Point", ["x", "x"]),
    ("Point", ["x"]),  # one name for two values
])
def test_namedtuple_names_from_the_file(tmp_path, type_name, fields):
    Point = collections.namedtuple("Point", ["x", "y"])
    path = _dump_with(tmp_path, Point(torch.ones(1), torch.zeros(1)))
    assert sbs_widget.load_dump(path)["m", 0, "I"][0][1]._fields == ("x", "y")

    def change(doc):
        node = doc["entries"][0]["value"]["v"][0]["v"][1]
        assert node["_t"] == "namedtuple"
        node["type"], node["fields"] = type_name, fields

    with pytest.raises(LoadError, match=r"entry 'm'\[0\]\.I: namedtuple"):
        sbs_widget.load_dump(_edit_dump(path, tmp_path / "bad.onnx", change))


def _edit_tensor(path, out, change):
    dump = onnx.load(path)
    node = next(n for n in dump.graph.node if n.op_type == "Constant")
    change(next(a.t for a in node.attribute if a.name == "value"))
    onnx.save(dump, out)
    return out, node.output[0]


def _short_raw(t):
    t.raw_data = t.raw_data[:-4]


def _few_typed(t):
    t.ClearField("raw_data")
    t.float_data.extend([1.0])


def _huge(t):
    t.ClearField("raw_data")
    del t.dims[:]
    t.dims.extend([2 ** 31, 2 ** 31])


def _negative(t):
    del t.dims[:]
    t.dims.extend([-2])


@pytest.mark.parametrize("change, words", [
    (_short_raw, r"holds 4 bytes of data where its shape needs 8"),
    (_few_typed, r"holds 1 values in float_data where its shape needs 2"),
    (_huge, r"holds no data"),
    (_negative, r"negative dimension"),
], ids=["short_raw", "few_typed", "huge_no_data", "negative"])
def test_dump_tensor_with_short_data(tmp_path, change, words):
    path = _dump_with(tmp_path, None)
    bad, name = _edit_tensor(path, tmp_path / "bad.onnx", change)
    with pytest.raises(LoadError, match=rf"tensor '{name}'.*{words}"):
        sbs_widget.load_dump(bad)


def test_dump_metadata_nested_too_deep(tmp_path):
    path = _dump_with(tmp_path, None)

    def change(doc):
        node = {"_t": "tuple", "v": [1]}
        for _ in range(300):  # within Python's recursion limit: it would be built
            node = {"_t": "tuple", "v": [node]}
        doc["entries"][0]["value"] = node

    with pytest.raises(LoadError, match="nested more than"):
        sbs_widget.load_dump(_edit_dump(path, tmp_path / "bad.onnx", change))

    def deeper(doc):  # past it: json itself refuses
        doc["entries"][0]["value"] = "@"

    bad = _edit_dump(path, tmp_path / "bad2.onnx", deeper)
    dump = onnx.load(bad)
    prop = next(p for p in dump.metadata_props if p.key == METADATA_KEY)
    prop.value = prop.value.replace('"@"', "[" * 100_000 + "]" * 100_000)
    onnx.save(dump, bad)
    with pytest.raises(LoadError, match="corrupt dump metadata"):
        sbs_widget.load_dump(bad)


def test_dump_metadata_too_large(tmp_path):
    from sbs_widget.dumps.steal import METADATA_LIMIT

    path = _dump_with(tmp_path, None)
    dump = onnx.load(path)
    prop = next(p for p in dump.metadata_props if p.key == METADATA_KEY)
    prop.value = prop.value[:-1] + " " * (METADATA_LIMIT + 1) + "}"  # valid JSON, over the limit
    onnx.save(dump, tmp_path / "big.onnx")
    del dump, prop
    with pytest.raises(LoadError, match="dump metadata of .* characters, over the"):
        sbs_widget.load_dump(tmp_path / "big.onnx")


def test_compare_dump_checks_its_onnx_file(pair, tmp_path):
    """``compare_dump`` reads its ONNX model through the same checks as every model path."""
    _, model, x = pair
    bad = _copy(model)
    too_few_values(_weight(bad))
    onnx.save(bad, tmp_path / "bad.onnx")
    lin = torch.nn.Linear(4, 4)
    with sbs_widget.steal_forward([("lin", lin)]) as stolen:
        lin(torch.ones(2, 4))
    with pytest.raises(LoadError, match="'w'"):
        list(sbs_widget.compare_dump(stolen, tmp_path / "bad.onnx"))
