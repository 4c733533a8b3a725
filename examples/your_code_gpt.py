"""A small GPT-shaped language model, as docs/your-code.md's config-factory spec names it (``your_code_gpt.py:...``).

The model is written the way many GPTs are: its sizes in a ``GPTConfig`` object, a class
``GPT(config)`` built from it, and ``forward(idx, targets)`` returning ``(logits, loss)``.
A spec's ``model.args`` are flat keyword arguments, so the spec names ``gpt``, a factory that
builds the config from them and returns the model; ``loss: model`` reads the one scalar
tensor of the ``(logits, loss)`` output. ``next_tokens`` yields ``(idx, targets)`` windows of
one synthetic token stream, the targets shifted by one.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import Dataset

@dataclass
class GPTConfig:
    """The model's sizes in one object, as a model that is built from a config keeps them."""

    block_size: int = 16
    vocab_size: int = 64
    n_layer: int = 1
    n_head: int = 2
    n_embd: int = 16


class Block(nn.Module):
    """Causal self-attention and an MLP, each behind a layer norm with a residual."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.n_head = config.n_head
        self.ln_1 = nn.LayerNorm(config.n_embd)
        self.qkv = nn.Linear(config.n_embd, 3 * config.n_embd)
        self.proj = nn.Linear(config.n_embd, config.n_embd)
        self.ln_2 = nn.LayerNorm(config.n_embd)
        self.mlp = nn.Sequential(nn.Linear(config.n_embd, 4 * config.n_embd), nn.GELU(),
                                 nn.Linear(4 * config.n_embd, config.n_embd))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, c = x.shape
        q, k, v = self.qkv(self.ln_1(x)).split(c, dim=2)
        heads = [h.view(b, t, self.n_head, c // self.n_head).transpose(1, 2) for h in (q, k, v)]
        y = F.scaled_dot_product_attention(*heads, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, c))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    """A decoder-only language model built from a ``GPTConfig``; ``forward`` returns ``(logits, loss)``."""

    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.wte = nn.Embedding(config.vocab_size, config.n_embd)
        self.wpe = nn.Embedding(config.block_size, config.n_embd)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.ln_f = nn.LayerNorm(config.n_embd)
        self.lm_head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        for p in self.parameters():
            if p.dim() > 1:
                nn.init.normal_(p, std=0.02 / math.sqrt(config.n_layer))

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        loss = None
        if targets is not None:
            loss = F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


def gpt(**kwargs) -> GPT:
    """The factory a spec names: flat ``model.args`` become the config object the model takes."""
    return GPT(GPTConfig(**kwargs))


class NextTokens(Dataset):
    """``(idx, targets)`` pairs of fixed-length token windows, the targets shifted by one."""

    def __init__(self, size: int = 128, block_size: int = 16, vocab_size: int = 64, seed: int = 0):
        g = torch.Generator().manual_seed(seed)
        self.stream = torch.randint(0, vocab_size, (size + block_size + 1,), generator=g)
        self.size, self.block_size = size, block_size

    def __len__(self) -> int:
        return self.size

    def __getitem__(self, i: int):
        window = self.stream[i: i + self.block_size + 1]
        return window[:-1], window[1:]


def next_tokens(size: int = 128, block_size: int = 16, vocab_size: int = 64) -> NextTokens:
    return NextTokens(size, block_size, vocab_size)
