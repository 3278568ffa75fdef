"""Small decoders exported with their KV cache: one program for prefill and decode steps.

A transformers causal LM (built from a small config, random init, seeded: no download) is exported
with a ``DynamicCache`` input and dynamic batch, new-token and past lengths::

    torch.export.export(model, (), kwargs=..., dynamic_shapes=..., strict=False)
    torch.onnx.export(ep, (), kwargs=..., dynamo=True)

The cache is made exportable the way transformers' own exporter does
(``transformers.exporters.exporter_dynamo.register_pytree_node``): its flattening keeps the layers'
tensors in order, ``[layer0.keys, layer0.values, layer1.keys, ...]``, and the rest of the cache
(layer types, flags) as the tree's context; the same registration reads a saved ``.pt2`` back.

Inputs, as the ONNX model names them: ``input_ids``, ``attention_mask`` (past + new length),
``cache_0 .. cache_{2L-1}`` (``cache_{2i}`` the keys, ``cache_{2i+1}`` the values of layer i, shaped
``(batch, kv_heads, past, head_dim)``; transformers 5 calls the argument ``cache``, 4.x
``past_key_values``). Outputs: the logits, then the present keys and values in the same order (the
exporter names them after the FX nodes that compute them: ``linear_*`` and ``cat_*``);
``output_names(ep)`` lists them.

A prefill is the same program with a past of length 0 (``prefill_kwargs``); ``decode_step_kwargs``
makes a step's inputs from a prefill: a past of the given length, one new token.

transformers is needed (a test dependency, not a runtime one).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import warnings

import torch

# family -> (config class, model class, config arguments beyond the common small ones)
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {"num_key_value_heads": 2}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {"num_key_value_heads": 2}),
    "mistral": ("MistralConfig", "MistralForCausalLM", {"num_key_value_heads": 2, "sliding_window": None}),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", {"num_key_value_heads": 2, "pad_token_id": 0}),
    "gpt2": ("GPT2Config", "GPT2LMHeadModel", {}),
}
# None left out: with transformers 5.25 and torch 2.13 each family above exports with its cache and
# compares with no mismatch, prefill and decode step, from objects and from files (checked by hand;
# tests/test_decoder_with_cache.py checks llama). Mistral without a sliding window: with one, the cache
# holds sliding-window layers, another cache layout.

VOCAB = 1000
HEADS = 4
EXPORT_PAST = 5  # the example past length of the export: not 0 or 1 (torch.export would specialize them),
EXPORT_SEQ = 8  # and unlike the new-token length and the batch, so that no two sizes are taken for one


def make_model(family: str = "llama", layers: int = 2, hidden: int = 64, seed: int = 0,
               dtype: torch.dtype | None = None) -> torch.nn.Module:
    """A small ``family`` causal LM with ``use_cache=True``, random weights from ``seed``, in eval mode."""
    import transformers

    if family not in FAMILIES:
        raise ValueError(f"unknown family {family!r}: one of {sorted(FAMILIES)}")
    config_class, model_class, extra = FAMILIES[family]
    if family == "gpt2":
        common = dict(n_embd=hidden, n_layer=layers, n_head=HEADS, n_positions=512, bos_token_id=0, eos_token_id=0)
    else:
        common = dict(hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
                      num_attention_heads=HEADS, max_position_embeddings=512)
    torch.manual_seed(seed)
    config = getattr(transformers, config_class)(vocab_size=VOCAB, use_cache=True, attn_implementation="eager",
                                                 **common, **extra)
    model = getattr(transformers, model_class)(config).eval()
    return model.to(dtype) if dtype is not None else model


def register_cache() -> None:
    """Make transformers' cache types pytree nodes, as transformers' exporter does (idempotent)."""
    from transformers.cache_utils import DynamicCache

    try:
        from transformers.exporters.exporter_dynamo import register_pytree_node
    except ImportError:  # transformers 4.x
        from transformers.integrations.executorch import register_dynamic_cache_export_support

        register_dynamic_cache_export_support()
        return
    register_pytree_node(DynamicCache)


def cache_argument(model: torch.nn.Module) -> str:
    """The name of the forward's cache argument: ``cache`` (transformers 5) or ``past_key_values``."""
    parameters = inspect.signature(model.forward).parameters
    return "cache" if "cache" in parameters else "past_key_values"


def _kv_shape(model: torch.nn.Module) -> tuple[int, int, int]:
    """(layers, kv heads, head dim) of ``model``'s cache."""
    c = model.config
    heads = getattr(c, "num_key_value_heads", None) or c.num_attention_heads
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // c.num_attention_heads
    return c.num_hidden_layers, heads, head_dim


def make_cache(pairs):
    """A ``DynamicCache`` holding ``pairs`` [(keys, values)] per layer (empty tensors for a prefill)."""
    from transformers.cache_utils import DynamicCache

    return DynamicCache(ddp_cache_data=[(k, v) for k, v in pairs])


