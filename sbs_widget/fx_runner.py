"""Running the FX graph of an ExportedProgram node by node, like ``torch.fx.Interpreter`` but lean:
one step per node, timing per node, and the caller decides when values are freed."""

from __future__ import annotations

import time

import torch
from torch.fx.node import map_arg

from .errors import InputError


def last_uses(graph: torch.fx.Graph) -> dict[str, int]:
    """FX node name -> index of the last node that reads it (computed once, used to free values)."""
    order = {n: i for i, n in enumerate(graph.nodes)}
    last: dict[str, int] = {}
    for n in graph.nodes:
        for inp in n.all_input_nodes:
            last[inp.name] = max(last.get(inp.name, -1), order[n])
    return last


def flat_inputs(program: torch.export.ExportedProgram, args: tuple, kwargs: dict) -> list:
    """Values for the graph's placeholders, in order: parameters, buffers, constants, user inputs."""
    try:
        return list(program._graph_module_flat_inputs(args, kwargs))
    except (ValueError, TypeError, KeyError, RuntimeError) as e:
        names = list(program.graph_signature.user_inputs)
        raise InputError(
            f"inputs do not match the exported program's signature ({e}); it expects "
            f"{len(names)} user inputs: {names}"
        ) from e


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
            if value.dtype != expected.dtype:
                raise InputError(f"input {node.name!r} has dtype {value.dtype}, the program was exported "
                                 f"with {expected.dtype}; convert it with .to({expected.dtype})")
            if value.dim() != expected.dim() or any(
                isinstance(d, int) and d != v for d, v in zip(expected.shape, value.shape)
            ):
                raise InputError(f"input {node.name!r} has shape {tuple(value.shape)}, the program expects "
                                 f"{tuple(expected.shape)} (symbolic dimensions may vary)")


SMALL_OP_ELEMENTS = 1 << 16


def example_tensors(node: torch.fx.Node) -> list[torch.Tensor]:
    """The example tensors export recorded for a node's outputs (``meta['val']``)."""
    val = node.meta.get("val")
    return [v for v in (val if isinstance(val, (tuple, list)) else [val]) if isinstance(v, torch.Tensor)]


def numel_hint(t: torch.Tensor) -> int:
    """Number of elements, symbolic dimensions counted at their example value."""
    n = 1
    for d in t.shape:
        if isinstance(d, int):
            n *= d
        else:
            hint = getattr(getattr(d, "node", None), "hint", None)
            n *= int(hint) if hint is not None else 16
    return n


def small_nodes(nodes: list[torch.fx.Node]) -> set[int]:
    """Positions of nodes on small tensors, run on one thread: torch's idle threads spin after each
    parallel op and, on a small machine, steal the cores the ONNX side (compiling ahead) needs."""
    return {i for i, n in enumerate(nodes) if sum(map(numel_hint, example_tensors(n))) < SMALL_OP_ELEMENTS}


class FxRunner:
    """Steps through ``program.graph``; ``env`` maps node names to values."""

    def __init__(self, program: torch.export.ExportedProgram, small: set[int] | None = None):
        self.program = program
        self.module = program.graph_module
        self.nodes = list(program.graph.nodes)
        self.env: dict[str, object] = {}
        self.position = 0
        self.small = small_nodes(self.nodes) if small is None else small



    def feed(self, flat: list) -> None:
        placeholders = [n for n in self.nodes if n.op == "placeholder"]
        if len(placeholders) != len(flat):
            raise InputError(f"the program has {len(placeholders)} placeholders, got {len(flat)} values")
        for node, value in zip(placeholders, flat):
            self.env[node.name] = value

    def step(self) -> tuple[torch.fx.Node, object, float]:
        """Run the next node; returns (node, value, seconds). Exceptions name the node."""
        node = self.nodes[self.position]
        self.position += 1
        if node.op == "placeholder":
            return node, self.env.get(node.name), 0.0
        if node.op == "output":
            return node, None, 0.0
        begin = time.perf_counter()
        if node.op == "get_attr":
            value = self.module
            for part in node.target.split("."):
                value = getattr(value, part)
        else:
            args = map_arg(node.args, self._get)
            kwargs = map_arg(node.kwargs, self._get)
            small = self.position - 1 in self.small
            threads = torch.get_num_threads()
            try:
                if small and threads > 1:
                    torch.set_num_threads(1)
                # No autograd: saved tensors would keep every intermediate alive.
                with torch.no_grad():
                    value = self._call(node, args, kwargs)
            except Exception as e:
                raise RuntimeError(f"while executing FX node {node.name!r} ({node.target}): "
                                   f"{type(e).__name__}: {e}") from e
            finally:
                if small and threads > 1:
                    torch.set_num_threads(threads)
        seconds = time.perf_counter() - begin
        self.env[node.name] = value
        return node, value, seconds

    def _call(self, node: torch.fx.Node, args, kwargs):
        if node.op == "call_function":
            return node.target(*args, **kwargs)
        if node.op == "call_module":
            return self.module.get_submodule(node.target)(*args, **kwargs)
        return getattr(args[0], node.target)(*args[1:], **kwargs)  # call_method

    def _get(self, n: torch.fx.Node):
        return self.env[n.name]

    @property
    def done(self) -> bool:
        return self.position >= len(self.nodes)
