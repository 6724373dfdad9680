"""Small PyTorch models shared by the PyTorch tests (tracing, profiling, runtime).

Each `make_*()` returns `(model, sample_inputs, loss_fn)`: `model(*sample_inputs)` runs, and
`loss_fn(outputs)` turns what the model returns into a scalar. Sizes are small (CPU tests) but
activations outweigh parameters, so that recomputation can save memory (solving the traced
graph at 70% of its no-recomputation peak must be feasible); the factories take keyword
arguments to scale them (benchmarks). Seeded: equal calls give equal models and inputs.
Importing this module needs torch.
"""
from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


def _seed(seed: int) -> None:
    torch.manual_seed(seed)


# --- MLP as nn.Sequential --------------------------------------------------------------------
def make_mlp(batch: int = 256, width: int = 32, depth: int = 4, seed: int = 0):
    """nn.Sequential of Linear/ReLU pairs and a final Linear; loss: mean of squares."""
    _seed(seed)
    mods: list[nn.Module] = []
    for _ in range(depth):
        mods += [nn.Linear(width, width), nn.ReLU()]
    mods.append(nn.Linear(width, 4))
    model = nn.Sequential(*mods)
    x = torch.randn(batch, width)
    return model, (x,), lambda out: out.pow(2).mean()


# --- MLP with dropout --------------------------------------------------------------------------
def make_dropout_mlp(batch: int = 256, width: int = 32, hidden: int = 64, seed: int = 0):
    """nn.Sequential with Dropout between layers (training mode): tests RNG reproduction."""
    _seed(seed)
    model = nn.Sequential(
        nn.Linear(width, hidden), nn.GELU(), nn.Dropout(0.2),
        nn.Linear(hidden, hidden), nn.GELU(), nn.Dropout(0.2),
        nn.Linear(hidden, width),
    )
    model.train()
    x = torch.randn(batch, width, requires_grad=True)
    return model, (x,), lambda out: out.pow(2).mean()


# --- GPT-like transformer ----------------------------------------------------------------------
# the model's home is the README's example module (examples/mymodels.py), loaded by path so
# that this file also runs as `schedlang run tests/torch_models.py:make_gpt`
_spec = importlib.util.spec_from_file_location(
    "mymodels", Path(__file__).resolve().parents[2] / "examples" / "mymodels.py")
assert _spec is not None and _spec.loader is not None  # a path ending in .py always has both
mymodels = sys.modules.get("mymodels") or importlib.util.module_from_spec(_spec)
if "mymodels" not in sys.modules:
    sys.modules["mymodels"] = mymodels
    _spec.loader.exec_module(mymodels)
CausalSelfAttention, Block, GPT = mymodels.CausalSelfAttention, mymodels.Block, mymodels.GPT


def make_gpt(batch: int = 2, context: int = 16, vocab: int = 64, dim: int = 32, heads: int = 4,
             layers: int = 3, dropout: float = 0.1, seed: int = 0, device="cpu",
             dtype=torch.float32):
    """GPT-like: token + position embeddings, `blocks` (ModuleList), final LayerNorm, head.
    Loss: cross-entropy against the next token. `device`, `dtype`: where the model, its inputs
    and the loss's targets live, and the parameters' type (the same model on every device:
    made on the CPU, then moved)."""
    _seed(seed)
    model = GPT(vocab, context, dim, heads, layers, dropout)
    model.train()
    idx = torch.randint(0, vocab, (batch, context))
    targets = torch.roll(idx, -1, dims=1).to(device)
    model, idx = model.to(device, dtype), idx.to(device)

    def loss_fn(logits):
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), targets.reshape(-1))

    return model, (idx,), loss_fn


# --- blocks called with keyword tensors only ---------------------------------------------------
class KeywordBlock(nn.Module):
    """A residual MLP block with dropout that takes its tensors as keywords only, as model
    code may call a layer (``layer(hidden_states=h, gate=g)``)."""

    def __init__(self, dim: int, dropout: float):
        super().__init__()
        self.ln = nn.LayerNorm(dim)
        self.up = nn.Linear(dim, 4 * dim)
        self.down = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, *, hidden_states, gate):
        h = self.drop(F.gelu(self.up(self.ln(hidden_states))))
        return hidden_states + self.drop(self.down(h)) * gate


