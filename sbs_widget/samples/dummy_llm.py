"""Small models built on the fly for demos, tests and benchmarks (no weights are downloaded)."""

from __future__ import annotations

import torch


class _Attention(torch.nn.Module):
    def __init__(self, dim: int, n_heads: int):
        super().__init__()
        self.n_heads = n_heads
        self.head_dim = dim // n_heads
        self.q_proj = torch.nn.Linear(dim, dim, bias=False)
        self.k_proj = torch.nn.Linear(dim, dim, bias=False)
        self.v_proj = torch.nn.Linear(dim, dim, bias=False)
        self.o_proj = torch.nn.Linear(dim, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, s, d = x.shape
        q = self.q_proj(x).reshape(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).reshape(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).reshape(b, s, self.n_heads, self.head_dim).transpose(1, 2)
        scores = q @ k.transpose(-2, -1) / (self.head_dim**0.5)
        mask = torch.full((s, s), float("-inf"), device=x.device).triu(1)
        weights = torch.softmax(scores + mask, dim=-1)
        out = (weights @ v).transpose(1, 2).reshape(b, s, d)
        return self.o_proj(out)


class _FeedForward(torch.nn.Module):
    def __init__(self, dim: int, hidden: int):
        super().__init__()
        self.fc1 = torch.nn.Linear(dim, hidden)
        self.fc2 = torch.nn.Linear(hidden, dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.nn.functional.gelu(self.fc1(x)))


class _DecoderLayer(torch.nn.Module):
    def __init__(self, dim: int, n_heads: int, hidden: int):
        super().__init__()
        self.norm1 = torch.nn.LayerNorm(dim)
        self.attention = _Attention(dim, n_heads)
        self.norm2 = torch.nn.LayerNorm(dim)
        self.feed_forward = _FeedForward(dim, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
        return x + self.feed_forward(self.norm2(x))


class DummyLLM(torch.nn.Module):
    """Token + position embeddings, one decoder layer (multi-head attention, feed-forward, two
    LayerNorms) and a vocabulary head: the smallest model with the structure of an LLM."""

    def __init__(self, vocab_size: int = 1024, dim: int = 16, n_heads: int = 2, hidden: int = 64,
                 max_positions: int = 256):
        super().__init__()
        self.embedding = torch.nn.Embedding(vocab_size, dim)
        self.position_embedding = torch.nn.Embedding(max_positions, dim)
        self.decoder = _DecoderLayer(dim, n_heads, hidden)
        self.lm_head = torch.nn.Linear(dim, vocab_size, bias=False)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device).unsqueeze(0)
        x = self.embedding(input_ids) + self.position_embedding(positions)
        return self.lm_head(self.decoder(x))


def dummy_llm(dynamic_shapes: bool = False, *, batch: int = 2, seq: int = 30, seed: int = 0):
    """Return ``(model, inputs)`` or, with ``dynamic_shapes=True``, ``(model, inputs, dynamic_shapes)``.

    ``inputs`` is a tuple of positional arguments: ``(input_ids,)`` of shape ``(batch, seq)``.

    >>> model, inputs = dummy_llm()
    >>> model(*inputs).shape
    torch.Size([2, 30, 1024])
    """
    torch.manual_seed(seed)
    model = DummyLLM().eval()
    inputs = (torch.randint(0, 1024, (batch, seq), dtype=torch.int64),)
    if not dynamic_shapes:
        return model, inputs
    shapes = ({0: torch.export.Dim("batch", min=1, max=256), 1: torch.export.Dim("seq", min=2, max=256)},)
    return model, inputs, shapes
