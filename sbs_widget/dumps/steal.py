"""Dump the inputs and outputs of chosen submodules of a torch model into one ONNX file.

``steal_forward`` intercepts ``forward``; ``load_dump`` rebuilds what it stored. In the file every
tensor is the output of a ``Constant`` node (any ONNX runtime can run the file to get them back) and the
nesting (args/kwargs, containers, non-tensor values) is JSON in ``metadata_props["sbs_widget.dump"]``.
Loading never unpickles nor evaluates anything: only JSON, raw tensor bytes and an allowlist of types.
"""

from __future__ import annotations

import collections
import functools
import json
import math
import warnings
from typing import Any, Iterable

import onnx
import torch
from torch.utils import _pytree

from sbs_widget.dtypes import onnx_elem_type, torch_dtype
from sbs_widget.errors import InputError, LoadError, SbsWidgetWarning
from sbs_widget.load.onnx_checks import check_tensor
from sbs_widget.safe_files import output_path
from sbs_widget.strings import string_type

METADATA_KEY = "sbs_widget.dump"
FORMAT_VERSION = 1
_CACHE_MODULE = "transformers.cache_utils"
_OUTPUTS_MODULE = "transformers.modeling_outputs"
# Bounds on what a dump file's metadata may make this process build: its JSON text (characters) and
# the nesting of the values it describes. A dump written by ``steal_forward`` is far below both.
METADATA_LIMIT = 16 << 20
DEPTH_LIMIT = 64
# The factories a ``collections.defaultdict`` in a dump may have, by (module, name): built here, never
# imported by a name the file gives.
_FACTORIES = {("builtins", f.__name__): f for f in (list, dict, set, tuple, int, float, str)}
_FACTORIES[(None, None)] = None
# Containers rebuilt by this module's code (torch's deserializers import modules named by the file).
_OWN_CONTAINERS = ("collections.OrderedDict", "collections.defaultdict", "collections.deque")


# ---------------------------------------------------------------- structure <-> JSON


def _cache_class(module: str, qualname: str):
    """A transformers cache class by name, or None: the only classes rebuilt from their ``__dict__``."""
    if module != _CACHE_MODULE:
        return None
    import importlib

    mod = importlib.import_module(_CACHE_MODULE)
    cls = getattr(mod, qualname, None)
    bases = tuple(b for b in (getattr(mod, "Cache", None), getattr(mod, "CacheLayerMixin", None)) if b)
    return cls if isinstance(cls, type) and issubclass(cls, bases) else None


def _known_transformers_class(name: str) -> type | None:
    """The class a pytree name from a dump gives, when it is one of transformers' own model outputs
    (``transformers.modeling_outputs.X``, the name transformers registers them under) or caches
    (``transformers.cache_utils:X``, the name its exporter registers them under), else None. Found by
    attribute lookup in those two modules, imported by their fixed names: never by the file's."""
    if name.startswith(_OUTPUTS_MODULE + "."):
        module, attr = _OUTPUTS_MODULE, name[len(_OUTPUTS_MODULE) + 1:]
    else:
        module, _, attr = name.partition(":")
        if module != _CACHE_MODULE:
            return None
    if not attr.isidentifier():
        return None
    import importlib

    try:
        from transformers.utils import ModelOutput

        mod = importlib.import_module(_OUTPUTS_MODULE if module == _OUTPUTS_MODULE else _CACHE_MODULE)
    except ImportError:
        return None
    if module == _CACHE_MODULE:
        return _cache_class(_CACHE_MODULE, attr)
    cls = getattr(mod, attr, None)
    if isinstance(cls, type) and issubclass(cls, ModelOutput) and cls.__module__ == _OUTPUTS_MODULE \
            and cls.__qualname__ == attr:
        return cls
    return None


def _register_known(name: str) -> type | None:
    """Register with torch's pytree, as transformers itself does, the class a dump names (see
    ``_known_transformers_class``) and not registered in this process yet: the class, or None."""
    cls = _known_transformers_class(name)
    if cls is None:
        return None
    if cls not in _pytree.SUPPORTED_NODES:
        try:
            if cls.__module__ == _CACHE_MODULE:  # caches: as its exporter registers them
                from transformers.exporters.exporter_dynamo import register_pytree_node
            else:  # model outputs: as every ModelOutput subclass registers itself when defined
                from transformers.utils.generic import _register_model_output_pytree_node as register_pytree_node
            register_pytree_node(cls)
        except (ImportError, ValueError):
            return None
    return cls if _pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(name) is cls else None


