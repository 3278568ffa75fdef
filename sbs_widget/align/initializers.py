"""What an ONNX initializer stands for, when its name does not say: a number a consumer takes as a
literal (not the twin of one of its FX inputs), a parameter the optimizer stored transposed, or a
linear's folded weight read transposed (its layout, not the FX value)."""

from __future__ import annotations

import torch


def is_literal_of(value: str, user: torch.fx.Node, index) -> bool:
    """Whether ``value`` is a one-element initializer holding a number the FX node ``user`` takes as a
    literal argument: the exporter's constant for that literal, not a twin of one of its FX inputs."""
    init = index.initializers.get(value)
    if init is None or index.initializer_numel(value) != 1:
        return False
    literals = [a for a in (*user.args, *user.kwargs.values())
                if isinstance(a, (int, float)) and not isinstance(a, bool)]
    if not literals:
        return False
    try:
        number = float(index.initializer_data(value)[0].reshape(-1)[0])
    except (ValueError, TypeError, IndexError):
        return False
    return any(number == float(a) or (abs(a) > 1e30 and abs(number - a) <= 1e-6 * abs(a)) for a in literals)


def stored_transposed(index, key: str, folded: list[str], placeholder: torch.fx.Node | None) -> bool:
    """Whether the one initializer ``key`` was folded into is that matrix transposed (a Linear's weight
    the optimizer stored as MatMul reads it): then it is compared with the parameter, transposed."""
    if len(folded) != 1 or index.folded_from(folded[0]) != [key] or placeholder is None:
        return False
    val = placeholder.meta.get("val")
    init = index.initializers.get(folded[0])
    if not isinstance(val, torch.Tensor) or init is None or val.ndim != 2:
        return False
    return list(init.dims) == [int(val.shape[1]), int(val.shape[0])]


_LINEAR = "aten.linear.default"


def read_transposed(value: str, node: torch.fx.Node, user: torch.fx.Node, i: int, index) -> bool:
    """Whether ONNX node ``i``, translating ``user = aten.linear(x, node, ...)``, reads ``value`` as the
    right-hand matrix of its product: linear computes ``x @ node.T``, so a MatMul's (or a Gemm's
    without ``transB``) right-hand side is ``node`` transposed, folded into a new initializer. A square
    weight's shape cannot tell them apart (RWKV's ``F.linear(x, w * 0.5)``): that value is not
    ``node``'s twin (the consumer's inner values compare it where the program transposes)."""
    if str(user.target) != _LINEAR or len(user.args) < 2 or user.args[1] is not node:
        return False
    op, inputs = index.op_types[i], index.node_inputs[i]
    if len(inputs) < 2 or inputs[1] != value or op not in ("MatMul", "Gemm"):
        return False
    if op == "Gemm":
        trans_b = next((a.i for a in index.nodes[i].attribute if a.name == "transB"), 0)
        return not trans_b
    return True
