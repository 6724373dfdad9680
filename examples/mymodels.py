"""Models for `schedlang run` and `schedlang trace` (the README's PyTorch examples).

    schedlang run examples/mymodels.py:make_gpt --budget 60%
    schedlang run examples/mymodels.py:make_moe --budget 70%

Each `make_*()` returns ``(model, sample_inputs, loss_fn)``: `model(*sample_inputs)` runs one
training batch and `loss_fn(outputs)` is its loss. Sizes are small enough for a CPU, with
activations that outweigh the parameters (a budget under plain execution's peak then has
plans that recompute). Seeded: equal calls give equal models and inputs.
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn


# --- a GPT-like transformer ---------------------------------------------------------------------
class CausalSelfAttention(nn.Module):
    def __init__(self, dim: int, heads: int, context: int, dropout: float):
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.attn_drop = nn.Dropout(dropout)
        self.resid_drop = nn.Dropout(dropout)
        self.register_buffer("mask", torch.tril(torch.ones(context, context, dtype=torch.bool)),
                             persistent=False)

    def forward(self, x):
        b, t, c = x.shape
        h = self.heads
        q, k, v = self.qkv(x).split(c, dim=2)
        q = q.view(b, t, h, c // h).transpose(1, 2)
        k = k.view(b, t, h, c // h).transpose(1, 2)
        v = v.view(b, t, h, c // h).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(c // h))
        att = att.masked_fill(~self.mask[:t, :t], float("-inf"))
        att = self.attn_drop(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(b, t, c)
        return self.resid_drop(self.proj(y))


class Block(nn.Module):
    def __init__(self, dim: int, heads: int, context: int, dropout: float):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, context, dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim),
                                 nn.Dropout(dropout))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int = 64, context: int = 16, dim: int = 32, heads: int = 4,
                 layers: int = 3, dropout: float = 0.1):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, dim)
        self.pos_emb = nn.Embedding(context, dim)
        self.drop = nn.Dropout(dropout)
        self.blocks = nn.ModuleList(Block(dim, heads, context, dropout) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        t = idx.size(1)
        pos = torch.arange(0, t, dtype=torch.long, device=idx.device)
        x = self.drop(self.tok_emb(idx) + self.pos_emb(pos))
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def next_token_loss(targets):
    """Cross-entropy of logits against `targets` (the next token of each position)."""
    def loss_fn(logits):
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))
    return loss_fn


def make_gpt(batch: int = 8, context: int = 64, vocab: int = 64, dim: int = 64, heads: int = 4,
             layers: int = 4, dropout: float = 0.1, seed: int = 0):
    """GPT-like: token and position embeddings, `blocks` (a ModuleList), a final LayerNorm and
    the head; the loss is the cross-entropy against the next token."""
    torch.manual_seed(seed)
    model = GPT(vocab, context, dim, heads, layers, dropout)
    model.train()
    idx = torch.randint(0, vocab, (batch, context))
    return model, (idx,), next_token_loss(torch.roll(idx, -1, dims=1))


# --- a top-k mixture of experts -----------------------------------------------------------------
class TopKMoE(nn.Module):
    """Each token goes to its `k` best experts of `experts` (a learned router), whose outputs
    are summed with the router's softmax weights (no capacity limit, no auxiliary loss)."""

    def __init__(self, dim: int, hidden: int, experts: int, k: int):
        super().__init__()
        self.k = k
        self.router = nn.Linear(dim, experts, bias=False)
        self.experts = nn.ModuleList(
            nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
            for _ in range(experts))

    def forward(self, x):
        flat = x.reshape(-1, x.size(-1))
        weights, chosen = torch.topk(F.softmax(self.router(flat), dim=-1), self.k, dim=-1)
        weights = weights / weights.sum(-1, keepdim=True)
        out = torch.zeros_like(flat)
        for e, expert in enumerate(self.experts):
            rows, slot = torch.nonzero(chosen == e, as_tuple=True)
            if rows.numel():
                out = out.index_add(0, rows, expert(flat[rows]) * weights[rows, slot, None])
        return out.reshape(x.shape)


class MoEBlock(nn.Module):
    def __init__(self, dim: int, heads: int, context: int, experts: int, k: int):
        super().__init__()
        self.ln1 = nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, context, 0.0)
        self.ln2 = nn.LayerNorm(dim)
        self.moe = TopKMoE(dim, 2 * dim, experts, k)

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.moe(self.ln2(x))


class MoE(nn.Module):
    def __init__(self, vocab: int, context: int, dim: int, heads: int, layers: int,
                 experts: int, k: int):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, dim)
        self.pos_emb = nn.Embedding(context, dim)
        self.blocks = nn.ModuleList(MoEBlock(dim, heads, context, experts, k)
                                    for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.tok_emb(idx) + self.pos_emb(pos)
        for block in self.blocks:
            x = block(x)
        return self.head(self.ln_f(x))


def make_moe(batch: int = 8, context: int = 64, vocab: int = 64, dim: int = 64, heads: int = 4,
             layers: int = 3, experts: int = 4, k: int = 2, seed: int = 0):
    """A 3-layer transformer whose MLPs are top-2-of-4 mixtures of experts (data-dependent
    routing: each expert sees the tokens the router sends it)."""
    torch.manual_seed(seed)
    model = MoE(vocab, context, dim, heads, layers, experts, k)
    model.train()
    idx = torch.randint(0, vocab, (batch, context))
    return model, (idx,), next_token_loss(torch.roll(idx, -1, dims=1))
