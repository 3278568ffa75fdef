"""Running the FX graph of an ExportedProgram node by node, like ``torch.fx.Interpreter`` but lean:
one step per node, timing per node, and the caller decides when values are freed."""

from __future__ import annotations

import contextlib
import threading
import time
import weakref

import torch
from torch.fx.immutable_collections import immutable_list
from torch.fx.node import map_arg

from sbs_widget.align.fx_graph import (  # noqa: F401 - also re-exported: the engine's modules import them from here
    dead_nodes,
    example_size,
    example_tensor,
    example_tensors,
    last_uses,
    numel_hint,
    program_outputs,
)
from sbs_widget.errors import InputError, RunCancelled
from sbs_widget.load.mapped_weights import PagesRead


def positional_by_name(program: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """``args``/``kwargs`` with the keyword inputs that the program takes positionally moved into
    ``args``: a tokenizer's dict names ``input_ids``, which the model was exported with as a
    positional input (torch.export matches keywords to keyword inputs only)."""
    try:
        names = list(program.module_call_graph[0].signature.forward_arg_names)
        spec = program.call_spec.in_spec
        positional = (spec.child(0) if hasattr(spec, "child") else spec.children_specs[0]).num_children
    except (AttributeError, IndexError, TypeError):
        return args, kwargs
    wanted = names[len(args):positional]
    if not wanted or not all(n in kwargs for n in wanted):
        return args, kwargs
    return tuple(args) + tuple(kwargs[n] for n in wanted), {k: v for k, v in kwargs.items() if k not in wanted}


def flat_inputs(program: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> list:
    """Values for the graph's placeholders, in order: parameters, buffers, constants, user inputs."""
    args, kwargs = positional_by_name(program, args, kwargs)
    try:
        with _constraints_checked_once(program, args, kwargs):
            return list(program._graph_module_flat_inputs(args, kwargs))
    except (ValueError, TypeError, KeyError, RuntimeError) as e:
        names = list(program.graph_signature.user_inputs)
        raise InputError(
            f"inputs do not match the exported program's signature ({e}); it expects "
            f"{len(names)} user inputs: {names}"
        ) from e


# Per program, the input signatures (shapes, dtypes, scalar values) whose range constraints held:
# torch checks them with sympy on every call (25 ms on a 16-layer decoder with its cache, more than a
# step's forward), and they depend on nothing else.
_CHECKED: "weakref.WeakKeyDictionary[torch.export.ExportedProgram, set]" = weakref.WeakKeyDictionary()
_CHECKED_LOCK = threading.Lock()


@contextlib.contextmanager
def _constraints_checked_once(program: torch.export.ExportedProgram, args: tuple, kwargs: dict):
    """Skips torch's input-constraint check where the same signature passed it before (the tree spec
    is still compared on every call)."""
    key = _input_signature(args, kwargs)
    with _CHECKED_LOCK:
        seen = _CHECKED.setdefault(program, set())
        if key is None or key not in seen:
            yield
            if key is not None:
                seen.add(key)
            return
        program._check_input_constraints = lambda *_: None  # (an instance attribute shadows the method)
        try:
            yield
        finally:
            del program._check_input_constraints


def _input_signature(args: tuple, kwargs: dict) -> tuple | None:
    """What the range constraints read of the inputs; None where a leaf is neither a tensor nor a plain
    scalar (no memo then)."""
    leaves, spec = torch.utils._pytree.tree_flatten((args, kwargs))
    key = [str(spec)]
    for leaf in leaves:
        if isinstance(leaf, torch.Tensor):
            key.append((leaf.dtype, tuple(leaf.shape), leaf.device.type))
        elif leaf is None or isinstance(leaf, (bool, int, float, str)):
            key.append((type(leaf), leaf))
        else:
            return None
    return tuple(key)


def check_inputs(program: torch.export.ExportedProgram, flat: list) -> None:
    """Dtype and shape of each user input against the placeholder's ``meta['val']``."""
    user = set(program.graph_signature.user_inputs)
    for node, value in zip((n for n in program.graph.nodes if n.op == "placeholder"), flat):
        if node.name not in user:
            continue
        expected = node.meta.get("val")
        if isinstance(expected, torch.Tensor):
            if not isinstance(value, torch.Tensor):
                raise InputError(f"input {node.name!r} must be a tensor ({expected.dtype}, shape "
                                 f"{tuple(expected.shape)}), got {type(value).__name__}")
            if value.device.type == "meta":
                raise InputError(f"input {node.name!r} is on the meta device: it has a shape but no values "
                                 "to compare; pass real tensors (torch.randn(...), or the model's inputs)")
            if value.dtype != expected.dtype:
                raise InputError(f"input {node.name!r} has dtype {value.dtype}, the program was exported "
                                 f"with {expected.dtype}; convert it with .to({expected.dtype})")
            if value.dim() != expected.dim() or any(
                isinstance(d, int) and d != v for d, v in zip(expected.shape, value.shape)
            ):
                raise InputError(f"input {node.name!r} has shape {tuple(value.shape)}, the program expects "
                                 f"{tuple(expected.shape)} (symbolic dimensions may vary)")


SMALL_OP_ELEMENTS = 1 << 16


def small_nodes(nodes: list[torch.fx.Node], sizes: list[tuple[int, int]] | None = None) -> set[int]:
    """Positions of nodes on small tensors, run on one thread: torch's idle threads spin after each
    parallel op and, on a small machine, steal the cores the ONNX side (compiling ahead) needs.
    ``sizes``: ``example_size`` of each node, when already known."""
    sizes = sizes if sizes is not None else [example_size(n) for n in nodes]
    return {i for i, (elements, _) in enumerate(sizes) if elements < SMALL_OP_ELEMENTS}


_CONST, _NODE, _NESTED = 0, 1, 2


_NESTED_TYPES = (list, tuple, dict, slice)


def _arg_plan(values, device: torch.device | None = None) -> tuple:
    """How to build a node's arguments fast: (kind, payload) per argument, so that a step reads node
    values from the environment without walking the arguments with ``map_arg`` each time. A list
    holding no node (a shape, a permutation) is a constant; a device becomes ``device`` when given.
    (Types are tested most common first: the plans are built by the first run, for every node.)"""
    plan = []
    for v in values:
        t = type(v)
        if t is torch.fx.Node:
            plan.append((_NODE, v.name))
        elif t is int or t is float or t is bool:
            plan.append((_CONST, v))
        elif not isinstance(v, _NESTED_TYPES):
            plan.append((_CONST, device if t is torch.device and device is not None else v))
        elif t is immutable_list and not any(type(x) is torch.fx.Node or isinstance(x, _NESTED_TYPES) for x in v):
            plan.append((_CONST, v))
        else:
            plan.append((_NESTED, v))
    return tuple(plan)


def _call_plan(node: torch.fx.Node, device: torch.device | None = None) -> tuple:
    """(target, argument plan, keyword plan, keyword names) of a call_function node, built once;
    ``device``: where the tensors it creates go (see ``FxRunner``)."""
    kwargs = node.kwargs
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        target = target._op  # what OpOverload.__call__ calls: one Python frame less per node
    elif isinstance(target, torch._ops.HigherOrderOperator):
        target = _CheckedHop(target, node.name)
    if not kwargs:
        return target, _arg_plan(node.args, device), (), ()
    return target, _arg_plan(node.args, device), _arg_plan(kwargs.values(), device), tuple(kwargs)


def inputs_device(flat: list) -> torch.device:
    """The device a run computes on: the first CUDA (or other accelerator) tensor's among the
    inputs, else the CPU."""
    for v in flat:
        if isinstance(v, torch.Tensor) and v.device.type != "cpu":
            return v.device
    return _CPU


def on_inputs_device(program: torch.export.ExportedProgram, flat: list) -> tuple[list, torch.device]:
    """``flat`` (``flat_inputs``) with the parameters, buffers and constants moved to the device of
    the user's inputs (the CPU when none is elsewhere), and that device: the FX side runs there."""
    device = inputs_device(flat[len(flat) - len(program.graph_signature.user_inputs):])
    if all(v.device == device for v in flat if isinstance(v, torch.Tensor)):
        return flat, device
    return [v.to(device) if isinstance(v, torch.Tensor) else v for v in flat], device


_CPU = torch.device("cpu")


def weight_reads(program: torch.export.ExportedProgram) -> dict[int, int]:
    """Position of each node of ``program.graph`` that reads weights -> the bytes of weights it reads
    (from the placeholders' example values)."""
    weights = {s.arg.name for s in program.graph_signature.input_specs if s.kind.name != "USER_INPUT"}
    reads: dict[int, int] = {}
    for i, node in enumerate(program.graph.nodes):
        read = sum(_fake_nbytes(m.meta.get("val")) for m in node.all_input_nodes if m.name in weights)
        if read:
            reads[i] = read
    return reads


def _fake_nbytes(value) -> int:
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


class FxRunner:
    """Steps through ``program.graph``; ``env`` maps node names to values.

    ``device``: where the tensors that nodes create go. A program records the device it was exported
    on in nodes such as ``arange(..., device=cpu)``; run on inputs from another device (a program
    exported on the CPU, inputs on CUDA), such a node would make a tensor on the wrong one, and the
    next op mixing the two would fail. Every device argument becomes ``device`` (what
    ``torch.export.passes.move_to_device_pass`` does to a program, without copying it)."""

    def __init__(self, program: torch.export.ExportedProgram, small: set[int] | None = None,
                 plans: dict[int, tuple] | None = None, device: torch.device | None = None):
        self.program = program
        self.module = program.graph_module
        self.nodes = list(program.graph.nodes)
        self.env: dict[str, object] = {}
        self.position = 0
        self.small = small_nodes(self.nodes) if small is None else small
        self.device = device
        self._plans = {} if plans is None else plans  # position -> call plan; shareable between runs
        # (on the same device)
        self.pages: tuple[dict[int, int], PagesRead] | None = None  # (see hand_back_pages)
        self.cancel = None  # the run's Cancel token (engine/cancel.py), which loops check (_CheckedHop)

    def hand_back_pages(self, files) -> None:
        """Weights mapped from their file (``files``, load/mapped_weights.py): hand their pages back
        every ``RELEASE_EVERY`` bytes of weights the nodes read, not only after each segment (a
        segment may read most of a model's weights)."""
        if files:
            self.pages = (weight_reads(self.program), PagesRead(files))

    def feed(self, flat: list) -> None:
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        if len(placeholders) != len(flat):
            raise InputError(f"the program has {len(placeholders)} placeholders, got {len(flat)} values")
        for node, value in zip(placeholders, flat):
            self.env[node.name] = value

    def step(self) -> tuple[torch.fx.Node, object, float]:
        """Run the next node; returns (node, value, seconds). Exceptions name the node."""
        position = self.position
        node = self.nodes[position]
        times: list = []
        error = self.run_to(position, times)
        if error is not None:
            raise RuntimeError(error)
        return node, self.env.get(node.name), times[0][1] if times else 0.0

    def run_to(self, stop: int, times: list, frees: list | None = None, release: dict | None = None,
               current: int = 0, keep: set | None = None, kept: dict | None = None) -> str | None:
        """Run nodes up to position ``stop`` included, appending ``(position, seconds)`` per computed
        node to ``times``. After each node, the names in ``frees[position]`` are dropped from ``env``
        unless ``release`` holds them past segment ``current``; values of nodes named in ``keep`` are
        also put in ``kept`` (read after the batch even if freed). Returns None, or the error message of
        the node that failed (then ``position`` is past it and its value absent).

        One call runs many nodes: autograd off and the thread count set once, not per node; the loop
        is written for speed (it runs once per node of the model)."""
        env, nodes, small, plans = self.env, self.nodes, self.small, self._plans
        threads = torch.get_num_threads()
        single = False
        perf = time.perf_counter
        append = times.append
        release_get = release.get if release is not None else None
        pages = self.pages
        position = self.position
        end = min(stop + 1, len(nodes))
        token = getattr(_running, "cancel", None)
        _running.cancel = self.cancel
        try:
            # No autograd (saved tensors would keep every intermediate alive), and inference mode: no
            # version counters or view tracking, ~14% less dispatch time per op on small models.
            with torch.inference_mode():
                while position < end:
                    node = nodes[position]
                    op = node.op
                    position += 1
                    if op == "call_function":
                        # Small ops on one thread: torch's idle threads spin after each parallel op
                        # and, on a small machine, steal the cores the ONNX side needs.
                        if threads > 1 and ((position - 1) in small) != single:
                            single = not single
                            torch.set_num_threads(1 if single else threads)
                        plan = plans.get(position - 1)
                        if plan is None:
                            plan = plans[position - 1] = _call_plan(node, self.device)
                        target, a_plan, k_plan, k_names = plan
                        begin = perf()
                        try:
                            args = [env[x] if k == _NODE else (x if k == _CONST else map_arg(x, self._get))
                                    for k, x in a_plan]
                            if k_names:
                                kwargs = [env[x] if k == _NODE else (x if k == _CONST else map_arg(x, self._get))
                                          for k, x in k_plan]
                                value = target(*args, **dict(zip(k_names, kwargs)))
                            else:
                                value = target(*args)
                        except RunCancelled:  # a loop stopped (_CheckedHop): the run ends, not the node
                            raise
                        except Exception as e:
                            return f"while executing FX node {node.name!r} ({node.target}): {type(e).__name__}: {e}"
                    elif op in ("placeholder", "output"):
                        continue
                    else:
                        begin = perf()
                        try:
                            value = self._other(node)
                        except Exception as e:
                            return f"while executing FX node {node.name!r} ({node.target}): {type(e).__name__}: {e}"
                    append((position - 1, perf() - begin))
                    if pages is not None and position - 1 in pages[0]:
                        pages[1].add(pages[0][position - 1])
                    name = node.name
                    env[name] = value
                    if keep and name in keep:
                        kept[name] = value
                    if frees is not None:
                        for name in frees[position - 1]:
                            if name in env and (release_get is None or release_get(name, -1) <= current):
                                del env[name]
        finally:
            _running.cancel = token
            self.position = position
            if single:
                torch.set_num_threads(threads)
        return None

    def _other(self, node: torch.fx.Node):
        if node.op == "get_attr":
            value = self.module
            for part in node.target.split("."):
                value = getattr(value, part)
            return value
        args = map_arg(node.args, self._get)
        kwargs = map_arg(node.kwargs, self._get)
        if node.op == "call_module":
            return self.module.get_submodule(node.target)(*args, **kwargs)
        return getattr(args[0], node.target)(*args[1:], **kwargs)  # call_method

    def _get(self, n: torch.fx.Node):
        return self.env[n.name]

    @property
    def done(self) -> bool:
        return self.position >= len(self.nodes)


_running = threading.local()  # the Cancel token of the run_to call in progress on this thread


class _CheckedHop:
    """A higher-order operator node's target. The loops (while_loop, scan, map_impl) call their
    subgraphs once per iteration inside one node, and a crafted bound makes that node run for ever:
    checked once per segment, the run's time limit and stop button would never be read. So each
    subgraph is handed over wrapped (``_Iteration``): every call checks the Cancel token of the run
    (``FxRunner.cancel``) and raises its ``RunTimeout`` / ``RunCancelled``, as the ONNX side does."""

    def __init__(self, hop: torch._ops.HigherOrderOperator, name: str):
        self.hop, self.where = hop, f"at FX node {name!r} (in a {hop.name()} of the torch program)"

    def __call__(self, *args, **kwargs):
        token = getattr(_running, "cancel", None)
        if token is None:
            return self.hop(*args, **kwargs)
        args = [_Iteration(a, token, self.where) if isinstance(a, torch.fx.GraphModule) else a for a in args]
        return self.hop(*args, **kwargs)


class _Iteration:
    """A subgraph of a higher-order operator that checks the run's Cancel token at each call; one
    holding control flow of its own is run by an interpreter that wraps that one's subgraphs too."""

    def __init__(self, gm: torch.fx.GraphModule, token, where: str):
        self.gm, self.token, self.where = gm, token, where
        self.nested = any(isinstance(n.target, torch._ops.HigherOrderOperator) for n in gm.graph.nodes)

    def __call__(self, *args):
        self.token.check(self.where)
        if not self.nested:
            return self.gm(*args)
        return _Nested(self.gm, self.token, self.where).run(*args)


class _Nested(torch.fx.Interpreter):
    def __init__(self, gm, token, where):
        super().__init__(gm)
        self.extra_traceback = False  # (it would rewrite the message of the RunTimeout raised inside)
        self.token, self.where = token, where

    def call_function(self, target, args, kwargs):
        if isinstance(target, torch._ops.HigherOrderOperator):
            args = tuple(_Iteration(a, self.token, self.where) if isinstance(a, torch.fx.GraphModule) else a
                         for a in args)
        return super().call_function(target, args, kwargs)


def torch_values(program: torch.export.ExportedProgram, inputs, kwargs, names: set[str]) -> dict:
    """The torch values of FX nodes ``names``: ``program`` run on ``inputs`` until it has them all."""
    from sbs_widget.load.readers import load_inputs

    args, kwargs = load_inputs(inputs, kwargs)
    flat, device = on_inputs_device(program, flat_inputs(program, args, kwargs))
    runner = FxRunner(program, device=device)
    runner.feed(flat)
    last = len(runner.nodes) - 1
    with torch.no_grad():
        while not all(n in runner.env for n in names) and runner.position < last:
            runner.step()
    missing = [n for n in names if n not in runner.env]
    if missing:
        raise InputError(f"the torch program did not produce {missing}")
    return {n: runner.env[n] for n in names}
