"""Batched KV-cache sampler: one jitted prefill and one jitted decode loop.

Cache layout, per call and layer:

    prefix k, v [1, K, P, Dh]   the shared prefix, left-padded inside its bucket; prefilled
                                ONCE at batch 1 and kept as one copy that decode attention
                                reads once per step for all rows (P = 0 when not worth it)
    rows k, v [B, K, T + N, Dh]
      slots [0, T)              each row's prompt suffix, left-padded
      slots [T, T + N)          generated tokens, one slot per decode step (same for every row)

Positions are per row (RoPE) and independent of slots, so padding gaps are harmless.
The suffixes are prefilled on a packed grid, not one row each: distinct suffixes only,
several short ones to a grid row (prefill_layout.py), each attending to the prefix and to itself;
then each row's K/V is gathered into its left-padded slots. A ragged batch (the agent's
50-300-token turns) so costs about its real tokens, not rows x the longest.
The decode loop is a `lax.while_loop` that stops when every row is done or the largest
budget is spent; its state is donated so the cache is updated in place, and no token
leaves the device until the loop ends. Parameters are jit arguments, so
`update_params` after an optimizer step reuses the compiled programs.

The sampler keeps its own copy of the weights, in the compute dtype and a decode-friendly
layout (layers.py), made once per `update_params`: one array per layer instead of the
model's stacked [L, ...] arrays (slicing a stacked weight inside the loop costs a copy per
step on XLA CPU), every matrix output-major with q/k/v and gate/up fused, and the logits
matrix [V, D] (for tied embeddings the embedding table itself). The cache is one (k, v)
pair per layer, head-major [B, K, S, Dh], so each decode step writes one slot in place and
decode attention reads each head's keys contiguously.
"""
from __future__ import annotations

import collections
import dataclasses
import math
import weakref
from collections.abc import Callable, Sequence
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, PartitionSpec as P

from memsearcher_jax.models.hf_io import shard_model
from memsearcher_jax.models.qwen2 import Qwen2
from memsearcher_jax.models.sharding import ShardingConfig, named_sharding
from memsearcher_jax.sampling.buckets import BucketConfig
from memsearcher_jax.sampling.distributions import sample_from_logits, token_logprobs
from memsearcher_jax.sampling.layers import LayerMath, fuse_qkv, layout_layer, layout_params
from memsearcher_jax.sampling.prefill_layout import layout_prefill
from memsearcher_jax.sampling.stopping import NO_TOKEN, normalize_stops, pack_stops, push_window, stop_hits

FINISH_REASONS = ("stop", "length")


@dataclasses.dataclass
class Completion:
    """One prompt's generated tokens (stop token / sequence included), the log-prob of each
    under the distribution it was sampled from (softmax(logits / temperature), before top-p /
    top-k; the raw logits when greedy), and why it ended ("stop" or "length")."""

    tokens: list[int]
    logprobs: list[float]
    finish_reason: str


# Queries per block in the prefill's attention. 512 keeps the f32 scores of an 8K-slot cache at
# ~20 MiB per head per row, while each block's products stay large enough to run at full speed.
DEFAULT_QUERY_BLOCK = 512


