"""More `transformers` architectures from tiny random configs (no download), as a new user
would build them: the survey of `bench/bench_architectures.py` and the parametrized tests of
`tests/pytorch/test_architectures.py`.

Each entry of `ARCHITECTURES` is a factory ``make(batch=..., seq=..., layers=..., dim=...,
seed=0)`` returning ``(model, args, kwargs, loss_fn)`` as `hf_models`' factories do: the model
in training mode, dropout on wherever the config has a rate, the loss a cross-entropy on the
output's logits. They cover decoder-only LMs (OPT, GPT-Neo, GPTBigCode, Falcon, Bloom, GPT-J,
Mistral, Mixtral: a mixture of experts, Qwen2, Phi, Gemma, Gemma 2), encoder-decoders (T5, Whisper),
encoders (RoBERTa, DistilBERT, ALBERT — one layer module called for every layer —, ELECTRA,
DeBERTa-v2) and vision models
(Swin, DeiT, CLIP's and SigLIP's vision towers) and Wav2Vec2 (LayerDrop, and SpecAugment's masks
drawn from NumPy: steps compared with eager seed NumPy too).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .hf_models import _ce, _classifier, _seed, _tf, _tokens

__all__ = ["ARCHITECTURES", "SIZES"]

VOCAB = 128
P = 0.1  # every dropout rate


def _labelled(batch, seq, seed=2):
    labels = _tokens(batch, seq, VOCAB, seed=seed)

    def loss_fn(out):
        logits = out.logits
        return F.cross_entropy(logits.reshape(-1, logits.size(-1)).float(), labels.reshape(-1))

    return loss_fn


def _causal(cls_name, cfg_name, batch, seq, seed, **cfg):
    tf = _tf()
    _seed(seed)
    model = getattr(tf, cls_name)(getattr(tf, cfg_name)(vocab_size=VOCAB, **cfg)).train()
    ids = _tokens(batch, seq, VOCAB)
    mask = torch.ones(batch, seq, dtype=torch.long)
    return model, (), {"input_ids": ids, "attention_mask": mask}, _ce(ids)


def _masked(cls_name, cfg_name, batch, seq, seed, mask=True, **cfg):
    tf = _tf()
    _seed(seed)
    model = getattr(tf, cls_name)(getattr(tf, cfg_name)(vocab_size=VOCAB, **cfg)).train()
    kwargs = {"input_ids": _tokens(batch, seq, VOCAB)}
    if mask:
        kwargs["attention_mask"] = torch.ones(batch, seq, dtype=torch.long)
    return model, (), kwargs, _labelled(batch, seq)


def opt(batch=2, seq=16, layers=2, dim=32, seed=0):
    return _causal("OPTForCausalLM", "OPTConfig", batch, seq, seed, hidden_size=dim,
                   num_hidden_layers=layers, ffn_dim=2 * dim, num_attention_heads=4,
                   max_position_embeddings=max(64, seq), word_embed_proj_dim=dim, dropout=P,
                   attention_dropout=P, use_cache=False)


def gpt_neo(batch=2, seq=16, layers=2, dim=32, seed=0):
    # global and local (windowed) attention alternating, as GPT-Neo's checkpoints have them
    types = [[["global", "local"], layers // 2]] if layers % 2 == 0 else [[["global"], layers]]
    return _causal("GPTNeoForCausalLM", "GPTNeoConfig", batch, seq, seed, hidden_size=dim,
                   num_layers=layers, num_heads=4, max_position_embeddings=max(64, seq),
                   attention_types=types, window_size=8, embed_dropout=P, attention_dropout=P,
                   resid_dropout=P, use_cache=False, bos_token_id=0, eos_token_id=0)


def gpt_bigcode(batch=2, seq=16, layers=2, dim=32, seed=0):
    return _causal("GPTBigCodeForCausalLM", "GPTBigCodeConfig", batch, seq, seed, n_embd=dim,
                   n_layer=layers, n_head=4, n_positions=max(64, seq), multi_query=True,
                   resid_pdrop=P, embd_pdrop=P, attn_pdrop=P, use_cache=False)


def falcon(batch=2, seq=16, layers=2, dim=32, seed=0):
    return _causal("FalconForCausalLM", "FalconConfig", batch, seq, seed, hidden_size=dim,
                   num_hidden_layers=layers, num_attention_heads=4, hidden_dropout=P,
                   attention_dropout=P, use_cache=False)


def bloom(batch=2, seq=16, layers=2, dim=32, seed=0):
    return _causal("BloomForCausalLM", "BloomConfig", batch, seq, seed, hidden_size=dim,
                   n_layer=layers, n_head=4, hidden_dropout=P, attention_dropout=P,
                   use_cache=False)


def gptj(batch=2, seq=16, layers=2, dim=32, seed=0):
    """GPT-J: attention and MLP side by side on one layer norm; CPU dropout writes its noise in
    place, which a selective checkpoint must not keep (`block_ops._in_place`)."""
    return _causal("GPTJForCausalLM", "GPTJConfig", batch, seq, seed, n_embd=dim,
                   n_layer=layers, n_head=4, rotary_dim=4, n_positions=max(64, seq),
                   resid_pdrop=P, embd_pdrop=P, attn_pdrop=P, bos_token_id=0, eos_token_id=0,
                   use_cache=False)


def _llama_like(cls_name, cfg_name, batch, seq, layers, dim, seed, **extra):
    return _causal(cls_name, cfg_name, batch, seq, seed, hidden_size=dim,
                   intermediate_size=2 * dim, num_hidden_layers=layers, num_attention_heads=4,
                   num_key_value_heads=2, max_position_embeddings=max(64, seq),
                   attention_dropout=P, use_cache=False, **extra)


def mistral(batch=2, seq=16, layers=2, dim=32, seed=0):
    return _llama_like("MistralForCausalLM", "MistralConfig", batch, seq, layers, dim, seed,
                       sliding_window=8)


def mixtral(batch=2, seq=16, layers=2, dim=32, seed=0):
    """Mixtral: a sparse mixture of experts in every block (routing by the data: each expert
    runs on the tokens routed to it)."""
    return _llama_like("MixtralForCausalLM", "MixtralConfig", batch, seq, layers, dim, seed,
                       num_local_experts=4, num_experts_per_tok=2)


def qwen2(batch=2, seq=16, layers=2, dim=32, seed=0):
    return _llama_like("Qwen2ForCausalLM", "Qwen2Config", batch, seq, layers, dim, seed)


def gemma(batch=2, seq=16, layers=2, dim=32, seed=0):
    return _llama_like("GemmaForCausalLM", "GemmaConfig", batch, seq, layers, dim, seed,
                       head_dim=dim // 4)


def gemma2(batch=2, seq=16, layers=2, dim=32, seed=0):
    """Gemma 2: sliding-window layers, soft-capped attention logits and a soft-capped head
    (the logits divided, squashed by tanh and scaled back: a glue whose backward its forward
    does not show, `glue_memory`)."""
    return _llama_like("Gemma2ForCausalLM", "Gemma2Config", batch, seq, layers, dim, seed,
                       head_dim=dim // 4, sliding_window=8)


def phi(batch=2, seq=16, layers=2, dim=32, seed=0):
    return _causal("PhiForCausalLM", "PhiConfig", batch, seq, seed, hidden_size=dim,
                   intermediate_size=2 * dim, num_hidden_layers=layers, num_attention_heads=4,
                   max_position_embeddings=max(64, seq), resid_pdrop=P, embd_pdrop=P,
                   attention_dropout=P, use_cache=False)


def t5(batch=2, seq=16, layers=2, dim=32, seed=0):
    tf = _tf()
    _seed(seed)
    cfg = tf.T5Config(vocab_size=VOCAB, d_model=dim, d_kv=dim // 4, d_ff=2 * dim,
                      num_layers=layers, num_heads=4, dropout_rate=P, use_cache=False,
                      decoder_start_token_id=0, pad_token_id=0)
    model = tf.T5ForConditionalGeneration(cfg).train()
    kwargs = {"input_ids": _tokens(batch, seq, VOCAB),
              "decoder_input_ids": _tokens(batch, seq, VOCAB, seed=3)}
    return model, (), kwargs, _labelled(batch, seq, seed=4)


def whisper(batch=2, seq=16, layers=2, dim=32, seed=0):
    tf = _tf()
    _seed(seed)
    frames = 2 * seq  # the encoder's two convolutions halve the frames: `seq` positions
    cfg = tf.WhisperConfig(vocab_size=VOCAB, num_mel_bins=16, d_model=dim, encoder_layers=layers,
                           decoder_layers=layers, encoder_attention_heads=4,
                           decoder_attention_heads=4, encoder_ffn_dim=2 * dim,
                           decoder_ffn_dim=2 * dim, max_source_positions=seq,
                           max_target_positions=max(64, seq), dropout=P, attention_dropout=P,
                           use_cache=False, pad_token_id=0, bos_token_id=1, eos_token_id=2,
                           decoder_start_token_id=1)
    model = tf.WhisperForConditionalGeneration(cfg).train()
    g = torch.Generator().manual_seed(5)
    kwargs = {"input_features": torch.randn(batch, 16, frames, generator=g),
              "decoder_input_ids": _tokens(batch, seq, VOCAB, seed=3)}
    return model, (), kwargs, _labelled(batch, seq, seed=4)


def roberta(batch=2, seq=16, layers=2, dim=32, seed=0):
    return _masked("RobertaForMaskedLM", "RobertaConfig", batch, seq, seed, hidden_size=dim,
                   num_hidden_layers=layers, num_attention_heads=4, intermediate_size=2 * dim,
                   max_position_embeddings=max(64, seq) + 2, pad_token_id=1,
                   hidden_dropout_prob=P, attention_probs_dropout_prob=P)


def distilbert(batch=2, seq=16, layers=2, dim=32, seed=0):
    return _masked("DistilBertForMaskedLM", "DistilBertConfig", batch, seq, seed, dim=dim,
                   n_layers=layers, n_heads=4, hidden_dim=2 * dim,
                   max_position_embeddings=max(64, seq), dropout=P, attention_dropout=P)


def albert(batch=2, seq=16, layers=2, dim=32, seed=0):
    # one layer group: the same AlbertLayer module runs every layer (shared weights)
    return _masked("AlbertForMaskedLM", "AlbertConfig", batch, seq, seed, embedding_size=16,
                   hidden_size=dim, num_hidden_layers=max(layers, 2), num_attention_heads=4,
                   intermediate_size=2 * dim, max_position_embeddings=max(64, seq),
                   hidden_dropout_prob=P, attention_probs_dropout_prob=P)


def electra(batch=2, seq=16, layers=2, dim=32, seed=0):
    return _masked("ElectraForMaskedLM", "ElectraConfig", batch, seq, seed, embedding_size=16,
                   hidden_size=dim, num_hidden_layers=layers, num_attention_heads=4,
                   intermediate_size=2 * dim, max_position_embeddings=max(64, seq),
                   hidden_dropout_prob=P, attention_probs_dropout_prob=P)


def deberta_v2(batch=2, seq=16, layers=2, dim=32, seed=0):
    # relative attention: the encoder hands every layer its relative embeddings
    return _masked("DebertaV2ForMaskedLM", "DebertaV2Config", batch, seq, seed,
                   hidden_size=dim, num_hidden_layers=layers, num_attention_heads=4,
                   intermediate_size=2 * dim, max_position_embeddings=max(64, seq),
                   relative_attention=True, position_buckets=16,
                   pos_att_type=["p2c", "c2p"], hidden_dropout_prob=P,
                   attention_probs_dropout_prob=P)


def _image_size(seq):
    return 32 if seq <= 16 else 64


def swin(batch=2, seq=16, layers=2, dim=32, seed=0):
    tf = _tf()
    _seed(seed)
    size = _image_size(seq)
    cfg = tf.SwinConfig(image_size=size, patch_size=4, embed_dim=dim // 2,
                        depths=[layers, layers], num_heads=[2, 4], window_size=4,
                        num_labels=5, hidden_dropout_prob=P, attention_probs_dropout_prob=P,
                        drop_path_rate=P)
    return _classifier(tf.SwinForImageClassification(cfg), batch, size)


def deit(batch=2, seq=16, layers=2, dim=32, seed=0):
    tf = _tf()
    _seed(seed)
    size = _image_size(seq)
    cfg = tf.DeiTConfig(image_size=size, patch_size=8, hidden_size=dim, num_hidden_layers=layers,
                        num_attention_heads=4, intermediate_size=2 * dim, num_labels=5,
                        hidden_dropout_prob=P, attention_probs_dropout_prob=P)
    return _classifier(tf.DeiTForImageClassification(cfg), batch, size)


def _vision_tower(cls_name, cfg_name, vision_cfg_name, batch, seq, layers, dim, seed):
    tf = _tf()
    _seed(seed)
    size = _image_size(seq)
    vision = getattr(tf, vision_cfg_name)(image_size=size, patch_size=8, hidden_size=dim,
                                          num_hidden_layers=layers, num_attention_heads=4,
                                          intermediate_size=2 * dim, attention_dropout=P)
    cfg = getattr(tf, cfg_name)(vision_config=vision.to_dict(), num_labels=5)
    return _classifier(getattr(tf, cls_name)(cfg), batch, size)


def clip_vision(batch=2, seq=16, layers=2, dim=32, seed=0):
    return _vision_tower("CLIPForImageClassification", "CLIPConfig", "CLIPVisionConfig", batch,
                         seq, layers, dim, seed)


def siglip_vision(batch=2, seq=16, layers=2, dim=32, seed=0):
    return _vision_tower("SiglipForImageClassification", "SiglipConfig", "SiglipVisionConfig",
                         batch, seq, layers, dim, seed)


def wav2vec2(batch=2, seq=16, layers=2, dim=32, seed=0):
    """Wav2Vec2 for audio classification, as configured by default in training: LayerDrop
    (each layer skipped with probability 0.1: drawn from torch's generator) and SpecAugment
    (time masks drawn from NumPy's global generator, in the model's own code)."""
    tf = _tf()
    _seed(seed)
    cfg = tf.Wav2Vec2Config(hidden_size=dim, num_hidden_layers=layers, num_attention_heads=4,
                            intermediate_size=2 * dim, conv_dim=(16, 16), conv_stride=(5, 2),
                            conv_kernel=(10, 3), num_conv_pos_embeddings=16,
                            num_conv_pos_embedding_groups=4, num_labels=5, hidden_dropout=P,
                            attention_dropout=P)
    model = tf.Wav2Vec2ForSequenceClassification(cfg).train()
    g = torch.Generator().manual_seed(5)
    samples = torch.randn(batch, 20 * seq + 20, generator=g)  # seq frames after the convs
    labels = torch.arange(batch) % 5

    def loss_fn(out):
        return F.cross_entropy(out.logits, labels)

    return model, (samples,), {}, loss_fn


ARCHITECTURES = {"opt": opt, "gpt_neo": gpt_neo, "gpt_bigcode": gpt_bigcode, "falcon": falcon,
                 "bloom": bloom, "gptj": gptj, "mistral": mistral, "mixtral": mixtral,
                 "qwen2": qwen2, "phi": phi, "gemma": gemma, "gemma2": gemma2, "t5": t5,
                 "whisper": whisper, "roberta": roberta,
                 "distilbert": distilbert, "albert": albert, "electra": electra,
                 "deberta_v2": deberta_v2, "swin": swin, "deit": deit,
                 "clip_vision": clip_vision, "siglip_vision": siglip_vision,
                 "wav2vec2": wav2vec2}

#: sizes where activations outweigh parameters (a budget well below plain execution exists)
SIZES = {"batch": 4, "seq": 64, "layers": 4, "dim": 32}
