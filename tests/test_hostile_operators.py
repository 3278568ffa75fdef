"""Crafted ``.pt2`` files that call operators with side effects (``load/operators.py``): real archives
written by ``torch.export.save``, edited inside the zip where torch's exporter would not write them.
Each is refused with a LoadError naming the node and the operator, before anything runs; the torch
side's loops obey the run's time limit; and correct exports of real models load unchanged."""

from __future__ import annotations

import contextlib
import io
import threading
import warnings

import pytest
import torch
from engine_models import export_module
from test_hostile_files import edit, edit_json
from torch._higher_order_ops import cond, while_loop

import sbs_widget
from sbs_widget.engine.cancel import Cancel
from sbs_widget.engine.fx_runner import FxRunner, flat_inputs
from sbs_widget.errors import LoadError, RunTimeout
from sbs_widget.load.operators import check_operators
from sbs_widget.load.readers import load_exported_program
from sbs_widget.samples import zoo

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")


def _nodes(doc) -> list:
    """Every node of a serialized program, nested graphs included."""
    found, stack = [], [doc]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            if "target" in value and "inputs" in value:
                found.append(value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return found


def _node(doc, name):
    return next(n for n in _nodes(doc) if n["name"] == name)


def _save(model, args, folder, name="model.pt2", **kw):
    """``model`` exported, saved to ``folder/name``, and its ONNX model (exported from the same program)."""
    ep, prog = export_module(model, args, **kw)
    torch.export.save(ep, folder / name)
    return folder / name, prog.model_proto, ep


def _refused(path, onx, args, *words):
    with pytest.raises(LoadError) as e:
        list(sbs_widget.run_aligned(path, onx, args))
    for w in words:
        assert w in str(e.value), str(e.value)
    assert "torch.export.load" in str(e.value), "says what to do with a trusted file"
    return str(e.value)


# -- file I/O ------------------------------------------------------------------------------------

class Scratch(torch.nn.Module):
    def forward(self, x):
        a = torch.zeros(8)
        a.fill_(2.0)  # in place on an intermediate: a real export holds it, and it stays allowed
        return x + a.sum()


def test_from_file_then_fill_writes_no_file(tmp_path):
    x = torch.randn(3)
    pt2, onx, _ = _save(Scratch(), (x,), tmp_path)
    assert sbs_widget.run_aligned(pt2, onx, (x,)) is not None  # the export itself loads
    marker = tmp_path / "written"

    def f(doc):
        node = _node(doc, "zeros")
        node["target"] = "torch.ops.aten.from_file.default"
        node["inputs"] = [{"name": "filename", "arg": {"as_string": str(marker)}, "kind": 1},
                          {"name": "shared", "arg": {"as_bool": True}, "kind": 1},
                          {"name": "size", "arg": {"as_int": 8}, "kind": 1}]

    bad = edit(pt2, tmp_path / "from_file.pt2", edit_json("models/model.json", f))
    _refused(bad, onx, (x,), "node 'zeros'", "torch.ops.aten.from_file.default", "file")
    assert not marker.exists(), "the file was written"
    # a real exploit: the program torch itself loads writes the file when run
    torch.export.load(bad).module()(x)
    assert marker.exists()


# -- writes into the caller's tensors and the program's weights ----------------------------------

class Doubled(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = x * 2.0
        w = self.linear.weight.transpose(0, 1)
        return torch.relu(y @ (w * 3.0))


@pytest.mark.parametrize("node, written", [("mul", "'x'"), ("mul_1", "'transpose'")])
def test_in_place_write_into_an_input_or_a_weight_view_is_refused(tmp_path, node, written):
    x = torch.randn(2, 4)
    pt2, onx, ep = _save(Doubled().eval(), (x,), tmp_path)

    def f(doc):
        _node(doc, node)["target"] = "torch.ops.aten.mul_.Tensor"

    bad = edit(pt2, tmp_path / "inplace.pt2", edit_json("models/model.json", f))
    before = x.clone()
    _refused(bad, onx, (x,), f"node {node!r}", "torch.ops.aten.mul_.Tensor", written)
    assert torch.equal(x, before), "the caller's tensor was written"
    # what it would do: torch runs it and changes the input or the weight
    loaded = torch.export.load(bad)
    weight = loaded.state_dict["linear.weight"].clone()
    x2 = x.clone()
    with torch.no_grad():  # (as the engine runs)
        loaded.module()(x2)
    assert not torch.equal(x2, x) or not torch.equal(loaded.state_dict["linear.weight"], weight)


class Counter(torch.nn.Module):
    """A buffer and an input written in place: torch.export keeps the in-place ops on them."""

    def __init__(self):
        super().__init__()
        self.register_buffer("count", torch.zeros(3))
        self.linear = torch.nn.Linear(3, 3)

    def forward(self, x):
        self.count.add_(1.0)
        x.mul_(2.0)
        return self.linear(x) + self.count


def test_trusted_program_writing_its_buffer_gives_the_same_results_twice(tmp_path):
    """Passed as an object, the program runs (the engine runs its functional decomposition: the new
    values are outputs, never written back); the caller's input and the program's buffer are
    untouched, and a second run on the cached program gives the same records. From a file, refused."""
    x = torch.randn(2, 3)
    pt2, onx, ep = _save(Counter(), (x.clone(),), tmp_path)
    state = {k: v.clone() for k, v in ep.state_dict.items()}
    before = x.clone()
    runs = [[(r.ep_name, r.onnx_name, r.status, r.err_abs) for r in sbs_widget.run_aligned(ep, onx, (x,))]
            for _ in range(2)]
    assert runs[0] == runs[1]
    assert runs[0][-1][2] == "ok"
    assert torch.equal(x, before)
    assert all(torch.equal(v, state[k]) for k, v in ep.state_dict.items())
    _refused(pt2, onx, (x,), "node 'add_'", "torch.ops.aten.add_.Tensor", "'b_count'")
    assert torch.equal(x, before)


def test_file_program_run_twice_gives_the_same_records(tmp_path):
    x = torch.randn(2, 4)
    pt2, onx, _ = _save(Doubled().eval(), (x,), tmp_path)
    ep = load_exported_program(pt2)
    state = {k: v.clone() for k, v in ep.state_dict.items()}
    runs = [[(r.ep_name, r.status, r.err_abs) for r in sbs_widget.run_aligned(ep, onx, (x,))] for _ in range(2)]
    assert runs[0] == runs[1] and runs[0][-1][1] == "ok"
    assert all(torch.equal(v, state[k]) for k, v in ep.state_dict.items())


# -- printing, custom operators, random numbers --------------------------------------------------

class Printing(torch.nn.Module):
    def forward(self, x):
        torch._higher_order_ops.print("x={x}", x=x)
        return x + 1


def test_print_is_refused(tmp_path, capfd):
    x = torch.randn(3)
    ep = torch.export.export(Printing(), (x,))
    torch.export.save(ep, tmp_path / "print.pt2")
    _, onx = export_module(torch.nn.Identity(), (x,))
    _refused(tmp_path / "print.pt2", onx.model_proto, (x,), "torch.ops.higher_order.print", "node 'print")
    assert "x=" not in capfd.readouterr().out


@torch.library.custom_op("sbs_test::twice", mutates_args=())
def twice(x: torch.Tensor) -> torch.Tensor:
    return x * 2


@twice.register_fake
def _twice_fake(x):
    return torch.empty_like(x)


class Custom(torch.nn.Module):
    def forward(self, x):
        return twice(x) + 1


def test_custom_operator_is_refused(tmp_path):
    x = torch.randn(3)
    ep = torch.export.export(Custom(), (x,))
    torch.export.save(ep, tmp_path / "custom.pt2")
    _, onx = export_module(torch.nn.Identity(), (x,))
    _refused(tmp_path / "custom.pt2", onx.model_proto, (x,), "node 'twice'", "torch.ops.sbs_test.twice.default",
             "namespace 'sbs_test'")


class Noisy(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.drop = torch.nn.Dropout(0.5)

    def forward(self, x):
        return self.drop(x) + 1


def test_random_ops_are_refused_and_eval_dropout_is_not(tmp_path):
    x = torch.randn(3, 4)
    pt2, onx, _ = _save(Noisy().eval(), (x,), tmp_path)
    assert load_exported_program(pt2) is not None  # dropout(train=False)
    records = list(sbs_widget.run_aligned(pt2, onx, (x,)))
    assert records[-1].status == "ok"
    train = torch.export.export(Noisy().train(), (x,))
    torch.export.save(train, tmp_path / "train.pt2")
    _refused(tmp_path / "train.pt2", onx, (x,), "node 'dropout'", "torch.ops.aten.dropout.default", "random")

    def f(doc):
        node = _node(doc, "dropout")
        node["target"] = "torch.ops.aten.rand_like.default"
        node["inputs"] = node["inputs"][:1]
        node["inputs"][0]["name"] = "self"

    bad = edit(pt2, tmp_path / "rand.pt2", edit_json("models/model.json", f))
    _refused(bad, onx, (x,), "node 'dropout'", "torch.ops.aten.rand_like.default", "random")


# -- loops ---------------------------------------------------------------------------------------

class Loop(torch.nn.Module):
    def forward(self, x):
        y = torch.relu(x) * 2.0
        out = while_loop(lambda i, v: i < 5, lambda i, v: (i + 1, v * 1.01), (torch.zeros((), dtype=torch.int64), y))
        return out[1] + 1


def test_endless_while_loop_ends_at_the_time_limit(tmp_path):
    """The loop's bound raised in the file (5 -> 10**12): the allow-list accepts while_loop, and the
    run's time limit ends it (each iteration checks the run's Cancel token), the records so far kept."""
    x = torch.randn(3, 4)
    pt2, onx, _ = _save(Loop(), (x,), tmp_path)
    assert list(sbs_widget.run_aligned(pt2, onx, (x,)))[-1].status == "ok"

    def f(doc):
        node = next(n for n in _nodes(doc) if n["target"] == "torch.ops.aten.lt.Scalar")
        node["inputs"][1]["arg"] = {"as_int": 10**12}

    bad = edit(pt2, tmp_path / "endless.pt2", edit_json("models/model.json", f))
    records: list = []
    ended: list = []

    def run():
        try:
            for r in sbs_widget.run_aligned(bad, onx, (x,), time_limit=2, segment_nodes=1):
                records.append(r)
        except BaseException as e:  # noqa: BLE001 - the test reads it
            ended.append(e)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(60)
    assert not thread.is_alive(), "the torch side's loop ignored the time limit"
    assert len(ended) == 1 and isinstance(ended[0], RunTimeout), ended
    assert "while_loop" in str(ended[0]) and "time limit of 2 s reached" in str(ended[0])
    assert any(r.kind == "input" for r in records), "the records computed so far are kept"


def test_the_float64_reference_runs_no_loop():
    """The verdicts' float64 reruns (engine/reference.py) run outside the run's Cancel token: control
    flow has no reference there, so a crafted bound cannot hang them."""
    from sbs_widget.engine.reference import has_reference

    ep = torch.export.export(Loop(), (torch.randn(3, 4),))
    loops = [n for n in ep.graph.nodes if isinstance(n.target, torch._ops.HigherOrderOperator)]
    assert loops and not any(has_reference(n) for n in loops)


class NestedLoop(torch.nn.Module):
    def forward(self, x, n):
        def loop(t, n):
            return while_loop(lambda i, v: i < n, lambda i, v: (i + 1, v * 1.01),
                              (torch.zeros((), dtype=torch.int64), t))[1]
        return cond(x.sum() > -1e9, loop, lambda t, n: t.cos(), (x, n))


def test_loop_inside_control_flow_obeys_the_stop_button():
    x = torch.randn(3)
    ep = torch.export.export(NestedLoop(), (x, torch.tensor(3)))
    check_operators(ep)
    token = Cancel()
    runner = FxRunner(ep)
    runner.cancel = token
    runner.feed(flat_inputs(ep, (x, torch.tensor(10**12)), {}))
    threading.Timer(0.5, token.cancel).start()
    with pytest.raises(sbs_widget.RunCancelled, match="stopped at FX node 'cond'"):
        runner.run_to(len(runner.nodes) - 1, [])


# -- real exports load unchanged -----------------------------------------------------------------

class InPlaceNet(torch.nn.Module):
    """Conv, BatchNorm (eval), ReLU(inplace=True), dropout and in-place arithmetic on intermediates,
    as timm-like models write them."""

    def __init__(self):
        super().__init__()
        self.conv, self.bn = torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4)
        self.relu, self.drop = torch.nn.ReLU(inplace=True), torch.nn.Dropout(0.1)
        self.linear = torch.nn.Linear(4, 4)

    def forward(self, x):
        y = self.drop(self.relu(self.bn(self.conv(x)))).mean((2, 3))
        z = self.linear(y)
        z += 1.0
        z[:, 0] = 3.0
        return torch.nn.functional.hardtanh_(z)


class Flow(torch.nn.Module):
    def forward(self, x):
        from functorch.experimental.control_flow import map as control_map
        from torch._higher_order_ops.scan import scan

        y = cond(x.sum() > 0, lambda t: t.sin(), lambda t: t.cos(), (x,))
        _, ys = scan(lambda c, v: (c + v, c * v), torch.zeros(3), y.reshape(1, 3).expand(4, 3))
        m = control_map(lambda a: a * 2, ys)
        with torch.no_grad():
            m = m + 1
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return m @ m.T


def _quiet_export(model, args, kwargs=None, **kw):
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()), \
            contextlib.redirect_stderr(io.StringIO()):
        warnings.simplefilter("ignore")
        return torch.export.export(model, args, kwargs=kwargs or {}, **kw)


def test_real_programs_with_in_place_ops_and_control_flow_load_from_files(tmp_path):
    x = torch.randn(2, 3, 8, 8)
    for name, model, args in [("inplace", InPlaceNet().eval(), (x,)), ("loop", Loop(), (torch.randn(3),)),
                              ("flow", Flow(), (torch.randn(3),))]:
        ep = _quiet_export(model, args)
        torch.export.save(ep, tmp_path / f"{name}.pt2")
        loaded = load_exported_program(tmp_path / f"{name}.pt2")
        check_operators(loaded)
        torch.testing.assert_close(loaded.module()(*args), model(*args))
    ops = {str(n.target) for n in _quiet_export(InPlaceNet().eval(), (x,)).graph.nodes}
    assert {"aten.relu_.default", "aten.add_.Tensor", "aten.fill_.Tensor", "aten.dropout.default"} <= ops, ops


def test_llms_with_a_kv_cache_pass():
    transformers = pytest.importorskip("transformers")
    from transformers.cache_utils import DynamicCache
    from transformers.exporters.exporter_dynamo import register_cache_pytrees_for_model

    for cls, cfg in [
        (transformers.LlamaForCausalLM, transformers.LlamaConfig(
            vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
            num_key_value_heads=2, use_cache=True, attn_implementation="eager")),
        (transformers.GPT2LMHeadModel, transformers.GPT2Config(
            vocab_size=100, n_embd=32, n_layer=1, n_head=4, use_cache=True, attn_implementation="eager",
            bos_token_id=0, eos_token_id=0)),
    ]:
        torch.manual_seed(0)
        model = cls(cfg).eval()
        register_cache_pytrees_for_model(model)
        cache = DynamicCache(config=cfg)
        heads = getattr(cfg, "num_key_value_heads", 4)
        cache.update(torch.randn(1, heads, 3, 8), torch.randn(1, heads, 3, 8), 0)
        kwargs = {"attention_mask": torch.ones(1, 5, dtype=torch.int64), "past_key_values": cache}
        check_operators(_quiet_export(model, (torch.randint(0, 100, (1, 2)),), kwargs, strict=False))


NO_FLOAT16 = {"dummy_llm", "bart"}  # (torch.export fails on their float16 versions)


@pytest.mark.parametrize("family", sorted(zoo.BUILDERS))
def test_zoo_programs_pass(family):
    """Every zoo family's program (float32 and float16), as torch.export writes it; the
    allow-list applies to the torch program, which torch.onnx's optimize option does not change."""
    for dtype in (None,) if family in NO_FLOAT16 else (None, torch.float16):
        model, args, kwargs = zoo.BUILDERS[family]()
        if dtype is not None:
            model = model.to(dtype)
            args = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
            kwargs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in kwargs.items()}
        check_operators(_quiet_export(model, args, kwargs), family)


def test_zoo_programs_pass_through_save_and_load(tmp_path):
    for family in ("mlp", "convnet", "gpt2", "bart"):
        model, args, kwargs = zoo.BUILDERS[family]()
        torch.export.save(_quiet_export(model, args, kwargs), tmp_path / f"{family}.pt2")
        check_operators(load_exported_program(tmp_path / f"{family}.pt2"))


def test_every_node_kind_and_operator_is_checked_in_subgraphs(tmp_path):
    """An in-place write into a placeholder of a while_loop's body is found."""
    x = torch.randn(3)
    pt2, onx, _ = _save(Loop(), (x,), tmp_path)

    def f(doc):
        body = next(n for n in _nodes(doc) if n["target"] == "torch.ops.aten.mul.Tensor" and
                    any(i["arg"].get("as_float") == 1.01 for i in n["inputs"]))
        body["target"] = "torch.ops.aten.mul_.Tensor"

    bad = edit(pt2, tmp_path / "body.pt2", edit_json("models/model.json", f))
    _refused(bad, onx, (x,), "subgraph", "torch.ops.aten.mul_.Tensor")