def _transformers_type(name) -> type | None:
    """The transformers ``ModelOutput`` or cache class registered with torch's pytree under ``name``, or
    None: the only pytree types, besides ``_OWN_CONTAINERS``, that a dump may hold. Looked up among the
    types registered in this process; one of transformers' known output or cache classes that is not
    registered yet is registered here (``_register_known``): nothing is imported by a name the file gives."""
    cls = _pytree.SERIALIZED_TYPE_TO_PYTHON_TYPE.get(name) if type(name) is str else None
    if cls is None and type(name) is str:
        cls = _register_known(name)
    if not isinstance(cls, type) or not cls.__module__.startswith("transformers."):
        return None
    try:
        from transformers.utils import ModelOutput
    except ImportError:  # pragma: no cover - registered by transformers, so it imports
        return None
    if issubclass(cls, ModelOutput) or _cache_class(cls.__module__, cls.__qualname__):
        return cls
    return None


def _pytree_name(cls) -> str | None:
    """The name ``cls`` is stored under as a pytree container, or None when a dump may not hold it."""
    ser = getattr(_pytree, "SUPPORTED_SERIALIZED_TYPES", {}).get(cls)
    name = getattr(ser, "serialized_type_name", None)
    if name in _OWN_CONTAINERS or (name and _transformers_type(name) is cls):
        return name
    return None


def _encode(obj, tensors: list, unsupported: list, where: str):
    """JSON-able description of ``obj``; tensors are appended to ``tensors`` and referenced by index."""
    if obj is None or type(obj) in (bool, int, str):
        return obj
    if type(obj) is float:
        return obj if math.isfinite(obj) else {"_t": "float", "v": repr(obj)}
    if isinstance(obj, torch.Tensor):
        if onnx_elem_type(obj.dtype) is None:  # a dump is an ONNX file: no type, no tensor
            unsupported.append(f"{where} (tensor of dtype {obj.dtype})")
            return {"_t": "unsupported", "type": str(obj.dtype)}
        tensors.append(obj)
        return {"_t": "tensor", "i": len(tensors) - 1}
    if type(obj) is tuple:
        return {"_t": "tuple", "v": [_encode(x, tensors, unsupported, f"{where}[{i}]") for i, x in enumerate(obj)]}
    if type(obj) is list:
        return [_encode(x, tensors, unsupported, f"{where}[{i}]") for i, x in enumerate(obj)]
    if type(obj) is dict:
        if all(k is None or type(k) in (str, int, bool) for k in obj):
            return {"_t": "dict", "k": list(obj),
                    "v": [_encode(v, tensors, unsupported, f"{where}[{k!r}]") for k, v in obj.items()]}
        unsupported.append(f"{where} (dict with keys that are not str/int/bool)")
        return {"_t": "unsupported", "type": "dict"}
    if isinstance(obj, torch.dtype):
        return {"_t": "dtype", "v": str(obj).removeprefix("torch.")}
    if isinstance(obj, torch.device):
        return {"_t": "device", "v": str(obj)}
    if isinstance(obj, torch.Size):
        return {"_t": "size", "v": list(obj)}
    if isinstance(obj, tuple) and hasattr(type(obj), "_fields"):  # namedtuple
        return {"_t": "namedtuple", "type": type(obj).__name__, "fields": list(obj._fields),
                "v": [_encode(x, tensors, unsupported, f"{where}.{f}") for f, x in zip(obj._fields, obj)]}
    cls = type(obj)
    if cls is collections.defaultdict:
        factory = obj.default_factory
        key = (None, None) if factory is None else (getattr(factory, "__module__", None),
                                                   getattr(factory, "__qualname__", None))
        if _FACTORIES.get(key, False) is not factory or not all(k is None or type(k) in (str, int, bool) for k in obj):
            unsupported.append(f"{where} (defaultdict of {factory!r}: a dump holds the factories "
                               "list/dict/set/tuple/int/float/str/None and keys str/int/bool)")
            return {"_t": "unsupported", "type": "defaultdict"}
        ctx = {"default_factory_module": key[0], "default_factory_name": key[1], "dict_context": list(obj)}
        return {"_t": "pytree", "type": "collections.defaultdict", "ctx": ctx,
                "v": [_encode(v, tensors, unsupported, f"{where}[{k!r}]") for k, v in obj.items()]}
    node = _pytree.SUPPORTED_NODES.get(cls)
    ser = getattr(_pytree, "SUPPORTED_SERIALIZED_TYPES", {}).get(cls)
    if node is not None and ser is not None and _pytree_name(cls) is None and isinstance(obj, tuple):
        # torch.return_types and other tuples registered without a name a dump may hold: their values
        return {"_t": "tuple", "v": [_encode(x, tensors, unsupported, f"{where}[{i}]") for i, x in enumerate(obj)]}
    if node is not None and ser is not None and _pytree_name(cls) is not None:
        children, context = node.flatten_fn(obj)
        to_ctx = getattr(ser, "to_dumpable_context", None)
        try:
            ctx = to_ctx(context) if to_ctx else context
            json.dumps(ctx)
        except (TypeError, ValueError):
            unsupported.append(f"{where} ({cls.__name__}: pytree context is not JSON)")
            return {"_t": "unsupported", "type": cls.__name__}
        return {"_t": "pytree", "type": ser.serialized_type_name, "ctx": ctx,
                "v": [_encode(x, tensors, unsupported, f"{where}.{i}") for i, x in enumerate(children)]}
    if isinstance(obj, type) and _cache_class(obj.__module__, obj.__qualname__):
        return {"_t": "class", "module": obj.__module__, "type": obj.__qualname__}
    if _cache_class(cls.__module__, cls.__qualname__):
        # transformers caches are not pytree nodes unless an exporter registered them: keep their state.
        state = {k: _encode(v, tensors, unsupported, f"{where}.{k}") for k, v in vars(obj).items()}
        return {"_t": "obj", "module": cls.__module__, "type": cls.__qualname__, "state": state}
    unsupported.append(f"{where} ({cls.__name__})")
    return {"_t": "unsupported", "type": cls.__name__}


