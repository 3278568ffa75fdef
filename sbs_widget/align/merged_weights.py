"""A weight with no initializer of its own because the exporter merged it with another one: a tied
weight (a transformers model's ``embed_tokens`` stored once, as ``lm_head.weight``) or one the ONNX
optimizer deduplicated (zero biases, unit norms: one initializer holds them all). It is compared with
that initializer when their values are the same, bit for bit."""

from __future__ import annotations

import torch

from sbs_widget.dtypes import TORCH_TO_ONNX

MAX_CANDIDATES = 64  # initializers of the weight's shape and type compared, at most (readers' first)


def merged_into(program: torch.export.ExportedProgram, index, key: str, placeholder, al,
                owner_of: dict[str, str]) -> tuple[str, str] | None:
    """(initializer, comment) for weight ``key`` (FX ``placeholder``) that the ONNX graph holds in an
    initializer named otherwise, or None. ``owner_of``: initializer -> state-dict key it was kept for."""
    tensor = _tensor(program, key)
    if tensor is None or placeholder is None:
        return None
    elem, dims = TORCH_TO_ONNX.get(tensor.dtype, 0), list(tensor.shape)
    readers = [x for user in placeholder.users for i in al.fx_group.get(user.name, []) for x in index.node_inputs[i]]
    others = [name for name in index.initializers if name not in readers]
    mine, compared = None, 0
    for name in list(dict.fromkeys(x for x in readers if x in index.initializers)) + others:
        init = index.initializers[name]
        if init.data_type != elem or list(init.dims) != dims:
            continue
        compared += 1
        if compared > MAX_CANDIDATES:
            return None
        if mine is None:
            mine = _bytes(tensor)
            if mine is None:
                return None
        try:
            arr, raw = index.initializer_data(name)
            same = (raw if raw is not None else arr.tobytes()) == mine
        except Exception:  # noqa: BLE001 (an unreadable initializer is no twin)
            same = False
        if same:
            owner = owner_of.get(name, name)
            kept = _tensor(program, owner)
            if kept is not None and owner != key and (kept is tensor or _shares(kept, tensor)):
                return name, f"tied to {name} (one tensor in the model: the exporter stored it once)"
            return name, (f"deduplicated into {name} by the ONNX optimizer (same values: one initializer "
                          "holds both)")
    return None


def _tensor(program, key: str):
    t = program.state_dict.get(key)
    if t is None:
        t = program.constants.get(key)
    return t if isinstance(t, torch.Tensor) else None


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    try:
        return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr() and a.shape == b.shape
    except (RuntimeError, NotImplementedError):
        return False


def _bytes(t: torch.Tensor) -> bytes | None:
    try:
        t = t.detach().cpu().contiguous()
        if t.dtype == torch.bfloat16:
            t = t.view(torch.int16)
        return t.numpy().tobytes()
    except (RuntimeError, TypeError, NotImplementedError):  # a meta tensor, a subclass
        return None


def removed_comment(program: torch.export.ExportedProgram, key: str) -> str:
    """Why weight ``key`` has no initializer at all: an all-zero bias is dropped by the optimizer (the
    Gemm or Add reading it adds nothing)."""
    t = _tensor(program, key)
    try:
        zeros = t is not None and t.numel() > 0 and t.device.type != "meta" and not bool(t.detach().any())
    except (RuntimeError, TypeError, NotImplementedError):
        zeros = False
    return "no initializer: removed by the ONNX optimizer" + (
        " (all zeros: the node reading it adds nothing, so the optimizer dropped it)" if zeros else "")
