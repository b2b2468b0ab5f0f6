"""Qwen2 / Qwen2.5 and Qwen3 (dense) decoder as a Flax NNX module.

One module serves both families (`ModelConfig.model_type`): Qwen2 adds biases to the q/k/v
projections (`config.attention_bias`); Qwen3 has none and RMS-normalises every query and
key head before rope (`config.qk_norm`, weights `q_norm`/`k_norm` [L, Dh]). Parameters a
family lacks do not exist in its module.

Layer parameters are stacked along a leading [L] axis, so the same parameter layout
serves a Python loop over layers and `lax.scan` (`ModelConfig.scan_layers`), and the
Hugging Face key table maps `model.layers.{i}.*` onto slice i of one array.

`model(input_ids, positions=None, attention_mask=None) -> logits [B, T, V]` trains and
scores padded batches (left or right padding, causal + padding mask).

The decoder's math is written once, as the module-level functions below (RMSNorm, rope,
the SwiGLU activation, the attention mask, scores and softmax): `Qwen2._layer` uses them
and so does the sampler's `sampling.layers.LayerMath`, which keeps only its own weight
layout and its cached-attention forms.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from memsearcher_jax.models.config import ModelConfig
from memsearcher_jax.models.sharding import ShardingConfig, constrain

NEG_INF = -1e30  # finite "minus infinity": a fully masked (padding) query row stays finite


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """RMSNorm in float32, cast back to x's dtype before the scale (as transformers does)."""
    xf = x.astype(jnp.float32)
    xf = xf * jax.lax.rsqrt(jnp.mean(xf * xf, axis=-1, keepdims=True) + eps)
    return weight.astype(x.dtype) * xf.astype(x.dtype)


def rope_cos_sin(positions: jax.Array, head_dim: int, theta: float) -> tuple[jax.Array, jax.Array]:
    """positions [B, T] -> cos, sin [B, T, 1, Dh] in float32 (half-rotation layout)."""
    inv_freq = 1.0 / (theta ** (jnp.arange(0, head_dim, 2, dtype=jnp.float32) / head_dim))
    freqs = positions.astype(jnp.float32)[..., None] * inv_freq  # [B, T, Dh/2]
    emb = jnp.concatenate([freqs, freqs], axis=-1)[:, :, None, :]
    return jnp.cos(emb), jnp.sin(emb)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """x [B, T, N, Dh]; rotate-half convention of the Hugging Face Qwen2 port."""
    xf = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-xf[..., half:], xf[..., :half]], axis=-1)
    return (xf * cos + rotated * sin).astype(x.dtype)


def swiglu(gate: jax.Array, up: jax.Array) -> jax.Array:
    """The MLP's activation on its gate and up projections: silu(gate) * up."""
    return jax.nn.silu(gate) * up


def slot_mask(valid: jax.Array, first_slot, t: int) -> jax.Array:
    """valid [B, S] (slots holding real tokens) -> mask [B, T, S] (True = may attend): the
    query at slot first_slot + i attends to the valid slots up to its own. With
    first_slot 0 and S == T it is the causal + padding mask of a padded batch."""
    q_slot = first_slot + jnp.arange(t)
    return valid[:, None, :] & (jnp.arange(valid.shape[1])[None, None, :] <= q_slot[None, :, None])


