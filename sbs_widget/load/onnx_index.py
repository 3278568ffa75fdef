"""A read-only index of an ONNX graph: producers, consumers, types, metadata, implicit inputs.

Built once per model; every other ONNX-side module (alignment, segments, local runs) reads it.
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import numpy_helper

from sbs_widget.dtypes import ONNX_TO_NUMPY
from sbs_widget.errors import LoadError
from sbs_widget.load.lean_onnx import InitializerFile, model_with_data, with_data
from sbs_widget.strings import shape_type

_FX_NODE_RE = re.compile(r"^%(\S+) :")
_FX_TARGET_RE = re.compile(r"call_function\[target=([^\]]+)\]")
_CALL_TARGET = "call_function[target="
_QUOTED = re.compile(r"'([^']*)'")
_FX_NODE_KEY = "pkg.torch.onnx.fx_node"
SCOPES_KEY = "pkg.torch.onnx.name_scopes"
_RULE_KEY = "pkg.onnxscript.rewriter.rule_name"
_FOLDED_KEY = "pkg.onnxscript.optimizer.folded_from"

@dataclass(slots=True, frozen=True)  # shared by the values of one type (a model has few types)
class ValueType:
    elem_type: int = 0
    shape: tuple | None = None  # ints and str (symbolic dims); None if unknown rank

    def describe(self) -> str:
        key = (self.elem_type, self.shape)
        text = _DESCRIBED.get(key)
        if text is None:  # a model has few distinct types: each is formatted once
            text = shape_type(self.elem_type, self.shape) if self.elem_type else "?"
            if len(_DESCRIBED) > 4096:
                _DESCRIBED.clear()
            _DESCRIBED[key] = text
        return text


_DESCRIBED: dict[tuple, str] = {}


def _value_type(vi: onnx.ValueInfoProto) -> ValueType:
    t = vi.type
    if not t.HasField("tensor_type"):
        return ValueType()
    tt = t.tensor_type
    if not tt.HasField("shape"):
        return ValueType(tt.elem_type, None)
    # dim_value and dim_param are a oneof: a zero dim_value is a known 0 only if it is the one set.
    return ValueType(tt.elem_type, tuple(d.dim_value or d.dim_param or (0 if d.HasField("dim_value") else "?")
                                         for d in tt.shape.dim))


def _name_list(text: str) -> list[str]:
    """A list of names written as Python's repr (``['a', 'b']``): plain quoted names are found with a
    regular expression (10x faster than ``ast.literal_eval``, which reads any other spelling)."""
    if '"' not in text and "\\" not in text:
        return _QUOTED.findall(text)
    try:
        value = ast.literal_eval(text)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):  # hostile metadata: no names
        return []
    return [str(v) for v in value] if isinstance(value, (list, tuple, set)) else []


def module_paths(scopes: str | None) -> list[str]:
    """The module paths a node belongs to, outermost first, from its ``pkg.torch.onnx.name_scopes``
    metadata (``"['', 'decoder', 'decoder.norm1', 'layer_norm']"``: the root ``''``, the module paths,
    then the node itself). Empty for no metadata or text that is not a list of names (hostile files).

    >>> module_paths("['', 'decoder', 'decoder.norm1', 'layer_norm']")
    ['decoder', 'decoder.norm1']
    >>> module_paths("not a list"), module_paths(None)
    ([], [])
    """
    if not scopes:
        return []
    return [p for p in _name_list(scopes)[:-1] if p]


def _fx_text(props) -> str | None:
    """The ``fx_node`` metadata of a node. The exporter writes it third: looked up there first
    (reading every key of every node costs twice as much)."""
    if len(props) > 2:
        fx = props[2]
        if fx.key == _FX_NODE_KEY:
            return fx.value
    for prop in props:
        if prop.key == _FX_NODE_KEY:
            return prop.value
    return None


def _after_name(data: bytes) -> int:
    """Where a serialized ValueInfoProto's fields after its name start (0 when it has no name)."""
    if not data or data[0] != 0x0A:  # field 1 (name), length-delimited
        return 0
    length, pos, shift = 0, 1, 0
    while True:
        byte = data[pos]
        pos += 1
        length |= (byte & 0x7F) << shift
        if byte < 0x80:
            return pos + length
        shift += 7


