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


def dummy(seed: int = 0):
    from .examples import dummy_llm

    model, inputs = dummy_llm(seed=seed)
    return model, inputs, {}


BUILDERS = {
    "dummy_llm": dummy, "mlp": mlp, "convnet": convnet,
    "llama": llama, "gpt2": gpt2, "bert": bert, "vit": vit, "resnet": resnet,
}


def export(name: str, *, optimize: bool = True, **kw):
    """Build model ``name`` and export it: returns ``(ep, onnx_program, args, kwargs)``."""
    import contextlib
    import io
    import warnings

    model, args, kwargs = BUILDERS[name](**kw)
    with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
        warnings.simplefilter("ignore")
        ep = torch.export.export(model, args, kwargs=kwargs)
        prog = torch.onnx.export(ep, args, kwargs=kwargs, dynamo=True, optimize=optimize)
    return ep, prog, args, kwargs
