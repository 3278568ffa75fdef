"""The call specs of a ``.pt2`` (how the program's inputs and outputs nest), read before torch reads them.

torch's reader turns each spec string (``module_call_graph[*].signature.in_spec``/``out_spec``) into a
``TreeSpec`` with ``torch.utils._pytree.treespec_loads``, and that reader imports by name: a
``collections.defaultdict`` node names its factory's module and class (``importlib.import_module``),
and a context holding ``{"__enum__": ..., "fqn": "module:Class"}`` imports that module. ``python -m``
and notebooks put the working folder first on ``sys.path``, so a ``.py`` shipped beside the model would
run. Here each spec is parsed as JSON and walked against an allow-list of container types first:
- the containers torch.export writes (tuple, list, dict, OrderedDict, namedtuple, deque, torch.Size,
  FX's immutable list and dict), a ``defaultdict`` only with a builtin factory (``list``, ``dict``...);
- transformers' caches and model outputs (``transformers.cache_utils``, ``modeling_outputs``, a model's
  ``modeling_*``): a Cache or ModelOutput subclass only, registered by ``untrusted`` when a load needs it;
- types the user's own code registered with ``torch.utils._pytree`` in this process (their code, not
  the file's), with a plain JSON context.
No enum in any context. A spec is bounded in size and depth. Anything else raises ``LoadError``.
"""

from __future__ import annotations

import json
import re

from sbs_widget.errors import LoadError

_CONTAINERS = frozenset({
    "builtins.tuple", "builtins.list", "builtins.dict", "collections.OrderedDict", "collections.namedtuple",
    "collections.deque", "torch.Size", "torch.fx.immutable_collections.immutable_list",
    "torch.fx.immutable_collections.immutable_dict",
})
_DEFAULTDICT = "collections.defaultdict"
# the factories a defaultdict may name: builtin types, nothing the file could import
_FACTORIES = frozenset({"list", "dict", "set", "tuple", "int", "float", "str", "bool", "frozenset"})
# transformers' serialized names: ``module:Class`` or ``module.Class``
_TRANSFORMERS = re.compile(r"transformers\.(cache_utils|modeling_outputs|models\.\w+\.modeling_\w+)[.:]\w+")
MAX_SPEC_CHARS = 4 << 20  # a spec lists one node per input leaf: an LLM's cache has thousands, not millions
MAX_SPEC_DEPTH = 64


def _refuse(where: str, why: str) -> LoadError:
    return LoadError(f"refused to load {where!r} of the .pt2 archive: its call spec {why}. sbs_widget loads "
                     "data only, since files may come from anyone; if you trust the file, load it yourself "
                     "(torch.export.load) and pass the ExportedProgram")


def _registered(type_name: str) -> bool:
    """Whether code of this process (not the file) registered ``type_name`` as a pytree node."""
    from torch.utils import _pytree

    return type_name in _pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE


def _has_enum(value) -> bool:
    stack = [value]
    while stack:
        v = stack.pop()
        if isinstance(v, dict):
            if "__enum__" in v:
                return True
            stack.extend(v.values())
        elif isinstance(v, list):
            stack.extend(v)
    return False


def _check_context(type_name: str, context, where: str) -> None:
    if type_name == _DEFAULTDICT:
        if not isinstance(context, dict) or set(context) != {"default_factory_module", "default_factory_name",
                                                             "dict_context"}:
            raise _refuse(where, "holds a defaultdict whose context is not torch's")
        module, name = context["default_factory_module"], context["default_factory_name"]
        if module != "builtins" or name not in _FACTORIES:
            raise _refuse(where, f"holds a defaultdict whose factory is {str(module)[:80]}.{str(name)[:80]}: "
                                 f"only builtin types ({', '.join(sorted(_FACTORIES))}) are read, since torch "
                                 "imports the module it names")
        return
    if type_name == "collections.namedtuple":
        if not isinstance(context, str):
            raise _refuse(where, "holds a namedtuple whose context is not a type name")
        return
    if context is None:
        return
    if not isinstance(context, str):
        raise _refuse(where, f"holds a {type_name[:80]} whose context is not a JSON string")
    try:
        parsed = json.loads(context)
    except (ValueError, RecursionError):
        raise _refuse(where, f"holds a {type_name[:80]} whose context is not JSON") from None
    if _has_enum(parsed):
        raise _refuse(where, "holds an enum in a context (torch imports the module an enum names)")


def check_call_spec(text, where: str) -> None:
    """Raise ``LoadError`` unless the spec string ``text`` names only allowed container types."""
    if text is None:
        return
    if not isinstance(text, str):
        raise _refuse(where, f"is a {type(text).__name__}, not a string")
    if len(text) > MAX_SPEC_CHARS:
        raise _refuse(where, f"has {len(text)} characters (at most {MAX_SPEC_CHARS})")
    try:
        protocol, root = json.loads(text)
    except (ValueError, TypeError, RecursionError):
        raise _refuse(where, "is not a pair [protocol, tree] of JSON") from None
    if protocol != 1:
        raise _refuse(where, f"uses protocol {str(protocol)[:20]}: sbs_widget reads protocol 1")
    stack = [(root, 0)]
    while stack:
        node, depth = stack.pop()
        if depth > MAX_SPEC_DEPTH:
            raise _refuse(where, f"nests deeper than {MAX_SPEC_DEPTH} containers")
        if not isinstance(node, dict) or set(node) != {"type", "context", "children_spec"} \
                or not isinstance(node["children_spec"], list):
            raise _refuse(where, "holds a node that is not {type, context, children_spec}")
        type_name = node["type"]
        if type_name is None:
            if node["context"] is not None or node["children_spec"]:
                raise _refuse(where, "holds a leaf with a context or children")
            continue
        if not isinstance(type_name, str):
            raise _refuse(where, "holds a node whose type is not a string")
        if type_name not in _CONTAINERS and type_name != _DEFAULTDICT and not _TRANSFORMERS.fullmatch(type_name) \
                and not _registered(type_name):
            raise _refuse(where, f"holds the type {type_name[:120]!r}, which is neither a container torch.export "
                                 "writes, a transformers cache or model output, nor a type registered with "
                                 "torch.utils._pytree in this process (register it, then load again)")
        _check_context(type_name, node["context"], where)
        stack.extend((child, depth + 1) for child in node["children_spec"])


def check_call_specs(program: dict, member: str) -> None:
    """Every in/out spec of the serialized program's module call graph."""
    graph_module = program.get("graph_module")
    calls = graph_module.get("module_call_graph") if isinstance(graph_module, dict) else None
    if calls is None:
        return
    if not isinstance(calls, list):
        raise _refuse(member, "graph is not a list")
    for i, entry in enumerate(calls):
        signature = entry.get("signature") if isinstance(entry, dict) else None
        if signature is None:
            continue
        if not isinstance(signature, dict):
            raise _refuse(member, f"entry {i} is not a signature")
        fqn = str(entry.get("fqn"))[:80]
        for key in ("in_spec", "out_spec"):
            check_call_spec(signature.get(key), f"{member} (module {fqn!r}, {key})")
