"""The sampler's own weight layout and the decoder layer over its per-layer KV cache.

The decoder's math (RMSNorm, rope, SwiGLU, the attention mask, scores and softmax) is
models.qwen2's; what is the sampler's own is the weight layout below and the cached forms
of attention (one token against the cache, a shared prefix plus each row's own slots,
prefill in query blocks and one row at a time).

Layout (one dict per layer; made once per `Sampler.update_params`, so its cost is not paid
while decoding; a LoRA model's adapters are merged into the weights here, W + (alpha / r) A B,
so decoding runs at the full weights' speed). Every matrix is stored output-major, [out..., in...]:

    qkv       [K, G + 2, Dh, D]  per KV head k: its G query heads, then its key and its value head
    qkv_bias  [K, G + 2, Dh]        (or q [H, Dh, D] + kv [K, 2, Dh, D] when a tensor-parallel
                                     mesh splits the query heads but not the KV heads; see fuse_qkv)
                                     biases only for Qwen2 (config.attention_bias)
    q_norm, k_norm  [Dh]         Qwen3's per-head RMSNorm weights (config.qk_norm), replicated
    o         [D, H, Dh]
    gate_up   [2, F, D]
    down      [D, F]
    head      [V, D]             the logits matrix; for tied embeddings also the embedding table

Why output-major: a decode step multiplies a few rows by every weight, and XLA CPU (YNNPACK)
runs [rows, in] x [in, out] 1.5-2x slower at 8-32 rows than the same product with the weight
as the LEFT operand, W [out, in] x h^T [in, rows], which streams the weight once without
repacking it (measured on 0.5B shapes with weights bigger than the cache). XLA would
canonicalise that product back into the slow form, so `project` keeps it with an optimization
barrier and transposes the small [out, rows] result instead. Prefill (many rows) uses the
ordinary form on the same stored weights. Fusing q/k/v and gate/up saves two weight
streams per layer; the groups are laid out so a tensor-parallel shard holds whole groups.
"""
from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.sharding import Mesh, PartitionSpec as P

from memsearcher_jax.models.config import ModelConfig
from memsearcher_jax.models.qwen2 import (
    apply_rope,
    attention_weights,
    masked_scores,
    merge_lora,
    query_block_size,
    rms_norm,
    rope_cos_sin,
    slot_mask,
    swiglu,
)
from memsearcher_jax.models.sharding import ShardingConfig, constrain, fit_spec, param_spec


def project(x: jax.Array, w: jax.Array, n_in: int, weights_left: bool) -> jax.Array:
    """x [*rows, *in] times w [*out, *in] (the last n_in dims contracted) -> [*rows, *out].

    weights_left: compute W x^T and transpose the result (the fast form for a few rows on
    XLA CPU; see the module docstring)."""
    rows, ins = x.shape[:x.ndim - n_in], x.shape[x.ndim - n_in:]
    outs = w.shape[:w.ndim - n_in]
    if w.shape[w.ndim - n_in:] != ins:
        raise ValueError(f"project: weight {w.shape} does not take inputs of shape {ins}")
    # Flattened to 2-D (a free reshape): on 3-D weights XLA CPU would copy-transpose W first.
    x2, w2 = x.reshape(math.prod(rows), math.prod(ins)), w.reshape(math.prod(outs), math.prod(ins))
    if weights_left:
        y = jax.lax.optimization_barrier(w2 @ x2.T)  # [out, rows]: keep W as the dot's left operand
        return y.T.reshape(*rows, *outs)
    return jnp.einsum("ri,oi->ro", x2, w2).reshape(*rows, *outs)


def fuse_qkv(config: ModelConfig, sharding: ShardingConfig, mesh: Mesh | None) -> bool:
    """Whether q, k and v can be one [K, G + 2, Dh, D] matrix split over KV heads: yes unless
    the mesh splits the query heads but cannot split the KV heads (then fusing would replicate
    the query weights on every tensor-parallel device)."""
    if mesh is None or mesh.size == 1:
        return True
    c = config
    q = fit_spec((c.num_layers, c.hidden_size, c.num_heads, c.head_dim),
                 param_spec("layers.q_kernel", 4, sharding), mesh)
    kv = fit_spec((c.num_layers, c.hidden_size, c.num_kv_heads, c.head_dim),
                  param_spec("layers.k_kernel", 4, sharding), mesh)
    return q[2] == kv[2]


