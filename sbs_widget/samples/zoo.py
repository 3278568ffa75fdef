"""Small models built from configs with seeded random init, for tests, benchmarks and the fault suite.

transformers is needed only for the transformers models (it is a test dependency, not a runtime one).
Each builder returns ``(model, args, kwargs)``.
"""

from __future__ import annotations

import torch


def _seed(seed: int) -> None:
    torch.manual_seed(seed)


def llama(layers: int = 2, hidden: int = 64, seq: int = 16, batch: int = 2, seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    _seed(seed)
    cfg = LlamaConfig(
        vocab_size=1000, hidden_size=hidden, intermediate_size=hidden * 2, num_hidden_layers=layers,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
        attn_implementation="eager", use_cache=False,
    )
    model = LlamaForCausalLM(cfg).eval()
    ids = torch.randint(0, 1000, (batch, seq))
    return model, (ids,), {"attention_mask": torch.ones(batch, seq, dtype=torch.int64)}


def gpt2(layers: int = 2, hidden: int = 64, seq: int = 16, batch: int = 2, seed: int = 0):
    from transformers import GPT2Config, GPT2LMHeadModel

    _seed(seed)
    cfg = GPT2Config(vocab_size=1000, n_embd=hidden, n_layer=layers, n_head=4, n_positions=256,
                     attn_implementation="eager", use_cache=False, bos_token_id=0, eos_token_id=0)
    model = GPT2LMHeadModel(cfg).eval()
    return model, (torch.randint(0, 1000, (batch, seq)),), {}


def bert(layers: int = 2, hidden: int = 64, seq: int = 16, batch: int = 2, seed: int = 0):
    from transformers import BertConfig, BertModel

    _seed(seed)
    cfg = BertConfig(vocab_size=1000, hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                     intermediate_size=hidden * 2, max_position_embeddings=256, attn_implementation="eager")
    model = BertModel(cfg).eval()
    ids = torch.randint(0, 1000, (batch, seq))
    return model, (ids,), {"attention_mask": torch.ones(batch, seq, dtype=torch.int64)}


def vit(layers: int = 2, hidden: int = 64, image: int = 32, batch: int = 2, seed: int = 0):
    from transformers import ViTConfig, ViTModel

    _seed(seed)
    cfg = ViTConfig(hidden_size=hidden, num_hidden_layers=layers, num_attention_heads=4,
                    intermediate_size=hidden * 2, image_size=image, patch_size=8,
                    attn_implementation="eager")
    model = ViTModel(cfg).eval()
    return model, (torch.randn(batch, 3, image, image),), {}


def resnet(seed: int = 0, batch: int = 2, image: int = 32):
    from transformers import ResNetConfig, ResNetModel

    _seed(seed)
    cfg = ResNetConfig(embedding_size=16, hidden_sizes=[16, 32], depths=[1, 1], layer_type="basic")
    return ResNetModel(cfg).eval(), (torch.randn(batch, 3, image, image),), {}


def _causal_lm(config_class: str, model_class: str, seq: int, batch: int, seed: int, **cfg):
    import transformers

    _seed(seed)
    config = getattr(transformers, config_class)(vocab_size=1000, use_cache=False, **cfg)
    model = getattr(transformers, model_class)(config).eval()
    return model, (torch.randint(0, 1000, (batch, seq)),), {}


_SMALL_DECODER = dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4)


def gemma(seq: int = 16, batch: int = 2, seed: int = 0):
    return _causal_lm("GemmaConfig", "GemmaForCausalLM", seq, batch, seed, num_key_value_heads=2, head_dim=16,
                      **_SMALL_DECODER)


def mistral(seq: int = 16, batch: int = 2, seed: int = 0):  # a sliding window shorter than the sequence
    return _causal_lm("MistralConfig", "MistralForCausalLM", seq, batch, seed, num_key_value_heads=2,
                      sliding_window=8, **_SMALL_DECODER)


def phi3(seq: int = 16, batch: int = 2, seed: int = 0):
    return _causal_lm("Phi3Config", "Phi3ForCausalLM", seq, batch, seed, num_key_value_heads=2, pad_token_id=0,
                      **_SMALL_DECODER)


