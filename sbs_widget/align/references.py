"""Finer torch references for one FX node: the programs its ONNX translation is checked against.

``reference_program`` gives, for an FX node, a small FX program computing the same value from the
node's tensor arguments with finer ops, whose values stand for the inside of the exporter's
translation (``blame/finer.py`` pairs them with the ONNX nodes by structure):

- attention (``scaled_dot_product_attention`` and its fused CPU/flash forms): torch's math path written
  out (``ATTENTION``): q and k^T each scaled by sqrt(scale) (``scale`` or 1/sqrt(E)), their matmul, the
  mask added (a boolean mask as 0 / -inf, ``is_causal`` as a lower-triangular one), softmax over the
  last axis, fully masked rows (NaN after softmax over -inf) set to 0 for a boolean mask, matmul with v.
  Grouped-query attention repeats k and v over the heads;
- softmax and log_softmax: the op itself traced by ``make_fx`` (its decomposition would split what ONNX
  keeps whole); a composite form comes out as the aten ops it is made of (``softmax(x, dtype=float32)``:
  ``_to_copy`` then ``_softmax``), the dtype conversions the exporter writes as Casts;
- linear and addmm: a matmul (the weight transposed) then the bias added, as ONNX writes them (torch's
  decomposition of linear gives addmm, which no single ONNX node computes);
- rsqrt: a square root then its reciprocal, as ONNX writes it;
- otherwise torch's own decomposition table (one level: silu -> sigmoid, mul).
"""

from __future__ import annotations

import math

import torch


def attention(query, key, value, attn_mask=None, dropout_p=0.0, is_causal=False, scale=None, enable_gqa=False):
    """scaled_dot_product_attention by its math definition (dropout left out: programs run in eval)."""
    dtype = query.dtype
    size = query.size(-1)
    if scale is None:  # 1 / sqrt(E), as torch's math path computes it
        factor = torch.tensor(1.0, dtype=dtype) / torch.sqrt(torch.tensor(float(size), dtype=dtype))
    else:
        factor = torch.tensor(scale, dtype=dtype)
    if enable_gqa and query.size(-3) != key.size(-3):
        rep = query.size(-3) // key.size(-3)
        key = key.unsqueeze(-3).expand(*key.shape[:-2], rep, *key.shape[-2:]).reshape(
            *key.shape[:-3], key.size(-3) * rep, *key.shape[-2:])
        value = value.unsqueeze(-3).expand(*value.shape[:-2], rep, *value.shape[-2:]).reshape(
            *value.shape[:-3], value.size(-3) * rep, *value.shape[-2:])
    scores = torch.matmul(query * torch.sqrt(factor), key.transpose(-2, -1) * torch.sqrt(factor))
    boolean = attn_mask is not None and attn_mask.dtype == torch.bool
    if is_causal and attn_mask is None:
        keep = torch.ones(query.size(-2), key.size(-2), dtype=torch.bool).tril()
        attn_mask = torch.where(keep, torch.tensor(0.0, dtype=dtype), torch.tensor(-math.inf, dtype=dtype))
    elif boolean:
        attn_mask = torch.where(attn_mask, torch.tensor(0.0, dtype=dtype), torch.tensor(-math.inf, dtype=dtype))
    if attn_mask is not None:
        scores = scores + attn_mask
    weights = torch.softmax(scores, dim=-1)
    if boolean:  # a row masked everywhere: softmax over -inf gives NaN, torch gives 0
        weights = torch.where(torch.isnan(weights), torch.tensor(0.0, dtype=dtype), weights)
    return torch.matmul(weights, value)


def linear(x, weight, bias=None):
    """linear as the exporter writes it: a matmul with the weight transposed, then the bias added (torch's
    own decomposition fuses them into addmm, which no single ONNX node computes)."""
    out = torch.matmul(x, weight.t())
    return out + bias if bias is not None else out


def addmm(bias, x, weight, *, beta=1, alpha=1):
    """addmm as a product then a sum (ONNX MatMul then Add, or Gemm)."""
    out = torch.mm(x, weight)
    out = out * alpha if alpha != 1 else out
    return out + (bias * beta if beta != 1 else bias)


def rsqrt(x):
    """rsqrt as ONNX writes it (Sqrt then Reciprocal): torch's decomposition keeps rsqrt whole."""
    return torch.reciprocal(torch.sqrt(x))


