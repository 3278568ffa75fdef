"""What a ``.pt2`` archive may hold before torch reads it: data, never code.

``torch.export.load`` trusts its file. Read as a hostile user would write it, its reader runs code
from the archive in these places (torch 2.13), each refused here before torch opens the file:
- pickles: constants named ``opaque_obj_*`` go to plain ``pickle.loads``, ``custom_obj_*`` to
  TorchScript's unpickler; pickled tensors (weights, constants, sample inputs) fall back to
  ``torch.load(weights_only=False)`` (those are read data-only by ``untrusted``, not refused);
- compiled code: ``data/aotinductor/`` holds shared libraries that the reader loads;
- expressions: every ``expr_str`` (symbolic sizes) goes to ``sympy.sympify``, i.e. Python ``eval``;
  here each must be symbols, integers and arithmetic of a strict grammar;
- call targets: a node's target string is resolved by ``getattr`` from ``torch``, ``operator`` or
  ``math`` (``torch.os.system`` resolves), and running the graph calls it: only torch operators and
  torch's symbolic-size functions are accepted;
- guards: ``guards_code`` is Python source that turning the program into a module ``exec``s (the
  exporter's decomposition does, and the guards it traces take part in naming the decomposed nodes):
  after loading, the loader keeps only the guards of a strict ``ast`` grammar (size arithmetic and
  comparisons over the inputs' sizes, as torch prints them) and drops any other (``guards.py``);
  sbs_widget checks input shapes itself;
- call specs: torch's pytree reader imports the modules a spec names (a defaultdict's factory, an
  enum): each spec is read first by ``call_specs`` against an allow-list of container types;
- the older archive layout, read by another code path: refused, with how to re-save it.
Bounds before work: a regular file only (a FIFO blocks), members stored uncompressed (``plain_files``:
a deflated one inflates to gigabytes), JSON bounded in bytes and in values, expressions in nesting,
precision and pairwise-compared arguments (sympy's Max of hundreds takes minutes), weights on a real
device. The operators a loaded program may call are checked by ``operators``.
A refused file raises ``LoadError`` naming the archive member and why.
"""

from __future__ import annotations

import ast
import json
import re
import zipfile

import torch

from sbs_widget.errors import LoadError
from sbs_widget.load.call_specs import check_call_specs
from sbs_widget.load.plain_files import check_regular_file, check_stored

# Members of the archive, relative to its root folder; anything else is refused.
_ALLOWED = re.compile(
    r"(archive_format|archive_version|version|byteorder|\.data/[\w.-]+"
    r"|models/[\w.-]+\.json|data/(weights|constants)/[\w.-]+|data/sample_inputs/[\w.-]+\.pt"
    r"|extra/[^\x00]+)")
_WHY_REFUSED = {
    "data/aotinductor/": "compiled AOTInductor code (a shared library torch would load and run)",
    "data/executorch/": "an ExecuTorch program, which sbs_widget does not read",
    "data/mtia": "compiled MTIA code",
    "xl_model_weights/": "weights in a layout sbs_widget does not read",
}

