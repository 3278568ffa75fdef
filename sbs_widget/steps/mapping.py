"""How one decode step's outputs become the next step's inputs, worked out from the program's
signature: the logits give the next token, each present key/value becomes the past one, the attention
mask grows by a column of ones, the position ids and the cache position move on by one.

The rules read the names and shapes the exporter gives the flattened inputs and outputs (as the
program's graph signature and the ONNX model both name them):

- the token input: an integer input named ``input_ids`` (or ``*ids``/``*tokens``), else the one
  integer input of rank 2 that is neither a mask nor a position;
- the logits: the output named ``logits``, else the first floating output of rank 3;
- the cache: floating inputs other than the token embeddings, in order, paired with the floating
  outputs other than the logits, in order (present ``k`` becomes past ``k``: both are the cache
  flattened the same way), each pair checked: same rank, same dtype, every dimension equal but one;
- ``attention_mask`` (``*mask``): one more column of ones per new token;
- ``position_ids``: the last position plus one per new token; ``cache_position``: the next positions.

Without a cache the whole sequence is fed again each step (ids, mask and positions grow). Anything
else raises ``InputError`` naming the input; ``StepMapping`` can be given by hand instead.
"""

from __future__ import annotations

import dataclasses
import re

import torch

from sbs_widget.errors import InputError

_IDS = re.compile(r"(^|_)(input_ids|ids|tokens|token_ids)$")
_MASK = re.compile(r"mask")
_POSITIONS = re.compile(r"position_ids|pos_ids")
_CACHE_POSITION = re.compile(r"cache_position")


@dataclasses.dataclass(frozen=True)
class StepMapping:
    """Which flat input is what (program input names) and which output feeds which input."""

    ids: str  # the token input
    logits: int  # position of the logits among the flattened outputs
    cache: tuple[tuple[int, str], ...] = ()  # (output position, input name): present -> past
    mask: str | None = None
    positions: str | None = None  # position_ids
    cache_position: str | None = None

    @property
    def with_cache(self) -> bool:
        return bool(self.cache)


def infer_mapping(inputs: dict[str, torch.Tensor], outputs: list[tuple[str, torch.Tensor]]) -> StepMapping:
    """The mapping of a program whose flat user inputs are ``inputs`` (name -> example value, in order)
    and flat outputs ``outputs`` ((name, value), in order), as one prefill step computed them."""
    ints = {n: v for n, v in inputs.items() if not v.is_floating_point()}
    floats = [n for n, v in inputs.items() if v.is_floating_point()]
    mask = next((n for n in ints if _MASK.search(n)), None)
    positions = next((n for n in ints if _POSITIONS.search(n)), None)
    cache_position = next((n for n in ints if _CACHE_POSITION.search(n)), None)
    ids = next((n for n in ints if _IDS.search(n)), None)
    if ids is None:
        others = [n for n in ints if n not in (mask, positions, cache_position) and ints[n].dim() == 2]
        ids = others[0] if len(others) == 1 else None
    if ids is None:
        raise InputError(f"no token input among the program's inputs {list(inputs)}: name it with "
                         "StepMapping(ids=...)")
    logits = next((k for k, (n, v) in enumerate(outputs) if n == "logits" or n.endswith(".logits")), None)
    if logits is None:
        logits = next((k for k, (_, v) in enumerate(outputs) if v.is_floating_point() and v.dim() == 3), None)
    if logits is None:
        raise InputError(f"no logits among the program's outputs {[n for n, _ in outputs]}: give "
                         "StepMapping(logits=position)")
    presents = [k for k, (_, v) in enumerate(outputs) if k != logits and v.is_floating_point()]
    if not floats:  # no cache: the whole sequence each step (other floating outputs are not fed back)
        presents = []
    if len(presents) != len(floats):
        raise InputError(f"{len(floats)} floating inputs ({floats[:4]}...) but {len(presents)} floating outputs "
                         "besides the logits: the cache cannot be paired; give StepMapping(cache=...)")
    cache = tuple(zip(presents, floats))
    for k, name in cache:
        _check_cache_pair(outputs[k], name, inputs[name])
    unknown = [n for n in ints if n not in (ids, mask, positions, cache_position)]
    if unknown:
        raise InputError(f"input {unknown[0]!r} cannot be mapped from one step to the next (not the tokens, "
                         "a mask, position ids or a cache position): give the mapping by hand")
    return StepMapping(ids, logits, cache, mask, positions, cache_position)


def _check_cache_pair(output: tuple[str, torch.Tensor], name: str, past: torch.Tensor) -> None:
    out_name, present = output
    grown = [d for d in range(present.dim()) if present.dim() == past.dim() and present.shape[d] != past.shape[d]]
    if present.dim() != past.dim() or present.dtype != past.dtype or len(grown) > 1:
        raise InputError(f"output {out_name!r} {tuple(present.shape)} does not become input {name!r} "
                         f"{tuple(past.shape)} (another rank, dtype, or more than one dimension grows): "
                         "give StepMapping(cache=...)")


def next_inputs(mapping: StepMapping, inputs: dict[str, torch.Tensor], outputs: list[torch.Tensor],
                token: torch.Tensor) -> dict[str, torch.Tensor]:
    """The inputs of the step after the one that read ``inputs`` and gave ``outputs``, the chosen next
    ``token`` (one per batch row) appended."""
    out = dict(inputs)
    new = token.reshape(-1, 1).to(inputs[mapping.ids].dtype)
    if mapping.with_cache:
        out[mapping.ids] = new
        for k, name in mapping.cache:
            out[name] = outputs[k]
    else:
        out[mapping.ids] = torch.cat([inputs[mapping.ids], new], dim=1)
    n_new = 1
    if mapping.mask is not None:
        m = inputs[mapping.mask]
        out[mapping.mask] = torch.cat([m, torch.ones(m.shape[0], n_new, dtype=m.dtype)], dim=1)
    if mapping.positions is not None:
        p = inputs[mapping.positions]
        step = p[:, -1:] + torch.arange(1, n_new + 1, dtype=p.dtype)
        out[mapping.positions] = step if mapping.with_cache else torch.cat([p, step], dim=1)
    if mapping.cache_position is not None:
        c = inputs[mapping.cache_position]
        step = c[-1:] + torch.arange(1, n_new + 1, dtype=c.dtype)
        out[mapping.cache_position] = step if mapping.with_cache else torch.cat([c, step])
    return out