def _decode(node, tensors: list, depth: int = 0):
    """Inverse of ``_encode``; only builds JSON types, tensors and allowlisted containers. Nothing in
    ``node`` chooses what is imported or called: every type is looked up in this module's own tables."""
    if node is None or type(node) in (bool, int, float, str):
        return node
    if depth > DEPTH_LIMIT:
        raise LoadError(f"dump: values nested more than {DEPTH_LIMIT} levels deep; steal_forward writes no such "
                        "value: the file was edited")
    depth += 1
    if type(node) is list:
        return [_decode(x, tensors, depth) for x in node]
    if type(node) is not dict:
        raise LoadError(f"dump: unexpected JSON value {str(node)[:80]!r}")
    tag = node.get("_t")
    if tag == "tensor":
        i = node["i"]
        if type(i) is not int or not 0 <= i < len(tensors):
            raise LoadError(f"dump: tensor reference {str(i)[:20]!r} out of the entry's {len(tensors)} tensor(s)")
        return tensors[i]
    if tag == "tuple":
        return tuple(_decode(x, tensors, depth) for x in _list(node["v"]))
    if tag == "dict":
        return dict(zip(_keys(node["k"]), (_decode(x, tensors, depth) for x in _list(node["v"]))))
    if tag == "float":
        return float(str(node["v"]))
    if tag == "dtype":
        dtype = getattr(torch, node["v"], None) if type(node["v"]) is str else None
        if not isinstance(dtype, torch.dtype):
            raise LoadError(f"dump: unknown dtype {str(node['v'])[:80]!r}")
        return dtype
    if tag == "device":
        try:
            return torch.device(node["v"])
        except (RuntimeError, TypeError, ValueError):
            raise LoadError(f"dump: unknown device {str(node['v'])[:80]!r}; a dump names devices such as "
                            "'cpu' or 'cuda:0'") from None
    if tag == "size":
        dims = _list(node["v"])
        if not all(type(d) is int and d >= 0 for d in dims):
            raise LoadError(f"dump: torch.Size {str(dims)[:80]} holds something other than sizes")
        return torch.Size(dims)
    if tag == "namedtuple":
        values = [_decode(x, tensors, depth) for x in _list(node["v"])]
        return _namedtuple_class(node["type"], node["fields"], len(values))(*values)
    if tag == "pytree":
        return _decode_pytree(node, [_decode(x, tensors, depth) for x in _list(node["v"])])
    if tag in ("obj", "class"):
        module, qualname = node["module"], node["type"]
        cls = _cache_class(module, qualname) if type(module) is str and type(qualname) is str else None
        if cls is None:
            raise LoadError(f"dump: type {str(module)[:80]}.{str(qualname)[:80]} is not an allowed container")
        if tag == "class":
            return cls
        state = node["state"]
        if type(state) is not dict:
            raise LoadError(f"dump: the state of {qualname} is not a mapping")
        obj = cls.__new__(cls)
        obj.__dict__.update({str(k): _decode(v, tensors, depth) for k, v in state.items()})
        return obj
    if tag == "unsupported":
        return f"<not stored: {str(node['type'])[:80]}>"
    raise LoadError(f"dump: unknown tag {str(tag)[:80]!r}")


