"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus).

All knobs are traced scalars, so one compiled program serves every setting; `lax.cond`
skips the sort when no filter is asked for and the sampling when decoding greedily.
Sampling draws ONE uniform per row (inverse CDF over the vocabulary), not a Gumbel
vector of size V, which is the expensive part of sampling on CPU.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def filter_mask(scaled: jax.Array, top_p: jax.Array, top_k: jax.Array) -> jax.Array:
    """Which tokens survive top-k then top-p.

    scaled [B, V] temperature-scaled logits; top_p in (0, 1] (1 = off); top_k >= 0 (0 = off).
    Keeps the k largest, then the smallest set of those whose probability (renormalised
    over the k kept) reaches top_p; the most likely token always survives. Ties with the
    last kept logit are kept too. Returns bool [B, V].
    """
    v = scaled.shape[-1]
    desc = -jnp.sort(-scaled, axis=-1)  # [B, V] descending
    rank = jnp.arange(v)[None, :]
    k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)
    in_k = rank < k
    probs = jax.nn.softmax(jnp.where(in_k, desc, -jnp.inf), axis=-1)
    mass_before = jnp.cumsum(probs, axis=-1) - probs
    # top_p == 1 keeps everything in the top-k (the cumulative sum may round past 1).
    keep = in_k & ((mass_before < top_p) | (top_p >= 1.0))
    n_keep = jnp.maximum(jnp.sum(keep, axis=-1), 1)  # a prefix of the sorted order
    threshold = jnp.take_along_axis(desc, (n_keep - 1)[:, None], axis=-1)  # [B, 1]
    return scaled >= threshold


def sample_from_logits(logits: jax.Array, uniforms: jax.Array, temperature: jax.Array, top_p: jax.Array,
                       top_k: jax.Array) -> jax.Array:
    """logits [B, V] float32, uniforms [B] in [0, 1) -> token ids int32 [B].

    temperature == 0 is greedy (argmax, first index on ties).
    """

    def greedy(_):
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)

    def sample(_):
        scaled = logits / jnp.maximum(temperature, 1e-6)
        need_filter = (top_p < 1.0) | (top_k > 0)
        keep = jax.lax.cond(need_filter, lambda s: filter_mask(s, top_p, top_k),
                            lambda s: jnp.ones(s.shape, bool), scaled)
        masked = jnp.where(keep, scaled, -jnp.inf)
        weights = jnp.exp(masked - jnp.max(masked, axis=-1, keepdims=True))  # 0 outside the filter
        cdf = jnp.cumsum(weights, axis=-1)
        target = uniforms[:, None] * cdf[:, -1:]
        # First index whose cdf passes the target; zero-weight tokens never pass first.
        tok = jnp.argmax(cdf > target, axis=-1)
        best = jnp.argmax(masked, axis=-1)  # guards the (rounding) case where none passes
        return jnp.where(jnp.any(cdf > target, axis=-1), tok, best).astype(jnp.int32)

    return jax.lax.cond(temperature <= 0.0, greedy, sample, None)


def token_logprobs(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """log_softmax(logits) at tokens: logits [B, V] (raw, temperature 1), tokens [B] -> [B] f32."""
    logz = jax.nn.logsumexp(logits, axis=-1)
    picked = jnp.take_along_axis(logits, tokens[:, None], axis=-1)[:, 0]
    return picked - logz