# Symbolic sizes: torch writes them with ``sympy.srepr``: ``Symbol('s77', positive=True, integer=True)``,
# ``Add(Mul(Integer(2), Symbol(...)), Integer(1))``, ``Mod(...)``, ``FloorDiv(...)``, ``Equality(...)``.
# Parsed here with ``ast`` (which runs nothing), an expression may hold only calls of these functions by
# name, symbols, numbers, plain strings and arithmetic: no attribute, subscript, lambda or other name,
# so the ``eval`` behind ``sympify`` has nothing to run.
_FUNCTIONS = frozenset({
    # sympy's own, as srepr and str print them
    "Add", "Mul", "Pow", "Integer", "Rational", "Float", "Symbol", "Dummy", "Mod", "Max", "Min", "Abs",
    "floor", "ceiling", "sqrt", "Piecewise", "ITE", "Equality", "Unequality", "StrictGreaterThan",
    "StrictLessThan", "GreaterThan", "LessThan", "Eq", "Ne", "Lt", "Le", "Gt", "Ge", "And", "Or", "Not",
    "Xor", "true", "false", "True", "False", "BooleanTrue", "BooleanFalse", "oo", "zoo", "nan", "Infinity",
    "NegativeInfinity", "ComplexInfinity", "NaN", "Zero", "One", "NegativeOne", "Half", "Tuple",
    # torch.utils._sympy, as the deserializer binds them
    "FloorDiv", "ModularIndexing", "Where", "PythonMod", "CleanDiv", "CeilToInt", "FloorToInt",
    "CeilDiv", "LShift", "RShift", "PowByNatural", "FloatPow", "IntTrueDiv", "FloatTrueDiv", "ToFloat",
    "TruncToInt", "TruncToFloat", "RoundToInt", "RoundDecimal", "Identity", "BitwiseFn_bitwise_and",
    "BitwiseFn_bitwise_or", "OpaqueUnaryFn_sqrt", "int_oo", "IntInfinity", "NegativeIntInfinity",
})
_KEYWORDS = frozenset({"positive", "negative", "nonnegative", "nonpositive", "integer", "real", "finite",
                       "infinite", "zero", "nonzero", "even", "odd", "rational", "commutative", "precision",
                       "evaluate"})
_SYMBOL = re.compile(r"[a-z]+\d+")  # s0, u12, zuf0, ps3: torch's symbol names
_STRING = re.compile(r"[a-z]+\d+|[-+]?(\d+\.?\d*|\.\d+)(e[-+]?\d{1,4})?")  # a symbol, or a Float's digits
_POWERS = frozenset({"Pow", "PowByNatural", "FloatPow"})
_ARITHMETIC = (ast.Expression, ast.BinOp, ast.UnaryOp, ast.Compare, ast.BoolOp, ast.Call, ast.keyword,
               ast.Name, ast.Constant, ast.Load, ast.operator, ast.unaryop, ast.cmpop, ast.boolop, ast.Tuple)
MAX_EXPRESSION = 20_000  # characters: torch's own are tens to hundreds
MAX_INTEGER = 2**64  # sizes are int64
MAX_EXPONENTS = 256  # product of the literal exponents: 2**10**12 would never end
MAX_DEPTH = 64  # calls and operators within each other: torch writes srepr, a few levels deep
MAX_PRECISION = 128  # bits of a Float: torch writes 53; sympy builds 30,000,000 for minutes
MAX_DIGITS = 64  # characters of a Float's digits
# sympy compares the arguments of these pairwise (and flattens nested ones into one call): Max of 64
# symbols takes seconds, of 256 a minute. torch's own take two or three.
_PAIRWISE = frozenset({"Max", "Min", "And", "Or", "Xor", "Piecewise", "ITE"})
MAX_PAIRWISE = 16  # their arguments in one expression
PAIRWISE_BUDGET = 32_768  # sum over a file's expressions of (their arguments)^2: a few seconds at most
# sympy parses ~0.5 MB of srepr a second; a 2-layer LLaMA with dynamic shapes writes 28 KB of expressions
EXPRESSIONS_BUDGET = 16 << 20


class ExpressionBudget:
    """What a file's expressions may cost sympy, all together (one per archive checked)."""

    def __init__(self):
        self.pairwise = 0
        self.chars = 0