def _list(value) -> list:
    if type(value) is not list:
        raise LoadError(f"dump: expected a list, found {str(value)[:80]!r}")
    return value


def _keys(value) -> list:
    """Mapping keys from the file: JSON scalars only (hashable, and nothing else to build)."""
    keys = _list(value)
    if not all(k is None or type(k) in (str, int, float, bool) for k in keys):
        raise LoadError(f"dump: mapping keys {str(keys)[:80]} are not strings, numbers or booleans")
    return keys


@functools.lru_cache(maxsize=256)
def _namedtuple_type(type_name: str, fields: tuple) -> type:
    return collections.namedtuple(type_name, fields)


def _namedtuple_class(type_name, fields, count: int) -> type:
    """The namedtuple class a dump names (one per name and fields, made once): its names must be what
    ``collections.namedtuple`` takes (identifiers, no keyword, no leading underscore, no repeat)."""
    if type(type_name) is not str or type(fields) is not list or not all(type(f) is str for f in fields):
        raise LoadError(f"dump: namedtuple {str(type_name)[:80]!r} has no name and field names")
    if len(fields) != count:
        raise LoadError(f"dump: namedtuple {type_name[:80]!r} names {len(fields)} field(s) for {count} value(s)")
    try:
        return _namedtuple_type(type_name, tuple(fields))
    except (ValueError, TypeError, SyntaxError) as e:
        raise LoadError(f"dump: namedtuple {type_name[:80]!r} with fields {str(fields)[:80]} cannot be rebuilt "
                        f"({e}); steal_forward writes no such names: the file was edited") from None


def _decode_pytree(node: dict, values: list):
    """A pytree container from the file: OrderedDict, deque and defaultdict (of a builtin factory) built
    here; transformers' ModelOutput and cache types by their registered unflatten function; any other
    type refused. torch's own deserializers are never called on the file's context: the defaultdict
    one imports the module the file names."""
    name, ctx = node["type"], node.get("ctx")
    shown = str(name)[:80]
    if name == "collections.OrderedDict":
        return collections.OrderedDict(zip(_keys(ctx), values, strict=True))
    if name == "collections.deque":
        if ctx is not None and (type(ctx) is not int or ctx < 0):
            raise LoadError(f"dump: deque length {str(ctx)[:20]!r} is not a size")
        return collections.deque(values, maxlen=ctx)
    if name == "collections.defaultdict":
        if type(ctx) is not dict or set(ctx) != {"default_factory_module", "default_factory_name", "dict_context"}:
            raise LoadError(f"dump: defaultdict context {str(ctx)[:80]} is not what steal_forward writes")
        key = (ctx["default_factory_module"], ctx["default_factory_name"])
        if type(key[0]) not in (str, type(None)) or type(key[1]) not in (str, type(None)) or key not in _FACTORIES:
            raise LoadError(f"dump: defaultdict with the factory {str(key[0])[:80]}.{str(key[1])[:80]} is refused: a "
                            "dump's defaultdict has one of list, dict, set, tuple, int, float, str or None")
        return collections.defaultdict(_FACTORIES[key], zip(_keys(ctx["dict_context"]), values, strict=True))
    cls = _transformers_type(name)
    if cls is None:
        raise LoadError(f"dump: container type {shown!r} is refused: a dump holds OrderedDict, deque, defaultdict "
                        "and transformers' ModelOutput and cache types (those of transformers.modeling_outputs "
                        "and transformers.cache_utils are registered with torch pytree on loading; another one, "
                        "a model's own output class say, is read once its module is imported: import it before "
                        "loading)")
    from_ctx = getattr(_pytree.SUPPORTED_SERIALIZED_TYPES[cls], "from_dumpable_context", None)
    if from_ctx is not None and not getattr(from_ctx, "__module__", "").startswith("transformers"):
        raise LoadError(f"dump: container type {shown!r} is read by {from_ctx!r}, which is not transformers' own")
    unflatten = _pytree.SUPPORTED_NODES[cls].unflatten_fn
    if _cache_class(cls.__module__, cls.__qualname__):
        # registered by transformers' exporter: its context names the classes to build, which its
        # unflatten function imports; only cache classes (and builtin containers) get there
        if from_ctx is not None or not getattr(unflatten, "__module__", "").startswith("transformers"):
            raise LoadError(f"dump: cache type {shown!r} is read by {unflatten!r}, which is not transformers' "
                            "exporter's")
        _check_exporter_context(ctx, len(values))
        try:
            return unflatten(values, ctx)
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, ImportError) as e:
            raise LoadError(f"dump: cache {shown!r} cannot be rebuilt ({type(e).__name__}: {str(e)[:200]})") \
                from None
    if from_ctx is None and ctx is not None:
        ctx = _keys(ctx)  # ModelOutput: its field names
    return unflatten(values, from_ctx(ctx) if from_ctx else ctx)