# The stacked kernels' ranks, for their PartitionSpecs (the layer slices drop the [L] axis).
_KERNEL_NDIM = {"layers.q_kernel": 4, "layers.k_kernel": 4, "layers.o_kernel": 4, "layers.up_kernel": 3,
                "layers.down_kernel": 3}


def layout_layer(s: dict, config: ModelConfig, sharding: ShardingConfig, fused_qkv: bool, put) -> dict:
    """One layer's weights (a slice of DecoderLayers.stacked(): LoRA adapters, when present,
    are merged into their kernels first) -> the sampler's per-layer dict (module docstring).
    put(x, spec) places x (a sharding constraint on a mesh, the identity without one). Mesh
    axes come from `sharding` (the model's layout), moved with the dimension they split."""
    c = config
    H, K, Dh, D = c.num_heads, c.num_kv_heads, c.head_dim, c.hidden_size
    G = H // K
    ax = lambda name, dim: tuple(param_spec(name, _KERNEL_NDIM[name], sharding))[dim]
    heads, kv_heads, ff = ax("layers.q_kernel", 2), ax("layers.k_kernel", 2), ax("layers.up_kernel", 2)
    # Every weight is kept in the compute dtype: the layer math casts each one to it before use
    # anyway (rms_norm too), so an f32-master model's copy costs half and computes the same.
    dt = jnp.dtype(c.dtype)
    s = {n: a.astype(dt) for n, a in merge_lora(s, c).items()}
    q = s["q_kernel"].transpose(1, 2, 0)  # [H, Dh, D]
    k, v = s["k_kernel"].transpose(1, 2, 0), s["v_kernel"].transpose(1, 2, 0)  # [K, Dh, D]
    layer = {"attn_norm": s["attn_norm"], "mlp_norm": s["mlp_norm"]}
    if c.qk_norm:
        layer["q_norm"], layer["k_norm"] = s["q_norm"], s["k_norm"]
    if fused_qkv:
        qkv = jnp.concatenate([q.reshape(K, G, Dh, D), k[:, None], v[:, None]], axis=1)
        layer["qkv"] = put(qkv, P(kv_heads))
        if c.attention_bias:
            bias = jnp.concatenate([s["q_bias"].reshape(K, G, Dh), s["k_bias"][:, None], s["v_bias"][:, None]], 1)
            layer["qkv_bias"] = put(bias, P(kv_heads))
    else:
        layer["q"] = put(q, P(heads))
        layer["kv"] = put(jnp.stack([k, v], axis=1), P(kv_heads))
        if c.attention_bias:
            layer["q_bias"] = put(s["q_bias"], P(heads))
            layer["kv_bias"] = put(jnp.stack([s["k_bias"], s["v_bias"]], axis=1), P(kv_heads))
    layer["o"] = put(s["o_kernel"].transpose(2, 0, 1), P(None, ax("layers.o_kernel", 1)))  # [D, H, Dh]
    layer["gate_up"] = put(jnp.stack([s["gate_kernel"].T, s["up_kernel"].T]), P(None, ff))  # [2, F, D]
    layer["down"] = put(s["down_kernel"].T, P(None, ax("layers.down_kernel", 1)))  # [D, F]
    return layer


def layout_head(embed, lm_head, final_norm, config: ModelConfig, sharding: ShardingConfig, put) -> dict:
    """The weights outside the layers -> {"final_norm", "head" [V, D], "embed" [V, D] or None
    (tied: the head is the table)}, in the compute dtype."""
    dt = jnp.dtype(config.dtype)
    vocab = tuple(sharding.lm_head)[1]
    if lm_head is None:
        head, embed = put(embed.astype(dt), P(vocab)), None
    else:
        head, embed = put(lm_head.T.astype(dt), P(vocab)), put(embed.astype(dt), sharding.embed)
    return {"final_norm": final_norm.astype(dt), "head": head, "embed": embed}