def _exponent(node) -> int | None:
    """The literal integer of ``node`` (``2`` or ``Integer(2)``), None when it is not one."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "Integer" \
            and len(node.args) == 1:
        node = node.args[0]
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        node = node.operand
    if isinstance(node, ast.Constant) and type(node.value) is int:
        return node.value
    return None


def _depth(tree) -> int:
    """How deeply calls and operators nest in ``tree`` (iteratively: the tree comes from the file)."""
    deepest, stack = 0, [(tree, 0)]
    while stack:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        if depth <= MAX_DEPTH:
            stack.extend((child, depth + isinstance(node, (ast.Call, ast.BinOp, ast.UnaryOp)))
                         for child in ast.iter_child_nodes(node))
    return deepest


def check_expression(text, where: str, budget: ExpressionBudget | None = None) -> None:
    """Raise unless ``text`` is a symbolic size of the strict grammar above, and cheap to build:
    bounded nesting, precision and pairwise-compared arguments (``budget`` sums those over a file)."""
    def bad(why: str) -> LoadError:
        return refuse(where, f"the symbolic expression {text[:80]!r} {why}")

    if not isinstance(text, str):
        raise refuse(where, f"a symbolic expression must be a string, not {type(text).__name__}")
    if len(text) > MAX_EXPRESSION:
        raise refuse(where, f"a symbolic expression of {len(text)} characters (at most {MAX_EXPRESSION})")
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise bad("is not an expression of symbols and arithmetic") from None
    if _depth(tree) > MAX_DEPTH:
        raise bad(f"nests calls deeper than {MAX_DEPTH} levels")
    exponents, pairwise = 1, 0
    for node in ast.walk(tree):
        if not isinstance(node, _ARITHMETIC) or isinstance(node, (ast.MatMult,)):
            raise bad(f"holds {type(node).__name__}: only symbols, numbers and arithmetic are read")
        if isinstance(node, ast.Call):
            if not isinstance(node.func, ast.Name) or node.func.id not in _FUNCTIONS:
                raise bad("calls something other than a sympy function by name")
            if node.func.id in _PAIRWISE:
                pairwise += len(node.args)
                if pairwise > MAX_PAIRWISE:
                    raise bad(f"gives {node.func.id} and the like more than {MAX_PAIRWISE} arguments (sympy "
                              "compares them pairwise: minutes for a few hundred)")
            if node.func.id in _POWERS:
                power = _exponent(node.args[1]) if len(node.args) == 2 else None
                if power is None or abs(power) > 64:
                    raise bad("raises to a power that is not a small integer")
                exponents *= max(abs(power), 1)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            power = _exponent(node.right)
            if power is None or abs(power) > 64:
                raise bad("raises to a power that is not a small integer")
            exponents *= max(abs(power), 1)
        elif isinstance(node, ast.keyword) and node.arg not in _KEYWORDS:
            raise bad(f"passes {node.arg!r}, not a symbol assumption")
        elif isinstance(node, ast.keyword) and node.arg == "precision" and not (
                isinstance(node.value, ast.Constant) and type(node.value.value) is int
                and 0 < node.value.value <= MAX_PRECISION):
            raise bad(f"asks for a precision that is not an integer of 1 to {MAX_PRECISION} bits")
        elif isinstance(node, ast.Name) and not (node.id in _FUNCTIONS or _SYMBOL.fullmatch(node.id)):
            raise bad(f"names {node.id!r}: not a size symbol nor a sympy function")
        elif isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, str) and (len(v) > MAX_DIGITS or not _STRING.fullmatch(v)):
                raise bad(f"holds the string {v[:40]!r}: not a symbol name nor a number of at most "
                          f"{MAX_DIGITS} characters")
            if not isinstance(v, (str, int, float, bool)) or (type(v) is int and abs(v) > MAX_INTEGER):
                raise bad(f"holds the constant {str(v)[:40]}: not a size")
        if exponents > MAX_EXPONENTS:
            raise bad("raises to powers whose product exceeds 256")
    if budget is not None:
        budget.chars += len(text)
        if budget.chars > EXPRESSIONS_BUDGET:
            raise bad(f"brings the file's symbolic expressions over {EXPRESSIONS_BUDGET} characters, more than "
                      "any exported program writes (sympy would parse them for a minute or more)")
    if budget is not None and pairwise > 2:
        budget.pairwise += pairwise * pairwise
        if budget.pairwise > PAIRWISE_BUDGET:
            raise bad(f"brings the file's Max/Min-like arguments over what sympy builds in seconds "
                      f"(sum of squares {budget.pairwise} > {PAIRWISE_BUDGET})")


# Call targets torch's reader resolves without an operator table: the symbolic-size functions.
_SYMBOLIC_CALLS = {
    f"_operator.{name}" for name in (
        "eq", "ne", "le", "ge", "lt", "gt", "neg", "pos", "mul", "add", "sub", "floordiv", "mod", "pow",
        "truediv", "and_", "or_", "lshift", "rshift", "getitem")
} | {"math.trunc", "math.ceil", "math.floor", "math.sqrt"} | {
    f"torch.{name}" for name in ("sym_not", "sym_int", "sym_float", "sym_ite", "sym_max", "sym_min",
                                 "sym_sqrt", "sym_sum")
}


def refuse(member: str, why: str) -> LoadError:
    return LoadError(f"refused to load {member!r} of the .pt2 archive: {why}. sbs_widget loads data "
                     "only, since files may come from anyone; if you trust the file, load it yourself "
                     "(torch.export.load) and pass the ExportedProgram")


def _resolve_operator(target: str):
    """The torch operator ``target`` names (``torch.ops.aten.add.Tensor``), found by attribute
    lookups on ``torch.ops`` only; None when it names none."""
    parts = target.split(".")
    if parts[:2] != ["torch", "ops"] or len(parts) < 4:
        return None
    obj = torch.ops
    for name in parts[2:]:
        if not name.isidentifier():
            return None
        try:
            obj = getattr(obj, name)
        except (AttributeError, RuntimeError):
            return None
    return obj


def check_target(target, where: str) -> None:
    """Raise unless ``target`` names a torch operator or one of torch's symbolic-size functions."""
    if not isinstance(target, str):
        raise refuse(where, f"a call target must be a string, not {type(target).__name__}")
    if target in _SYMBOLIC_CALLS:
        return
    op = _resolve_operator(target)
    if isinstance(op, (torch._ops.OpOverload, torch._ops.HigherOrderOperator)):
        return
    if op is None and re.fullmatch(r"torch\.ops(\.\w+){2,3}", target):
        raise refuse(where, f"it calls {target!r}, an operator not registered in this process; import the "
                            "library that defines it, or check the file")
    raise refuse(where, f"it calls {target!r}, which is not a torch operator (running the program would "
                        "call it)")