# Standard ops with graph attributes: only those (and custom-domain ops, which may have them) have their
# attributes read; reading every node's attributes costs more than the rest of the index.
_WITH_SUBGRAPHS = {"If", "Loop", "Scan", "SequenceMap"}


def subgraph_outer_inputs(node: onnx.NodeProto) -> list[str]:
    """Names a node's subgraphs (If/Loop/Scan bodies) read from the enclosing scope."""
    outer: list[str] = []
    for attr in node.attribute:
        graphs = [attr.g] if attr.type == onnx.AttributeProto.GRAPH else list(attr.graphs)
        for g in graphs:
            defined = {i.name for i in g.input} | {i.name for i in g.initializer}
            for sub in g.node:
                for name in list(sub.input) + subgraph_outer_inputs(sub):
                    if name and name not in defined and name not in outer:
                        outer.append(name)
                defined.update(sub.output)
    return outer


@dataclass
class OnnxIndex:
    model: onnx.ModelProto
    nodes: list = field(default_factory=list)
    producer: dict = field(default_factory=dict)     # value -> node index
    consumers: dict = field(default_factory=dict)    # value -> [node index]
    node_inputs: list = field(default_factory=list)  # explicit + implicit (subgraph) inputs per node
    node_outputs: list = field(default_factory=list)  # node index -> tuple of output names ("" kept)
    op_types: list = field(default_factory=list)      # node index -> op_type
    types: dict = field(default_factory=dict)        # value -> ValueType
    value_meta: dict = field(default_factory=dict)   # value -> {key: value}
    node_fx: list = field(default_factory=list)      # node index -> FX node name (decomposed program) or None
    node_fx_target: list = field(default_factory=list)
    initializers: dict = field(default_factory=dict)  # name -> TensorProto
    constant_nodes: dict = field(default_factory=dict)  # value -> node index of a Constant node
    inputs: list = field(default_factory=list)
    outputs: list = field(default_factory=list)
    # Where the bytes of initializers left in their files lie (``lean_onnx``: a model read from a path);
    # None: every initializer holds its bytes.
    data: InitializerFile | None = None

    @classmethod
    def build(cls, model: onnx.ModelProto, data: InitializerFile | None = None) -> "OnnxIndex":
        g = model.graph
        idx = cls(model=model, data=data)
        idx.nodes = list(g.node)
        idx.initializers = {i.name: i for i in g.initializer}
        init_names = set(idx.initializers)
        idx.inputs = [i.name for i in g.input if i.name not in init_names]
        idx.outputs = [o.name for o in g.output]
        parsed: dict[bytes, ValueType] = {}  # a ValueInfoProto serialized without its name -> its type
        types = idx.types
        for vi in list(g.input) + list(g.output) + list(g.value_info):
            # Serializing a value's info is cheaper than reading its fields, and a model has few
            # distinct types: the bytes after the name (field 1, written first) are the type's,
            # then metadata if any.
            data = vi.SerializeToString()
            start = _after_name(data)
            key = data[start:]
            vt = parsed.get(key)
            if vt is None:
                vt = parsed[key] = _value_type(vi)
            name = vi.name
            if vt.elem_type or name not in types:
                types[name] = vt
            only_type = len(key) > 1 and key[0] == 0x12 and key[1] < 0x80 and len(key) == 2 + key[1]
            if not only_type and vi.metadata_props:  # (checked only when more than a type follows)
                idx.value_meta.setdefault(name, {}).update({p.key: p.value for p in vi.metadata_props})
        for init in g.initializer:
            idx.types.setdefault(init.name, ValueType(init.data_type, tuple(init.dims)))
            if init.metadata_props:
                idx.value_meta.setdefault(init.name, {}).update({p.key: p.value for p in init.metadata_props})
        # The loop below runs once per node of the model: locals, and no list made per lookup.
        node_inputs, node_outputs, op_types = idx.node_inputs, idx.node_outputs, idx.op_types
        consumers, producer, node_fx, node_fx_target = idx.consumers, idx.producer, idx.node_fx, idx.node_fx_target
        skip = len(_CALL_TARGET)
        for i, node in enumerate(idx.nodes):
            # Read once into Python objects: each protobuf field access builds new ones.
            op_type, domain, outputs = node.op_type, node.domain, tuple(node.output)
            ins = list(node.input)
            if "" in ins:  # optional inputs left out
                ins = [x for x in ins if x]
            if domain and domain != "ai.onnx" or op_type in _WITH_SUBGRAPHS:
                ins += [x for x in subgraph_outer_inputs(node) if x not in node.input]
            node_inputs.append(ins)
            node_outputs.append(outputs)
            op_types.append(op_type)
            for x in ins:
                readers = consumers.get(x)
                if readers is None:
                    consumers[x] = [i]
                else:
                    readers.append(i)
            for o in outputs:
                if o:
                    producer[o] = i
            if op_type == "Constant" and (not domain or domain == "ai.onnx"):
                idx.constant_nodes[outputs[0]] = i
            # Only the FX node is kept (the rest, stack traces included, is most of an index's memory
            # otherwise): ``node_meta`` reads any key from the model. '%name : [num_users=1] =
            # call_function[target=aten.mm.default](args = ...)' is read with string searches (faster
            # than a regular expression, for the usual case).
            fx = _fx_text(node.metadata_props)
            colon = fx.find(" : ") if fx and fx[0] == "%" else -1
            call = fx.find(_CALL_TARGET, colon) if colon > 1 and " " not in fx[1:colon] else -1
            end = fx.find("]", call + skip) if call >= 0 else -1
            if end > call + skip:
                node_fx.append(fx[1:colon])
                node_fx_target.append(fx[call + skip:end])
            else:
                fx = fx or ""
                m = _FX_NODE_RE.match(fx)
                node_fx.append(m.group(1) if m else None)
                t = _FX_TARGET_RE.search(fx)
                node_fx_target.append(t.group(1) if t else None)
        return idx

    def module_of_node(self, i: int) -> str:
        """Owning module path (the innermost of ``module_paths``), "" for the root or no metadata."""
        props = self.nodes[i].metadata_props
        # the exporter writes the scopes fourth: looked up there first
        scopes = props[3].value if len(props) > 3 and props[3].key == SCOPES_KEY else self.node_meta(i, SCOPES_KEY)
        if not scopes:
            return ""
        cache = self.__dict__.setdefault("_scopes", {})
        if scopes not in cache:
            paths = module_paths(scopes)
            cache[scopes] = paths[-1] if paths else ""
        return cache[scopes]

    def node_meta(self, i: int, key: str) -> str | None:
        """A metadata value of node ``i``, read from the model (not kept in the index)."""
        for prop in self.nodes[i].metadata_props:
            if prop.key == key:
                return prop.value
        return None

    def rewrite_rule(self, i: int) -> str | None:
        """The onnxscript rewrite rule(s) that made node ``i`` (a fusion such as BiasGelu), or None."""
        cache = self.__dict__.setdefault("_rewritten", {})
        if i not in cache:
            cache[i] = self.node_meta(i, _RULE_KEY)
        return cache[i]

    def is_rewritten(self, i: int) -> bool:
        """Whether node ``i`` was made by a rewrite rule: its inputs need not be the inputs of the FX
        node its metadata names."""
        return self.rewrite_rule(i) is not None

    def folded_from(self, value: str) -> list[str]:
        """Values a constant-folded initializer was computed from (onnxscript's metadata)."""
        cache = self.__dict__.setdefault("_folded", {})
        if value not in cache:
            raw = self.value_meta.get(value, {}).get(_FOLDED_KEY)
            cache[value] = _name_list(raw) if raw else []
        return cache[value]

    def folded_into(self) -> dict[str, list[str]]:
        """Reverse of ``folded_from``: source value -> initializers folded from it."""
        if "_folded_into" not in self.__dict__:
            out: dict[str, list[str]] = {}
            value_meta = self.value_meta
            for name in self.initializers:
                meta = value_meta.get(name)
                if meta and _FOLDED_KEY in meta:  # (one without the metadata has no sources)
                    for src in self.folded_from(name):
                        out.setdefault(src, []).append(name)
            self.__dict__["_folded_into"] = out
        return self.__dict__["_folded_into"]

    def initializer_numel(self, name: str) -> int:
        """Element count of an initializer (read from its dims once)."""
        cache = self.__dict__.setdefault("_numel", {})
        n = cache.get(name)
        if n is None:
            n = 1
            for d in self.initializers[name].dims:
                n *= d
            cache[name] = n
        return n

    def is_constant(self, value: str) -> bool:
        return value in self.initializers or value in self.constant_nodes

    def initializer_data(self, name: str) -> tuple[np.ndarray, bytes | None]:
        """The initializer's values (read-only), and the bytes they are read from in place (None when
        they are not stored as little-endian raw bytes: then the array is a converted copy, or, for an
        initializer left in its file (``in_file``), a read-only map of the file)."""
        t = self.initializers[name]
        dtype = ONNX_TO_NUMPY.get(t.data_type)
        if self.in_file(name) and dtype is not None and sys.byteorder == "little":
            return self.data.array(name, dtype, tuple(t.dims)), None
        try:  # ``onnx_checks.check_tensor`` refused malformed tensors when the model was loaded: this
            # only keeps a tensor edited since from ending in a raw numpy error
            if dtype is not None and t.data_location != onnx.TensorProto.EXTERNAL and t.HasField("raw_data") \
                    and sys.byteorder == "little":
                raw = t.raw_data
                return np.frombuffer(raw, dtype=dtype).reshape(tuple(t.dims)), raw
            return numpy_helper.to_array(t), None
        except (ValueError, TypeError, KeyError, UnicodeDecodeError) as e:
            raise LoadError(f"ONNX initializer {name!r} cannot be read as its shape {list(t.dims)} and type say "
                            f"({type(e).__name__}: {e}); the file is corrupt or was edited: export the model "
                            "again") from e

    def in_file(self, name: str) -> bool:
        """Whether initializer ``name`` was left in its file (its TensorProto describes external data)."""
        data = self.data
        return data is not None and name in data.refs and \
            self.initializers[name].data_location == onnx.TensorProto.EXTERNAL

    def initializer_proto(self, name: str) -> onnx.TensorProto:
        """Initializer ``name`` with its bytes in the message, for a model that embeds it (a copy read from
        the file when it was left there)."""
        t = self.initializers[name]
        return with_data(t, self.data) if self.in_file(name) else t

    def full_model(self) -> onnx.ModelProto:
        """The model with every initializer's bytes in the message (a copy when some were left in their
        file): for whole-model consumers (a session run from another folder)."""
        return model_with_data(self.model, self.data)

    def describe(self, value: str) -> str:
        vt = self.types.get(value)
        if vt is None:
            return "?"
        # Values share their ValueType (a model has few types): the text is kept per type object,
        # alive as long as the index holds it.
        texts = self.__dict__.setdefault("_type_texts", {})
        hit = texts.get(id(vt))
        if hit is None or hit[0] is not vt:
            hit = texts[id(vt)] = (vt, vt.describe())
        return hit[1]
