"""Choosing the next token from logits: greedy, temperature, top-k and top-p (nucleus).

All knobs are traced scalars, so one compiled program serves every setting; `lax.cond`
skips the filter when none is asked for and the sampling when decoding greedily.
Sampling draws ONE uniform per row (inverse CDF over the vocabulary, in two levels), not a
Gumbel vector of size V, which is the expensive part of sampling on CPU.
"""
from __future__ import annotations

import jax
import jax.numpy as jnp


def filter_mask(scaled: jax.Array, top_p: jax.Array, top_k: jax.Array, iters: int = 40,
                candidates: int = 256) -> jax.Array:
    """Which tokens survive top-k then top-p.

    scaled [B, V] temperature-scaled logits; top_p in (0, 1] (1 = off); top_k >= 0 (0 = off).
    Keeps the k largest, then the smallest set of those whose probability (renormalised
    over the k kept) reaches top_p; the most likely token always survives; ties with the
    last kept logit are kept too. Returns bool [B, V].

    Each cut is a threshold on the logits. Fast path: the `candidates` largest logits
    (`lax.top_k`) hold the k-th largest when k <= candidates, and hold the nucleus whenever
    their running mass reaches top_p (a confident model's usual case); the cuts are then read
    off them exactly. Otherwise (some row's nucleus is wider than the candidates, or k is
    larger) the whole batch takes `_bisect_mask`. At [32, 152k] on XLA CPU: ~20 ms on the
    fast path, ~100 ms when it falls back, ~85 ms for the bisection alone. candidates=0: the
    bisection only (what the Sampler uses off CPU, where a large-k TopK may be a sort and
    vocabulary-sharded logits would be gathered for it; not measured there).
    """
    v = scaled.shape[-1]
    if candidates <= 0:
        return _bisect_mask(scaled, top_p, top_k, iters)
    c = min(candidates, v)
    # The barrier keeps XLA CPU's fast TopK: when the values feed a fusion that also reads
    # `scaled`, it otherwise falls back to sorting all of [B, V] (~0.85 s at [32, 152k]).
    vals = jax.lax.optimization_barrier(jax.lax.top_k(scaled, c)[0])  # [B, c], descending
    top, bottom = vals[:, :1], jnp.min(scaled, axis=-1, keepdims=True)
    k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)
    k_cut = jnp.where(k < v, jnp.take(vals, jnp.clip(k - 1, 0, c - 1), axis=-1)[:, None], bottom)
    total = jnp.sum(jnp.where(scaled >= k_cut, jnp.exp(scaled - top), 0.0), axis=-1, keepdims=True)
    # The first candidate whose running mass reaches top_p of the kept mass: {x >= its logit}
    # reaches it (ties included), and no higher threshold does.
    running = jnp.cumsum(jnp.where(vals >= k_cut, jnp.exp(vals - top), 0.0), axis=-1)
    reach = running >= top_p * total
    first = jnp.argmax(reach, axis=-1)
    p_cut = jnp.where(top_p < 1.0, jnp.take_along_axis(vals, first[:, None], axis=-1), k_cut)
    fast = scaled >= jnp.maximum(p_cut, k_cut)
    slow = ((k < v) & (k > c)) | ((top_p < 1.0) & ~jnp.all(jnp.any(reach, axis=-1)))
    return jax.lax.cond(slow, lambda: _bisect_mask(scaled, top_p, top_k, iters), lambda: fast)


def _bisect_mask(scaled: jax.Array, top_p: jax.Array, top_k: jax.Array, iters: int = 40) -> jax.Array:
    """filter_mask without candidates: each cut found by bisection (`iters` masked reductions
    over V; a sort of [B, V] is ~30x slower on CPU at V = 32k). Bisection keeps `lo` feasible
    (the set {x >= lo} satisfies the cut), so the result is the exact set up to logits within
    (max - min) / 2**iters of the boundary."""
    v = scaled.shape[-1]
    top = jnp.max(scaled, axis=-1, keepdims=True)
    bottom = jnp.min(scaled, axis=-1, keepdims=True)

    def bisect(feasible):
        def body(_, bounds):
            lo, hi = bounds
            mid = 0.5 * (lo + hi)
            ok = feasible(mid)
            return jnp.where(ok, mid, lo), jnp.where(ok, hi, mid)
        lo, _ = jax.lax.fori_loop(0, iters, body, (bottom, top))
        return lo  # [B, 1]

    k = jnp.where(top_k > 0, jnp.minimum(top_k, v), v)
    count_ok = lambda t: jnp.sum(scaled >= t, axis=-1, keepdims=True) >= k
    k_cut = jax.lax.cond(k < v, lambda: bisect(count_ok), lambda: bottom)
    # A threshold exactly at the top logit is feasible for every cut.
    k_cut = jnp.where(jnp.sum(scaled >= top, axis=-1, keepdims=True) >= k, top, k_cut)
    in_k = scaled >= k_cut
    weights = jnp.where(in_k, jnp.exp(scaled - top), 0.0)
    total = jnp.sum(weights, axis=-1, keepdims=True)
    mass_ok = lambda t: jnp.sum(jnp.where(scaled >= t, weights, 0.0), axis=-1, keepdims=True) >= top_p * total
    p_cut = jax.lax.cond(top_p < 1.0, lambda: bisect(mass_ok), lambda: k_cut)
    p_cut = jnp.where(mass_ok(top), top, jnp.maximum(p_cut, k_cut))
    return scaled >= p_cut