def gpt_neox(seq: int = 16, batch: int = 2, seed: int = 0):
    return _causal_lm("GPTNeoXConfig", "GPTNeoXForCausalLM", seq, batch, seed, **_SMALL_DECODER)


def falcon(seq: int = 16, batch: int = 2, seed: int = 0):  # multi-query: one key head, shaped like the mask
    return _causal_lm("FalconConfig", "FalconForCausalLM", seq, batch, seed, hidden_size=64, num_hidden_layers=2,
                      num_attention_heads=4)


def distilbert(seq: int = 16, batch: int = 2, seed: int = 0):
    from transformers import DistilBertConfig, DistilBertModel

    _seed(seed)
    cfg = DistilBertConfig(vocab_size=1000, dim=64, n_layers=2, n_heads=4, hidden_dim=128)
    return DistilBertModel(cfg).eval(), (torch.randint(0, 1000, (batch, seq)),), {}


def mobilevit(batch: int = 1, image: int = 32, seed: int = 0):
    from transformers import MobileViTConfig, MobileViTModel

    _seed(seed)
    cfg = MobileViTConfig(image_size=image, patch_size=2, hidden_sizes=[32, 48, 64],
                          neck_hidden_sizes=[8, 8, 16, 16, 24, 32, 64], num_attention_heads=2)
    return MobileViTModel(cfg).eval(), (torch.randn(batch, 3, image, image),), {}


def qwen2(seq: int = 16, batch: int = 2, seed: int = 0):
    return _causal_lm("Qwen2Config", "Qwen2ForCausalLM", seq, batch, seed, num_key_value_heads=2, **_SMALL_DECODER)


def roberta(seq: int = 12, batch: int = 2, seed: int = 0):  # positions counted from the padding index
    from transformers import RobertaConfig, RobertaModel

    _seed(seed)
    cfg = RobertaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=128, max_position_embeddings=64)
    return RobertaModel(cfg).eval(), (torch.randint(3, 1000, (batch, seq)),), {}


def deberta(seq: int = 12, batch: int = 2, seed: int = 0):  # relative positions, a scale per layer
    from transformers import DebertaV2Config, DebertaV2Model

    _seed(seed)
    cfg = DebertaV2Config(vocab_size=1000, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                          intermediate_size=128, max_position_embeddings=64)
    return DebertaV2Model(cfg).eval(), (torch.randint(3, 1000, (batch, seq)),), {}


def bart(seq: int = 12, batch: int = 2, seed: int = 0):  # encoder-decoder
    from transformers import BartConfig, BartModel

    _seed(seed)
    cfg = BartConfig(vocab_size=1000, d_model=64, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
                     decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128, use_cache=False,
                     max_position_embeddings=128)
    return BartModel(cfg).eval(), (torch.randint(0, 1000, (batch, seq)),), {}


def clip_vision(batch: int = 2, image: int = 32, seed: int = 0):
    from transformers import CLIPVisionConfig, CLIPVisionModel

    _seed(seed)
    cfg = CLIPVisionConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           image_size=image, patch_size=8)
    return CLIPVisionModel(cfg).eval(), (torch.randn(batch, 3, image, image),), {}


def convnext(batch: int = 2, image: int = 32, seed: int = 0):
    from transformers import ConvNextConfig, ConvNextModel

    _seed(seed)
    cfg = ConvNextConfig(hidden_sizes=[16, 32], depths=[1, 1], num_stages=2, image_size=image)
    return ConvNextModel(cfg).eval(), (torch.randn(batch, 3, image, image),), {}


class MLP(torch.nn.Module):
    def __init__(self, dims=(32, 64, 64, 16)):
        super().__init__()
        self.layers = torch.nn.ModuleList(torch.nn.Linear(a, b) for a, b in zip(dims[:-1], dims[1:]))

    def forward(self, x):
        for i, layer in enumerate(self.layers):
            x = layer(x)
            if i < len(self.layers) - 1:
                x = torch.nn.functional.gelu(x)
        return x


