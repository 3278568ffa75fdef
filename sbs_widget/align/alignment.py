"""What an alignment is: per FX node, its description and its ONNX twin; per weight, its initializer;
and, for FX values without a twin of their own, what they equal or why they have none. Built by
``align.py`` (pairs) and ``twinless.py`` (aliases and reasons)."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(slots=True)  # one per FX node
class FxNodeInfo:
    index: int
    name: str
    op: str
    target: str
    module: str = ""
    stack_line: str = ""
    origin: str | None = None
    shape_type: str = ""
    is_tensor: bool = False
    elements: int = 0  # of the example outputs (symbolic dimensions at their example value)
    nbytes: int = 0


@dataclass(slots=True)  # one per paired FX node
class Twin:
    """An FX value and its ONNX twin: the value it is compared with, and how they were matched."""

    fx_name: str
    onnx_value: str
    how: str          # name | metadata | folded | consumer | input | output | weight
    kind: str = "node"


@dataclass(slots=True)  # one per weight
class WeightPair:
    placeholder: str        # FX placeholder name (p_*, b_*, c_*)
    key: str                # state-dict key / constant name
    onnx_name: str | None   # ONNX initializer
    comparable: bool
    comment: str = ""
    transposed: bool = False  # the initializer holds the parameter transposed (the optimizer folded it)


@dataclass
class Alignment:
    fx_nodes: list[FxNodeInfo]
    pairs: dict[str, Twin] = field(default_factory=dict)       # FX node name -> pair
    onnx_to_fx: dict[str, str] = field(default_factory=dict)   # ONNX value -> FX node name
    weights: list[WeightPair] = field(default_factory=list)
    input_pairs: list[tuple[str, str]] = field(default_factory=list)   # (FX placeholder, ONNX input)
    output_pairs: list[tuple[str | None, str]] = field(default_factory=list)  # (FX value or None, ONNX output)
    tensor_inputs: list[str] = field(default_factory=list)  # user-input placeholders the ONNX model has
    fx_group: dict[str, list[int]] = field(default_factory=dict)  # FX node -> ONNX node indices
    aliases: dict[str, list[str]] = field(default_factory=dict)   # ONNX value -> more FX nodes equal to it
    alias_of: dict[str, str] = field(default_factory=dict)        # FX node -> ONNX value it equals
    absorbed: dict[str, str] = field(default_factory=dict)  # FX node -> op of the fused node that took its end
    duplicate_of: dict[str, str] = field(default_factory=dict)  # FX node -> earlier FX node computing the same
    # (only for FX nodes without a twin of their own)
    fused_into: dict[str, str] = field(default_factory=dict)  # FX node without twin -> the fused ONNX node, in words
    empty: set = field(default_factory=set)  # FX values of 0 elements without twin (the optimizer drops them)
    shares_constant_of: dict[str, str] = field(default_factory=dict)  # FX node -> FX node whose equal
    # constant the optimizer kept for both (its twin is that node's folded initializer)
    reshaped: set = field(default_factory=set)  # aliases equal to their ONNX value once reshaped to its shape
    of_input: dict[str, str] = field(default_factory=dict)  # FX no-op on a user input without twin -> ONNX
    # input (the optimizer removed it: the ONNX nodes read the input itself, nothing to compare)
    folded_for: dict[str, str] = field(default_factory=dict)  # FX node without twin -> the constant-folded
    # FX node its value only feeds (their computation became one initializer)
    fx_dtypes: frozenset = frozenset()  # dtypes of the program's tensor values (its precision)

    def twin(self, fx_name: str) -> str | None:
        """The ONNX value FX node ``fx_name`` is compared with: its own twin, or the one it is an alias of."""
        pair = self.pairs.get(fx_name)
        return pair.onnx_value if pair is not None else self.alias_of.get(fx_name)

    def has_twin(self, fx_name: str) -> bool:
        return fx_name in self.pairs or fx_name in self.alias_of


_TARGET_NAMES: dict = {}  # op -> str(op): an op's name costs more to format than to look up


def target_name(target) -> str:
    try:
        name = _TARGET_NAMES.get(target)
    except TypeError:  # an unhashable callable
        return str(target)
    if name is None:
        name = str(target)
        if len(_TARGET_NAMES) < 100_000:
            _TARGET_NAMES[target] = name
    return name
