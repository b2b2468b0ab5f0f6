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

LoRA (`config.lora_rank > 0`): every target projection W (q, k, v, o, gate, up, down) gets
adapters `{t}_lora_a` [L, in..., r] and `{t}_lora_b` [L, r, out...] of type `LoRAParam`
(an `nnx.Param`, so every Param filter still sees them; `nnx.split(model, LoRAParam,
nnx.Param)` separates them from the base), float32, A drawn like PEFT's kaiming-uniform and
B zero; the layer computes x W + (alpha / r) (x A) B, so at initialisation the logits are
the base's exactly. `merge_lora` folds them into the kernels (the sampler's copy, export).

The decoder layer is composed twice, from one set of primitives. The primitives (RMSNorm,
rope, the SwiGLU activation, the attention mask, scores and softmax) are the module-level
functions below, written once. The compositions are two: `CausalLM._layer` here (training and
scoring, no cache) and `sampling.layers.LayerMath.layer` (prefill and decode over a KV cache,
in the sampler's weight layout). Tests keep the two equal: `tests/test_sampling.py::
test_logprobs_equal_full_forward` and `::test_greedy_equals_naive_loop_and_transformers`
(Qwen2), `tests/test_qwen3.py::test_sampler_greedy_equals_transformers_and_logprobs_equal_forward`
(Qwen3), `tests/test_lora.py::test_sampler_decodes_with_the_adapters_merged` (LoRA). A change
to one composition needs the same change in the other.

`CausalLM` is the module (both families); `Qwen2` is its former name, kept as an alias.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx
from jax.sharding import Mesh

from memsearcher_jax.models.config import LORA_KERNELS, ModelConfig
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


def query_block_size(t: int, query_block: int) -> int:
    """The block the sampler's blocked prefill attention (a `lax.map` over equal blocks) uses for
    T queries: the largest divisor of T that is at most query_block (T itself when query_block is
    0 or >= T). Prompt buckets are 2^k or 3 * 2^k, so a power-of-two block gives itself or 3/4 of
    itself (T = 768, block 512: 384)."""
    if query_block <= 0 or query_block >= t:
        return t
    return next(n for n in range(query_block, 0, -1) if t % n == 0)


def query_blocks(t: int, query_block: int) -> list[tuple[int, int]]:
    """The [lo, hi) query ranges of training's blocked attention over T slots: `query_block` at a
    time, the last one shorter when the block does not divide T (0 or >= T: one range). A
    Python loop unrolls them into the program, so their number must stay ~T / query_block
    whatever T is. Rounding the block down to a divisor of T instead gave T = 1996 = 4 x 499
    499 blocks of 4 in one program, and XLA's CPU compiler crashed on it."""
    if query_block <= 0 or query_block >= t:
        return [(0, t)]
    return [(lo, min(lo + query_block, t)) for lo in range(0, t, query_block)]


def causal_attention(q: jax.Array, k: jax.Array, v: jax.Array, mask: jax.Array, query_block: int) -> jax.Array:
    """`attention` over one sequence of T slots whose mask is causal (no query attends a later
    slot), `query_block` queries at a time (`query_blocks`), each block against the keys up to
    its own last slot only. The keys left out are masked for every query of the block, so the
    result is `attention`'s; the scores computed drop from T^2 to T^2 (n + 1) / 2n for n blocks
    (at T = 1024 the scores are most of a small model's step)."""
    ranges = query_blocks(q.shape[1], query_block)
    if len(ranges) == 1:
        return attention(q, k, v, mask)
    blocks = [attention(q[:, lo:hi], k[:, :hi], v[:, :hi], mask[:, lo:hi, :hi]) for lo, hi in ranges]
    return jnp.concatenate(blocks, axis=1)


def _init(rngs: nnx.Rngs, shape, dtype, std=0.02):
    return std * jax.random.normal(rngs.params(), shape, dtype=jnp.float32).astype(dtype)


class LoRAParam(nnx.Param):
    """A LoRA adapter: the only trainable parameters of a LoRA model (the base stays frozen)."""


LORA_NAMES = tuple(f"{t}_lora_{ab}" for t in LORA_KERNELS for ab in ("a", "b"))


def is_lora_name(name: str) -> bool:
    """Whether a parameter name (e.g. "layers.q_lora_a" or "q_lora_a") is a LoRA adapter."""
    return name.rsplit(".", 1)[-1] in LORA_NAMES


def lora_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """{"q_lora_a": (L, D, r), "q_lora_b": (L, r, H, Dh), ...} for the config's targets."""
    out = {}
    for t in cfg.lora_targets if cfg.lora else ():
        ins, outs = cfg.lora_io(t)
        out[f"{t}_lora_a"] = (cfg.num_layers, *ins, cfg.lora_rank)
        out[f"{t}_lora_b"] = (cfg.num_layers, cfg.lora_rank, *outs)
    return out


def init_lora(cfg: ModelConfig, key: jax.Array) -> dict[str, jax.Array]:
    """Fresh adapters, float32: A uniform in +-1/sqrt(fan_in) (PEFT's kaiming-uniform with
    a = sqrt(5)), B zero, so the adapted model starts as the base."""
    out = {}
    for i, (name, shape) in enumerate(sorted(lora_shapes(cfg).items())):
        if name.endswith("_a"):
            bound = 1.0 / math.sqrt(math.prod(shape[1:-1]))
            out[name] = jax.random.uniform(jax.random.fold_in(key, i), shape, jnp.float32, -bound, bound)
        else:
            out[name] = jnp.zeros(shape, jnp.float32)
    return out


def lora_delta(a: jax.Array, b: jax.Array, scale: float, n_in: int) -> jax.Array:
    """scale * A B as a kernel-shaped float32 array: A [..., in..., r], B [..., r, out...]
    (an optional leading [L] on both) -> [..., in..., out...]."""
    a, b = a.astype(jnp.float32), b.astype(jnp.float32)
    if a.ndim == n_in + 1:
        return scale * jnp.tensordot(a, b, axes=1)
    return scale * jax.vmap(lambda x, y: jnp.tensordot(x, y, axes=1))(a, b)


def merge_lora(params: dict, cfg: ModelConfig) -> dict:
    """A layer's (or the stacked layers') parameter dict with every adapter pair folded into its
    kernel (W + scale A B, summed in float32, stored back in W's dtype) and the adapters
    dropped. Without adapters the dict is returned as it is."""
    if not any(is_lora_name(n) for n in params):
        return params
    out = {n: v for n, v in params.items() if not is_lora_name(n)}
    for t, (kernel, n_in) in LORA_KERNELS.items():
        if f"{t}_lora_a" in params:
            w = params[kernel]
            delta = lora_delta(params[f"{t}_lora_a"], params[f"{t}_lora_b"], cfg.lora_scale, n_in)
            out[kernel] = (w.astype(jnp.float32) + delta).astype(w.dtype)
    return out


def lora_apply(p: dict, target: str, x: jax.Array, y: jax.Array, cfg: ModelConfig) -> jax.Array:
    """y (x's projection through the target's kernel) plus the adapters' (alpha / r) (x A) B,
    in x's dtype; y itself when the target has no adapters."""
    if f"{target}_lora_a" not in p:
        return y
    n_in = LORA_KERNELS[target][1]
    xa = jnp.tensordot(x, p[f"{target}_lora_a"].astype(x.dtype), axes=n_in)  # [..., r]
    return y + jnp.tensordot(xa, p[f"{target}_lora_b"].astype(x.dtype), axes=1) * jnp.asarray(cfg.lora_scale, x.dtype)


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

    def add_lora(self, cfg: ModelConfig, key: jax.Array) -> None:
        """Fresh LoRA adapters (init_lora) for the config's targets."""
        for name, value in init_lora(cfg, key).items():
            setattr(self, name, LoRAParam(value))

    # Every parameter either family may have (and the LoRA adapters); a module holds those its config asks for.
    PARAM_NAMES = ("attn_norm", "q_kernel", "q_bias", "k_kernel", "k_bias", "v_kernel", "v_bias",
                   "q_norm", "k_norm", "o_kernel", "mlp_norm", "gate_kernel", "up_kernel", "down_kernel") + LORA_NAMES

    def stacked(self) -> dict[str, jax.Array]:
        """{name: [L, ...] array} for the parameters this module has."""
        return {n: getattr(self, n)[...] for n in self.PARAM_NAMES if hasattr(self, n)}


class CausalLM(nnx.Module):
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
        if config.lora:  # last: the base weights are drawn exactly as without adapters
            self.layers.add_lora(config, rngs.params())

    # ----- one layer, a pure function of its (sliced) parameters -----
    def _layer(self, p: dict, x: jax.Array, cos, sin, mask):
        cfg, sh, mesh = self.config, self.sharding, self.mesh
        dt = jnp.dtype(cfg.dtype)
        h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
        q = lora_apply(p, "q", h, jnp.einsum("btd,dhk->bthk", h, p["q_kernel"].astype(dt)), cfg)
        k = lora_apply(p, "k", h, jnp.einsum("btd,dhk->bthk", h, p["k_kernel"].astype(dt)), cfg)
        v = lora_apply(p, "v", h, jnp.einsum("btd,dhk->bthk", h, p["v_kernel"].astype(dt)), cfg)
        if cfg.attention_bias:
            q, k, v = q + p["q_bias"].astype(dt), k + p["k_bias"].astype(dt), v + p["v_bias"].astype(dt)
        if cfg.qk_norm:  # per head, over head_dim, before rope
            q, k = rms_norm(q, p["q_norm"], cfg.rms_norm_eps), rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
        q = constrain(apply_rope(q, cos, sin), sh.act_bthd, mesh)
        k = apply_rope(k, cos, sin)
        attn = constrain(causal_attention(q, k, v, mask, cfg.train_query_block), sh.act_bthd, mesh)
        o = lora_apply(p, "o", attn, jnp.einsum("bthk,hkd->btd", attn, p["o_kernel"].astype(dt)), cfg)
        x = x + constrain(o, sh.act_btd, mesh)
        h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
        gate = lora_apply(p, "gate", h, jnp.einsum("btd,df->btf", h, p["gate_kernel"].astype(dt)), cfg)
        up = lora_apply(p, "up", h, jnp.einsum("btd,df->btf", h, p["up_kernel"].astype(dt)), cfg)
        act = constrain(swiglu(gate, up), sh.act_btf, mesh)
        down = lora_apply(p, "down", act, jnp.einsum("btf,fd->btd", act, p["down_kernel"].astype(dt)), cfg)
        return x + constrain(down, sh.act_btd, mesh)

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
                      attention_mask: jax.Array | None = None, segment_ids: jax.Array | None = None) -> jax.Array:
        """input_ids [B, T] -> final-normed hidden states [B, T, D]. See __call__."""
        b, t = input_ids.shape
        if segment_ids is not None:
            if positions is None:
                raise ValueError("segment_ids (packed rows) need explicit positions: each segment counts from 0")
            attention_mask = segment_ids >= 0
        if attention_mask is None:
            attention_mask = jnp.ones((b, t), dtype=bool)
        attention_mask = attention_mask.astype(bool)
        if positions is None:
            # Count real tokens so left padding gives positions 0.. on the real tokens.
            positions = jnp.maximum(jnp.cumsum(attention_mask.astype(jnp.int32), axis=-1) - 1, 0)
        cos, sin = rope_cos_sin(positions, self.config.head_dim, self.config.rope_theta)
        mask = slot_mask(attention_mask, 0, t)
        if segment_ids is not None:  # packed rows: a token sees only its own sequence
            mask = mask & (segment_ids[:, :, None] == segment_ids[:, None, :])
        x = self._run_layers(self._embed(input_ids), cos, sin, mask)
        return rms_norm(x, self.final_norm[...], self.config.rms_norm_eps)

    def __call__(self, input_ids: jax.Array, positions: jax.Array | None = None,
                 attention_mask: jax.Array | None = None, segment_ids: jax.Array | None = None) -> jax.Array:
        """input_ids int32 [B, T] -> logits float32 [B, T, V].

        attention_mask [B, T] marks real tokens (1) and padding (0); positions default to
        the running count of real tokens, so left padding leaves real-token logits unchanged.
        segment_ids [B, T]: several sequences packed in one row (-1 = padding; replaces
        attention_mask); a token attends only to earlier tokens of its own segment, and
        `positions` (required then) restart at 0 in each segment.
        """
        return self.logits_from_hidden(self.hidden_states(input_ids, positions, attention_mask, segment_ids))


Qwen2 = CausalLM  # the former name (the module runs Qwen3 too); kept so existing code keeps working
