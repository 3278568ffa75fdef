"""Which operators a program loaded from a file may call.

``pt2_checks`` makes sure reading a ``.pt2`` runs none of the file's code; this module makes sure
*running* the loaded program does nothing but compute. A crafted file may name any registered
operator, and the engine calls them all (``compare``, ``run_aligned``, the widget). Refused here,
before anything runs, with the node and the operator named:

- operators of any namespace but ``aten`` and ``prims`` (custom operators run their library's code)
  and call targets other than torch's symbolic-size functions (``operator.add``, ``math.floor``,
  ``torch.sym_max``...); TorchScript builtins that ``torch.ops.aten`` also resolves (``aten::save``,
  ``aten::warn``, ``aten::manual_seed``...: no dispatcher kernel) are not tensor operators;
- side effects: file and storage access (``aten::from_file``, ``set_`` from a ``Storage``...),
  printing, operators that return nothing but exist for a side effect (only the asserts and size
  constraints, which can only raise, are kept), the random ones (``torch.Tag.nondeterministic_seeded``)
  unless a literal argument turns their randomness off (``dropout(x, p, train=False)``, an attention
  or RNN with a dropout of 0: what eval-mode exports hold), and sparse constructors that skip the
  checks of their indices;
- writes (schema arguments marked ``(a!)``, ``out=`` variants included, and the running statistics
  a training-mode batch norm updates though its schema does not say so) into anything that may
  alias a placeholder (parameter, buffer, constant, user input), a ``get_attr`` tensor or a literal
  argument: each would change the caller's tensors or the cached program, so that a second run
  computes something else. Aliases are followed through views (returns marked ``(a)``),
  ``getitem`` and the outputs of control flow whose subgraph returns one of its inputs. In-place
  ops on intermediate values (``relu_`` of ``nn.ReLU(inplace=True)``, ``out += identity``) are kept.
  A program whose signature declares mutated buffers or inputs (a functional export) is accepted:
  their new values are outputs of the graph, which the engine never writes back;
- higher-order operators other than the control flow the FX runner runs without side effects
  (``cond``, ``while_loop``, ``scan``, ``map_impl``, ``wrap_with_set_grad_enabled``,
  ``wrap_with_autocast``); their subgraphs are checked with the same rules, their placeholders
  counted as the caller's tensors. (``print``, ``with_effects``, ``auto_functionalized``,
  delegates... are refused.)
- node kinds other than placeholders, ``get_attr``, ``call_function`` and the output.
"""

from __future__ import annotations

import functools

import torch

from sbs_widget.errors import LoadError
from sbs_widget.load.pt2_checks import _SYMBOLIC_CALLS

NAMESPACES = frozenset({"aten", "prims"})
# Higher-order operators the FX runner calls, side-effect free; the loops among them call their
# subgraphs once per iteration (fx_runner checks the run's Cancel token there).
LOOP_HOPS = frozenset({"while_loop", "scan", "map_impl"})
HOPS = LOOP_HOPS | {"cond", "wrap_with_set_grad_enabled", "wrap_with_autocast"}

# Operators refused by name: file and storage access, printing, global state.
_REFUSED = {
    "from_file": "reads (or, shared, writes) a file",
    "_print": "prints",
    "set_": "points a tensor at other memory",
    "_cufft_set_plan_cache_max_size": "changes global state",
    "_cufft_clear_plan_cache": "changes global state",
    "record_stream": "changes how memory is freed",
}
# Operators returning nothing and writing nothing that may stay: they can only raise.
_CHECKS = frozenset({"_assert_async", "_assert_scalar", "_assert_tensor_metadata", "sym_constrain_range",
                     "sym_constrain_range_for_size", "_linalg_check_errors"})