# Containers in the context of a cache registered by transformers' exporter (``_flatten_to_context``).
_EXPORTER_SEQUENCES = ("builtins:tuple", "builtins:list", "builtins:set", "builtins:frozenset")
_EXPORTER_MAPPINGS = ("builtins:dict", "collections:OrderedDict")


def _check_exporter_context(ctx, count: int, depth: int = 0) -> None:
    """Refuse (``LoadError``) a cache's context that would make transformers' exporter build anything
    but transformers' cache classes, builtin containers, tensors among the ``count`` values and plain
    torch values (dtypes, devices, sizes): everything it imports is named by the context."""
    if ctx is None or type(ctx) in (bool, int, float, str):
        return
    if depth > DEPTH_LIMIT:
        raise LoadError(f"dump: cache context nested more than {DEPTH_LIMIT} levels deep")
    depth += 1
    if type(ctx) is list:
        for x in ctx:
            _check_exporter_context(x, count, depth)
        return
    if type(ctx) is not dict:
        raise LoadError(f"dump: unexpected cache context {str(ctx)[:80]!r}")
    tag = ctx.get("_t")
    if tag is None:
        for v in ctx.values():
            _check_exporter_context(v, count, depth)
        return
    value, path = ctx.get("v"), ctx.get("p")
    if tag in ("tensor", "sym"):
        ok = type(ctx.get("i")) is int and 0 <= ctx["i"] < count
    elif tag in ("dtype", "layout"):
        n = ctx.get("n")
        ok = type(n) is str and isinstance(getattr(torch, n, None), torch.dtype if tag == "dtype" else torch.layout)
    elif tag == "device":
        try:
            ok = type(ctx.get("s")) is str and torch.device(ctx["s"]) is not None
        except (RuntimeError, TypeError, ValueError):
            ok = False
    elif tag == "size":
        ok = type(value) is list and all(type(d) is int and d >= 0 for d in value)
    elif tag == "items":
        ok = type(value) is list and all(type(p) is list and len(p) == 2 for p in value)
        if ok:
            _keys([p[0] for p in value])
            _check_exporter_context([p[1] for p in value], count, depth)
    elif tag in ("type", "obj"):
        module, _, qualname = path.partition(":") if type(path) is str else ("", "", "")
        ok = _cache_class(module, qualname) is not None and (tag == "type" or type(ctx.get("s")) is dict)
        if ok and tag == "obj":
            _check_exporter_context(list(ctx["s"].values()), count, depth)
    elif tag in ("seq", "map"):
        ok = path in (_EXPORTER_SEQUENCES if tag == "seq" else _EXPORTER_MAPPINGS) and \
            type(value) is (list if tag == "seq" else dict)
        if ok:
            _check_exporter_context(value if tag == "seq" else list(value.values()), count, depth)
    else:
        ok = False
    if not ok:
        raise LoadError(f"dump: cache context entry {str(ctx)[:120]} is refused: the context of a cache holds "
                        "transformers' cache classes, builtin containers, tensors, dtypes, devices and sizes")


# ---------------------------------------------------------------- steal_forward