def masked_scores(scores: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Raw q.k products -> scaled scores, NEG_INF where `mask` (broadcast against them) is False."""
    return jnp.where(mask, scores * scale, NEG_INF)


def attention_weights(scores: jax.Array, mask: jax.Array, scale: float) -> jax.Array:
    """Raw q.k products -> softmax over the last axis (the slots) of masked_scores, in the
    products' dtype (float32 everywhere here)."""
    return jax.nn.softmax(masked_scores(scores, mask, scale), axis=-1)


def attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array) -> jax.Array:
    """Grouped-query attention.

    q [B, T, H, Dh], k/v [B, S, K, Dh], mask [B, T, S] (True = may attend) -> [B, T, H, Dh].
    Scores and softmax in float32.
    """
    b, t, h, d = q.shape
    kh = k.shape[2]
    qg = q.reshape(b, t, kh, h // kh, d)
    scores = jnp.einsum("btkgd,bskd->bkgts", qg, k, preferred_element_type=jnp.float32)
    probs = attention_weights(scores, mask[:, None, None, :, :], d ** -0.5).astype(v.dtype)
    out = jnp.einsum("bkgts,bskd->btkgd", probs, v)
    return out.reshape(b, t, h, d)


def _init(rngs: nnx.Rngs, shape, dtype, std=0.02):
    return std * jax.random.normal(rngs.params(), shape, dtype=jnp.float32).astype(dtype)


class DecoderLayers(nnx.Module):
    """All decoder layers' parameters, stacked along a leading [L] axis."""

    def __init__(self, cfg: ModelConfig, *, rngs: nnx.Rngs):
        L, D, F, H, K, Dh = (cfg.num_layers, cfg.hidden_size, cfg.intermediate_size, cfg.num_heads,
                             cfg.num_kv_heads, cfg.head_dim)
        pd = jnp.dtype(cfg.param_dtype)
        self.attn_norm = nnx.Param(jnp.ones((L, D), pd))
        self.q_kernel = nnx.Param(_init(rngs, (L, D, H, Dh), pd))
        self.k_kernel = nnx.Param(_init(rngs, (L, D, K, Dh), pd))
        self.v_kernel = nnx.Param(_init(rngs, (L, D, K, Dh), pd))
        if cfg.attention_bias:
            self.q_bias = nnx.Param(jnp.zeros((L, H, Dh), pd))
            self.k_bias = nnx.Param(jnp.zeros((L, K, Dh), pd))
            self.v_bias = nnx.Param(jnp.zeros((L, K, Dh), pd))
        if cfg.qk_norm:
            self.q_norm = nnx.Param(jnp.ones((L, Dh), pd))
            self.k_norm = nnx.Param(jnp.ones((L, Dh), pd))
        self.o_kernel = nnx.Param(_init(rngs, (L, H, Dh, D), pd))
        self.mlp_norm = nnx.Param(jnp.ones((L, D), pd))
        self.gate_kernel = nnx.Param(_init(rngs, (L, D, F), pd))
        self.up_kernel = nnx.Param(_init(rngs, (L, D, F), pd))
        self.down_kernel = nnx.Param(_init(rngs, (L, F, D), pd))

    # Every parameter either family may have; a module holds those its config asks for.
    PARAM_NAMES = ("attn_norm", "q_kernel", "q_bias", "k_kernel", "k_bias", "v_kernel", "v_bias",
                   "q_norm", "k_norm", "o_kernel", "mlp_norm", "gate_kernel", "up_kernel", "down_kernel")

    def stacked(self) -> dict[str, jax.Array]:
        """{name: [L, ...] array} for the parameters this module has."""
        return {n: getattr(self, n)[...] for n in self.PARAM_NAMES if hasattr(self, n)}


class Qwen2(nnx.Module):
    """Qwen2.5 or Qwen3 (by `config.model_type`) causal LM. `model(input_ids)` -> logits [B, T, V] (float32)."""

    def __init__(self, config: ModelConfig, *, rngs: nnx.Rngs | None = None,
                 mesh: Mesh | None = None, sharding: ShardingConfig | None = None):
        rngs = rngs if rngs is not None else nnx.Rngs(0)
        self.config = config
        self.mesh = mesh
        self.sharding = sharding or ShardingConfig.training()
        pd = jnp.dtype(config.param_dtype)
        self.embed = nnx.Param(_init(rngs, (config.vocab_size, config.hidden_size), pd))
        self.layers = DecoderLayers(config, rngs=rngs)
        self.final_norm = nnx.Param(jnp.ones((config.hidden_size,), pd))
        if not config.tie_word_embeddings:
            self.lm_head = nnx.Param(_init(rngs, (config.hidden_size, config.vocab_size), pd))

    # ----- one layer, a pure function of its (sliced) parameters -----
    def _layer(self, p: dict, x: jax.Array, cos, sin, mask):
        cfg, sh, mesh = self.config, self.sharding, self.mesh
        dt = jnp.dtype(cfg.dtype)
        h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
        q = jnp.einsum("btd,dhk->bthk", h, p["q_kernel"].astype(dt))
        k = jnp.einsum("btd,dhk->bthk", h, p["k_kernel"].astype(dt))
        v = jnp.einsum("btd,dhk->bthk", h, p["v_kernel"].astype(dt))
        if cfg.attention_bias:
            q, k, v = q + p["q_bias"].astype(dt), k + p["k_bias"].astype(dt), v + p["v_bias"].astype(dt)
        if cfg.qk_norm:  # per head, over head_dim, before rope
            q, k = rms_norm(q, p["q_norm"], cfg.rms_norm_eps), rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
        q = constrain(apply_rope(q, cos, sin), sh.act_bthd, mesh)
        k = apply_rope(k, cos, sin)
        attn = constrain(attention(q, k, v, mask), sh.act_bthd, mesh)
        x = x + constrain(jnp.einsum("bthk,hkd->btd", attn, p["o_kernel"].astype(dt)), sh.act_btd, mesh)
        h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
        gate = jnp.einsum("btd,df->btf", h, p["gate_kernel"].astype(dt))
        up = jnp.einsum("btd,df->btf", h, p["up_kernel"].astype(dt))
        act = constrain(swiglu(gate, up), sh.act_btf, mesh)
        return x + constrain(jnp.einsum("btf,fd->btd", act, p["down_kernel"].astype(dt)), sh.act_btd, mesh)

    def _run_layers(self, x, cos, sin, mask):
        params = self.layers.stacked()
        layer = jax.checkpoint(self._layer) if self.config.remat else self._layer
        if self.config.scan_layers:
            x, _ = jax.lax.scan(lambda carry, p: (layer(p, carry, cos, sin, mask), None), x, params)
            return x
        for i in range(self.config.num_layers):
            x = layer({n: a[i] for n, a in params.items()}, x, cos, sin, mask)
        return x

    def _embed(self, input_ids):
        x = jnp.take(self.embed[...], input_ids, axis=0).astype(jnp.dtype(self.config.dtype))
        return constrain(x, self.sharding.act_btd, self.mesh)

    def logits_from_hidden(self, h: jax.Array) -> jax.Array:
        """Final hidden [B, T, D] (already normed) -> float32 logits [B, T, V]."""
        dt = jnp.dtype(self.config.dtype)
        if self.config.tie_word_embeddings:
            logits = jnp.einsum("btd,vd->btv", h, self.embed[...].astype(dt), preferred_element_type=jnp.float32)
        else:
            logits = jnp.einsum("btd,dv->btv", h, self.lm_head[...].astype(dt), preferred_element_type=jnp.float32)
        return constrain(logits, self.sharding.logits_btv, self.mesh)

    def hidden_states(self, input_ids: jax.Array, positions: jax.Array | None = None,
                      attention_mask: jax.Array | None = None) -> jax.Array:
        """input_ids [B, T] -> final-normed hidden states [B, T, D]."""
        b, t = input_ids.shape
        if attention_mask is None:
            attention_mask = jnp.ones((b, t), dtype=bool)
        attention_mask = attention_mask.astype(bool)
        if positions is None:
            # Count real tokens so left padding gives positions 0.. on the real tokens.
            positions = jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta)
        x = self._run_layers(self._embed(input_ids), cos, sin, slot_mask(attention_mask, 0, t))
        return rms_norm(x, self.final_norm[...], self.config.rms_norm_eps)

    def __call__(self, input_ids: jax.Array, positions: jax.Array | None = None,
                 attention_mask: jax.Array | None = None) -> jax.Array:
        """input_ids int32 [B, T] -> logits float32 [B, T, V].

        attention_mask [B, T] marks real tokens (1) and padding (0); positions default to
        the running count of real tokens, so left padding leaves real-token logits unchanged.
        """
        return self.logits_from_hidden(self.hidden_states(input_ids, positions, attention_mask))