# Random operators are kept where a literal argument turns the randomness off.
_OFF_WHEN_FALSE = ("train", "training")
_OFF_WHEN_ZERO = ("p", "dropout", "dropout_p")  # only for dropouts, attentions and RNNs
_RNNS = frozenset({"lstm", "gru", "rnn_tanh", "rnn_relu"})
# Batch norms that update running_mean/running_var in place when training, though their schema
# marks no write; these names compute without updating.
_STATS = ("running_mean", "running_var")
_STATS_KEPT = ("_functional", "_no_update", "_no_training")


def _refuse(where: str, node: torch.fx.Node, what: str, why: str) -> LoadError:
    return LoadError(
        f"refused to run {where}: node {node.name!r} calls {what}, which {why}. sbs_widget runs "
        "programs loaded from files only when every operator they call just computes; if you trust the "
        "file, load it yourself (torch.export.load) and pass the ExportedProgram")


def _name(target) -> str:
    if isinstance(target, torch._ops.OpOverload):
        return f"torch.ops.{target.namespace}.{target._opname}.{target._overloadname}"
    if isinstance(target, torch._ops.HigherOrderOperator):
        return f"torch.ops.higher_order.{target.name()}"
    return f"{getattr(target, '__module__', '?')}.{getattr(target, '__name__', type(target).__name__)}"