def _walk_program(obj, where: str) -> None:
    """Check every expression, call target and operator argument of a serialized program (nested
    graphs included), iteratively: a crafted file may nest deeper than Python's recursion limit."""
    budget = ExpressionBudget()
    stack = [(obj, where)]
    while stack:
        value, at = stack.pop()
        if isinstance(value, dict):
            if "target" in value and "inputs" in value:  # a node
                check_target(value["target"], f"{at} (node {str(value.get('name'))[:80]!r})")
            if "expr_str" in value:
                check_expression(value["expr_str"], at, budget)
            if "as_operator" in value and value["as_operator"] is not None:
                check_target(value["as_operator"], at)
            stack.extend((v, at) for k, v in value.items() if k != "metadata")
        elif isinstance(value, list):
            stack.extend((v, at) for v in value)


def _check_program(data: bytes, member: str) -> None:
    try:
        program = json.loads(data)
    except (ValueError, RecursionError) as e:
        raise refuse(member, f"it is not valid JSON ({type(e).__name__}: {str(e)[:120]})") from None
    if not isinstance(program, dict):
        raise refuse(member, "it is not a serialized program")
    for key in (program.get("range_constraints") or {}):
        if not isinstance(key, str) or not _SYMBOL.fullmatch(key):
            raise refuse(member, f"a range constraint on {str(key)[:80]!r}, which is not a size symbol")
    check_call_specs(program, member)  # before anything else reads them: torch's reader imports by name
    _walk_program(program, member)


