"""Whether the ONNX model was exported from *this* program, told from the exporter's metadata.

``torch.onnx.export`` (dynamo) writes on each ONNX node the FX node it translates, as
``Node.format_node()`` prints it (``pkg.torch.onnx.fx_node``)::

    %gelu : [num_users=1] = call_function[target=torch.ops.aten.gelu.default](args = (%linear,),
        kwargs = {approximate: tanh})  (one line)

Alignment pairs nodes by that name. A model exported from another program (GELU's ``tanh``
approximation instead of the exact one, another scale constant) still aligns, and every difference
then looks like a translation bug. So, for each FX node the metadata names and the program holds,
the target and the arguments that are not values of the graph (literals: strings, numbers, dims,
dtypes, lists of them) are compared, both sides read the same way: the program's node printed as
the exporter prints it, both texts parsed into the same structure, then matched argument by
argument through the operator's schema (a keyword left to its default on one side and spelled out
on the other is the same argument). Which values feed a node is not compared (the exporter's own
passes insert casts and rename them); neither are arguments that change where a value lives, not
what it is (``device``, ``pin_memory``...).

>>> parse_call("call_function[target=torch.ops.aten.gelu.default](args = (%x,), kwargs = {approximate: tanh})")
('torch.ops.aten.gelu.default', [NODE], {'approximate': 'tanh'})
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import torch

from sbs_widget.load.onnx_index import OnnxIndex

FX_NODE_KEY = "pkg.torch.onnx.fx_node"
MAX_TEXT = 1 << 16    # longer metadata (a hostile file, a huge literal list) is not read
MAX_DEPTH = 32        # nesting of lists read
# Arguments that say where a value lives or how it is laid out, not what it is.
PLACEMENT = frozenset({"device", "pin_memory", "layout", "memory_format", "non_blocking"})


class _Node:
    """A value of the graph in a parsed argument (``%name``): names are not compared."""

    def __repr__(self) -> str:
        return "NODE"


NODE = _Node()
_TOKENS = re.compile(r"[()\[\]{},]|[^()\[\]{},]+")
_CALL = "call_function[target="
_OPEN = {"(": ")", "[": "]", "{": "}"}


@dataclass
class Difference:
    """The first node where the metadata and the program disagree."""

    fx_name: str
    onnx_node: str
    argument: str      # "target" or the argument's name (or position)
    exported: str      # as the ONNX metadata says
    program: str       # as the program has it

    def message(self) -> str:
        what = "its target" if self.argument == "target" else f"argument {self.argument!r}"
        return (f"the ONNX model was exported from another program: FX node {self.fx_name!r} (ONNX node "
                f"{self.onnx_node!r}) differs in {what}: {self.exported} in the ONNX model's metadata, "
                f"{self.program} in this program. The culprits found are then about the difference between "
                "the two files, not a translation bug: export the ONNX model from this program "
                "(torch.onnx.export(ep, ..., dynamo=True)) to judge the translation")


def format_arg(arg) -> str:
    """An argument as ``torch.fx.Node.format_node`` prints it (``torch.fx.node._format_arg``)."""
    if hasattr(arg, "_custom_fx_repr_fn"):
        return arg._custom_fx_repr_fn()
    if isinstance(arg, list):
        return "[" + ", ".join(format_arg(a) for a in arg) + "]"
    if isinstance(arg, tuple):
        return "(" + ", ".join(format_arg(a) for a in arg) + ("," if len(arg) == 1 else "") + ")"
    if isinstance(arg, dict):
        return "{" + ", ".join(f"{k}: {format_arg(v)}" for k, v in arg.items()) + "}"
    if isinstance(arg, torch.fx.Node):
        return f"%{arg}"
    return str(arg)


def _parse(text: str):
    """A printed argument as nested lists (``(`` and ``[`` alike), dicts (``{key: value}``) and strings
    (literals as printed; ``NODE`` for graph values). None when it does not parse (unbalanced, too
    deep): such a node is not judged."""
    root: list = []
    stack: list[tuple[str, list, list]] = [("", root, [])]  # (closing char, items, pieces of the item)
    for m in _TOKENS.finditer(text):
        tok = m.group()
        closing, items, pieces = stack[-1]
        if tok in _OPEN:
            if len(stack) > MAX_DEPTH:
                return None
            stack.append((_OPEN[tok], [], []))
        elif tok in ")]}":
            if tok != closing:
                return None
            stack.pop()
            _end_item(items, pieces)
            value = _dict(items) if tok == "}" else items
            if value is None:
                return None
            stack[-1][2].append(value)
        elif tok == ",":
            _end_item(items, pieces)
            stack[-1] = (closing, items, [])
        else:
            pieces.append(tok)
    if len(stack) != 1:
        return None
    _end_item(root, stack[0][2])
    return root[0] if len(root) == 1 else None


def _end_item(items: list, pieces: list) -> None:
    """An item ends at a comma or a closing bracket: its pieces (text, then maybe a container) joined."""
    parts = [p.strip() if isinstance(p, str) else p for p in pieces]
    parts = [p for p in parts if not (isinstance(p, str) and not p)]
    if not parts:
        return  # ``(x,)``: the trailing comma; ``[]``: no item
    if len(parts) == 1:
        p = parts[0]
        items.append(NODE if isinstance(p, str) and p.startswith("%") else p)
    else:
        items.append(("piece", parts))  # ``key: [..]`` in a dict; anything else stays opaque text


def _dict(items: list) -> dict | None:
    out = {}
    for item in items:
        if isinstance(item, tuple) and len(item[1]) == 2 and isinstance(item[1][0], str) and \
                item[1][0].endswith(":"):
            out[item[1][0][:-1].strip()] = item[1][1]
        elif isinstance(item, str) and ": " in item:
            key, _, value = item.partition(": ")
            out[key.strip()] = NODE if value.strip().startswith("%") else value.strip()
        else:
            return None
    return out


def parse_call(text: str) -> tuple[str, list, dict] | None:
    """(target, positional arguments, keyword arguments) of a printed FX node, or None."""
    if not text or len(text) > MAX_TEXT:
        return None
    call = text.find(_CALL)
    end = text.find("](args = ", call) if call >= 0 else -1
    if end < 0:
        return None
    target = text[call + len(_CALL):end]
    rest = text[end + len("](args = "):]
    split = rest.rfind(", kwargs = ")
    if split < 0 or not rest.endswith(")"):
        return None
    args, kwargs = _parse(rest[:split]), _parse(rest[split + len(", kwargs = "):-1])
    if not isinstance(args, list) or not isinstance(kwargs, dict):
        return None
    return target, args, kwargs


def _by_name(target, args: list, kwargs: dict) -> dict:
    """Arguments keyed by their schema's names, defaults filled in (positions as names without one)."""
    schema = getattr(target, "_schema", None)
    names = [a.name for a in schema.arguments] if schema is not None else []
    if len(args) > len(names):
        names = []
    out = {names[i] if names else str(i): a for i, a in enumerate(args)}
    out.update(kwargs)
    if schema is not None:
        for a in schema.arguments:
            if a.name not in out and a.has_default_value():
                out[a.name] = _parse(format_arg(a.default_value))
    return out


def _same(a, b) -> bool:
    if a is NODE or b is NODE:
        return a is b
    if isinstance(a, str) and isinstance(b, str):
        if a == b:
            return True
        try:
            return float(a) == float(b)  # 2 and 2.0
        except ValueError:
            return False
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def _shown(value) -> str:
    if value is NODE:
        return "a value of the graph"
    if isinstance(value, str):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_shown(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {_shown(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _compare(node: torch.fx.Node, text: str) -> tuple[str, str, str] | None:
    """(argument, exported, program) of the first difference between ``node`` and its printed twin."""
    parsed = parse_call(text)
    if parsed is None:
        return None
    target_text, args, kwargs = parsed
    ours = node._pretty_print_target(node.target)
    if target_text != ours:
        return "target", target_text, ours
    mine_args, mine_kwargs = _parse(format_arg(tuple(node.args))), _parse(format_arg(dict(node.kwargs)))
    if not isinstance(mine_args, list) or not isinstance(mine_kwargs, dict):
        return None
    theirs, mine = _by_name(node.target, args, kwargs), _by_name(node.target, mine_args, mine_kwargs)
    for name in list(mine) + [k for k in theirs if k not in mine]:
        if name in PLACEMENT:
            continue
        a, b = theirs.get(name), mine.get(name)
        if a is None or b is None:
            if a is None and b is None:
                continue
            return name, "absent" if a is None else _shown(a), "absent" if b is None else _shown(b)
        if not _same(a, b):
            return name, _shown(a), _shown(b)
    return None


def first_difference(program: torch.export.ExportedProgram, index: OnnxIndex) -> Difference | None:
    """The first FX node (in the ONNX graph's order) whose target or literal arguments differ from what
    the ONNX model's metadata says of the node of that name; None when none does (or no metadata)."""
    nodes = {n.name: n for n in program.graph.nodes if n.op == "call_function"}
    seen: set[str] = set()
    for i, fx in enumerate(index.node_fx):
        if not fx or fx in seen or fx not in nodes:
            continue
        seen.add(fx)
        text = index.node_meta(i, FX_NODE_KEY)
        found = _compare(nodes[fx], text or "")
        if found is not None:  # named by the node that computes (not a Constant it reads)
            at = next((j for j in range(i, len(index.nodes)) if index.node_fx[j] == fx
                       and index.op_types[j] != "Constant"), i)
            return Difference(fx, index.nodes[at].name, *found)
    return None