def _bound(op: torch._ops.OpOverload, node: torch.fx.Node) -> dict:
    """The node's argument values by schema name (defaults included)."""
    values = {}
    for i, arg in enumerate(op._schema.arguments):
        if i < len(node.args) and not arg.kwarg_only:
            values[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            values[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            values[arg.name] = arg.default_value
    return values


def _random_off(op: torch._ops.OpOverload, args: dict) -> bool:
    if any(args.get(a) is False for a in _OFF_WHEN_FALSE):
        return True
    base = op._opname
    if "dropout" in base or "attention" in base or base in _RNNS:  # a probability of literally 0
        return any(type(args.get(a)) in (int, float) and args[a] == 0 for a in _OFF_WHEN_ZERO)
    return False


def _written(op: torch._ops.OpOverload, args: dict) -> list[str]:
    """Names of the arguments ``op`` writes into."""
    names = [a.name for a in op._schema.arguments if a.alias_info is not None and a.alias_info.is_write]
    if _STATS[0] in args and not any(k in op._opname for k in _STATS_KEPT) \
            and not any(args.get(a) is False for a in (*_OFF_WHEN_FALSE, "use_input_stats")):
        names += [s for s in _STATS if args.get(s) is not None]
    return names


def _nodes(value) -> list:
    out: list = []
    torch.fx.node.map_aggregate(value, lambda v: out.append(v) if isinstance(v, torch.fx.Node) else None)
    return out


@functools.lru_cache(maxsize=None)
def _never(op: torch._ops.OpOverload) -> str | None:
    """Why ``op`` may never run, whatever its arguments (read once per operator)."""
    if op.namespace not in NAMESPACES:
        return (f"is a custom operator (namespace {op.namespace!r}): it runs code of the library that "
                "defines it")
    if not torch._C._dispatch_has_kernel(op._name):
        return "is a TorchScript builtin, not a tensor operator"
    base, schema = op._opname, op._schema
    if base in _REFUSED:
        return _REFUSED[base]
    text = str(schema)
    if "Storage" in text or "Generator" in text.replace("Generator?", "") \
            or any(a.name in ("filename", "path", "file") for a in schema.arguments):
        return "accesses files, storages or random generators"
    if base.startswith("_sparse_") and base.endswith("_unsafe"):
        return "builds a sparse tensor without checking its indices"
    return None


def _check_op(op: torch._ops.OpOverload, node: torch.fx.Node, where: str, alias: dict) -> bool:
    """Raise unless ``op`` may run at ``node``; whether its output may alias the caller's tensors."""
    name, base, schema = _name(op), op._opname, op._schema
    why = _never(op)
    if why is not None:
        raise _refuse(where, node, name, why)
    args = _bound(op, node)
    written = _written(op, args)
    if not schema.returns and not written and base not in _CHECKS:
        raise _refuse(where, node, name, "returns nothing: it exists for a side effect")
    if torch.Tag.nondeterministic_seeded in op.tags and not _random_off(op, args):
        raise _refuse(where, node, name, "draws random numbers (changing the random state, and the results "
                                         "of each run); exported in eval mode, dropouts have train=False")
    for arg in written:
        value = args.get(arg)
        targets = _nodes(value)
        if value is not None and not targets:
            raise _refuse(where, node, name, f"writes into its literal argument {arg!r}")
        hit = next((t for t in targets if alias.get(t, True)), None)
        if hit is not None:
            raise _refuse(where, node, name, f"writes into {arg!r} ({hit.name!r}), which is or may be a view of "
                                             "an input, weight, buffer or constant of the program: running it "
                                             "would change the caller's tensors or the loaded program"
                          + (" (a training-mode batch norm updates its running statistics: export the "
                             "model in eval mode)" if arg in _STATS else ""))
    if not any(r.alias_info is not None for r in schema.returns):
        return False
    viewed = [args.get(a.name) for a in schema.arguments if a.alias_info is not None]
    return any(alias.get(t, True) for v in viewed for t in _nodes(v))


def _subgraph(owner: torch.nn.Module, node: torch.fx.Node):
    value = owner
    for part in str(node.target).split("."):
        value = getattr(value, part, None)
    return value


def _check_graph(gm: torch.nn.Module, where: str, depth: int = 0) -> bool:
    """Check ``gm``'s graph (recursively); whether one of its outputs may alias a placeholder."""
    if depth > 64:
        raise LoadError(f"refused to run {where}: control flow nested more than 64 deep")
    graph = getattr(gm, "graph", None)
    if not isinstance(graph, torch.fx.Graph):
        raise LoadError(f"refused to run {where}: a subgraph that is not an FX graph ({type(gm).__name__})")
    alias: dict[torch.fx.Node, bool] = {}  # node -> may alias a placeholder or a get_attr tensor
    out = False
    for node in graph.nodes:
        op = node.op
        if op in ("placeholder", "get_attr"):
            alias[node] = True
        elif op == "output":
            out = any(alias.get(t, True) for t in _nodes(node.args))
        elif op != "call_function":
            raise LoadError(f"refused to run {where}: node {node.name!r} is a {op} node, which programs "
                            "loaded from files do not hold")
        elif isinstance(node.target, torch._ops.OpOverload):
            alias[node] = _check_op(node.target, node, where, alias)
        elif isinstance(node.target, torch._ops.HigherOrderOperator):
            alias[node] = _check_hop(gm, node, where, alias, depth)
        else:
            name = _name(node.target)
            if name not in _SYMBOLIC_CALLS:
                raise _refuse(where, node, name, "is not a torch operator")
            alias[node] = name == "_operator.getitem" and any(alias.get(t, True) for t in _nodes(node.args[:1]))
    return out


def _check_hop(gm, node: torch.fx.Node, where: str, alias: dict, depth: int) -> bool:
    hop = node.target.name()
    if hop not in HOPS:
        raise _refuse(where, node, _name(node.target), "is a higher-order operator the engine does not run "
                                                         f"(only {', '.join(sorted(HOPS))})")
    returns_input = False
    for sub in (t for t in _nodes((node.args, node.kwargs)) if t.op == "get_attr"):
        module = _subgraph(gm, sub)
        if isinstance(module, torch.nn.Module):
            returns_input |= _check_graph(module, f"{where}, subgraph {sub.target!r} of node {node.name!r}",
                                          depth + 1)
    return returns_input and any(alias.get(t, True) for t in _nodes((node.args, node.kwargs)))


def check_operators(program: torch.export.ExportedProgram, where: str = "the program") -> None:
    """Raise ``LoadError`` unless every node of ``program`` (nested subgraphs included) calls an
    operator of the allow-list above, without writing into the program's inputs or weights."""
    _check_graph(program.graph_module, where)
