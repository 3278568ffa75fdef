"""Model Explorer overlays: node data files read with the real package's Python API (no browser),
their node ids those the ONNX adapter (model-explorer-onnx) and the ExportedProgram adapter give."""

from __future__ import annotations

import json
import warnings

import pytest
from engine_models import exported
from gate_pairs import fault_models

import sbs_widget
from sbs_widget.blame.culprits import find_culprits
from sbs_widget.engine.entry import prepare
from sbs_widget.gate.explorer import DATA_NAMES, PROGRAM_GRAPH_ID, write_model_explorer

model_explorer = pytest.importorskip("model_explorer")
dacite = pytest.importorskip("dacite")
onnx_adapter = pytest.importorskip("model_explorer_onnx.main")
from model_explorer import node_data_builder as ndb  # noqa: E402


@pytest.fixture(scope="module")
def overlays(tmp_path_factory):
    folder = tmp_path_factory.mktemp("me")
    ep, prog, args, kwargs = exported("dummy_llm", False)
    bad, node = fault_models(prog.model_proto)["op"]
    path = str(folder / "bad.onnx")
    import onnx

    onnx.save(bad, path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        prepared = prepare(ep, bad)
        records = list(prepared.run(args, kwargs))
        culprits = find_culprits(records, prepared=prepared)
    written = write_model_explorer(records, path, folder / "overlay", culprits=culprits)
    return dict(folder=folder, path=path, written=written, node=node, ep=ep, prepared=prepared, records=records)


def _load(path) -> ndb.ModelNodeData:
    """The file read into the package's own dataclasses (strictly typed: a wrong field fails)."""
    with open(path, encoding="utf-8") as f:
        data = json.load(f)
    # status and verdict hold labels (strings): the web app shows each label with its colour (it buckets
    # the values by bgColor), while the Python builder annotates numbers only: types checked on numbers
    numeric = all(isinstance(r["value"], (int, float)) for g in data.values() for r in g["results"].values())
    model = dacite.from_dict(ndb.ModelNodeData, {"graphsData": data},
                             config=dacite.Config(strict=True, check_types=numeric))
    again = json.loads(model.to_json_string())  # and written back by the package: the same results
    for graph_id, graph in data.items():
        assert again[graph_id]["results"] == graph["results"]
    return model


def test_files_read_by_model_explorer(overlays):
    names = sorted(p.rsplit("/", 1)[-1] for p in overlays["written"])
    assert names == sorted(f"{side}_{n}.json" for side in ("onnx", "program") for n in DATA_NAMES)
    for path in overlays["written"]:
        model = _load(path)
        assert model.graphsData and all(g.results for g in model.graphsData.values())
        config = model_explorer.config().add_node_data_from_path(path)  # the API the viewer is given them by
        assert config.node_data_sources[-1].endswith(path.rsplit("/", 1)[-1])


def test_onnx_node_ids_are_those_of_the_onnx_adapter(overlays):
    graphs = onnx_adapter.ONNXAdapter().convert(overlays["path"], {})["graphs"]
    main = graphs[0]
    ids = {n.id for n in main.nodes}
    verdict = _load(overlays["folder"] / "overlay" / "onnx_verdict.json").graphsData
    assert set(verdict) == {main.id}
    results = verdict[main.id].results
    assert set(results) <= ids and len(results) >= 0.5 * len(ids)
    assert results[overlays["node"]].value == "culprit 1"
    status = _load(overlays["folder"] / "overlay" / "onnx_status.json").graphsData[main.id].results
    assert status[overlays["node"]].value == "mismatch"
    assert {r.value for r in status.values()} <= {"ok", "noise", "mismatch", "one-sided", "reset", "error"}
    error = _load(overlays["folder"] / "overlay" / "onnx_error.json").graphsData[main.id].results
    assert error[overlays["node"]].value > 0.1 and error[overlays["node"]].bgColor
    assert any(k.startswith("[value] ") for k in results)  # inputs, weights, outputs


def test_program_node_ids_are_those_of_the_exported_program_adapter(overlays):
    from model_explorer.config import DEFAULT_SETTINGS
    from model_explorer.pytorch_exported_program_adapter_impl import PytorchExportedProgramAdapterImpl

    results = _load(overlays["folder"] / "overlay" / "program_verdict.json").graphsData[PROGRAM_GRAPH_ID].results
    ids = set()
    for program in (overlays["ep"], overlays["prepared"].decomposed_ep):  # yours, and the one translated
        graph = PytorchExportedProgramAdapterImpl(program, DEFAULT_SETTINGS).convert()["graphs"][0]
        assert graph.id == PROGRAM_GRAPH_ID
        ids |= {n.id for n in graph.nodes}
    assert set(results) <= ids
    culprit = next(r for r in overlays["records"] if r.onnx_node_name == overlays["node"])
    assert results[culprit.ep_name].value == "culprit 1"


def test_unnamed_onnx_nodes_and_a_named_graph(tmp_path):
    """Nodes without a name get the ids the adapter gives them (onnx_ir's NameFixPass: node, node_1...)."""
    import onnx

    ep, prog, args, kwargs = exported("mlp", False)
    model = onnx.ModelProto()
    model.CopyFrom(prog.model_proto)
    for node in model.graph.node:
        node.name = ""
    model.graph.name = "my graph"
    path = str(tmp_path / "unnamed.onnx")
    onnx.save(model, path)
    records = list(sbs_widget.run_aligned(prog, None, args, kwargs))
    write_model_explorer(records, path, tmp_path / "o", program=False)
    graph = onnx_adapter.ONNXAdapter().convert(path, {})["graphs"][0]
    results = _load(tmp_path / "o" / "onnx_status.json").graphsData[graph.id].results
    assert set(results) <= {n.id for n in graph.nodes} and {"node", "node_1"} <= set(results)