def mlp(seed: int = 0, batch: int = 4):
    _seed(seed)
    return MLP().eval(), (torch.randn(batch, 32),), {}


class Tagger(torch.nn.Module):
    """A two-layer recurrent network (LSTM, or ``cell``) and a linear head; its final states are left
    unused."""

    def __init__(self, cell: type = torch.nn.LSTM):
        super().__init__()
        self.rnn = cell(16, 32, num_layers=2, batch_first=True)
        self.head = torch.nn.Linear(32, 4)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.head(y)


def lstm(seed: int = 0, batch: int = 2, seq: int = 10):
    _seed(seed)
    return Tagger().eval(), (torch.randn(batch, seq, 16),), {}


class ConvNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = torch.nn.BatchNorm2d(8)
        self.conv2 = torch.nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = torch.nn.BatchNorm2d(16)
        self.head = torch.nn.Linear(16, 10)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.head(x.mean(dim=(2, 3)))


def convnet(seed: int = 0, batch: int = 2):
    _seed(seed)
    model = ConvNet().eval()
    with torch.no_grad():  # non-trivial running stats so that folding BN into Conv changes weights
        for bn in (model.bn1, model.bn2):
            bn.running_mean.uniform_(-0.5, 0.5)
            bn.running_var.uniform_(0.5, 1.5)
    return model, (torch.randn(batch, 3, 16, 16),), {}


class LoudConvNet(torch.nn.Module):
    """Conv, BatchNorm, ReLU blocks with a residual path, whose activations grow to ~1e3 as in trained
    vision nets (MobileNet- or DLA-style): there, long dot products that cancel near zero differ by
    rounding far beyond a fixed 1e-4 between any two correct implementations."""

    def __init__(self, width: int = 32, blocks: int = 6, gain: float = 2.0):
        super().__init__()
        self.stem = torch.nn.Conv2d(3, width, 3, padding=1)
        self.convs = torch.nn.ModuleList(torch.nn.Conv2d(width, width, 3, padding=1) for _ in range(blocks))
        self.norms = torch.nn.ModuleList(torch.nn.BatchNorm2d(width) for _ in range(blocks))
        self.head = torch.nn.Linear(width, 10)
        with torch.no_grad():  # He initialization times ``gain``: each block amplifies what it reads
            for conv in [self.stem, *self.convs]:
                conv.weight.normal_(0.0, gain * (2.0 / conv.weight[0].numel()) ** 0.5)

    def forward(self, x):
        x = torch.relu(self.stem(x))
        for conv, norm in zip(self.convs, self.norms):
            x = torch.relu(norm(conv(x))) + x
        return self.head(x.mean(dim=(2, 3)))


def loud_convnet(seed: int = 0, batch: int = 2, image: int = 32):
    _seed(seed)
    model = LoudConvNet().eval()
    with torch.no_grad():
        for norm in model.norms:
            norm.running_mean.uniform_(-0.5, 0.5)
            norm.running_var.uniform_(0.3, 3.0)
            norm.weight.uniform_(0.5, 1.5)
    return model, (torch.randn(batch, 3, image, image),), {}


def dummy(seed: int = 0):
    from sbs_widget.samples.dummy_llm import dummy_llm

    model, inputs = dummy_llm(seed=seed)
    return model, inputs, {}


BUILDERS = {
    "dummy_llm": dummy, "mlp": mlp, "convnet": convnet, "loud_convnet": loud_convnet,
    "llama": llama, "gpt2": gpt2, "bert": bert, "vit": vit, "resnet": resnet,
    # more families, for benchmarks/alignment_quality.py --models ...
    "gemma": gemma, "mistral": mistral, "phi3": phi3, "gpt_neox": gpt_neox, "distilbert": distilbert,
    "mobilevit": mobilevit, "falcon": falcon, "lstm": lstm, "qwen2": qwen2, "roberta": roberta,
    "deberta": deberta, "bart": bart, "clip_vision": clip_vision, "convnext": convnext,
}