def _name_targets(targets) -> list[tuple[str, torch.nn.Module]]:
    if isinstance(targets, torch.nn.Module):
        targets = [targets]
    targets = list(targets)
    if all(isinstance(t, tuple) and len(t) == 2 for t in targets):
        pairs = [(str(n), m) for n, m in targets]
    elif all(isinstance(t, torch.nn.Module) for t in targets):
        # The module that contains all the others names them by their path in it.
        pairs = []
        for root in targets:
            paths = {id(m): p for p, m in root.named_modules()}
            if all(id(t) in paths for t in targets):
                pairs = [(paths[id(t)] or type(root).__name__, t) for t in targets]
                break
        if not pairs:
            pairs = [(f"{type(t).__name__}_{i}", t) for i, t in enumerate(targets)]
    else:
        raise InputError("steal_forward: targets must be a module, a list of modules or of (name, module) pairs")
    names = [n for n, _ in pairs]
    if len(set(names)) != len(names) or len({id(m) for _, m in pairs}) != len(pairs):
        raise InputError(f"steal_forward: duplicated name or module in targets {names}")
    return pairs


class ForwardStealer:
    """What ``steal_forward`` returns: a context manager holding what it intercepted.

    - ``storage``: ``{(name, iteration, "I"): (args, kwargs), (name, iteration, "O"): output}`` in call order
    - ``stored_bytes``, ``dropped`` (keys not kept beyond ``storage_limit``), ``dropped_bytes``
    - ``unsupported``: where a value could not be stored (kept as a ``"<not stored: type>"`` string)
    """

    def __init__(self, targets, *, dump_file=None, storage_limit: int = 2**27, verbose: int = 0):
        self.targets = _name_targets(targets)
        self.dump_file = dump_file
        self.storage_limit = storage_limit
        self.verbose = verbose
        self.stored_bytes = 0
        self.dropped: list[tuple] = []
        self.dropped_bytes = 0
        self.unsupported: list[str] = []
        self._entries: dict[tuple, tuple[Any, list[torch.Tensor]]] = {}
        self._counts: dict[str, int] = {}
        self._saved: list[tuple[torch.nn.Module, Any]] = []
        self._depth = 0

    # storing ---------------------------------------------------------------
    def _store(self, key: tuple, value) -> None:
        tensors: list[torch.Tensor] = []
        node = _encode(value, tensors, self.unsupported, f"{key[0]}[{key[1]}].{key[2]}")
        size = sum(t.numel() * t.element_size() for t in tensors)
        if self.dropped or self.stored_bytes + size > self.storage_limit:
            self.dropped.append(key)
            self.dropped_bytes += size
            return
        self.stored_bytes += size
        # Cloned now: the model may change its inputs in place later (caches do).
        self._entries[key] = (node, [t.detach().clone() for t in tensors])

    @property
    def storage(self) -> dict:
        """The stored values, rebuilt with their original nesting (tensors are shared, not copied)."""
        return {k: _decode(node, tensors) for k, (node, tensors) in self._entries.items()}

    # interception ----------------------------------------------------------
    def _wrap(self, name: str, forward):
        @functools.wraps(forward)
        def stolen_forward(*args, **kwargs):
            it = self._counts.get(name, 0)
            self._counts[name] = it + 1
            self._store((name, it, "I"), (args, kwargs))
            self._depth += 1
            try:
                out = forward(*args, **kwargs)
            finally:
                self._depth -= 1
            self._store((name, it, "O"), out)
            if self.verbose:
                print(f"{'  ' * self._depth}{name}[{it}] {string_type((args, kwargs))} -> {string_type(out)}")
            return out

        return stolen_forward

    def __enter__(self) -> "ForwardStealer":
        for name, module in self.targets:
            # Keep the instance attribute if there was one (someone else patched forward before us).
            self._saved.append((module, module.__dict__.get("forward")))
            module.forward = self._wrap(name, module.forward)
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        for module, previous in reversed(self._saved):
            if previous is None:
                del module.forward
            else:
                module.forward = previous
        self._saved.clear()
        if self.unsupported:
            shown = ", ".join(self.unsupported[:5]) + (" ..." if len(self.unsupported) > 5 else "")
            warnings.warn(f"steal_forward could not store {len(self.unsupported)} value(s), kept as "
                          f"'<not stored: type>': {shown}", SbsWidgetWarning, stacklevel=2)
        if self.dropped:
            warnings.warn(f"steal_forward: storage_limit={self.storage_limit} bytes reached, dropped "
                          f"{len(self.dropped)} value(s) ({self.dropped_bytes} bytes) from {self.dropped[0]} "
                          f"onward; raise storage_limit or steal fewer modules", SbsWidgetWarning, stacklevel=2)
        if self.dump_file is not None:
            save_dump(self._entries, self.dump_file)
        if self.verbose:
            print(f"steal_forward: {len(self._entries)} value(s), {self.stored_bytes} bytes"
                  + (f" -> {self.dump_file}" if self.dump_file is not None else ""))


