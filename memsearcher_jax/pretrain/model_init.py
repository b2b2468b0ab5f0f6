"""The reading base's initial model: a Qwen2 shape from cfg.model, with the structured init that
lets it learn to read (mimetic attention, positional heads, name and value rows tied per type)."""
from __future__ import annotations

import jax.numpy as jnp
import ml_collections
import numpy as np
from flax import nnx

from memsearcher_jax.agent.prompts import PromptBuilder
from memsearcher_jax.data.vocab import ReadingVocab, name_groups, value_groups
from memsearcher_jax.models import ModelConfig, Qwen2


def base_model_config(cfg: ml_collections.ConfigDict, vocab_size: int, eos_id: int, pad_id: int) -> ModelConfig:
    m = cfg.model
    return ModelConfig(vocab_size=-(-vocab_size // 64) * 64, hidden_size=m.hidden_size,
                       intermediate_size=m.intermediate_size, num_layers=m.num_layers, num_heads=m.num_heads,
                       num_kv_heads=m.num_kv_heads, head_dim=m.head_dim, rope_theta=m.rope_theta,
                       tie_word_embeddings=True, max_position_embeddings=4096, bos_token_id=pad_id,
                       eos_token_id=eos_id, remat=bool(m.get("remat", False)),
                       train_query_block=int(m.get("train_query_block", 0)))


def set_codes(embed: np.ndarray, groups: list[list[int]], seed: int) -> np.ndarray:
    """Each row of a group becomes the group's current mean + its own random code of norm ~1
    (std 1/sqrt(d) per entry, the scale trained embeddings reach). With tied updates the mean
    is then learnt for the group and the codes stay fixed: every member looks alike but for
    its code, which is what copying reads."""
    emb = np.asarray(embed, np.float32).copy()
    rng = np.random.default_rng(seed)
    d = emb.shape[1]
    for ids in groups:
        emb[ids] = emb[ids].mean(axis=0) + rng.normal(0.0, 1.0 / np.sqrt(d), (len(ids), d))
    return emb


def mimetic_attention(q: np.ndarray, k: np.ndarray, v: np.ndarray, o: np.ndarray,
                      alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Mimetic initialisation of attention (Trockman & Kolter, 2023): each key kernel moves a
    fraction alpha of the way to the query kernel of its group's first head, each output kernel
    to the transpose of its group's value kernel, so W_q W_k^T and W_v W_o start near positive
    semi-definite: heads begin by attending to similar content and copying what they attend to,
    the two halves of the reading circuit. q [L, D, H, Dh], k and v [L, D, K, Dh], o [L, H, Dh, D];
    returns the new (k, o)."""
    k, o = np.array(k, np.float32), np.array(o, np.float32)
    heads, groups = q.shape[2], k.shape[2]
    per = heads // groups
    for g in range(groups):
        k[:, :, g] = (1 - alpha) * k[:, :, g] + alpha * q[:, :, g * per]
        for h in range(g * per, (g + 1) * per):
            o[:, h] = (1 - alpha) * o[:, h] + alpha * np.swapaxes(v[:, :, g], 1, 2)
    return k, o


def positional_biases(q_bias: np.ndarray, k_bias: np.ndarray, offsets: dict[int, tuple[int, ...]], strength: float,
                      rope_theta: float) -> tuple[np.ndarray, np.ndarray]:
    """Query / key biases that start heads as positional heads: in layer L, head h attends to the
    token `offsets[L][h % len]` places before it. Each rope pair i of the key bias is
    (strength, 0) and of head h's query bias strength * (cos, -sin)(d * theta_i), so the biases'
    score at distance t is strength^2 * sum_i cos(theta_i (t - d)), largest at t = d (the content
    terms start small). Reading needs such heads first (a token's neighbours moved into its own
    position) and gradient descent is slow to find them. q_bias [L, H, Dh], k_bias [L, K, Dh];
    returns new arrays, the layers not named unchanged."""
    q_bias, k_bias = np.array(q_bias, np.float32), np.array(k_bias, np.float32)
    heads, head_dim = q_bias.shape[1], q_bias.shape[2]
    half = head_dim // 2
    theta = 1.0 / (rope_theta ** (np.arange(0, head_dim, 2) / head_dim))
    for layer, deltas in offsets.items():
        k_bias[layer, :, :half], k_bias[layer, :, half:] = strength, 0.0
        for h in range(heads):
            d = deltas[h % len(deltas)]
            q_bias[layer, h, :half] = strength * np.cos(d * theta)
            q_bias[layer, h, half:] = -strength * np.sin(d * theta)
    return q_bias, k_bias


def init_model(cfg: ml_collections.ConfigDict, vocab: ReadingVocab, builder: PromptBuilder, vocab_size: int):
    """The initial model and its tied embedding rows (names / values: a shared vector per type + a code each)."""
    mc = base_model_config(cfg, vocab_size, builder.eos_id, builder.pad_id)
    model = Qwen2(mc, rngs=nnx.Rngs(cfg.model.init_seed))
    alpha = float(cfg.model.get("mimetic_init", 0.0))
    if alpha:
        layers = model.layers
        k, o = mimetic_attention(np.asarray(layers.q_kernel[...]), np.asarray(layers.k_kernel[...]),
                                 np.asarray(layers.v_kernel[...]), np.asarray(layers.o_kernel[...]), alpha)
        layers.k_kernel[...] = jnp.asarray(k, layers.k_kernel[...].dtype)
        layers.o_kernel[...] = jnp.asarray(o, layers.o_kernel[...].dtype)
    offsets = {int(layer): tuple(d) for layer, d in enumerate(cfg.model.get("positional_heads", ()))}
    offsets = {layer: d for layer, d in offsets.items() if d}
    if offsets:
        layers = model.layers
        qb, kb = positional_biases(np.asarray(layers.q_bias[...]), np.asarray(layers.k_bias[...]), offsets,
                                   float(cfg.model.positional_strength), cfg.model.rope_theta)
        layers.q_bias[...] = jnp.asarray(qb, layers.q_bias[...].dtype)
        layers.k_bias[...] = jnp.asarray(kb, layers.k_bias[...].dtype)
    tied = (name_groups(vocab) if cfg.model.tie_names else []) + (value_groups(vocab) if cfg.model.tie_values else [])
    if tied:
        model.embed[...] = jnp.asarray(set_codes(model.embed[...], tied, cfg.model.init_seed), model.embed[...].dtype)
    return model, tied


def model_summary(model: Qwen2, tied: list, vocab_size: int) -> str:
    """One line on the initial model: its size besides the embedding, and how its name rows train."""
    mc = model.config
    return (f"model: {mc.num_params() - mc.vocab_size * mc.hidden_size:,} parameters besides the "
            f"{mc.vocab_size}x{mc.hidden_size} embedding ({sum(map(len, tied))} name/value rows as "
            f"{'a shared vector per type + a fixed code each' if tied else 'trained one by one'}); "
            f"vocabulary {vocab_size}")