def layout_params(stacked: dict, embed, lm_head, final_norm, config: ModelConfig, sharding: ShardingConfig,
                  fused_qkv: bool, put) -> dict:
    """The model's stacked [L, ...] weights -> the sampler layout (module docstring).

    stacked: DecoderLayers.stacked() (LoRA adapters included: they are merged); lm_head None
    when tied; put(x, spec) places x (a sharding constraint on a mesh, the identity without
    one)."""
    layers = [layout_layer({n: a[i] for n, a in stacked.items()}, config, sharding, fused_qkv, put)
              for i in range(config.num_layers)]
    return {"layers": layers, **layout_head(embed, lm_head, final_norm, config, sharding, put)}


def cached_attention(q, k, v, mask, by_row: bool = False, query_block: int = 0):
    """q [B, T, H, Dh], cache k/v [B, K, S, Dh], mask [B, T, S] -> [B, T, H, Dh]; f32 softmax.

    One new token (T == 1) is a matrix-vector product per head, which XLA CPU runs far
    faster as broadcast-multiply-reduce than as a batched dot of tiny matrices.
    Many tokens (prefill) go through `_grouped_attention`, `query_block` queries at a time
    (0: all at once), so the f32 scores held at once are [B, K, G, query_block, S] instead of
    [B, K, G, T, S]: at 8K-token prompts the unchunked scores are GiBs per row.
    by_row (prefill on XLA CPU, batch not sharded): one row at a time as well, so the scores
    stay in cache; 3-4x faster than all rows at once at 0.5B shapes.
    """
    b, t, h, d = q.shape
    kh = k.shape[1]
    g = h // kh
    scale = d ** -0.5
    if t == 1:
        qg = q.reshape(b, kh, g, d).astype(jnp.float32)
        probs = attention_weights(_one_token_scores(qg, k), mask[:, None, :, :], scale)
        return _one_token_mix(probs, v).reshape(b, 1, h, d).astype(q.dtype)
    if by_row:
        return jax.lax.map(lambda a: _blocked_attention(*(x[None] for x in a), query_block)[0], (q, k, v, mask))
    return _blocked_attention(q, k, v, mask, query_block)


def prefixed_decode_attention(q, pk, pv, prefix_valid, k, v, mask):
    """One new token per row attending to a prefix every row shares and to its own slots.

    q [B, 1, H, Dh]; pk, pv [1, K, P, Dh] (P > 0): the shared prefix's keys and values, stored
    once; prefix_valid [1, P]; k, v [B, K, S, Dh]: each row's own cache; mask [B, 1, S].
    -> [B, 1, H, Dh], the softmax over prefix + own slots (f32) as if they were one cache.

    The prefix part is one matrix product per KV head over all B x G queries, so its keys and
    values are read once per step instead of once per row (the agent's G samples and the
    batch's questions share the system prompt).
    """
    b, _, h, d = q.shape
    kh = k.shape[1]
    g = h // kh
    scale = d ** -0.5
    qg = q.reshape(b, kh, g, d).astype(jnp.float32)
    # Prefix: [K, B*G, Dh] x [K, P, Dh]^T -> [K, B*G, P]
    qk = qg.transpose(1, 0, 2, 3).reshape(kh, b * g, d)
    s_pre = jax.lax.dot_general(qk, pk[0].astype(jnp.float32), (((2,), (2,)), ((0,), (0,))))
    s_pre = masked_scores(s_pre, prefix_valid[0][None, None, :], scale)
    s_own = masked_scores(_one_token_scores(qg, k), mask[:, None, :, :], scale)  # own slots, as for one token
    s_pre = s_pre.reshape(kh, b, g, -1).transpose(1, 0, 2, 3)  # [B, K, G, P]
    top = jnp.maximum(jnp.max(s_pre, axis=-1, keepdims=True), jnp.max(s_own, axis=-1, keepdims=True))
    e_pre, e_own = jnp.exp(s_pre - top), jnp.exp(s_own - top)
    total = jnp.sum(e_pre, axis=-1, keepdims=True) + jnp.sum(e_own, axis=-1, keepdims=True)
    w_pre = (e_pre / total).transpose(1, 0, 2, 3).reshape(kh, b * g, -1)
    out_pre = jax.lax.dot_general(w_pre, pv[0].astype(jnp.float32), (((2,), (1,)), ((0,), (0,))))  # [K, B*G, Dh]
    out_pre = out_pre.reshape(kh, b, g, d).transpose(1, 0, 2, 3)
    return (out_pre + _one_token_mix(e_own / total, v)).reshape(b, 1, h, d).astype(q.dtype)


