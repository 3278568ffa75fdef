"""Dump the inputs and outputs of chosen submodules of a torch model into one ONNX file.

``steal_forward`` intercepts ``forward``; ``load_dump`` rebuilds what it stored. In the file every
tensor is the output of a ``Constant`` node (any ONNX runtime can run the file to get them back) and the
nesting (args/kwargs, containers, non-tensor values) is JSON in ``metadata_props["sbs_widget.dump"]``.
Loading never unpickles nor evaluates anything: only JSON, raw tensor bytes and an allowlist of types.
"""

from __future__ import annotations

import functools
import json
import math
import warnings
from typing import Any, Iterable

import onnx
import torch

from sbs_widget.dtypes import onnx_elem_type, torch_dtype
from sbs_widget.dumps.codec import (  # noqa: F401 (METADATA_KEY, METADATA_LIMIT: the format, said here too)
    DEPTH_LIMIT,
    FORMAT_VERSION,
    METADATA_KEY,
    METADATA_LIMIT,
    _decode,
    _encode,
    _list,
)
from sbs_widget.errors import InputError, LoadError, SbsWidgetWarning
from sbs_widget.load.onnx_checks import check_tensor
from sbs_widget.safe_files import output_path
from sbs_widget.strings import string_type

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