def steal_forward(targets, *, dump_file=None, storage_limit: int = 2**27, verbose: int = 0) -> ForwardStealer:
    """Intercept every call of ``forward`` of ``targets`` and keep its inputs and outputs.

    ``targets``: a module, a list of ``(name, module)`` pairs or a list of modules (named by their path
    in the one that contains the others; that one is named by its class). Keys are
    ``(name, iteration, "I")`` -> ``(args, kwargs)`` and ``(name, iteration, "O")`` -> output, where
    ``iteration`` counts the calls of that module from 0. On exit ``forward`` is restored, even after an
    exception, and everything is written to ``dump_file`` (see ``load_dump``) if given.

    >>> import torch, sbs_widget
    >>> model, inputs = sbs_widget.dummy_llm()
    >>> with sbs_widget.steal_forward([model, model.decoder.feed_forward]) as stolen:
    ...     _ = model(*inputs)
    >>> sorted(stolen.storage)[:2]
    [('DummyLLM', 0, 'I'), ('DummyLLM', 0, 'O')]
    >>> sbs_widget.string_type(stolen.storage["decoder.feed_forward", 0, "O"])
    'T1s2x30x16'
    """
    return ForwardStealer(targets, dump_file=dump_file, storage_limit=storage_limit, verbose=verbose)


# ---------------------------------------------------------------- file


def _tensor_proto(name: str, t: torch.Tensor) -> onnx.TensorProto:
    t = t.detach().cpu().contiguous()
    proto = onnx.TensorProto()
    proto.name = name
    proto.data_type = onnx_elem_type(t.dtype)
    proto.dims.extend(t.shape)
    # Raw little-endian bytes of the exact bits: bfloat16 and float8 need no numpy type.
    proto.raw_data = t.reshape(-1).view(torch.uint8).numpy().tobytes()
    return proto


def dump_model(entries: dict[tuple, tuple[Any, list[torch.Tensor]]]) -> onnx.ModelProto:
    """The ONNX model holding ``entries`` (``key -> (json node, tensors)``, as ``ForwardStealer`` keeps them)."""
    nodes, outputs, meta, used = [], [], [], set()
    for (name, it, kind), (node, tensors) in entries.items():
        names = []
        for j, t in enumerate(tensors):
            out = f"{name}.{it}.{kind}.{j}"
            if out in used:  # only with odd user names
                out = f"{out}.{len(used)}"
            used.add(out)
            names.append(out)
            nodes.append(onnx.helper.make_node("Constant", [], [out], value=_tensor_proto(out, t)))
            outputs.append(onnx.helper.make_tensor_value_info(out, onnx_elem_type(t.dtype), list(t.shape)))
        meta.append({"name": name, "iteration": it, "kind": kind, "value": node, "tensors": names})
    graph = onnx.helper.make_graph(nodes, "sbs_widget_dump", [], outputs)
    model = onnx.helper.make_model(graph, opset_imports=[onnx.helper.make_opsetid("", 18)], ir_version=9,
                                   producer_name="sbs_widget")
    doc = {"version": FORMAT_VERSION, "entries": meta}
    onnx.helper.set_model_props(model, {METADATA_KEY: json.dumps(doc, allow_nan=False)})
    return model


def save_dump(entries: dict, path) -> None:
    """Write ``entries`` (``ForwardStealer._entries``) to ``path`` (written aside, then renamed over
    ``path``: a link there is replaced, never followed)."""
    model = dump_model(entries)
    with output_path(path) as tmp:
        onnx.save(model, tmp)


def _tensor_from_proto(proto: onnx.TensorProto, where: str = "dump") -> torch.Tensor:
    dtype = torch_dtype(proto.data_type)
    if proto.data_location == onnx.TensorProto.EXTERNAL:
        raise LoadError(f"{where}: tensor {proto.name!r} uses external data, which load_dump does not read")
    # negative or huge dimensions, too few or too many bytes or values: counted before anything is built
    check_tensor(proto, f"tensor {proto.name!r}", where)
    if dtype is None:
        raise LoadError(f"{where}: tensor {proto.name!r}: no torch dtype for ONNX element type {proto.data_type}")
    shape = tuple(proto.dims)
    n = math.prod(shape)
    if proto.raw_data or n == 0:
        raw = proto.raw_data
        if len(raw) != n * torch.empty((), dtype=dtype).element_size():
            raise LoadError(f"dump: tensor {proto.name!r} has {len(raw)} bytes for shape {shape} {dtype}")
        flat = torch.frombuffer(bytearray(raw), dtype=torch.uint8) if raw else torch.empty(0, dtype=torch.uint8)
        return flat.view(dtype).reshape(shape)
    # Typed fields (a file rewritten by another tool); numpy_helper knows every layout.
    arr = onnx.numpy_helper.to_array(proto)
    if dtype.itemsize == 2 and dtype != torch.float16 and dtype != torch.int16:
        return torch.from_numpy(arr.view("int16").copy()).view(dtype)
    return torch.from_numpy(arr.copy())