def _storage_extent(meta: dict, where: str) -> int:
    """Elements the strided view reaches into its storage; 0 for an empty tensor."""
    try:
        sizes = [s["as_int"] for s in meta["sizes"]]
        strides = [s["as_int"] for s in meta["strides"]]
        offset = meta["storage_offset"]["as_int"]
    except (KeyError, TypeError):
        raise refuse(where, "a tensor whose sizes, strides or offset are not plain integers") from None
    if not all(type(v) is int for v in (*sizes, *strides, offset)) or min((*sizes, *strides, offset), default=0) < 0:
        raise refuse(where, f"a tensor of sizes {sizes}, strides {strides}, offset {offset}: not non-negative "
                            "integers")
    if len(sizes) != len(strides):
        raise refuse(where, f"a tensor of {len(sizes)} sizes and {len(strides)} strides")
    if 0 in sizes:
        return 0
    return offset + sum((n - 1) * s for n, s in zip(sizes, strides)) + 1


def _check_payloads(data: bytes, member: str, folder: str, records: dict[str, int], weights: bool) -> None:
    """A weights or constants config: every entry a tensor stored in the archive, sized to fit."""
    try:
        config = json.loads(data)["config"]
        items = list(config.items())
    except (ValueError, KeyError, TypeError, AttributeError):
        raise refuse(member, "it is not a payload config (JSON with a 'config' mapping)") from None
    for name, meta in items:
        where = f"{member} (entry {str(name)[:80]!r})"
        if not isinstance(meta, dict) or not isinstance(meta.get("path_name"), str):
            raise refuse(where, "an entry without a path_name")
        path = meta["path_name"]
        if path.startswith("opaque_obj_"):
            raise refuse(where, "a pickled Python object (torch reads it with pickle.loads, which runs code)")
        if path.startswith("custom_obj_"):
            raise refuse(where, "a TorchScript object (torch rebuilds it by running its class's code)")
        if not path.startswith("weight_" if weights else "tensor_") or "/" in path or "\\" in path:
            raise refuse(where, f"a payload {path!r}: not a tensor file of this archive")
        size = records.get(folder + path)
        if size is None:
            raise refuse(where, f"its data {folder + path!r} is missing from the archive")
        if meta.get("use_pickle"):
            continue  # a pickled tensor: read with torch.load(weights_only=True), data only
        tensor = meta.get("tensor_meta")
        if not isinstance(tensor, dict):
            raise refuse(where, "a tensor without its tensor_meta")
        device = (tensor.get("device") or {}).get("type")
        if device == "meta":
            raise refuse(where, "a tensor on the meta device: it has a shape but no values to run; export the "
                                "model with its weights loaded (not on meta) and save it again")
        if device not in ("cpu", "cuda"):
            raise refuse(where, f"a tensor on device {str(device)[:40]!r}: only cpu and cuda are read")
        if device == "cuda" and not torch.cuda.is_available():
            raise refuse(where, "a tensor saved on cuda, and this process has no CUDA device; load the "
                                "program where CUDA is, move it to the CPU (ep.module().cpu()...) and save it again")
        try:
            item = torch.empty((), dtype=_dtype(tensor.get("dtype"))).element_size()
        except (KeyError, TypeError, ValueError):
            raise refuse(where, f"a tensor of unknown dtype {tensor.get('dtype')!r}") from None
        extent = _storage_extent(tensor, where)
        if size % item or extent * item > size:
            raise refuse(where, f"its data holds {size} bytes, and the tensor needs {extent * item} "
                                f"({item}-byte elements): the file is truncated or edited")


def _dtype(code) -> torch.dtype:
    from torch._export.serde.schema import ScalarType
    from torch._export.serde.serialize import _SERIALIZE_TO_TORCH_DTYPE

    return _SERIALIZE_TO_TORCH_DTYPE[ScalarType(code)]


