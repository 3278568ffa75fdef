"""A dump's structure as JSON and back: what ``steal_forward`` stores of the calls it intercepts (args,
kwargs, outputs: containers, numbers, strings, tensors by index) and what ``load_dump`` rebuilds.

The file may come from anyone: decoding builds JSON types, tensors and an allow-list of containers
only (OrderedDict, deque, a defaultdict with a builtin factory, namedtuples by name, transformers'
outputs and caches looked up in transformers' own two modules), never importing a name the file
chose; bounded in size and nesting.
"""

import collections
import functools
import json
import math

import torch
from torch.utils import _pytree

from sbs_widget.dtypes import onnx_elem_type
from sbs_widget.errors import LoadError

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