def load_dump(path) -> dict:
    """Rebuild ``{(name, iteration, "I"): (args, kwargs), (name, iteration, "O"): output}`` from a dump file.

    The round trip is bitwise exact for every dtype, bfloat16 included; keys come in call order.

    >>> import tempfile, os, torch, sbs_widget
    >>> lin = torch.nn.Linear(2, 3)
    >>> path = os.path.join(tempfile.mkdtemp(), "dump.onnx")
    >>> with sbs_widget.steal_forward([("lin", lin)], dump_file=path):
    ...     y = lin(torch.ones(4, 2))
    >>> torch.equal(sbs_widget.load_dump(path)["lin", 0, "O"], y)
    True
    """
    try:
        model = onnx.load(str(path), load_external_data=False)
    except Exception as e:
        raise LoadError(f"cannot read dump file {path}: {e}") from e
    props = {p.key: p.value for p in model.metadata_props}
    if METADATA_KEY not in props:
        raise LoadError(f"{path} is not a sbs_widget dump (no metadata_props[{METADATA_KEY!r}])")
    text = props.pop(METADATA_KEY)
    if len(text) > METADATA_LIMIT:  # JSON builds objects many times its size: refused before parsing
        raise LoadError(f"{path}: dump metadata of {len(text)} characters, over the {METADATA_LIMIT} a dump may "
                        "hold (sbs_widget.dumps.steal.METADATA_LIMIT); the file was edited or is not a dump")
    try:
        doc = json.loads(text)
        entries = doc["entries"]
    except (ValueError, KeyError, TypeError, RecursionError) as e:
        raise LoadError(f"{path}: corrupt dump metadata ({type(e).__name__}: {str(e)[:200]})") from None
    del text
    if type(entries) is not list or not all(type(e) is dict for e in entries):
        raise LoadError(f"{path}: corrupt dump metadata (entries is not a list of objects)")
    if doc.get("version") != FORMAT_VERSION:
        raise LoadError(f"{path}: dump format version {str(doc.get('version'))[:20]} is not {FORMAT_VERSION}")
    constants = {}
    for node in model.graph.node:
        if node.op_type == "Constant" and len(node.output) == 1:
            for att in node.attribute:
                if att.name == "value":
                    constants[node.output[0]] = _tensor_from_proto(att.t, f"dump {path}")
    result = {}
    for e in entries:
        label = f"{str(e.get('name'))[:80]!r}[{str(e.get('iteration'))[:20]}].{str(e.get('kind'))[:5]}"
        try:
            tensors = [constants[n] for n in _list(e["tensors"])]
            key = (e["name"], e["iteration"], e["kind"])
            if type(key[0]) is not str or type(key[1]) is not int or key[2] not in ("I", "O"):
                raise LoadError("its key is not (module name, call number, 'I' or 'O')")
            result[key] = _decode(e["value"], tensors)
        except LoadError as err:
            raise LoadError(f"{path}: entry {label}: {str(err).removeprefix('dump: ')}") from None
        except (KeyError, IndexError, TypeError, ValueError, AttributeError, RecursionError) as err:
            raise LoadError(f"{path}: entry {label} is inconsistent ({type(err).__name__}: {str(err)[:200]})") \
                from None
    return result


def flatten_tensors(value) -> list[torch.Tensor]:
    """The tensors of a stored value, in the order torch.export flattens ``(args, kwargs)``.

    >>> import torch
    >>> len(flatten_tensors(((torch.ones(1),), {"mask": torch.ones(2), "n": 3})))
    2
    """
    found: list[torch.Tensor] = []
    _encode(value, found, [], "")
    return found


def iter_calls(dump: dict, name: str | None = None) -> Iterable[tuple[str, int]]:
    """``(name, iteration)`` of every call in ``dump``, in the order the calls started."""
    for key in dump:
        if key[2] == "I" and (name is None or key[0] == name):
            yield key[0], key[1]