def check_query_block(value) -> int:
    """`prefill_query_block` as an int; ValueError naming it unless an integer >= 0."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 0:
        raise ValueError(f"prefill_query_block must be an integer >= 0 (0 = unblocked), got {value!r}")
    return int(value)


class DecodeState(NamedTuple):
    """Everything the decode loop carries. B rows, S cache slots, N token budget, W stop width."""

    cache: tuple              # L pairs (k, v), each [B, K, S, Dh]: each row's own slots (S = T + N)
    kv_valid: jax.Array       # [B, S] bool
    prefix: tuple             # L pairs (k, v), each [1, K, P, Dh]: the shared prefix, stored once
    prefix_valid: jax.Array   # [1, P] bool
    last: jax.Array           # [B] int32, the token to feed next
    pos: jax.Array            # [B] int32, its position
    step: jax.Array           # () int32, tokens sampled so far
    first_slot: jax.Array     # () int32, own-cache slot of generated token 0 (= T)
    tokens: jax.Array         # [B, N] int32
    logprobs: jax.Array       # [B, N] float32
    window: jax.Array         # [B, W] int32, last W generated tokens
    done: jax.Array           # [B] bool
    stopped: jax.Array        # [B] bool, ended on a stop
    length: jax.Array         # [B] int32, tokens generated
    budget: jax.Array         # [B] int32
    row_keys: jax.Array       # [B, 2] uint32 raw PRNG keys, one per row
    temperature: jax.Array    # () float32
    top_p: jax.Array          # () float32
    top_k: jax.Array          # () int32
    stop_table: jax.Array     # [Ns, W] int32
    stop_lengths: jax.Array   # [Ns] int32


def validate_request(prompts, max_new_tokens, temperature, top_p, top_k, vocab_size: int, max_len: int,
                     stops: Sequence[tuple[int, ...]]) -> list[int]:
    """Raise ValueError naming what is wrong; returns the per-row budgets."""
    if not isinstance(prompts, (list, tuple)) or len(prompts) == 0:
        raise ValueError("prompts must be a non-empty list of token-id lists")
    if isinstance(max_new_tokens, (int, np.integer)):
        budgets = [int(max_new_tokens)] * len(prompts)
    else:
        budgets = [int(b) for b in max_new_tokens]
        if len(budgets) != len(prompts):
            raise ValueError(f"max_new_tokens has {len(budgets)} entries for {len(prompts)} prompts")
    for i, b in enumerate(budgets):
        if b < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {b} (row {i})")
    if not temperature >= 0:
        raise ValueError(f"temperature must be >= 0 (0 = greedy), got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if int(top_k) != top_k or top_k < 0:
        raise ValueError(f"top_k must be an integer >= 0 (0 = off), got {top_k}")
    for i, p in enumerate(prompts):
        if len(p) == 0:
            raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        if len(p) + budgets[i] > max_len:
            raise ValueError(f"prompt {i} has {len(p)} tokens + max_new_tokens {budgets[i]} = "
                             f"{len(p) + budgets[i]}, more than the sampler's max_len {max_len}")
        lo, hi = min(p), max(p)
        if lo < 0 or hi >= vocab_size:
            raise ValueError(f"prompt {i} has token id {lo if lo < 0 else hi} outside [0, {vocab_size})")
    for s in stops:
        if min(s) < 0 or max(s) >= vocab_size:
            raise ValueError(f"stop {list(s)} has a token id outside [0, {vocab_size})")
    return budgets


def _weak_refs(leaves: list) -> list | None:
    try:
        return [weakref.ref(x) for x in leaves]
    except TypeError:  # a leaf that cannot be weakly referenced: such weights are always copied
        return None


def _same_arrays(refs: list | None, leaves: list) -> bool:
    """Whether `leaves` are the very arrays `refs` point to."""
    return refs is not None and len(refs) == len(leaves) and all(r() is x for r, x in zip(refs, leaves))


class Sampler:
    """Keeps compiled prefill/decode programs between calls; see module docstring.

    model: a Qwen2. With `mesh`, the model is laid out with ShardingConfig.sampling() (TP
    weights, batch over data and fsdp) unless it already lives on that mesh.
    cache_dtype: KV-cache storage dtype (default: the model's compute dtype). max_len: longest prompt + budget accepted
    (defaults to the model's max_position_embeddings). prefill_query_block: the prefill's
    attention takes this many queries at a time (0: all at once), which bounds its f32 scores
    to [rows, heads, block, slots] per layer.
    layer_by_layer: build (and on update_params rebuild in place) the weight copy one layer at
    a time from the model as it lies (any layout, on the model's own mesh), never holding the
    model re-laid out whole nor two copies: what a LoRA trainer uses, whose learner keeps only
    a frozen FSDP base. to_local: moves each piece from the model's mesh to the sampler's (a
    multi-host job: global arrays -> host-local ones).
    """

    def __init__(self, model: Qwen2, *, cache_dtype=None, mesh: Mesh | None = None,
                 buckets: BucketConfig | None = None, max_len: int | None = None,
                 prefill_query_block: int = DEFAULT_QUERY_BLOCK, layer_by_layer: bool = False,
                 to_local: Callable | None = None):
        query_block = check_query_block(prefill_query_block)
        self.mesh = mesh
        self.cache_dtype = jnp.dtype(cache_dtype or model.config.dtype)
        self.buckets = buckets or BucketConfig()
        self.config = model.config
        self.max_len = int(max_len or model.config.max_position_embeddings)
        self.num_compilations = 0
        self.compiled_keys: set[tuple] = set()
        self.layer_by_layer, self._to_local = layer_by_layer, to_local
        self._piece_fns: dict = {}
        source_refs = _weak_refs(jax.tree.leaves(nnx.state(model)))  # the caller's arrays, before placement
        if layer_by_layer:
            self._check_source(model)
        else:
            model = self._place(model)
        self._sharding: ShardingConfig = (ShardingConfig.sampling() if layer_by_layer and mesh is not None
                                          else model.sharding)
        platform = (mesh.devices.flat[0] if mesh is not None else jax.devices()[0]).platform
        self._fused_qkv = fuse_qkv(self.config, self._sharding, mesh)
        # Top-p/top-k's candidate fast path is measured on XLA CPU only (distributions.py).
        self._top_p_candidates = 256 if platform == "cpu" else 0
        # XLA CPU layouts (layers.py); a row loop in prefill attention only while rows are not split.
        self._math = LayerMath(self.config, self._sharding, mesh, weights_left=platform == "cpu",
                               attention_by_row=platform == "cpu" and self._batch_shards() == 1,
                               query_block=query_block)
        self._graphdef, state = nnx.split(model)
        self._layout_fn = jax.jit(self._layout)
        self._params = self._layout_pieces(model) if layer_by_layer else self._layout_fn(state)
        self._laid_out_from = source_refs
        self._prefill = jax.jit(self._prefill_impl, static_argnames=("num_new",))
        self._decode = jax.jit(self._decode_impl, donate_argnums=(1,))

    # ----- parameters -----
    def _place(self, model: Qwen2) -> Qwen2:
        # Decode reads every weight each step: it wants the TP-only sampling layout, never the
        # FSDP training one (which would all-gather weights inside the loop).
        if self.mesh is not None and (model.mesh != self.mesh or model.sharding != ShardingConfig.sampling()):
            # shard_model re-places the Variables it is given; clone so the caller's model stays put.
            model = shard_model(nnx.clone(model), self.mesh, ShardingConfig.sampling())
        return model

    def _layout(self, state) -> dict:
        """Model state -> the sampler's weights (see layers.py): per-layer dicts, "final_norm",
        "head" [V, D] and "embed" [V, D] (None when tied: the head is the table)."""
        model = nnx.merge(self._graphdef, state)
        return layout_params(model.layers.stacked(), model.embed[...],
                             None if self.config.tie_word_embeddings else model.lm_head[...],
                             model.final_norm[...], self.config, self._sharding, self._fused_qkv, self._constrain)

    def _check_source(self, model: Qwen2) -> None:
        if self.mesh is not None and self._to_local is None and model.mesh != self.mesh:
            raise ValueError("layer_by_layer: the model lives on another mesh than the sampler's; pass to_local "
                             "(arrays on the model's mesh -> the sampler's) or place the model on the sampler's mesh")

    def _layout_pieces(self, model: Qwen2, into: dict | None = None) -> dict:
        """The sampler's weights made one piece at a time (each layer, then the head and the
        embedding table) by a small jitted program on the model's own mesh, LoRA adapters
        merged in; `to_local` then moves each piece onto the sampler's mesh. With `into` (the
        current weights), each piece replaces its old arrays as soon as it exists, so a refresh
        holds one piece beyond the sampler's copy, never a second copy."""
        src_mesh = model.mesh if self.mesh is not None else None
        key = (src_mesh, model.config)
        if key not in self._piece_fns:
            put = lambda x, spec: x if src_mesh is None or src_mesh.size == 1 else jax.lax.with_sharding_constraint(
                x, named_sharding(src_mesh, x.shape, spec))
            c, sh, fused, dt = self.config, self._sharding, self._fused_qkv, jnp.dtype(self.config.dtype)
            vocab = tuple(sh.lm_head)[1]  # as layers.layout_head places them
            self._piece_fns[key] = (
                jax.jit(lambda stacked, i: layout_layer(
                    {n: jax.lax.dynamic_index_in_dim(a, i, keepdims=False) for n, a in stacked.items()},
                    c, sh, fused, put)),
                jax.jit(lambda table, norm: {"head": put((table if c.tie_word_embeddings else table.T).astype(dt),
                                                         P(vocab)), "final_norm": norm.astype(dt)}),
                jax.jit(lambda table: put(table.astype(dt), sh.embed)))
        layer_fn, head_fn, embed_fn = self._piece_fns[key]
        local = self._to_local or (lambda tree: tree)
        params = into if into is not None else {"layers": [None] * self.config.num_layers}
        stacked = model.layers.stacked()
        for i in range(self.config.num_layers):
            params["layers"][i] = local(layer_fn(stacked, np.int32(i)))
        tied = self.config.tie_word_embeddings
        params.update(local(head_fn(model.embed[...] if tied else model.lm_head[...], model.final_norm[...])))
        params["embed"] = None if tied else local(embed_fn(model.embed[...]))
        return params

    def update_params(self, model_or_state) -> None:
        """Swap in new weights (a Qwen2 or its nnx.State) with the same shapes; no recompilation
        of the sampling programs (the layout copy is its own small program, compiled once).
        A layer_by_layer sampler takes a Qwen2 and rebuilds its copy piece by piece in place.
        The very arrays laid out last time (jax arrays are immutable, so changed weights are new
        arrays) are not copied again: a 0.5B model's copy costs seconds on CPU."""
        is_model = isinstance(model_or_state, Qwen2)
        leaves = jax.tree.leaves(nnx.state(model_or_state) if is_model else model_or_state)
        compatible = model_or_state.config == self.config if is_model else not self.layer_by_layer
        if compatible and _same_arrays(self._laid_out_from, leaves):
            return
        if self.layer_by_layer:
            if not isinstance(model_or_state, Qwen2) or model_or_state.config != self.config:
                raise ValueError("update_params on a layer_by_layer sampler needs a Qwen2 with the sampler's "
                                 "ModelConfig")
            self._check_source(model_or_state)
            self._layout_pieces(model_or_state, into=self._params)
            self._laid_out_from = _weak_refs(leaves)
            return
        if isinstance(model_or_state, Qwen2):
            if model_or_state.config != self.config:
                raise ValueError("update_params got a model with a different ModelConfig than the sampler's: "
                                 f"{model_or_state.config} vs {self.config}")
            graphdef, state = nnx.split(self._place(model_or_state))
            if graphdef != self._graphdef:
                raise ValueError("update_params got a model whose structure (graphdef) differs from the sampler's")
        else:
            state = model_or_state
        new = jax.eval_shape(self._layout, state)
        for a, b in zip(jax.tree.leaves(self._params), jax.tree.leaves(new)):
            if a.shape != b.shape or a.dtype != b.dtype:
                raise ValueError(f"update_params: parameter shape/dtype {b.shape}/{b.dtype} differs from "
                                 f"the sampler's {a.shape}/{a.dtype}")
        self._params = self._layout_fn(state)
        self._laid_out_from = _weak_refs(leaves)

    # ----- layout helpers -----
    def _batch_shards(self) -> int:
        if self.mesh is None:
            return 1
        axes = self._sharding.batch[0]
        names = axes if isinstance(axes, tuple) else ((axes,) if axes else ())
        return math.prod(self.mesh.shape[n] for n in names)

    def _constrain(self, x, spec: P):
        if self.mesh is None or self.mesh.size == 1:
            return x
        return jax.lax.with_sharding_constraint(x, named_sharding(self.mesh, x.shape, spec))

    def _rows_spec(self, ndim: int) -> P:
        return P(self._sharding.batch[0], *([None] * (ndim - 1)))

    def _put(self, x: np.ndarray, batched: bool):
        if self.mesh is None:
            return jnp.asarray(x)
        spec = self._rows_spec(x.ndim) if batched else P()
        return jax.device_put(x, named_sharding(self.mesh, x.shape, spec))

    # ----- the two programs -----
    def _emit(self, st: DecodeState, logits: jax.Array) -> DecodeState:
        """Sample token `st.step` for every row from logits [B, V]; record it; update stops."""
        keys = jax.vmap(lambda k: jax.random.fold_in(jax.random.wrap_key_data(k), st.step))(st.row_keys)
        u = jax.vmap(lambda k: jax.random.uniform(k, (), jnp.float32))(keys)
        tok = sample_from_logits(logits, u, st.temperature, st.top_p, st.top_k, self._top_p_candidates)
        # The log-prob under the distribution sampled from (logits / temperature, before any top-p /
        # top-k cut, as the trainer computes it); greedy rows keep the raw logits.
        scale = jnp.where(st.temperature > 0, st.temperature, 1.0)
        lp = token_logprobs(logits.astype(jnp.float32) / scale, tok)
        active = ~st.done
        col = jnp.where(active, tok, 0)[:, None]
        tokens = jax.lax.dynamic_update_slice(st.tokens, col, (0, st.step))
        logprobs = jax.lax.dynamic_update_slice(st.logprobs, jnp.where(active, lp, 0.0)[:, None], (0, st.step))
        window = push_window(st.window, tok, active)
        hit = active & stop_hits(window, st.stop_table, st.stop_lengths)
        length = st.length + active.astype(jnp.int32)
        return st._replace(tokens=tokens, logprobs=logprobs, window=window, length=length, last=tok,
                           stopped=st.stopped | hit, done=st.done | hit | (length >= st.budget),
                           step=st.step + 1)

    def _prefill_impl(self, params, prefix_ids, prefix_pos, prefix_valid, ids, pos, seg, rows, cols, next_pos,
                      budget, row_keys, temperature, top_p, top_k, stop_table, stop_lengths, *,
                      num_new: int) -> DecodeState:
        """prefix_* [1, P] (P may be 0): the shared prefix; ids, pos, seg [R, T]: the packed
        suffixes (seg: which suffix each token belongs to, unique within its row, -1 = padding);
        rows [B], cols [B, T]: where row b's left-padded suffix slot t comes from in the packed
        grid (cols -1 = empty slot); next_pos [B]: each row's prompt length; budget, row_keys
        [B] (budget 0 = padding row).

        The prefix is prefilled once at batch 1; the suffixes packed several to a grid row
        (a token attends to the prefix and to the earlier tokens of its own suffix), so short
        prompts cost no padding compute and duplicates are computed once; then every row's
        K/V is gathered into the decode cache. Returns the decode state with token 0 already
        sampled.
        """
        self.num_compilations += 1  # runs only while tracing, i.e. once per compiled program
        cfg = self.config
        r, t = ids.shape
        b = budget.shape[0]
        p = prefix_ids.shape[1]
        kh, dh = cfg.num_kv_heads, cfg.head_dim
        c = tuple(self._sharding.cache)  # [L, B, S, K, Dh] -> per layer [B, K, S, Dh]
        cache_spec = P(c[1], c[3], c[2], c[4])
        zeros = lambda n, s: jnp.zeros((n, kh, s, dh), self.cache_dtype)
        if p > 0:
            pcache = tuple((zeros(1, p), zeros(1, p)) for _ in range(cfg.num_layers))
            _, pcache = self._math.run(params, prefix_ids, prefix_pos, pcache, prefix_valid, 0)
        else:
            pcache = tuple((zeros(1, 0), zeros(1, 0)) for _ in range(cfg.num_layers))
        # The grid's cache: the prefix in slots [0, P) of every grid row, the row's own tokens after.
        grid = tuple(tuple(self._constrain(jnp.concatenate([jnp.broadcast_to(x, (r, kh, p, dh)), zeros(r, t)], 2),
                                           cache_spec) for x in layer) for layer in pcache)
        causal = jnp.arange(t)[None, None, :] <= jnp.arange(t)[None, :, None]
        own = (seg[:, None, :] == seg[:, :, None]) & (seg[:, None, :] >= 0) & causal
        mask = jnp.concatenate([jnp.broadcast_to(prefix_valid[:, None, :], (r, t, p)), own], axis=2)
        hidden, grid = self._math.run(params, ids, pos, grid, None, p, mask=self._constrain(mask, self._rows_spec(3)))

        valid = cols >= 0  # [B, T]
        col = jnp.maximum(cols, 0)

        def assemble(g):  # grid [R, K, P + T, Dh] -> each row's own slots [B, K, T + N, Dh]
            mine = g[:, :, p:][rows[:, None], :, col]  # [B, T, K, Dh]
            mine = jnp.where(valid[:, :, None, None], mine, 0).transpose(0, 2, 1, 3)
            return self._constrain(jnp.concatenate([mine, zeros(b, num_new)], axis=2), cache_spec)

        # The prefix stays one copy [1, K, P, Dh] that decode attention reads once per step for
        # all rows (layers.prefixed_decode_attention); the rows keep only their own slots.
        cache = tuple((assemble(gk), assemble(gv)) for gk, gv in grid)
        kv_valid = self._constrain(jnp.concatenate([valid, jnp.zeros((b, num_new), bool)], 1), self._rows_spec(2))
        # Left padding puts every row's last prompt token in its last suffix slot.
        last_hidden = self._constrain(hidden[rows, col[:, -1]], self._rows_spec(2))
        logits = self._logits(params, last_hidden)
        w = stop_table.shape[1]
        st = DecodeState(
            cache=cache, kv_valid=kv_valid, prefix=tuple(tuple(self._constrain(x, cache_spec) for x in layer)
                                                         for layer in pcache),
            prefix_valid=prefix_valid,
            last=jnp.zeros((b,), jnp.int32), pos=next_pos,
            step=jnp.zeros((), jnp.int32), first_slot=jnp.asarray(t, jnp.int32),
            tokens=jnp.zeros((b, num_new), jnp.int32), logprobs=jnp.zeros((b, num_new), jnp.float32),
            window=jnp.full((b, w), NO_TOKEN, jnp.int32), done=budget <= 0, stopped=jnp.zeros((b,), bool),
            length=jnp.zeros((b,), jnp.int32), budget=budget, row_keys=row_keys, temperature=temperature,
            top_p=top_p, top_k=top_k, stop_table=stop_table, stop_lengths=stop_lengths)
        return self._emit(st, logits)

    def _logits(self, params, h):
        """h [B, D] final-normed -> float32 logits [B, V]."""
        return self._math.logits(params, h)

    def _decode_impl(self, params, st: DecodeState) -> DecodeState:
        """Feed the last token, sample the next, until all rows are done or budgets are spent."""
        self.num_compilations += 1
        max_steps = jnp.max(st.budget)

        def cond(st: DecodeState):
            return (st.step < max_steps) & ~jnp.all(st.done)

        def body(st: DecodeState):
            slot = st.first_slot + st.step - 1  # where the last sampled token goes
            b = st.last.shape[0]
            kv_valid = jax.lax.dynamic_update_slice(st.kv_valid, jnp.ones((b, 1), bool), (0, slot))
            shared = st.prefix if st.prefix[0][0].shape[2] > 0 else None  # P = 0: no prefix
            hidden, cache = self._math.run(params, st.last[:, None], st.pos[:, None], st.cache, kv_valid,
                                           slot, prefix=shared, prefix_valid=st.prefix_valid)
            st = st._replace(cache=cache, kv_valid=kv_valid, pos=st.pos + 1)
            return self._emit(st, self._logits(params, hidden[:, 0]))

        return jax.lax.while_loop(cond, body, st)

    # ----- host side -----
    def generate(self, prompts: list[list[int]], *, max_new_tokens: int | Sequence[int], temperature: float = 0.0,
                 top_p: float = 1.0, top_k: int = 0, stop_token_ids: Sequence[int] = (),
                 stop_sequences: Sequence[Sequence[int]] = (), seed: int = 0,
                 share_prefix: bool | None = None, share_duplicates: bool = True, pack: bool = True,
                 row_seeds: Sequence[int] | None = None) -> list[Completion]:
        """Complete every prompt (a list of token ids). See module docstring for the layout.

        max_new_tokens: one budget, or one per prompt. temperature 0 = greedy. top_k 0 and
        top_p 1 are off. share_prefix: None decides by BucketConfig.min_shared_prefix.
        share_duplicates: prefill identical prompts once (each row still samples on its own).
        pack: prefill several short suffixes in one row of the prefill grid (False: one each).
        row_seeds: one non-negative integer per prompt; row i's random stream is then derived
        from (seed, row_seeds[i]) instead of from its position i in the batch, so its tokens do
        not depend on which other prompts share the call (the agent passes trajectory ids, so a
        host that samples only its own slice of the trajectories draws what one process
        sampling all of them would). None: the stream of row i is (seed, i).
        """
        stops = normalize_stops(stop_token_ids, stop_sequences)
        budgets = validate_request(prompts, max_new_tokens, temperature, top_p, top_k, self.config.vocab_size,
                                   self.max_len, stops)
        row_seeds = checked_row_seeds(row_seeds, len(prompts))
        prompts = [list(map(int, p)) for p in prompts]
        n = len(prompts)
        lay = layout_prefill(prompts, self.buckets, self._batch_shards(), share_prefix, share_duplicates, pack)
        b, nb = lay.batch, self.buckets.new_tokens(max(budgets))
        budget = np.zeros((b,), np.int32)
        budget[:n] = budgets  # padding rows: budget 0, done from the start, never emitted
        keys = row_keys(seed, row_seeds, b)
        table, lengths = pack_stops(stops)

        self.compiled_keys.add((b, lay.prefix_slots, lay.suffix_slots, nb, table.shape, lay.grid_rows))
        prefix_ids, prefix_pos, prefix_valid = lay.prefix
        (ids, pos, seg), (rows, cols, next_pos) = lay.grid, lay.reads
        st = self._prefill(self._params, self._put(prefix_ids, False), self._put(prefix_pos, False),
                           self._put(prefix_valid, False), self._put(ids, True), self._put(pos, True),
                           self._put(seg, True), self._put(rows, True), self._put(cols, True),
                           self._put(next_pos, True), self._put(budget, True), self._put(keys, True),
                           jnp.float32(temperature), jnp.float32(top_p), jnp.int32(top_k), self._put(table, False),
                           self._put(lengths, False), num_new=nb)
        st = self._decode(self._params, st)
        tokens, logprobs, length, stopped = jax.device_get((st.tokens, st.logprobs, st.length, st.stopped))
        return [Completion(tokens=tokens[i, :length[i]].tolist(), logprobs=logprobs[i, :length[i]].tolist(),
                           finish_reason="stop" if stopped[i] else "length") for i in range(n)]


def checked_row_seeds(row_seeds: Sequence[int] | None, num_prompts: int) -> list[int] | None:
    """generate()'s row_seeds as ints, or a ValueError naming what is wrong with them."""
    if row_seeds is None:
        return None
    row_seeds = [int(r) for r in row_seeds]
    if len(row_seeds) != num_prompts:
        raise ValueError(f"row_seeds has {len(row_seeds)} entries for {num_prompts} prompts")
    if any(not 0 <= r < 2 ** 32 for r in row_seeds):
        raise ValueError("row_seeds must be integers in [0, 2**32)")
    return row_seeds


def row_keys(seed: int, row_seeds: list[int] | None, batch: int) -> np.ndarray:
    """Each row's random key data: (seed, i) for row i, or (seed, row_seeds[i]) when given
    (padding rows past the prompts, never emitted, take 0)."""
    base = jax.random.key(int(seed))
    if row_seeds is None:
        fold = jnp.arange(batch)
    else:
        fold = jnp.asarray(np.asarray(row_seeds + [0] * (batch - len(row_seeds)), np.uint32))
    return np.asarray(jax.random.key_data(jax.vmap(lambda r: jax.random.fold_in(base, r))(fold)))


# Samplers kept by `generate`, keyed on what shapes their programs: a loop of one-shot calls on
# the same architecture reuses the compiled prefill/decode and only swaps the weights in.
_SAMPLERS: collections.OrderedDict[tuple, Sampler] = collections.OrderedDict()
_MAX_KEPT_SAMPLERS = 2


def cached_sampler(model: Qwen2, *, cache_dtype=None, mesh: Mesh | None = None) -> Sampler:
    """A Sampler for `model`'s architecture, reused across calls, holding `model`'s current
    weights. Prefill and decode are never recompiled; the weight-layout copy is redone only when
    the model's arrays changed since the last call (`Sampler.update_params`)."""
    cache_dtype = jnp.dtype(cache_dtype or model.config.dtype)
    graphdef = nnx.graphdef(model)
    key = (model.config, graphdef, mesh, cache_dtype)
    sampler = _SAMPLERS.get(key)
    if sampler is None:
        sampler = Sampler(model, cache_dtype=cache_dtype, mesh=mesh)
        _SAMPLERS[key] = sampler
        while len(_SAMPLERS) > _MAX_KEPT_SAMPLERS:
            _SAMPLERS.popitem(last=False)
    else:
        _SAMPLERS.move_to_end(key)
        sampler.update_params(model)
    return sampler


def generate(model: Qwen2, prompts: list[list[int]], *, max_new_tokens: int | Sequence[int],
             temperature: float = 0.0, top_p: float = 1.0, top_k: int = 0, stop_token_ids: Sequence[int] = (),
             stop_sequences: Sequence[Sequence[int]] = (), seed: int = 0, cache_dtype=None,
             mesh: Mesh | None = None) -> list[Completion]:
    """One-shot generation. Repeated calls on models of one architecture reuse one Sampler's
    compiled programs (`cached_sampler`). cache_dtype: the KV cache's dtype, by default the
    model's compute dtype (so a float32 model's log-probs match its full forward)."""
    # Validate before any Sampler is built: building one compiles the weight-layout program.
    validate_request(prompts, max_new_tokens, temperature, top_p, top_k, model.config.vocab_size,
                     model.config.max_position_embeddings, normalize_stops(stop_token_ids, stop_sequences))
    return cached_sampler(model, cache_dtype=cache_dtype, mesh=mesh).generate(
        prompts, max_new_tokens=max_new_tokens, temperature=temperature, top_p=top_p, top_k=top_k,
        stop_token_ids=stop_token_ids, stop_sequences=stop_sequences, seed=seed)