def inputs_with_cache(model: torch.nn.Module, batch: int, seq: int, past: int, seed: int = 0,
                      dtype: torch.dtype | None = None) -> dict:
    """Keyword inputs of ``model``: ``seq`` new tokens after a past of ``past`` (random keys and values;
    an empty cache for ``past=0``)."""
    layers, heads, head_dim = _kv_shape(model)
    dtype = dtype or next(model.parameters()).dtype
    g = torch.Generator().manual_seed(seed)
    pairs = [tuple(torch.randn(batch, heads, past, head_dim, generator=g).to(dtype) for _ in range(2))
             for _ in range(layers)]
    return {"input_ids": torch.randint(0, VOCAB, (batch, seq), generator=g),
            "attention_mask": torch.ones(batch, past + seq, dtype=torch.int64),
            cache_argument(model): make_cache(pairs)}


def _cache_of(kwargs: dict):
    return kwargs.get("cache", kwargs.get("past_key_values"))


def cache_pairs(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The (keys, values) of each layer of a ``DynamicCache``."""
    return [(layer.keys, layer.values) for layer in cache.layers]


def decode_step_kwargs(prefill_kwargs: dict, past: int | None = None, new_tokens: int = 1, seed: int = 1,
                       present=None) -> dict:
    """The inputs of a decode step after ``prefill_kwargs``: ``new_tokens`` tokens after a past of ``past``
    positions (the prefill's length by default). The past keys and values are ``present`` (the prefill's
    outputs: a ``DynamicCache`` or [(keys, values)] per layer) cut or padded to ``past``, else random of
    the prefill cache's shape."""
    ids = prefill_kwargs["input_ids"]
    name = "cache" if "cache" in prefill_kwargs else "past_key_values"
    pairs = cache_pairs(prefill_kwargs[name])
    past = ids.shape[1] + pairs[0][0].shape[2] if past is None else past
    g = torch.Generator().manual_seed(seed)
    if present is not None and not isinstance(present, (list, tuple)):
        present = cache_pairs(present)
    out = []
    for i, (k, _) in enumerate(pairs):
        shape = (k.shape[0], k.shape[1], past, k.shape[3])
        if present is not None and present[i][0].shape[2] >= past:
            out.append((present[i][0][:, :, :past].clone(), present[i][1][:, :, :past].clone()))
        else:
            out.append(tuple(torch.randn(shape, generator=g).to(k.dtype) for _ in range(2)))
    return {"input_ids": torch.randint(0, VOCAB, (ids.shape[0], new_tokens), generator=g),
            "attention_mask": torch.ones(ids.shape[0], past + new_tokens, dtype=torch.int64),
            name: make_cache(out)}


def dynamic_shapes(kwargs: dict) -> dict:
    """Batch, new-token and past lengths dynamic (a past of 0: a prefill; 1 new token: a decode step)."""
    batch, seq, past = torch.export.Dim("batch", min=1, max=1024), torch.export.Dim("seq", min=1, max=4096), \
        torch.export.Dim("past", min=0, max=4096)
    total = torch.export.Dim.DYNAMIC  # past + seq: torch works out its range
    name = "cache" if "cache" in kwargs else "past_key_values"
    layers = len(cache_pairs(kwargs[name]))
    return {"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: total},
            name: [{0: batch, 2: past}] * (2 * layers)}


def export_with_cache(family: str = "llama", layers: int = 2, hidden: int = 64, seed: int = 0,
                      dtype: torch.dtype | None = None, *, batch: int = 2, seq: int = EXPORT_SEQ,
                      optimize: bool = True):
    """``(ep, onnx_program, prefill_kwargs)``: a ``family`` decoder exported with its cache (dynamic batch,
    new-token and past lengths; see the module's docstring), and a prefill's inputs (``seq`` tokens,
    an empty past) for it. ``decode_step_kwargs(prefill_kwargs, past=...)`` gives a step's."""
    register_cache()
    model = make_model(family, layers, hidden, seed, dtype)
    example = inputs_with_cache(model, batch, seq if seq != EXPORT_PAST else seq + 1, EXPORT_PAST, seed)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, (), kwargs=example, dynamic_shapes=dynamic_shapes(example), strict=False)
        with contextlib.redirect_stdout(io.StringIO()):
            onnx_program = torch.onnx.export(ep, (), kwargs=example, dynamo=True, optimize=optimize)
    return ep, onnx_program, inputs_with_cache(model, batch, seq, 0, seed + 1)


def input_names(onnx_program) -> list[str]:
    return [i.name for i in onnx_program.model_proto.graph.input]


def output_names(onnx_program) -> list[str]:
    return [o.name for o in onnx_program.model_proto.graph.output]