def _one_token_scores(qg, k):
    """qg [B, K, G, Dh] f32, cache k [B, K, S, Dh] -> raw f32 q.k products [B, K, G, S].
    Broadcast-multiply-reduce: XLA CPU runs it far faster than a batched dot of tiny matrices."""
    return jnp.sum(qg[:, :, :, None, :] * k[:, :, None, :, :].astype(jnp.float32), axis=-1)


def _one_token_mix(weights, v):
    """weights [B, K, G, S] f32, cache v [B, K, S, Dh] -> [B, K, G, Dh] f32."""
    return jnp.sum(weights[..., None] * v[:, :, None, :, :].astype(jnp.float32), axis=3)


def _blocked_attention(q, k, v, mask, query_block: int):
    """_grouped_attention over consecutive blocks of queries, one block at a time (a loop, so
    one block's scores are live at once); the keys are all S slots for every block."""
    b, t, h, d = q.shape
    blk = query_block_size(t, query_block)
    if blk == t:
        return _grouped_attention(q, k, v, mask)
    n = t // blk
    qb = q.reshape(b, n, blk, h, d).swapaxes(0, 1)       # [n, B, blk, H, Dh]
    mb = mask.reshape(b, n, blk, -1).swapaxes(0, 1)      # [n, B, blk, S]
    out = jax.lax.map(lambda a: _grouped_attention(a[0], k, v, a[1]), (qb, mb))
    return out.swapaxes(0, 1).reshape(b, t, h, d)


def _grouped_attention(q, k, v, mask):
    """cached_attention's many-token case with the queries laid out [B, K, G * T, Dh], so both
    products are plain batched matrix products without transposed copies of the scores."""
    b, t, h, d = q.shape
    kh = k.shape[1]
    g = h // kh
    qg = q.reshape(b, t, kh, g, d).transpose(0, 2, 3, 1, 4).reshape(b, kh, g * t, d)
    scores = jax.lax.dot_general(qg, k, (((3,), (3,)), ((0, 1), (0, 1))), preferred_element_type=jnp.float32)
    probs = attention_weights(scores.reshape(b, kh, g, t, -1), mask[:, None, None], d ** -0.5)
    probs = probs.astype(v.dtype).reshape(b, kh, g * t, -1)
    out = jax.lax.dot_general(probs, v, (((3,), (2,)), ((0, 1), (0, 1))))  # [B, K, G * T, Dh]
    return out.reshape(b, kh, g, t, d).transpose(0, 3, 1, 2, 4).reshape(b, t, h, d)