class KeywordModel(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, dropout: float):
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.blocks = nn.ModuleList(KeywordBlock(dim, dropout) for _ in range(layers))
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx):
        h = self.emb(idx)
        gate = torch.sigmoid(h.mean(-1, keepdim=True))  # glue read by every block
        for block in self.blocks:
            h = block(hidden_states=h, gate=gate)
        return self.head(h)


def make_keyword_blocks(batch: int = 4, context: int = 16, vocab: int = 64, dim: int = 32,
                        layers: int = 4, dropout: float = 0.2, seed: int = 0, device="cpu"):
    """`KeywordModel`: blocks with dropout called with keyword tensors only (the hook front
    end's case where torch's checkpoint alone would not see the tensors' devices). Loss:
    cross-entropy against the next token."""
    _seed(seed)
    model = KeywordModel(vocab, dim, layers, dropout).train()
    idx = torch.randint(0, vocab, (batch, context))
    targets = torch.roll(idx, -1, dims=1).to(device)
    model, idx = model.to(device), idx.to(device)

    def loss_fn(logits):
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))

    return model, (idx,), loss_fn


# --- U-Net-like CNN ----------------------------------------------------------------------------
def _double_conv(cin: int, cout: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(cout, cout, 3, padding=1), nn.ReLU())


class UNet(nn.Module):
    """Two levels: encoder convs, max pooling, a bottleneck, a decoder that upsamples and
    concatenates the encoder's output of the same level (skip connections across levels)."""

    def __init__(self, cin: int = 3, base: int = 4, classes: int = 2):
        super().__init__()
        self.enc1 = _double_conv(cin, base)
        self.enc2 = _double_conv(base, 2 * base)
        self.bottleneck = _double_conv(2 * base, 4 * base)
        self.up2 = nn.ConvTranspose2d(4 * base, 2 * base, 2, stride=2)
        self.dec2 = _double_conv(4 * base, 2 * base)
        self.up1 = nn.ConvTranspose2d(2 * base, base, 2, stride=2)
        self.dec1 = _double_conv(2 * base, base)
        self.out = nn.Conv2d(base, classes, 1)

    def forward(self, x):
        e1 = self.enc1(x)
        e2 = self.enc2(F.max_pool2d(e1, 2))
        b = self.bottleneck(F.max_pool2d(e2, 2))
        d2 = self.dec2(torch.cat([self.up2(b), e2], dim=1))
        d1 = self.dec1(torch.cat([self.up1(d2), e1], dim=1))
        return self.out(d1)


def make_unet(batch: int = 2, size: int = 32, cin: int = 3, base: int = 4, seed: int = 0):
    """U-Net-like CNN; loss: mean of squares of the logits."""
    _seed(seed)
    model = UNet(cin, base)
    x = torch.randn(batch, cin, size, size)
    return model, (x,), lambda out: out.pow(2).mean()


ALL = {"mlp": make_mlp, "dropout_mlp": make_dropout_mlp, "gpt": make_gpt, "unet": make_unet}


class _Stages(nn.Module):
    """Two stages, each an nn.Sequential of two residual blocks of different widths (no
    repeated stack), pooling between them in the model's own forward."""

    def __init__(self, c: int = 8):
        super().__init__()
        self.stem = nn.Conv2d(3, c, 3, padding=1)
        self.stage1 = nn.Sequential(_Res(c, 2 * c), _Res(2 * c, 2 * c))
        self.stage2 = nn.Sequential(_Res(2 * c, 4 * c), _Res(4 * c, 4 * c))
        self.head = nn.Linear(4 * c, 5)

    def forward(self, x):
        x = self.stage1(self.stem(x))
        x = self.stage2(F.max_pool2d(x, 2))
        return self.head(x.mean((2, 3)))


def make_stages(batch: int = 4, size: int = 32, seed: int = 0):
    torch.manual_seed(seed)
    model = _Stages()
    x = torch.randn(batch, 3, size, size)
    return model, (x,), {}, lambda out: out.pow(2).mean()


class _Res(nn.Module):
    def __init__(self, cin: int, cout: int):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, padding=1)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1)
        self.skip = nn.Conv2d(cin, cout, 1)

    def forward(self, x):
        return F.relu(self.conv2(F.relu(self.conv1(x))) + self.skip(x))
