"""Tiny randomly initialised `transformers` models (no download) and their sample batches.

Each factory returns ``(model, args, kwargs, loss_fn)``: ``model(*args, **kwargs)`` is one
training forward, ``loss_fn(output)`` its scalar loss. Dropout is on (training mode) where the
config has it, so that gradients equal eager PyTorch only when recomputations restore the RNG.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

transformers = None


def _tf():
    global transformers
    if transformers is None:
        import transformers as tf
        transformers = tf
    return transformers


def _seed(seed):
    torch.manual_seed(seed)


def _tokens(batch, seq, vocab, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, vocab, (batch, seq), generator=g)


def _lm_loss(out):
    logits = out.logits
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(),
                           _lm_loss.targets[:, 1:].reshape(-1))


def llama(batch=2, seq=16, layers=4, dim=32, seed=0, use_cache=False, device="cpu",
          dtype=torch.float32, dropout=0.1):
    tf = _tf()
    _seed(seed)
    cfg = tf.LlamaConfig(vocab_size=128, hidden_size=dim, intermediate_size=2 * dim,
                         num_hidden_layers=layers, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=max(64, seq), use_cache=use_cache,
                         attention_dropout=dropout)
    model = tf.LlamaForCausalLM(cfg).train().to(device, dtype)
    ids = _tokens(batch, seq, 128).to(device)
    mask = torch.ones(batch, seq, dtype=torch.long, device=device)
    return model, (), {"input_ids": ids, "attention_mask": mask}, _ce(ids)


def gpt2(batch=2, seq=16, layers=4, dim=32, seed=0, use_cache=False, device="cpu",
         dtype=torch.float32, dropout=0.1):
    """GPT2LMHeadModel; `dropout`: the config's three dropout rates (transformers' default)."""
    tf = _tf()
    _seed(seed)
    cfg = tf.GPT2Config(vocab_size=128, n_positions=max(64, seq), n_embd=dim, n_layer=layers,
                        n_head=4, use_cache=use_cache, resid_pdrop=dropout, embd_pdrop=dropout,
                        attn_pdrop=dropout)
    model = tf.GPT2LMHeadModel(cfg).train().to(device, dtype)
    ids = _tokens(batch, seq, 128).to(device)
    return model, (ids,), {}, _ce(ids)


def bert(batch=2, seq=16, layers=4, dim=32, seed=0):
    tf = _tf()
    _seed(seed)
    cfg = tf.BertConfig(vocab_size=128, hidden_size=dim, num_hidden_layers=layers,
                        num_attention_heads=4, intermediate_size=2 * dim,
                        max_position_embeddings=64)
    model = tf.BertForMaskedLM(cfg).train()
    ids = _tokens(batch, seq, 128)
    mask = torch.ones(batch, seq, dtype=torch.long)
    labels = _tokens(batch, seq, 128, seed=2)

    def loss_fn(out):
        return F.cross_entropy(out.logits.reshape(-1, out.logits.size(-1)), labels.reshape(-1))

    return model, (), {"input_ids": ids, "attention_mask": mask}, loss_fn


def bart(batch=2, seq=16, layers=3, dim=32, seed=0, use_cache=False):
    tf = _tf()
    _seed(seed)
    cfg = tf.BartConfig(vocab_size=128, d_model=dim, encoder_layers=layers,
                        decoder_layers=layers, encoder_attention_heads=4,
                        decoder_attention_heads=4, encoder_ffn_dim=2 * dim,
                        decoder_ffn_dim=2 * dim, max_position_embeddings=64,
                        use_cache=use_cache)
    model = tf.BartForConditionalGeneration(cfg).train()
    ids = _tokens(batch, seq, 128)
    dec = _tokens(batch, seq, 128, seed=3)
    labels = _tokens(batch, seq, 128, seed=4)

    def loss_fn(out):
        return F.cross_entropy(out.logits.reshape(-1, out.logits.size(-1)), labels.reshape(-1))

    return model, (), {"input_ids": ids, "decoder_input_ids": dec}, loss_fn


def _classifier(model, batch, size):
    """An image classifier in training mode, a batch of random images and its loss (5 classes)."""
    x = torch.randn(batch, 3, size, size)
    labels = torch.arange(batch) % 5

    def loss_fn(out):
        return F.cross_entropy(out.logits, labels)

    return model.train(), (x,), {}, loss_fn


def vit(batch=2, size=32, layers=4, dim=32, seed=0):
    tf = _tf()
    _seed(seed)
    cfg = tf.ViTConfig(image_size=size, patch_size=8, num_channels=3, hidden_size=dim,
                       num_hidden_layers=layers, num_attention_heads=4,
                       intermediate_size=2 * dim, num_labels=5, hidden_dropout_prob=0.1)
    return _classifier(tf.ViTForImageClassification(cfg), batch, size)


def resnet(batch=2, size=32, seed=0):
    tf = _tf()
    _seed(seed)
    cfg = tf.ResNetConfig(num_channels=3, embedding_size=8, hidden_sizes=[8, 16],
                          depths=[3, 3], layer_type="basic", num_labels=5)
    return _classifier(tf.ResNetForImageClassification(cfg), batch, size)


def convnext(batch=2, size=32, seed=0):
    tf = _tf()
    _seed(seed)
    # stochastic depth: each block's drop rate differs (a stack all the same) and draws from
    # the RNG, so recomputations must restore it
    cfg = tf.ConvNextConfig(num_channels=3, patch_size=2, num_stages=2, hidden_sizes=[8, 16],
                            depths=[3, 3], num_labels=5, drop_path_rate=0.1)
    return _classifier(tf.ConvNextForImageClassification(cfg), batch, size)


def _ce(ids):
    def loss_fn(out):
        logits = out.logits  # (a float32 loss of bf16 logits, as mixed-precision training does)
        return F.cross_entropy(logits[:, :-1].reshape(-1, logits.size(-1)).float(),
                               ids[:, 1:].reshape(-1))

    return loss_fn


HF = {"llama": llama, "gpt2": gpt2, "bert": bert, "bart": bart, "vit": vit, "resnet": resnet,
      "convnext": convnext}


class GPT2Logits(torch.nn.Module):
    """transformers' GPT-2 modules called in GPT2LMHeadModel's order (training, no cache, no
    mask) from a module fx traces (one layer per block, their insides untraced): the same
    attribute names as tests.torch_models.GPT (`blocks`, `ln_f`, `head`)."""

    class HiddenOnly(torch.nn.Module):
        def __init__(self, block):
            super().__init__()
            self.block = block

        def forward(self, h):
            out = self.block(h)
            return out[0] if isinstance(out, tuple) else out

    def __init__(self, lm):
        super().__init__()
        t = lm.transformer
        self.wte, self.wpe, self.drop, self.ln_f = t.wte, t.wpe, t.drop, t.ln_f
        self.blocks = torch.nn.ModuleList(self.HiddenOnly(b) for b in t.h)
        self.head = lm.lm_head

    def embed(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        return self.drop(self.wte(idx) + self.wpe(pos))

    def forward(self, idx):
        h = self.embed(idx)
        for block in self.blocks:
            h = block(h)
        return self.head(self.ln_f(h))