class LayerMath:
    """Decoder layers over the sampler layout and a head-major per-layer cache [B, K, S, Dh]:
    Qwen2._layer's math from the same functions (tests compare with the model's full forward)."""

    def __init__(self, config: ModelConfig, sharding: ShardingConfig, mesh: Mesh | None, weights_left: bool,
                 attention_by_row: bool, query_block: int = 0):
        self.config, self.sharding, self.mesh = config, sharding, mesh
        self.weights_left = weights_left  # for decode steps (one token per row)
        self.attention_by_row = attention_by_row  # for prefill (many tokens per row)
        self.query_block = query_block  # prefill attention: queries per block (0: all at once)

    def _proj(self, x, w, n_in: int = 1):
        return project(x, w.astype(x.dtype), n_in, self.weights_left and x.shape[1] == 1)

    def layer(self, p: dict, x, cos, sin, mask, kv, write_index, prefix=None, prefix_valid=None):
        """x [B, T, D] -> x after the layer, and the cache pair with K/V written at write_index.
        prefix: this layer's shared (pk, pv) [1, K, P, Dh] that every row also attends to (one
        new token per row only), with prefix_valid [1, P]."""
        cfg, sh, mesh = self.config, self.sharding, self.mesh
        dt = jnp.dtype(cfg.dtype)
        b, t = x.shape[:2]
        H, Dh = cfg.num_heads, cfg.head_dim
        h = rms_norm(x, p["attn_norm"], cfg.rms_norm_eps)
        if "qkv" in p:
            y = self._proj(h, p["qkv"])  # [B, T, K, G + 2, Dh]
            if cfg.attention_bias:
                y = y + p["qkv_bias"].astype(dt)
            q, k, v = y[:, :, :, :-2].reshape(b, t, H, Dh), y[:, :, :, -2], y[:, :, :, -1]
        else:
            q, kv_ = self._proj(h, p["q"]), self._proj(h, p["kv"])  # kv_ [B, T, K, 2, Dh]
            if cfg.attention_bias:
                q, kv_ = q + p["q_bias"].astype(dt), kv_ + p["kv_bias"].astype(dt)
            k, v = kv_[:, :, :, 0], kv_[:, :, :, 1]
        if cfg.qk_norm:  # Qwen3: per head, before rope (as Qwen2._layer)
            q, k = rms_norm(q, p["q_norm"], cfg.rms_norm_eps), rms_norm(k, p["k_norm"], cfg.rms_norm_eps)
        q = constrain(apply_rope(q, cos, sin), sh.act_bthd, mesh)
        k = apply_rope(k, cos, sin)
        ck, cv = kv
        ck = jax.lax.dynamic_update_slice(ck, k.transpose(0, 2, 1, 3).astype(ck.dtype), (0, 0, write_index, 0))
        cv = jax.lax.dynamic_update_slice(cv, v.transpose(0, 2, 1, 3).astype(cv.dtype), (0, 0, write_index, 0))
        if prefix is not None:
            if t != 1:
                raise ValueError("a separately stored shared prefix is read by one-token decode steps only")
            attn = prefixed_decode_attention(q, prefix[0].astype(dt), prefix[1].astype(dt), prefix_valid,
                                             ck.astype(dt), cv.astype(dt), mask)
        else:
            attn = cached_attention(q, ck.astype(dt), cv.astype(dt), mask, self.attention_by_row, self.query_block)
        attn = constrain(attn, sh.act_bthd, mesh)
        x = x + constrain(self._proj(attn, p["o"], 2), sh.act_btd, mesh)
        h = rms_norm(x, p["mlp_norm"], cfg.rms_norm_eps)
        gate_up = self._proj(h, p["gate_up"])  # [B, T, 2, F]
        act = constrain(swiglu(gate_up[:, :, 0], gate_up[:, :, 1]), sh.act_btf, mesh)
        x = x + constrain(self._proj(act, p["down"]), sh.act_btd, mesh)
        return x, (ck, cv)

    def run(self, params: dict, ids, positions, cache: tuple, kv_valid, write_index, mask=None, prefix=None,
            prefix_valid=None):
        """ids, positions [B, T] through all layers, writing K/V at slots [write_index, +T).

        cache: L pairs of [B, K, S, Dh]; kv_valid [B, S]: valid slots after the write; each
        token attends to the valid slots up to its own (qwen2.slot_mask), or to those of
        `mask` [B, T, S] when given. prefix (decode only, T == 1): L pairs of
        [1, K, P, Dh] every row attends to before its own slots, prefix_valid [1, P]. Returns
        final-normed hidden [B, T, D] and the new cache.
        """
        cfg = self.config
        cos, sin = rope_cos_sin(positions, cfg.head_dim, cfg.rope_theta)
        if mask is None:
            mask = slot_mask(kv_valid, write_index, ids.shape[1])
        table = params["head"] if params["embed"] is None else params["embed"]  # tied: head is the table
        x = jnp.take(table, ids, axis=0).astype(jnp.dtype(cfg.dtype))
        new_cache = []
        for i, (p, kv) in enumerate(zip(params["layers"], cache)):
            x, kv = self.layer(p, x, cos, sin, mask, kv, write_index, None if prefix is None else prefix[i],
                               prefix_valid)
            new_cache.append(kv)
        return rms_norm(x, params["final_norm"], cfg.rms_norm_eps), tuple(new_cache)

    def logits(self, params: dict, h):
        """h [B, D] final-normed -> float32 logits [B, V]."""
        dt = jnp.dtype(self.config.dtype)
        head = params["head"].astype(dt)
        if self.weights_left:
            y = jax.lax.dot_general(head, h.astype(dt), (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
            logits = jax.lax.optimization_barrier(y).T
        else:
            logits = jnp.einsum("bd,vd->bv", h.astype(dt), head, preferred_element_type=jnp.float32)
        return constrain(logits, P(self.sharding.batch[0], tuple(self.sharding.lm_head)[1]), self.mesh)
