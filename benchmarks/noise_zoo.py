"""Noise or bug (issue 35): how a fixed tolerance judges rounding on real architectures.

A correct export differs from torch by rounding alone, and rounding grows with the values: on conv
nets whose activations reach 1e2-1e3 (MobileNetV4-style outputs reach 1.2e3) a fixed float32
tolerance of 1e-4 calls rounding a mismatch and the culprit finder names nodes that are not at fault.
The engine is gaining a ``noise`` status: a pair beyond tolerance where onnxruntime is about as close
to a float64 reference as torch is. This benchmark measures, per architecture and dtype:

- ``out |t-o|``: max |torch - onnxruntime| over the floating outputs (the ExportedProgram run by torch,
  the ONNX model run by onnxruntime's CPU provider, default options);
- ``|t-64|`` / ``|o-64|``: max |torch - float64| and max |onnxruntime - float64| at the outputs, the
  float64 reference being the eager model in float64 (``copy.deepcopy(model).double()``, inputs
  upcast; for float16 rows, the float16 weights upcast, so only the computation's rounding counts);
  ``o/t`` is their ratio: near 1 (or below) for rounding, far above 1 for a real difference;
- ``act max``: max |value| of every module output in the float64 run (the regime the model is in);
- ``mismatch`` / ``noise``: records of ``sbs_widget.run_aligned(..., node_local=True)`` with that status;
- ``culprits``: ``len(sbs_widget.culprits(...))``; ``sbs s``: seconds of both calls; ``export s``
  (0 when read from the cache).

Models: small transformers configs (hidden 16-64, 1-3 layers or stages, images 32-64 px, sequences
of 16 tokens, batch 2), random init seeded, then made to look trained (``trained_like``): every
floating parameter multiplied elementwise by (1 + 0.3 randn) and, for matrices and kernels, by a
lognormal scale per output channel (sigma 0.5); biases get 0.1 randn added; norm layers (BatchNorm,
LayerNorm, GroupNorm, the RMSNorms...) get weight 1 + 0.5 randn and bias 0.3 randn; BatchNorm
running_mean 0.5 randn, running_var uniform(0.3, 3). Other floating buffers (rotary ``inv_freq``, mask
constants) are constants of the architecture and stay as they are. ``--scale-activations`` (``auto``:
the conv nets, family ``conv``) then rescales each Conv/Linear in execution order (one float32 pass
with hooks) so that its output's max |value| grows geometrically with depth from 3 to ``--act-target``
(default 500), halving the target until the model's outputs and activations stay finite in float16.
Everything is seeded: the same numbers every run.

Each model runs in its own process (``--timeout-per-model`` bounds it: a hanging export or run is
reported ``timeout``); exports are cached in ``--cache`` (ExportedProgram via ``torch.export.save``,
ONNX via ``onnx.save``, keyed by model, dtype and a digest of the weights), so reruns skip them.
``--before`` passes ``reference=False`` to ``run_aligned`` and ``culprits`` (no float64 reference:
the behaviour before the ``noise`` status); an engine without that keyword is called without it.

    python benchmarks/noise_zoo.py --cache /tmp/noise_zoo_cache --json noise_zoo.json
    python benchmarks/noise_zoo.py --before --cache /tmp/noise_zoo_cache   # reference off
    python benchmarks/noise_zoo.py --models resnet,convnext,llama --dtypes float32
    python benchmarks/noise_zoo.py --scale-activations off   # perturbed weights only, no growth
    python benchmarks/noise_zoo.py --list                    # the models and their families

Architectures tried that are not in ``MODELS`` (transformers 5.25, torch 2.13):

- DiNAT, NAT: need the ``natten`` package (not installed; NAT is gone from transformers 5);
- VAN, EfficientFormer, MobileNetV4: not in transformers 5.25 (removed, or timm-only);
- ViTMAE: random masking inside forward (a new mask each run; not comparable);
- Swin with ``attn_implementation="sdpa"`` (the default): the exporter's decomposition fails
  ("Cannot view a tensor with shape [32, 16, 2, 8] and strides (256, 8, 128, 1) as (32, 16, 16)", the
  SDPA output's transpose then ``reshape(*input_shape, -1)``); kept with eager attention;
- Mixtral: with the default ``experts_implementation`` (``grouped_mm``) ``torch._grouped_mm`` has no
  float64 kernel (no reference); with ``"eager"`` torch.export fails on the routing
  (``GuardOnDataDependentSymNode: Eq(u0, 0)``, the experts that got no token skipped by data);
- configs transformers 5.25 refuses or cannot run, fixed in the builders: CvT with fewer blocks than
  its stage index in a stage (``drop_path_rates[self.stage]`` out of range: depths 1, 2, 3), Hiera with
  ``num_query_pool`` >= stages, BiT with channels not divisible by ``num_groups`` (32 by default),
  MobileViTV2 on 32 px (a 1x1 map unfolded by 2x2 patches: 64 px), EfficientNet with ``hidden_dim``
  other than its top conv's width, ModernBERT with special token ids beyond a small vocabulary.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import copy
import hashlib
import io
import json
import math
import os
import subprocess
import sys
import tempfile
import time
import traceback
import warnings

import torch

# the sbs_widget measured: this checkout's, or the one --sbs-widget names (the workers read it from the environment)
SBS_ROOT = os.environ.get("NOISE_ZOO_SBS_WIDGET") or os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, SBS_ROOT)

SEED = 0
IMAGE = 32
SEQ = 16
BATCH = 2
VOCAB = 1000

# Built but left out of MODELS, with the reason (filled from the runs of this script).
FAILED = {
}


# ----------------------------------------------------------------------------- builders


def _hf(config: str, model: str, **cfg):
    import transformers

    torch.manual_seed(SEED)
    return getattr(transformers, model)(getattr(transformers, config)(**cfg)).eval()


def _image(channels: int = 3, size: int = IMAGE):
    gen = torch.Generator().manual_seed(SEED + 1)
    return torch.randn(BATCH, channels, size, size, generator=gen)


def _ids(low: int = 3):
    gen = torch.Generator().manual_seed(SEED + 2)
    return torch.randint(low, VOCAB, (BATCH, SEQ), generator=gen)


def _vision(config: str, model: str, size: int = IMAGE, **cfg):
    return _hf(config, model, **cfg), (_image(size=size),), {}


def _encoder(config: str, model: str, mask: bool = True, **cfg):
    kwargs = {"attention_mask": torch.ones(BATCH, SEQ, dtype=torch.int64)} if mask else {}
    return _hf(config, model, vocab_size=VOCAB, attn_implementation="eager", **cfg), (_ids(),), kwargs


def _decoder(config: str, model: str, **cfg):
    return _hf(config, model, vocab_size=VOCAB, use_cache=False, attn_implementation="eager", **cfg), (_ids(),), {}


_DEC = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)
_ENC = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
            max_position_embeddings=64)
_VIT = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4, image_size=IMAGE,
            patch_size=8, attn_implementation="eager")

# name -> (family, builder returning (model, args, kwargs)); family "conv" gets --scale-activations auto
MODELS = {
    # conv nets
    "resnet": ("conv", lambda: _vision("ResNetConfig", "ResNetModel", embedding_size=16, hidden_sizes=[16, 32, 64],
                                       depths=[1, 1, 1], layer_type="bottleneck")),
    "convnext": ("conv", lambda: _vision("ConvNextConfig", "ConvNextModel", hidden_sizes=[16, 32, 64],
                                         depths=[1, 1, 1], num_stages=3)),
    "convnextv2": ("conv", lambda: _vision("ConvNextV2Config", "ConvNextV2Model", hidden_sizes=[16, 32, 64],
                                           depths=[1, 1, 1], num_stages=3)),
    "mobilenet_v1": ("conv", lambda: _vision("MobileNetV1Config", "MobileNetV1Model", depth_multiplier=0.25,
                                             image_size=IMAGE)),
    "mobilenet_v2": ("conv", lambda: _vision("MobileNetV2Config", "MobileNetV2Model", depth_multiplier=0.35,
                                             image_size=IMAGE)),
    "efficientnet": ("conv", lambda: _vision("EfficientNetConfig", "EfficientNetModel", width_coefficient=0.25,
                                             depth_coefficient=0.5, image_size=IMAGE, hidden_dim=320)),
    "regnet": ("conv", lambda: _vision("RegNetConfig", "RegNetModel", embedding_size=16, hidden_sizes=[16, 32, 64],
                                       depths=[1, 1, 1], groups_width=8)),
    "bit": ("conv", lambda: _vision("BitConfig", "BitModel", embedding_size=16, hidden_sizes=[16, 32, 64],
                                    depths=[1, 1, 1], num_groups=8)),
    "poolformer": ("conv", lambda: _vision("PoolFormerConfig", "PoolFormerModel", hidden_sizes=[16, 32, 48, 64],
                                           depths=[1, 1, 1, 1])),
    "textnet": ("conv", lambda: _vision("TextNetConfig", "TextNetModel", stem_out_channels=16,
                                        hidden_sizes=[16, 16, 32, 48, 64])),
    "hgnetv2": ("conv", lambda: _vision("HGNetV2Config", "HGNetV2Backbone", embedding_size=16,
                                        hidden_sizes=[32, 64, 96, 128], depths=[1, 1, 1, 1])),
    # vision transformers and hybrids
    "vit": ("vision", lambda: _vision("ViTConfig", "ViTModel", **_VIT)),
    "deit": ("vision", lambda: _vision("DeiTConfig", "DeiTModel", **_VIT)),
    "beit": ("vision", lambda: _vision("BeitConfig", "BeitModel", use_relative_position_bias=True, **_VIT)),
    "data2vec_vision": ("vision", lambda: _vision("Data2VecVisionConfig", "Data2VecVisionModel",
                                                  use_relative_position_bias=True, **_VIT)),
    "dinov2": ("vision", lambda: _vision("Dinov2Config", "Dinov2Model", hidden_size=64, num_hidden_layers=2,
                                         num_attention_heads=4, mlp_ratio=2, image_size=IMAGE, patch_size=8)),
    "yolos": ("vision", lambda: _vision("YolosConfig", "YolosModel", num_detection_tokens=5,
                                        **dict(_VIT, image_size=[IMAGE, IMAGE]))),
    "clip_vision": ("vision", lambda: _vision("CLIPVisionConfig", "CLIPVisionModel", **_VIT)),
    "siglip_vision": ("vision", lambda: _vision("SiglipVisionConfig", "SiglipVisionModel", **_VIT)),
    "swin": ("vision", lambda: _vision("SwinConfig", "SwinModel", image_size=IMAGE, patch_size=2, embed_dim=16,
                                       depths=[1, 1], num_heads=[2, 4], window_size=4, attn_implementation="eager")),
    "swinv2": ("vision", lambda: _vision("Swinv2Config", "Swinv2Model", image_size=IMAGE, patch_size=2, embed_dim=16,
                                         depths=[1, 1], num_heads=[2, 4], window_size=4)),
    "segformer": ("vision", lambda: _vision("SegformerConfig", "SegformerModel", num_encoder_blocks=2, depths=[1, 1],
                                            sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                                            patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])),
    "glpn": ("vision", lambda: _vision("GLPNConfig", "GLPNModel", num_encoder_blocks=2, depths=[1, 1],
                                       sr_ratios=[2, 1], hidden_sizes=[16, 32], num_attention_heads=[1, 2],
                                       patch_sizes=[7, 3], strides=[4, 2], mlp_ratios=[2, 2])),
    "pvt": ("vision", lambda: _vision("PvtConfig", "PvtModel", image_size=IMAGE, num_encoder_blocks=2, depths=[1, 1],
                                      sequence_reduction_ratios=[2, 1], hidden_sizes=[16, 32],
                                      num_attention_heads=[1, 2], patch_sizes=[4, 2], strides=[4, 2],
                                      mlp_ratios=[2, 2])),
    "pvt_v2": ("vision", lambda: _vision("PvtV2Config", "PvtV2Model", image_size=IMAGE, num_encoder_blocks=2,
                                         depths=[1, 1], sr_ratios=[2, 1], hidden_sizes=[16, 32],
                                         num_attention_heads=[1, 2], patch_sizes=[7, 3], strides=[4, 2],
                                         mlp_ratios=[2, 2])),
    "mobilevit": ("vision", lambda: _vision("MobileViTConfig", "MobileViTModel", image_size=IMAGE, patch_size=2,
                                            hidden_sizes=[32, 48, 64], neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64],
                                            num_attention_heads=2)),
    "mobilevitv2": ("vision", lambda: _vision("MobileViTV2Config", "MobileViTV2Model", size=64, image_size=64,
                                              patch_size=2, width_multiplier=0.25)),
    "focalnet": ("vision", lambda: _vision("FocalNetConfig", "FocalNetModel", image_size=IMAGE, patch_size=4,
                                           embed_dim=16, depths=[1, 1], focal_levels=[2, 2], focal_windows=[3, 3])),
    "cvt": ("vision", lambda: _vision("CvtConfig", "CvtModel", embed_dim=[16, 32, 48], num_heads=[1, 2, 3],
                                      depth=[1, 2, 3], mlp_ratio=[2.0, 2.0, 2.0], drop_path_rate=[0.0, 0.0, 0.0])),
    "levit": ("vision", lambda: _vision("LevitConfig", "LevitModel", size=64, image_size=64, hidden_sizes=[32, 48, 64],
                                        num_attention_heads=[2, 3, 4], depths=[1, 1, 1], key_dim=[8, 8, 8],
                                        down_ops=[["Subsample", 8, 4, 4, 2, 2], ["Subsample", 8, 6, 4, 2, 2]])),
    "swiftformer": ("vision", lambda: _vision("SwiftFormerConfig", "SwiftFormerModel", depths=[1, 1, 1, 1],
                                              embed_dims=[16, 16, 32, 32])),
    "hiera": ("vision", lambda: _vision("HieraConfig", "HieraModel", size=64, image_size=[64, 64], embed_dim=16,
                                        depths=[1, 1, 1, 1], num_heads=[1, 2, 4, 8], query_stride=[2, 2],
                                        masked_unit_size=[8, 8], mlp_ratio=2.0)),
    # language: encoders
    "bert": ("text", lambda: _encoder("BertConfig", "BertModel", **_ENC)),
    "roberta": ("text", lambda: _encoder("RobertaConfig", "RobertaModel", **_ENC)),
    "distilbert": ("text", lambda: _encoder("DistilBertConfig", "DistilBertModel", dim=64, n_layers=2, n_heads=4,
                                            hidden_dim=128)),
    "albert": ("text", lambda: _encoder("AlbertConfig", "AlbertModel", embedding_size=32, **_ENC)),
    "electra": ("text", lambda: _encoder("ElectraConfig", "ElectraModel", embedding_size=32, **_ENC)),
    "mobilebert": ("text", lambda: _encoder("MobileBertConfig", "MobileBertModel", hidden_size=64, embedding_size=32,
                                            intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                                            intra_bottleneck_size=32, num_feedforward_networks=2,
                                            max_position_embeddings=64)),
    "deberta_v2": ("text", lambda: _encoder("DebertaV2Config", "DebertaV2Model", **_ENC)),
    "t5_encoder": ("text", lambda: _encoder("T5Config", "T5EncoderModel", d_model=64, d_kv=16, d_ff=128,
                                            num_layers=2, num_heads=4)),
    "modernbert": ("text", lambda: _encoder("ModernBertConfig", "ModernBertModel", hidden_size=64,
                                            intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                                            global_attn_every_n_layers=2, local_attention=8, pad_token_id=0,
                                            bos_token_id=1, eos_token_id=2, cls_token_id=1, sep_token_id=2)),
    # language: decoders
    "llama": ("text", lambda: _decoder("LlamaConfig", "LlamaForCausalLM", num_key_value_heads=2, **_DEC)),
    "qwen2": ("text", lambda: _decoder("Qwen2Config", "Qwen2ForCausalLM", num_key_value_heads=2, **_DEC)),
    "qwen3": ("text", lambda: _decoder("Qwen3Config", "Qwen3ForCausalLM", num_key_value_heads=2, head_dim=16, **_DEC)),
    "mistral": ("text", lambda: _decoder("MistralConfig", "MistralForCausalLM", num_key_value_heads=2,
                                         sliding_window=8, **_DEC)),
    "phi": ("text", lambda: _decoder("PhiConfig", "PhiForCausalLM", **_DEC)),
    "phi3": ("text", lambda: _decoder("Phi3Config", "Phi3ForCausalLM", num_key_value_heads=2, pad_token_id=0, **_DEC)),
    "gemma": ("text", lambda: _decoder("GemmaConfig", "GemmaForCausalLM", num_key_value_heads=2, head_dim=16, **_DEC)),
    "gemma2": ("text", lambda: _decoder("Gemma2Config", "Gemma2ForCausalLM", num_key_value_heads=2, head_dim=16,
                                        sliding_window=8, **_DEC)),
    "gpt2": ("text", lambda: _decoder("GPT2Config", "GPT2LMHeadModel", n_embd=64, n_layer=2, n_head=4,
                                      n_positions=64, bos_token_id=0, eos_token_id=0)),
    "gpt_neox": ("text", lambda: _decoder("GPTNeoXConfig", "GPTNeoXForCausalLM", **_DEC)),
    "gptj": ("text", lambda: _decoder("GPTJConfig", "GPTJForCausalLM", n_embd=64, n_layer=2, n_head=4, rotary_dim=8,
                                      n_positions=64, bos_token_id=0, eos_token_id=0)),
    "gpt_bigcode": ("text", lambda: _decoder("GPTBigCodeConfig", "GPTBigCodeForCausalLM", n_embd=64, n_layer=2,
                                             n_head=4, n_positions=64, bos_token_id=0, eos_token_id=0)),
    "opt": ("text", lambda: _decoder("OPTConfig", "OPTForCausalLM", hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                                     num_attention_heads=4, word_embed_proj_dim=64, max_position_embeddings=64)),
    "falcon": ("text", lambda: _decoder("FalconConfig", "FalconForCausalLM", hidden_size=64, num_hidden_layers=2,
                                        num_attention_heads=4)),
    "bloom": ("text", lambda: _decoder("BloomConfig", "BloomForCausalLM", hidden_size=64, n_layer=2, n_head=4)),
    "mpt": ("text", lambda: _decoder("MptConfig", "MptForCausalLM", d_model=64, n_layers=2, n_heads=4,
                                     expansion_ratio=2, max_seq_len=64)),
    "olmo": ("text", lambda: _decoder("OlmoConfig", "OlmoForCausalLM", num_key_value_heads=2, **_DEC)),
    "stablelm": ("text", lambda: _decoder("StableLmConfig", "StableLmForCausalLM", num_key_value_heads=2, **_DEC)),
    "starcoder2": ("text", lambda: _decoder("Starcoder2Config", "Starcoder2ForCausalLM", num_key_value_heads=2,
                                            **_DEC)),
    "granite": ("text", lambda: _decoder("GraniteConfig", "GraniteForCausalLM", num_key_value_heads=2, **_DEC)),
    "cohere": ("text", lambda: _decoder("CohereConfig", "CohereForCausalLM", num_key_value_heads=2, **_DEC)),
}


# ----------------------------------------------------------------------------- trained-looking weights


def _is_norm(module: torch.nn.Module) -> bool:
    if isinstance(module, (torch.nn.modules.batchnorm._BatchNorm, torch.nn.LayerNorm, torch.nn.GroupNorm,
                           torch.nn.modules.instancenorm._InstanceNorm)):
        return True
    name = type(module).__name__.lower()
    return "norm" in name and isinstance(getattr(module, "weight", None), torch.nn.Parameter) \
        and module.weight.dim() == 1 and not list(module.children())


def trained_like(model: torch.nn.Module, seed: int = SEED) -> torch.nn.Module:
    """Make the statistics of a freshly initialized model look trained (see the module docstring)."""
    gen = torch.Generator().manual_seed(1000 + seed)

    def randn(shape):
        return torch.randn(shape, generator=gen)

    with torch.no_grad():
        norms = set()
        for m in model.modules():
            if not _is_norm(m):
                continue
            w, b = getattr(m, "weight", None), getattr(m, "bias", None)
            if isinstance(w, torch.Tensor) and w.is_floating_point():
                w.copy_(1 + 0.5 * randn(w.shape))
                norms.add(id(w))
            if isinstance(b, torch.Tensor) and b.is_floating_point():
                b.copy_(0.3 * randn(b.shape))
                norms.add(id(b))
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.copy_(0.5 * randn(m.running_mean.shape))
                m.running_var.copy_(torch.rand(m.running_var.shape, generator=gen) * 2.7 + 0.3)
        for name, p in model.named_parameters():
            if not p.is_floating_point() or id(p) in norms:
                continue
            p.mul_(1 + 0.3 * randn(p.shape))
            if p.dim() >= 2:
                p.mul_(torch.exp(0.5 * randn(p.shape[:1])).reshape(-1, *([1] * (p.dim() - 1))))
            elif name.endswith("bias"):
                p.add_(0.1 * randn(p.shape))
    return model


def _tensors(out) -> list[torch.Tensor]:
    return [t for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)]


def _floats(out) -> list[torch.Tensor]:
    return [t for t in _tensors(out) if t.is_floating_point()]


def _cast(x, dtype):
    return x.to(dtype) if isinstance(x, torch.Tensor) and x.is_floating_point() else x


def _cast_inputs(args, kwargs, dtype):
    return tuple(_cast(a, dtype) for a in args), {k: _cast(v, dtype) for k, v in kwargs.items()}


def _max_abs(ts) -> float:
    return max((float(t.detach().double().abs().max()) for t in ts if t.numel()), default=0.0)


def activation_max(model, args, kwargs) -> tuple[float, bool]:
    """Max |value| over every module output and the model outputs, and whether all are finite."""
    seen = []

    def hook(_m, _i, out):
        seen.extend(_floats(out))

    handles = [m.register_forward_hook(hook) for m in model.modules()]
    try:
        with torch.no_grad():
            out = model(*args, **kwargs)
    finally:
        for h in handles:
            h.remove()
    seen.extend(_floats(out))
    finite = all(bool(torch.isfinite(t).all()) for t in seen)
    return _max_abs(t.nan_to_num(0, 0, 0) for t in seen), finite


def scale_activations(model, args, kwargs, target: float = 500.0) -> float:
    """Rescale every Conv/Linear in execution order so that the max |output| of the k-th of n grows
    geometrically from 3 to ``target``, halving ``target`` until float16 stays finite. Returns the
    target used (0 when even 4 did not stay finite: the weights are then left unscaled)."""
    layers = [m for m in model.modules() if isinstance(m, (torch.nn.Conv1d, torch.nn.Conv2d, torch.nn.Linear))]
    original = {k: v.clone() for k, v in model.state_dict().items()}
    while target >= 4:
        model.load_state_dict(original)
        order: list[torch.nn.Module] = []
        with torch.no_grad():
            model(*args, **kwargs)  # the execution order of the layers
            calls = []
            hs = [m.register_forward_pre_hook(lambda m, _i: calls.append(m)) for m in layers]
            try:
                model(*args, **kwargs)
            finally:
                for h in hs:
                    h.remove()
            for m in calls:
                if m not in order:
                    order.append(m)
            n = max(len(order) - 1, 1)
            goal = {m: 3.0 * (target / 3.0) ** (k / n) for k, m in enumerate(order)}
            done = set()

            def hook(m, _i, out):
                if m in done or not isinstance(out, torch.Tensor):
                    return None
                done.add(m)
                peak = float(out.abs().max())
                if not math.isfinite(peak) or peak == 0:
                    return None
                f = min(max(goal[m] / peak, 1 / 16), 16.0)
                m.weight.mul_(f)
                if m.bias is not None:
                    m.bias.mul_(f)
                return out * f

            hs = [m.register_forward_hook(hook) for m in order]
            try:
                model(*args, **kwargs)
            finally:
                for h in hs:
                    h.remove()
        half = copy.deepcopy(model).half()
        _, finite = activation_max(half, *_cast_inputs(args, kwargs, torch.float16))
        if finite:
            return target
        target /= 2
    model.load_state_dict(original)
    return 0.0


# ----------------------------------------------------------------------------- one model


def build(name: str, scale: str, act_target: float):
    """The model (float32, trained-looking, maybe scaled), its inputs and the activation target used."""
    family, builder = MODELS[name]
    import transformers

    transformers.logging.set_verbosity_error()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        model, args, kwargs = builder()
        trained_like(model)
        used = 0.0
        if scale == "on" or (scale == "auto" and family == "conv"):
            used = scale_activations(model, args, kwargs, act_target)
    return model, args, kwargs, used


def _digest(model) -> str:
    h = hashlib.sha1()
    for k, v in model.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().reshape(-1).contiguous().view(torch.uint8).numpy().tobytes() if v.numel() else b"")
    return h.hexdigest()[:12]


def export(model, args, kwargs, cache: str | None, key: str):
    """(ep, onnx ModelProto, seconds spent exporting), read from ``cache`` when there."""
    import onnx

    paths = (os.path.join(cache, key + ".pt2"), os.path.join(cache, key + ".onnx")) if cache else None
    if paths and all(os.path.exists(p) for p in paths):
        return torch.export.load(paths[0]), onnx.load(paths[1]), 0.0
    t0 = time.perf_counter()
    with contextlib.redirect_stdout(io.StringIO()), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, args, kwargs=kwargs)
        onx = torch.onnx.export(ep, args, kwargs=kwargs, dynamo=True).model_proto
    seconds = time.perf_counter() - t0
    if paths:
        os.makedirs(cache, exist_ok=True)
        torch.export.save(ep, paths[0] + ".tmp")
        onnx.save(onx, paths[1] + ".tmp")
        os.replace(paths[0] + ".tmp", paths[0])
        os.replace(paths[1] + ".tmp", paths[1])
    return ep, onx, seconds


def _flat_inputs(ep, args, kwargs) -> list:
    spec = ep.call_spec.in_spec
    if spec is not None and len(spec.children_specs) == 2 and spec.children_specs[1].context:
        kwargs = {k: kwargs[k] for k in spec.children_specs[1].context if k in kwargs}
    return [x for x in torch.utils._pytree.tree_leaves((args, kwargs)) if isinstance(x, torch.Tensor)]


def run_onnxruntime(onx, ep, args, kwargs) -> list[torch.Tensor]:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.log_severity_level = 3
    sess = ort.InferenceSession(onx.SerializeToString(), opts, providers=["CPUExecutionProvider"])
    flat = _flat_inputs(ep, args, kwargs)
    names = [i.name for i in sess.get_inputs()]
    if len(names) != len(flat):
        raise RuntimeError(f"{len(names)} ONNX inputs for {len(flat)} tensors")
    outs = sess.run(None, {n: x.numpy() for n, x in zip(names, flat)})
    return [torch.from_numpy(o) for o in outs]


def _call(fn, *a, before: bool, **kw):
    """``fn(*a, reference=False, **kw)`` with ``before``, or without the keyword where it does not exist yet."""
    if before:
        try:
            return fn(*a, reference=False, **kw), True
        except TypeError as e:
            if "reference" not in str(e):
                raise
    return fn(*a, **kw), False


def measure(name: str, dtype_name: str, *, scale: str, act_target: float, cache: str | None, before: bool) -> dict:
    import sbs_widget

    dtype = getattr(torch, dtype_name)
    family = MODELS[name][0]
    row = {"model": name, "family": family, "dtype": dtype_name, "sbs_widget": os.path.dirname(sbs_widget.__file__)}
    model, args, kwargs, used = build(name, scale, act_target)
    row["act_target"] = used
    if dtype != torch.float32:
        model = model.to(dtype)
        args, kwargs = _cast_inputs(args, kwargs, dtype)
    ref_model = copy.deepcopy(model).double()
    ref_args, ref_kwargs = _cast_inputs(args, kwargs, torch.float64)
    row["act_max"], _ = activation_max(ref_model, ref_args, ref_kwargs)
    with torch.no_grad():
        ref = _floats(ref_model(*ref_args, **ref_kwargs))
        _, row["finite"] = activation_max(model, args, kwargs)

    t0 = time.perf_counter()
    key = f"{name}-{dtype_name}-{_digest(model)}"
    ep, onx, row["export_s"] = export(model, args, kwargs, cache, key)
    with torch.no_grad():
        got = _floats(ep.module()(*args, **kwargs))
    try:
        ort_out = [o for o in run_onnxruntime(onx, ep, args, kwargs) if o.is_floating_point()]
    except Exception as e:  # e.g. a float16 kernel onnxruntime's CPU provider lacks
        row.update(status="skipped", note=f"onnxruntime: {type(e).__name__}: {str(e).splitlines()[0][:200]}")
        return row
    if not (len(got) == len(ort_out) == len(ref)):
        row["note"] = f"outputs: torch {len(got)}, onnxruntime {len(ort_out)}, float64 {len(ref)}"
    pairs = list(zip(got, ort_out, ref))

    def err(a, b):
        return max((float((x.double() - y.double()).abs().max()) for x, y in zip(a, b) if x.numel()), default=0.0)

    row["out_to"] = err([p[0] for p in pairs], [p[1] for p in pairs])
    row["out_t64"] = err([p[0] for p in pairs], [p[2] for p in pairs])
    row["out_o64"] = err([p[1] for p in pairs], [p[2] for p in pairs])
    row["out_scale"] = _max_abs(p[2] for p in pairs)

    t1 = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        records, row["reference_kw"] = _call(
            lambda *a, **k: list(sbs_widget.run_aligned(*a, **k)), ep, onx, args, kwargs, node_local=True,
            before=before)
        found, _ = _call(sbs_widget.culprits, ep, onx, args, kwargs, before=before)
    row["sbs_s"] = time.perf_counter() - t1
    statuses = [r.status for r in records]
    row["records"] = len(records)
    for s in ("mismatch", "noise", "error", "one-sided"):
        row[s] = statuses.count(s)
    row["rec_out_to"] = max((r.err_abs or 0.0 for r in records if r.kind == "output"), default=0.0)
    row["culprits"] = len(found)
    row["culprit1"] = f"{found[0].onnx_op_type} {found[0].onnx_node}" if found else ""
    row["status"] = "ok"
    row["seconds"] = time.perf_counter() - t0
    return row


def worker(opts) -> int:
    """Measure one model in every dtype, one JSON line per row appended to ``opts.out``."""
    torch.manual_seed(SEED)
    for dtype_name in opts.dtypes.split(","):
        t0 = time.perf_counter()
        try:
            row = measure(opts.worker, dtype_name, scale=opts.scale_activations, act_target=opts.act_target,
                          cache=opts.cache, before=opts.before)
        except Exception as e:
            tb = traceback.format_exc().strip().splitlines()
            row = {"model": opts.worker, "family": MODELS[opts.worker][0], "dtype": dtype_name, "status": "failed",
                   "note": f"{type(e).__name__}: {str(e).strip().splitlines()[0][:200] if str(e).strip() else ''}",
                   "where": " | ".join(tb[-4:])[:600], "seconds": time.perf_counter() - t0}
        with open(opts.out, "a") as f:
            f.write(json.dumps(row) + "\n")
    return 0


# ----------------------------------------------------------------------------- table


def _fmt(v) -> str:
    if v is None:
        return ""
    if isinstance(v, bool):
        return "yes" if v else "NO"
    if isinstance(v, float):
        if v == 0:
            return "0"
        return f"{v:.1f}" if 0.1 <= abs(v) < 1000 else f"{v:.2g}"
    return str(v)


COLUMNS = [("model", "model"), ("dtype", "dtype"), ("act_target", "scaled to"), ("act_max", "act max"),
           ("out_to", "out \\|t-o\\|"), ("out_t64", "\\|t-64\\|"), ("out_o64", "\\|o-64\\|"), ("ratio", "o/t"),
           ("records", "records"), ("mismatch", "mismatch"), ("noise", "noise"), ("error", "error"),
           ("culprits", "culprits"), ("export_s", "export s"), ("sbs_s", "sbs s"), ("status", "status")]


def table(rows: list[dict]) -> str:
    lines = ["| " + " | ".join(h for _, h in COLUMNS) + " |", "|" + "---|" * len(COLUMNS)]
    for r in rows:
        r = dict(r)
        if r.get("out_t64") is not None and r.get("out_o64") is not None:
            r["ratio"] = r["out_o64"] / r["out_t64"] if r["out_t64"] > 0 else (0.0 if r["out_o64"] == 0 else math.inf)
        if r.get("finite") is False:
            r["status"] = f"{r.get('status')} (non-finite)"
        lines.append("| " + " | ".join(_fmt(r.get(k)) for k, _ in COLUMNS) + " |")
    return "\n".join(lines)


def summary(rows: list[dict]) -> str:
    out = []
    for dtype in sorted({r["dtype"] for r in rows}):
        ok = [r for r in rows if r["dtype"] == dtype and r.get("status") == "ok"]
        flagged = [r for r in ok if r["mismatch"]]
        out.append(f"- {dtype}: {len(ok)} models measured, {len(flagged)} with pairs beyond tolerance "
                   f"({sum(r['mismatch'] for r in ok)} mismatch, {sum(r['noise'] for r in ok)} noise), "
                   f"{sum(1 for r in ok if r['culprits'])} with culprits ({sum(r['culprits'] for r in ok)} in all)")
    far = [r for r in rows if r.get("status") == "ok" and r["out_o64"] > 10 * max(r["out_t64"], 1e-30)
           and r["out_to"] > 1e-6]
    if far:
        out.append("- onnxruntime more than 10x farther from float64 than torch at the outputs: "
                   + ", ".join(f"{r['model']} {r['dtype']} ({r['out_o64']:.2g} vs {r['out_t64']:.2g})" for r in far))
    bad = [r for r in rows if r.get("status") != "ok"]
    if bad:
        out.append("- not measured: " + "; ".join(f"{r['model']} {r['dtype']}: {r.get('status')} "
                                                   f"{r.get('note', '')}" for r in bad))
    return "\n".join(out)


def run_worker(name: str, opts, env) -> list[dict]:
    """Measure model ``name`` in its own process (bounded by ``--timeout-per-model``): its rows."""
    dtypes = opts.dtypes.split(",")
    with tempfile.TemporaryDirectory() as tmp:
        out = os.path.join(tmp, "rows.jsonl")
        cmd = [sys.executable, os.path.abspath(__file__), "--worker", name, "--out", out, "--dtypes", opts.dtypes,
               "--scale-activations", opts.scale_activations, "--act-target", str(opts.act_target)]
        cmd += ["--cache", opts.cache] if opts.cache else []
        cmd += ["--before"] if opts.before else []
        t0 = time.perf_counter()
        status, tail = None, ""
        try:
            proc = subprocess.run(cmd, capture_output=True, text=True, timeout=opts.timeout_per_model, env=env)
            if proc.returncode:
                status, tail = "crashed", (proc.stderr.strip().splitlines() or [""])[-1][:200]
        except subprocess.TimeoutExpired:
            status = "timeout"
        with contextlib.suppress(FileNotFoundError), open(out) as f:
            got = [json.loads(line) for line in f]
    done = {r["dtype"] for r in got}
    for dtype in dtypes:
        if dtype not in done:
            got.append({"model": name, "family": MODELS[name][0], "dtype": dtype, "status": status or "missing",
                        "note": tail or f"after {time.perf_counter() - t0:.0f} s"})
    got.sort(key=lambda r: dtypes.index(r["dtype"]))
    for r in got:
        if r.get("status") == "ok":
            print(f"{name:16s} {r['dtype']:8s} act {r['act_max']:9.3g}  |t-o| {r['out_to']:9.3g}  "
                  f"|t-64| {r['out_t64']:9.3g}  |o-64| {r['out_o64']:9.3g}  mismatch {r['mismatch']:3d}  "
                  f"noise {r['noise']:3d}  culprits {r['culprits']:2d}  {r['seconds']:5.1f} s", flush=True)
        else:
            print(f"{name:16s} {r['dtype']:8s} {r.get('status')}: {r.get('note', '')}", flush=True)
    return got


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--models", default="all", help="comma-separated names (default: all); see --list")
    parser.add_argument("--dtypes", default="float32,float16")
    parser.add_argument("--before", action="store_true", help="reference=False: no float64 reference (old behaviour)")
    parser.add_argument("--scale-activations", default="auto", choices=["auto", "on", "off"],
                        help="grow activations through depth (auto: the conv nets)")
    parser.add_argument("--act-target", type=float, default=500.0, help="max |activation| of the last layer")
    parser.add_argument("--timeout-per-model", type=float, default=600.0, help="seconds per model, all dtypes")
    parser.add_argument("--jobs", type=int, default=1, help="models measured at once (timings then share cores)")
    parser.add_argument("--cache", default=None, help="folder of cached exports (.pt2 + .onnx)")
    parser.add_argument("--json", default=None, help="write the rows there")
    parser.add_argument("--sbs-widget", default=None,
                        help="folder holding the sbs_widget package to measure (e.g. a `git archive` of a commit)")
    parser.add_argument("--list", action="store_true", help="list the models and exit")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--out", default=None, help=argparse.SUPPRESS)
    opts = parser.parse_args(argv)
    if opts.worker:
        return worker(opts)
    if opts.list:
        for name, (family, _) in MODELS.items():
            print(f"{name:18s} {family}")
        return 0
    names = list(MODELS) if opts.models == "all" else opts.models.split(",")
    unknown = [n for n in names if n not in MODELS]
    if unknown:
        parser.error(f"unknown models {unknown}; known: {', '.join(MODELS)}")
    t_all = time.perf_counter()
    env = dict(os.environ)
    if opts.sbs_widget:
        env["NOISE_ZOO_SBS_WIDGET"] = os.path.abspath(opts.sbs_widget)
    if opts.jobs > 1:  # share the cores between the workers
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // opts.jobs))
    with concurrent.futures.ThreadPoolExecutor(opts.jobs) as pool:
        done = pool.map(lambda name: run_worker(name, opts, env), names)
        rows = [r for model_rows in done for r in model_rows]
    print()
    print(f"noise_zoo: {'before (reference=False)' if opts.before else 'engine default'}, scale-activations "
          f"{opts.scale_activations} (target {opts.act_target:g}), torch {torch.__version__}, "
          f"{time.perf_counter() - t_all:.0f} s, sbs_widget from {env.get('NOISE_ZOO_SBS_WIDGET', SBS_ROOT)}")
    print()
    print(table(rows))
    print()
    print(summary(rows))
    if opts.json:
        with open(opts.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