def _reference_fn(node: torch.fx.Node):
    """(callable taking the node's args and kwargs, what it is called in a reason) or None."""
    from torch._decomp import decomposition_table

    name = getattr(getattr(node.target, "overloadpacket", None), "__name__", "")
    if name in ("scaled_dot_product_attention", "_scaled_dot_product_attention_math"):
        return attention, "torch's math definition of attention"
    if name == "_scaled_dot_product_flash_attention_for_cpu":  # (q, k, v, dropout, is_causal, *, mask, scale)
        def fused(q, k, v, dropout_p=0.0, is_causal=False, *, attn_mask=None, scale=None):
            return attention(q, k, v, attn_mask, dropout_p, is_causal, scale)
        return fused, "torch's math definition of attention"
    if name == "linear":
        return linear, "linear as a matmul and a bias added"
    if name == "rsqrt":
        return rsqrt, "rsqrt as a square root and its reciprocal"
    if name == "addmm":
        return addmm, "addmm as a product and a sum"
    if isinstance(node.target, torch._ops.OpOverload) and name in _COMPOSITE:
        return node.target, f"torch's own {name}"
    fn = decomposition_table.get(node.target)
    if fn is not None:
        return fn, "torch's own decomposition"
    # a composite op (its kernel is made of other ops: traced, it comes out as them); reading
    # core_aten_decompositions() for these would cost 0.3 s per call (it materializes all of them)
    if isinstance(node.target, torch._ops.OpOverload) and torch._C._dispatch_has_kernel_for_dispatch_key(
            node.target.name(), "CompositeImplicitAutograd"):
        return node.target, "torch's own decomposition"
    return None


# ops traced as themselves (make_fx keeps them whole or splits a composite into its aten ops)
_COMPOSITE = {"softmax", "_softmax", "log_softmax", "_log_softmax"}


def reference_program(node: torch.fx.Node, values: dict):
    """(finer graph module, its placeholder -> FX argument name, the argument tensors, what the
    reference is) for ``node`` on its torch argument values (``values``: by FX name), or None."""
    from torch.fx.experimental.proxy_tensor import make_fx

    found = _reference_fn(node)
    if found is None:
        return None
    fn, label = found
    names, tensors, copies = [], [], {}
    for a in list(node.args) + list(node.kwargs.values()):
        if isinstance(a, torch.fx.Node):
            if not isinstance(values.get(a.name), torch.Tensor):
                return None
            if a.name not in copies:  # contiguous copies, traced and run alike (the trace's views assume
                # the strides it saw); one FX value given twice (attention(x, x, x)) is one tensor, read
                # by the trace through one placeholder, distinct FX values stay distinct
                copies[a.name] = values[a.name].detach().clone(memory_format=torch.contiguous_format)
            names.append(a.name)
            tensors.append(copies[a.name])
        elif isinstance(a, (list, tuple)) and any(isinstance(x, torch.fx.Node) for x in a):
            return None

    def call(*ts):
        it = iter(ts)
        args = [next(it) if isinstance(a, torch.fx.Node) else a for a in node.args]
        kwargs = {k: next(it) if isinstance(a, torch.fx.Node) else a for k, a in node.kwargs.items()}
        out = fn(*args, **kwargs)
        return out[0] if isinstance(out, (tuple, list)) else out

    gm = make_fx(call)(*tensors)  # one level: the ops the reference calls stay whole
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    return gm, dict(zip(placeholders, names)), tensors, label


def composite_program(nodes: list, values: dict):
    """Like ``reference_program`` for FX ``nodes`` run one after the other (in program order, the last
    one's value returned), each by its own reference: what one ONNX translation covers when an optimizer
    merged several FX nodes (an addmm and the view after it). ``values``: the tensors they read from
    outside, by FX name. None when one of them has no reference and is no plain op."""
    from torch.fx.experimental.proxy_tensor import make_fx

    from sbs_widget.align.flow import FX_CARRY, op_name

    inside = {n.name for n in nodes}
    fns, labels = [], []
    for n in nodes:
        # views stay views (their decomposition is prims the pairing does not read as carriers)
        found = None if op_name(n) in FX_CARRY else _reference_fn(n)
        if found is None and not isinstance(n.target, torch._ops.OpOverload):
            return None
        fn, label = found if found is not None else (n.target, "")
        fns.append(fn)
        if label:
            labels.append(label)
    names = list(dict.fromkeys(a.name for n in nodes for a in n.all_input_nodes if a.name not in inside))
    tensors = [values[x].detach().clone(memory_format=torch.contiguous_format) for x in names]

    def call(*ts):
        env = dict(zip(names, ts))
        for n, fn in zip(nodes, fns):
            args = torch.fx.node.map_arg(n.args, lambda a: env[a.name])
            kwargs = torch.fx.node.map_arg(n.kwargs, lambda a: env[a.name])
            env[n.name] = fn(*args, **kwargs)
        out = env[nodes[-1].name]
        return out[0] if isinstance(out, (tuple, list)) else out

    gm = make_fx(call)(*tensors)
    placeholders = [n.name for n in gm.graph.nodes if n.op == "placeholder"]
    what = ", then ".join(getattr(getattr(n.target, "overloadpacket", None), "__name__", str(n.target)) for n in nodes)
    label = f"{labels[0] if labels else 'torch'} over {what} (merged into one translation)"
    return gm, dict(zip(placeholders, names)), tensors, label