def trained_like(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Perturb every floating parameter, and BatchNorm statistics, as training would: a fresh
    transformers model has zero biases and norms of weight 1, which hide a wrong pairing (a value
    with its bias against one without) and let the ONNX optimizer merge identical weights."""
    gen = torch.Generator().manual_seed(1000 + seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.is_floating_point():
                p.add_(torch.randn(p.shape, generator=gen, dtype=p.dtype), alpha=0.02)
        for m in model.modules():
            if isinstance(m, torch.nn.modules.batchnorm._BatchNorm) and m.running_mean is not None:
                m.running_mean.add_(torch.rand(m.running_mean.shape, generator=gen) - 0.5)
                m.running_var.mul_(torch.rand(m.running_var.shape, generator=gen) + 0.5)
    return model


def fused_for_ort(model):
    """An ONNX model rewritten by onnxscript's fusions for onnxruntime (SkipLayerNormalization,
    MultiHeadAttention, BiasGelu...), as people do before deploying it."""
    import contextlib
    import io

    import onnx_ir
    from onnxscript.rewriter.ort_fusions import optimize_for_ort

    ir_model = onnx_ir.from_proto(model)
    with contextlib.redirect_stdout(io.StringIO()):
        optimize_for_ort(ir_model)
    return onnx_ir.to_proto(ir_model)


def export(name: str, *, optimize: bool = True, dtype: torch.dtype | None = None, dynamic: bool = False, **kw):
    """Build model ``name`` (``trained_like``) and export it: returns ``(ep, onnx_program, args, kwargs)``.
    ``dtype``: cast the model and its floating inputs first (``torch.float16``: a half-precision export).
    ``dynamic``: the batch dimension of every input, and the sequence of token inputs, are dynamic
    (``other_shapes`` gives inputs of other sizes to run it on)."""
    import contextlib
    import inspect
    import io
    import warnings

    model, args, kwargs = BUILDERS[name](**kw)
    trained_like(model, kw.get("seed", 0))
    if dtype is not None:
        model = model.to(dtype)
        args = tuple(a.to(dtype) if a.is_floating_point() else a for a in args)
        kwargs = {k: v.to(dtype) if v.is_floating_point() else v for k, v in kwargs.items()}
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        shapes = None
        if dynamic:
            names = list(inspect.signature(model.forward).parameters)
            shapes = {names[i]: _dynamic_dims(a) for i, a in enumerate(args)}
            shapes.update({k: _dynamic_dims(v) for k, v in kwargs.items()})
        ep = torch.export.export(model, args, kwargs=kwargs, dynamic_shapes=shapes)
        prog = torch.onnx.export(ep, args, kwargs=kwargs, dynamo=True, optimize=optimize)
    return ep, prog, args, kwargs


_BATCH, _SEQ = torch.export.Dim("batch", max=64), torch.export.Dim("seq", max=256)


def _dynamic_dims(x: torch.Tensor) -> dict:
    """Dynamic dimensions of an input: the batch, and the sequence of token ids and masks (2-D)."""
    return {0: _BATCH, 1: _SEQ} if x.dim() == 2 and not x.is_floating_point() else {0: _BATCH}


def other_shapes(args: tuple, kwargs: dict, batch: int, seq: int, seed: int = 1) -> tuple[tuple, dict]:
    """Inputs like ``args``/``kwargs`` (as ``export(..., dynamic=True)`` made them dynamic) with another
    batch size, and sequence length for token inputs: random token ids (kept inside the vocabularies
    the zoo uses), all-ones masks, random images."""
    gen = torch.Generator().manual_seed(seed)

    def like(x: torch.Tensor, is_mask: bool) -> torch.Tensor:
        if x.dim() == 2 and not x.is_floating_point():
            if is_mask:
                return torch.ones(batch, seq, dtype=x.dtype)
            return torch.randint(int(x.min()), int(x.max()) + 1, (batch, seq), generator=gen, dtype=x.dtype)
        return torch.randn((batch,) + tuple(x.shape[1:]), generator=gen, dtype=x.dtype)

    return (tuple(like(a, False) for a in args),
            {k: like(v, "mask" in k) for k, v in kwargs.items()})