MAX_JSON_BYTES = 1 << 30  # a program's description: an 8-layer LLaMA's is 1.2 MB
# Parsed JSON costs ~100 bytes of Python objects a value (more in torch's reader): ``[0,0,...]`` would
# turn a 1 GB member into 50 GB. Counted before parsing (an upper bound: a comma or bracket inside a
# string counts too). Real programs spend 64 values (26 bytes each) a node.
MAX_JSON_ELEMENTS = 10_000_000  # 150,000 nodes (an 8-layer LLaMA has 711)


def json_elements(data: bytes) -> int:
    """An upper bound on the values a JSON text holds, counted without parsing it."""
    return data.count(b",") + data.count(b"[") + data.count(b"{") + 1


def _members(path: str) -> tuple[str, dict[str, int], object]:
    """``(root folder, {member: size}, torch's reader)``. The members are listed by torch's own zip
    reader (the one that will load the file) and by Python's: a crafted zip that reads differently
    in the two (duplicate names, two directories) is refused, since torch falls back to Python's
    reader for older layouts."""
    try:
        reader = torch._C.PyTorchFileReader(path)
        names = reader.get_all_records()
        with zipfile.ZipFile(path) as archive:
            infos = [i for i in archive.infolist() if not i.is_dir()]
    except (zipfile.BadZipFile, OSError, RuntimeError, ValueError) as e:
        raise LoadError(f"cannot load ExportedProgram {path!r}: not a .pt2 archive ({str(e).splitlines()[0][:200]}); "
                        "is it a file written by torch.export.save, and complete?") from None
    check_stored(infos, path, "the .pt2 archive")
    roots = {i.filename.split("/", 1)[0] for i in infos}
    if len(roots) != 1 or any("/" not in i.filename for i in infos):
        raise refuse(path, "its members do not share one root folder, as torch.export.save writes them")
    root = roots.pop() + "/"
    python_names = [i.filename[len(root):] for i in infos]
    if len(set(python_names)) != len(python_names) or len(set(names)) != len(names):
        raise refuse(path, "two members of the same name (readers would disagree on which one is read)")
    if set(python_names) != set(names):
        raise refuse(path, "its zip directory reads differently in torch's reader and in Python's")
    return root, {n: reader.get_record_size(n) for n in names}, reader


def check_pt2(path: str) -> None:
    """Raise ``LoadError`` unless the ``.pt2`` at ``path`` holds data torch reads without running
    code of the file's (see the module docstring). Members are read with torch's own reader: the
    bytes checked are the bytes torch will load."""
    check_regular_file(path, "ExportedProgram file")  # a FIFO would block the first read
    root, records, reader = _members(path)
    if "archive_format" not in records:
        legacy = "serialized_exported_program.json" in records
        raise refuse(path, "an archive written by torch older than 2.7, which another code path reads; load it "
                           "with that torch and save it again" if legacy else "no archive_format member")
    for name in records:
        if not _ALLOWED.fullmatch(name):
            why = next((w for prefix, w in _WHY_REFUSED.items() if name.startswith(prefix)),
                       "a member torch.export.save does not write")
            raise refuse(root + name, why)
    elements = 0
    for name, size in records.items():
        if not name.endswith(".json"):
            continue
        if size > MAX_JSON_BYTES:
            raise refuse(root + name, f"{size} bytes of JSON, more than any exported program describes")
        data = reader.get_record(name)
        elements += json_elements(data)
        if elements > MAX_JSON_ELEMENTS:
            raise refuse(root + name, f"JSON of more than {MAX_JSON_ELEMENTS} values (parsed, they would take "
                                      "gigabytes), more than any exported program describes")
        if name.startswith("models/"):
            _check_program(data, root + name)
        elif name.endswith("_weights_config.json"):
            _check_payloads(data, root + name, "data/weights/", records, True)
        elif name.endswith("_constants_config.json"):
            _check_payloads(data, root + name, "data/constants/", records, False)
