"""Guards of a loaded program: the Python text (``guards_code``) torch execs when the program becomes a
module. The exporter's decomposition does, and the nodes the guards trace take part in naming the
decomposed nodes (without them, node names drift from the ONNX metadata's). A guard is kept only when
it is one expression of a strict grammar over the inputs' sizes (``is_safe_guard``); any other is
dropped (``drop_guards``). Part of reading a ``.pt2`` from anyone (``pt2_checks.py``)."""

from __future__ import annotations

import ast
import contextlib
import re

from sbs_widget.load.pt2_checks import MAX_DEPTH, MAX_EXPONENTS, MAX_INTEGER, _depth, _exponent

# Guards: torch prints them with ``ShapeGuardPythonPrinter``: ``L['input_ids'].size()[1] + L['cache'][0]
# .size()[2] <= 0``, ``max(...)``, ``x // 2``, ``a > 2 and b < 5``. torch pastes each into the source of a
# function (``torch._assert(<guard>, "Guard failed: <guard>")``) and execs it: a guard is kept only when
# its text is one expression of the grammar below (no comment, quote, backslash or line break that could
# end the expression or the message early), over the inputs (``L[...]`` with identifier or integer keys)
# and a few pure functions of numbers. Anything else is dropped.
_GUARD_CHARS = re.compile(r"[A-Za-z0-9_\[\]().,'*+\-/%<>=! ]*")
_GUARD_NODES = (ast.Expression, ast.Compare, ast.BinOp, ast.UnaryOp, ast.BoolOp, ast.IfExp, ast.Call,
                ast.Attribute, ast.Subscript, ast.Name, ast.Constant, ast.Load, ast.Add, ast.Sub, ast.Mult,
                ast.FloorDiv, ast.Mod, ast.Div, ast.Pow, ast.USub, ast.UAdd, ast.Not, ast.And, ast.Or, ast.Eq,
                ast.NotEq, ast.Lt, ast.LtE, ast.Gt, ast.GtE)
_GUARD_NAMES = frozenset({"L", "math", "max", "min", "abs"})
_GUARD_MATH = frozenset({"floor", "ceil", "trunc", "sqrt", "isnan", "inf"})
_GUARD_METHODS = frozenset({"size", "stride", "storage_offset"})
_GUARD_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,99}")
MAX_GUARD = 2_000  # characters: torch's own are tens to a few hundred
MAX_GUARDS = 1_024


def is_safe_guard(text, inputs: frozenset[str] | None = None) -> bool:
    """Whether the guard ``text`` is size arithmetic of the grammar above, cheap to trace; ``inputs``:
    the names its ``L['name']`` may take (the program's inputs), any identifier when None."""
    if not isinstance(text, str) or len(text) > MAX_GUARD or not _GUARD_CHARS.fullmatch(text):
        return False
    try:
        tree = ast.parse(text, mode="eval")
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    if _depth(tree) > MAX_DEPTH:
        return False
    nodes = list(ast.walk(tree))
    keys = {id(node.slice) for node in nodes if isinstance(node, ast.Subscript)}
    subscripted = {id(node.value): node for node in nodes if isinstance(node, ast.Subscript)}
    called = {id(node.func) for node in nodes if isinstance(node, ast.Call)}
    exponents = 1
    for node in nodes:
        if not isinstance(node, _GUARD_NODES):
            return False
        if isinstance(node, ast.Name):  # L only indexed (by an input's name), math only for its attributes,
            where = subscripted.get(id(node))  # max, min and abs only called
            if node.id not in _GUARD_NAMES or (node.id == "L") != (where is not None) or \
                    (node.id in ("max", "min", "abs")) != (id(node) in called):
                return False
            if where is not None and not (isinstance(where.slice, ast.Constant) and isinstance(where.slice.value, str)
                                          and (inputs is None or where.slice.value in inputs)):
                return False
        elif isinstance(node, ast.Attribute):
            if isinstance(node.value, ast.Name) and node.value.id == "math":
                if node.attr not in _GUARD_MATH:
                    return False
            elif node.attr not in _GUARD_METHODS or id(node) not in called:
                return False
        elif isinstance(node, ast.Call):
            if node.keywords or not (
                    isinstance(node.func, ast.Name) and node.func.id in ("max", "min", "abs")
                    or isinstance(node.func, ast.Attribute)):
                return False
            if isinstance(node.func, ast.Attribute) and node.func.attr in _GUARD_METHODS and len(node.args) > 1:
                return False
        elif isinstance(node, ast.Subscript):
            key = node.slice
            if not isinstance(key, ast.Constant) or not (
                    type(key.value) is int and 0 <= key.value < 2**31
                    or isinstance(key.value, str) and _GUARD_KEY.fullmatch(key.value)):
                return False
        elif isinstance(node, ast.Constant):
            v = node.value
            if isinstance(v, str):
                if id(node) not in keys:  # a string only as a key of an input (checked above)
                    return False
            elif type(v) not in (int, float, bool) or (type(v) is int and abs(v) > MAX_INTEGER):
                return False
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow):
            power = _exponent(node.right)
            if power is None or not 0 <= power <= 64:
                return False
            exponents *= max(power, 1)
            if exponents > MAX_EXPONENTS:
                return False
    return True


def drop_guards(program) -> None:
    """Keep, of a loaded program's guards (Python source that ``program.module()`` execs, and that the
    exporter's decomposition traces), only those of the strict grammar of ``is_safe_guard``: the
    decomposition then names its nodes as the exporter's did; the others are dropped."""
    guards = getattr(program, "_guards_code", None)
    if guards:
        inputs = None
        with contextlib.suppress(AttributeError, IndexError, TypeError):
            inputs = frozenset(program.module_call_graph[0].signature.forward_arg_names)
        program._guards_code = [g for g in guards if is_safe_guard(g, inputs)] \
            if isinstance(guards, list) and len(guards) <= MAX_GUARDS else []