def first_max_index(x: jax.Array) -> jax.Array:
    """argmax over the last axis (first index on ties) as two plain reductions: a max, then
    the smallest float index holding it. XLA CPU runs jnp.argmax's (value, index) reduction
    3-4x slower. Float indices are exact below 2**24. NaN rows give the last index."""
    v = x.shape[-1]
    if v > 2 ** 24:
        raise ValueError(f"first_max_index: {v} entries; float indices are exact only up to 2**24")
    top = jnp.max(x, axis=-1)
    idx = jax.lax.broadcasted_iota(jnp.float32, x.shape, x.ndim - 1)
    return jnp.minimum(jnp.min(jnp.where(x == top[..., None], idx, float(v)), axis=-1).astype(jnp.int32), v - 1)


def _block_size(v: int, most: int) -> int:
    """A block length for inverse_cdf: a divisor of v in [64, most] if there is one (no padding
    copy; 151936 = 1187 x 128), else `most`."""
    if v <= most:
        return v
    return next((c for c in range(most, 63, -1) if v % c == 0), most)


def inverse_cdf(weights: jax.Array, uniforms: jax.Array, block: int = 1024) -> jax.Array:
    """The first index whose running sum of weights [B, V] (>= 0) passes uniforms [B] x total.

    In two levels (block sums, then one block's running sum) instead of one cumsum over V,
    which XLA CPU computes as a slow log-depth scan. A zero-weight index never passes first;
    returns -1 for a row where rounding lets none pass.
    """
    b, v = weights.shape
    c = _block_size(v, block)
    nb = -(-v // c)
    blocks = (weights if nb * c == v else jnp.pad(weights, ((0, 0), (0, nb * c - v)))).reshape(b, nb, c)
    cdf = jnp.cumsum(jnp.sum(blocks, axis=-1), axis=-1)  # [B, nb]
    target = uniforms * cdf[:, -1]
    # cdf is nondecreasing, so the first block past the target is the count of those not past it.
    blk = jnp.minimum(jnp.sum(cdf <= target[:, None], axis=-1), nb - 1)
    before = jnp.where(blk > 0, jnp.take_along_axis(cdf, jnp.maximum(blk - 1, 0)[:, None], axis=1)[:, 0], 0.0)
    row = jnp.take_along_axis(blocks, blk[:, None, None], axis=1)[:, 0]  # [B, C]
    inner = before[:, None] + jnp.cumsum(row, axis=-1)
    i = jnp.sum(inner <= target[:, None], axis=-1)
    ok = (i < c) & (jnp.take_along_axis(row, jnp.minimum(i, c - 1)[:, None], axis=1)[:, 0] > 0)
    return jnp.where(ok, blk * c + i, -1).astype(jnp.int32)


def sample_from_logits(logits: jax.Array, uniforms: jax.Array, temperature: jax.Array, top_p: jax.Array,
                       top_k: jax.Array, candidates: int = 256) -> jax.Array:
    """logits [B, V] float32, uniforms [B] in [0, 1) -> token ids int32 [B].

    temperature == 0 is greedy (argmax, first index on ties). candidates: filter_mask's.
    """

    def greedy(_):
        return first_max_index(logits)

    def sample(_):
        scaled = logits / jnp.maximum(temperature, 1e-6)
        need_filter = (top_p < 1.0) | (top_k > 0)
        masked = jax.lax.cond(need_filter,
                              lambda s: jnp.where(filter_mask(s, top_p, top_k, candidates=candidates), s, -jnp.inf),
                              lambda s: s, scaled)
        weights = jnp.exp(masked - jnp.max(masked, axis=-1, keepdims=True))  # 0 outside the filter
        tok = inverse_cdf(weights, uniforms)
        # The most likely token guards the (rounding) case where none passes.
        return jax.lax.cond(jnp.any(tok < 0), lambda: jnp.where(tok >= 0, tok, first_max_index(masked)), lambda: tok)

    return jax.lax.cond(temperature <= 0.0, greedy, sample, None)


def token_logprobs(logits: jax.Array, tokens: jax.Array) -> jax.Array:
    """log_softmax(logits) at tokens, the one log-prob rule of sampler and trainers alike:
    logits [..., V] (raw, temperature 1, any float dtype), tokens [...] int -> float32 [...]."""
    logits = logits.astype(jnp.float32)
    picked = jnp.take_along_axis(logits, tokens[..., None], axis=-1)[..., 0]
    return picked - jax.nn.logsumexp(logits, axis=-1)
