"""Multi-context GRPO: from scored trajectories to the optimizer updates of one training step.

The step itself (rollout, filtering, this file's pieces, the sampler's new weights) is
`rl/trainer.py::Trainer.train_step`; this file is what it calls between rollout and sampler:

    trajectories --rewards--> R_i --group_advantages--> A_i
    (rl/batching.py: A_i on every conversation row, rows --pack--> [R, S] token arrays)
    rows --trainer log-probs--> old / ref log-probs
    rows --shuffle, split into `optimizer_steps` mini-batches--> for each one holding a loss token:
        aggregation weights over the mini-batch (exact global token mean by default)
        --micro-batches of rows of like length, gradients summed--> / denominator --AdamW--> params

The rows, their packing, the mini-batch indices and the micro-batch blocks are the learner's
host-side batching, all in `rl/batching.py`; the per-token loss, aggregation weights and metric
sums are pure functions in `rl/losses.py`. `GRPOLearner` holds the params, the frozen reference,
the optimizer state and the jitted programs; its `train_on_rows` takes the rows' log-probs, runs
one update per mini-batch (blocks laid out by its base `batching.RowLayout`) and reduces their metrics.
"""
from __future__ import annotations

import dataclasses
import functools
import math
import time
from collections.abc import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh

from memsearcher_jax.agent.rollout import Trajectory
from memsearcher_jax.qa_metrics import RewardResult, compute_reward
from memsearcher_jax.rl.advantages import group_advantages
from memsearcher_jax.rl.batching import (
    RowBatch,
    RowLayout,
    fit_block,
    loss_windows,
    minibatch_row_indices,
    packed_targets,
    real_lengths,
    to_host,
)
from memsearcher_jax.rl.learner import Learner, OptimConfig, apply_update, make_optimizer, merge_params
from memsearcher_jax.rl.losses import (
    AUX_METRIC_KEYS,
    WHOLE_TRAJECTORY_AGGREGATIONS,
    LossConfig,
    combine_metric_sums,
    empty_metric_sums,
    masked_aux_sums,
    per_token_loss,
    tis_weights,
    weighted_loss_sum,
)
from memsearcher_jax.runtime import compile_stats
from memsearcher_jax.sampling.distributions import token_logprobs

# ----------------------------------------------------------------------------- rewards and advantages

def score_trajectories(trajs: Sequence[Trajectory], reward_fn: Callable = compute_reward) -> list[RewardResult]:
    """Each trajectory's reward from its final conversation: reward_fn(blocks, ended_with_eos,
    golds) -> RewardResult (docs/method.md §3 by default)."""
    return [reward_fn(t.final.blocks, t.final.ended_with_eos, t.golds) for t in trajs]


def with_coverage(results: Sequence[RewardResult], trajs: Sequence[Trajectory], coef: float) -> list[RewardResult]:
    """Each reward plus coef x the share of its task's questions some search named (issue 83: GRPO
    otherwise learns that a short episode answering part of a task is a sure partial reward). A
    question counts as searched as the hint counts it (Trajectory.unsearched_questions). coef 0:
    the results themselves, untouched; EM and F1 are never changed."""
    if coef == 0:
        return list(results)
    shares = [1.0 - t.unsearched_questions() / max(len(t.subjects), 1) for t in trajs]
    return [dataclasses.replace(r, reward=r.reward + coef * share) for r, share in zip(results, shares)]


def trajectory_advantages(trajs: Sequence[Trajectory], rewards: Sequence[float]) -> np.ndarray:
    return group_advantages(np.asarray(rewards, np.float64), np.array([t.group_id for t in trajs]))


# ----------------------------------------------------------------------------- the loss through the model (traced)

def _logp_entropy(logits: jax.Array, targets: jax.Array, entropy: bool = True, temperature: float = 1.0):
    if temperature != 1.0:  # the policy the rollout sampled from (as verl divides by it); 1.0 leaves logits as they are
        logits = logits.astype(jnp.float32) / temperature
    logp = token_logprobs(logits, targets)
    if not entropy:  # a pass over the vocabulary saved (XLA cannot drop it from inside lax.map's loop)
        return logp, jnp.zeros_like(logp)
    logz = jax.nn.logsumexp(logits, axis=-1)
    return logp, logz - jnp.sum(jax.nn.softmax(logits, axis=-1) * logits, axis=-1)


def _head_logp_entropy(model, h: jax.Array, targets: jax.Array, logits_chunk: int, entropy: bool, temperature=1.0):
    """Final hidden states h [B, T, D] and the ids they predict [B, T] -> (logp, entropy) [B, T]."""
    if logits_chunk <= 0 or logits_chunk >= h.shape[1]:
        return _logp_entropy(model.logits_from_hidden(h), targets, entropy, temperature)
    b, t = targets.shape
    n = -(-t // logits_chunk)
    h = jnp.pad(h, ((0, 0), (0, n * logits_chunk - t), (0, 0)))
    targets = jnp.pad(targets, ((0, 0), (0, n * logits_chunk - t)))
    chunks = (h.reshape(b, n, logits_chunk, -1).swapaxes(0, 1), targets.reshape(b, n, logits_chunk).swapaxes(0, 1))
    piece = jax.checkpoint(lambda c: _logp_entropy(model.logits_from_hidden(c[0]), c[1], entropy, temperature))
    logp, ent = (x.swapaxes(0, 1).reshape(b, n * logits_chunk)[:, :t] for x in jax.lax.map(piece, chunks))
    return logp, ent


def token_logprobs_and_entropy(model, tokens: jax.Array, attention: jax.Array, logits_chunk: int = 0,
                               entropy: bool = True, targets_at: jax.Array | None = None,
                               positions: jax.Array | None = None, segments: jax.Array | None = None,
                               temperature: float = 1.0):
    """tokens/attention [B, S] -> (logp [B, S], entropy [B, S]) aligned to targets.

    logp[:, j] = log p(tokens[j] | tokens[<j]) for j >= 1 (0 at j = 0); entropy[:, j] is the
    entropy of the distribution that predicted token j. Softmax in float32.

    targets_at [B, W] int (positions >= 1): only those targets' log-probs and entropies, [B, W]
    each. The trunk still runs over every position (attention needs them), but the head, the
    largest matmul of a small model, and its log-softmax run on W positions instead of S - 1:
    the loss reads only the generated tokens, a short window of a long agent prompt.

    logits_chunk > 0: the float32 logits are never whole: the final hidden states go
    through the head `logits_chunk` positions at a time, each chunk's logits recomputed in the
    backward pass (jax.checkpoint), so the loss holds one chunk's logits instead of all of them.
    entropy=False: zeros instead (the log-prob passes need none).

    positions, segments [B, S] int: packed rows (`pack_segments`): several conversations per
    row, each attending only to itself with positions from 0; `attention` is then unused.
    temperature (static): log-probs and entropy of softmax(logits / temperature), what a rollout drew from.
    """
    if segments is not None:
        h = model.hidden_states(tokens, positions=positions, segment_ids=segments)
    else:
        h = model.hidden_states(tokens, attention_mask=attention)
    if targets_at is not None:
        h = jnp.take_along_axis(h, (targets_at - 1)[:, :, None], axis=1)
        targets = jnp.take_along_axis(tokens, targets_at, axis=1)
        return _head_logp_entropy(model, h, targets, logits_chunk, entropy, temperature)
    logp, ent = _head_logp_entropy(model, h[:, :-1], tokens[:, 1:], logits_chunk, entropy, temperature)
    pad = jnp.zeros((tokens.shape[0], 1), jnp.float32)
    return jnp.concatenate([pad, logp], axis=1), jnp.concatenate([pad, ent], axis=1)


def micro_batch_loss(params, graphdef, mb: dict, loss_cfg: LossConfig, frozen=None, logits_chunk: int = 0):
    """sum(weights * per-token loss) for one micro-batch, plus masked metric sums. frozen: a
    LoRA model's base (params are then its adapters); logits_chunk: see token_logprobs_and_entropy.

    mb: tokens, attention [B, S]; advantages [B]; loss_mask, weights, old_logp, ref_logp (and
    tis) [B, S], or, with "targets_at" [B, W] (loss_windows), [B, W]: those positions only.
    Packed rows: positions and segments [B, S] instead of attention, advantages per token.
    Without ref_logp (rl.kl_coef 0: no reference pass) the KL term and its metric are 0."""
    model = merge_params(graphdef, params, frozen)
    logp, entropy = token_logprobs_and_entropy(model, mb["tokens"], mb.get("attention"), logits_chunk,
                                               targets_at=mb.get("targets_at"), positions=mb.get("positions"),
                                               segments=mb.get("segments"), temperature=loss_cfg.temperature)
    if loss_cfg.entropy_coef == 0:  # a metric only: no backward pass over the vocabulary for it
        entropy = jax.lax.stop_gradient(entropy)
    loss, aux = per_token_loss(logp, mb["old_logp"], mb.get("ref_logp"), entropy, mb["advantages"], loss_cfg,
                               mb.get("tis"))
    aux = dict(aux, entropy=entropy, trainer_logp=logp)
    sums = masked_aux_sums({k: aux[k] for k in AUX_METRIC_KEYS}, mb["loss_mask"])
    return weighted_loss_sum(loss, mb["weights"]), sums


# ----------------------------------------------------------------------------- learner

@dataclasses.dataclass(frozen=True)
class GRPOConfig:
    """Defaults: the rl.* keys' (settings/training.py; tests/test_lower_defaults.py holds them equal)."""
    optimizer_steps: int = 2           # mini-batches (optimizer steps) per training step, fixed
    micro_batch_size: int = 8          # rows per micro-batch (gradient accumulation unit)
    logprob_batch_size: int = 32       # rows per forward when recomputing old/ref log-probs
    shuffle_rows: bool = True          # the recipe does not shuffle; we do (docs/method.md §2)
    min_seq_len: int = 1024            # smallest sequence-length bucket
    max_seq_len: int = 32768
    logits_chunk: int = 0              # loss and log-probs: the head's logits this many positions at a time (0: all)
    pack_rows: bool = True             # conversations share rows (segments) in the log-prob passes and the update
    # Where the old policy's log-probs come from: "recompute" (a trainer pass, as verl does) or
    # "sampler" (the rollout's own, which ran these weights; recomputed after all in a step where
    # any row shows a sampled token with |trainer - sampler| > old_logprobs_max_gap).
    old_logprobs: str = "recompute"
    old_logprobs_max_gap: float = 0.01
    loss: LossConfig = LossConfig()
    optim: OptimConfig = OptimConfig()

    def __post_init__(self):
        if self.old_logprobs not in ("recompute", "sampler"):
            raise ValueError(f"GRPOConfig.old_logprobs={self.old_logprobs!r}; expected 'recompute' or 'sampler'")
        if not self.old_logprobs_max_gap > 0:
            raise ValueError(f"GRPOConfig.old_logprobs_max_gap must be > 0, got {self.old_logprobs_max_gap}")


class GRPOLearner(RowLayout, Learner):
    """Holds params, the frozen reference, the optimizer state, and the jitted programs.

    LoRA (the model's config.lora_rank > 0): params are the adapters, the optimizer state
    covers them alone, and the reference is the frozen base itself, scored with all-zero
    adapters (x A 0 adds exactly nothing), so no copy of the weights is kept. With no KL term
    (loss.kl_coef 0) there is no reference at all: ref_params is None."""

    def __init__(self, model, config: GRPOConfig, mesh: Mesh | None = None):
        super().__init__(model, make_optimizer(config.optim))
        self.config = config
        self.mesh = mesh
        if config.loss.kl_coef == 0:
            self.ref_params = None  # no KL term reads a reference: keep no copy of the weights
        elif self.frozen is None:
            # The reference is the initial weights, frozen: a separate copy of the arrays.
            self.ref_params = jax.tree.map(lambda x: x.copy(), self.params)
        else:
            self.ref_params = jax.tree.map(lambda x: jnp.zeros(x.shape, x.dtype, device=x.sharding), self.params)
        self.skipped_steps = 0
        graphdef, loss_cfg, tx, chunk = self.graphdef, config.loss, self.tx, config.logits_chunk

        @jax.jit
        def logprobs(params, frozen, tokens, attention, targets_at, positions=None, segments=None):
            model = merge_params(graphdef, params, frozen)
            return token_logprobs_and_entropy(model, tokens, attention, chunk, False, targets_at, positions, segments,
                                              loss_cfg.temperature)[0]

        # One program per micro-batch, called in a Python loop, and one for the optimizer step: their
        # shapes never depend on how many micro-batches a step has (a lax.scan over all of them
        # compiled anew for every count), and a dispatch per micro-batch costs nothing beside it.
        grad_fn = jax.value_and_grad(micro_batch_loss, has_aux=True)

        @jax.jit
        def zero_sums(params):
            return (jax.tree.map(lambda p: jnp.zeros(p.shape, jnp.float32), params), jnp.zeros((), jnp.float32),
                    empty_metric_sums())

        @functools.partial(jax.jit, donate_argnums=(0,))
        def accumulate(acc, params, frozen, mb):
            (loss, sums), g = grad_fn(params, graphdef, mb, loss_cfg, frozen, chunk)
            return jax.tree.map(jnp.add, acc[0], g), acc[1] + loss, combine_metric_sums(acc[2], sums)

        @self.donating_jit
        def update(params, opt_state, acc, denominator):
            grads, loss_sum, sums = acc
            grads = jax.tree.map(lambda g: g / denominator, grads)
            params, opt_state, gnorm, skipped = apply_update(params, opt_state, grads, tx)
            return params, opt_state, loss_sum / denominator, gnorm, skipped, sums

        self._logprobs = logprobs
        self._zero_sums, self._accumulate, self._update = zero_sums, accumulate, update

    def compute_logprobs(self, params, rows: RowBatch) -> np.ndarray:
        """Trainer log-probs [R, S] of exactly the sampled ids at the positions the loss reads (each
        row's window over its loss_mask, see loss_windows; 0 outside them), in chunks of
        logprob_batch_size rows of like length, each only as wide as its own longest row.
        rl.pack_rows: over packed rows instead (`_packed_logprobs`), 0 off the loss positions."""
        if self.config.pack_rows:
            return self._packed_logprobs(params, rows)
        bs = self.config.logprob_batch_size
        lengths = real_lengths(rows.attention)
        order = np.argsort(lengths, kind="stable")
        out = np.zeros(rows.tokens.shape, np.float32)
        for i in range(0, rows.num_rows, bs):
            idx = order[i:i + bs]
            width = self.row_width(lengths[idx], rows.tokens.shape[1])
            # Zero rows pad the last chunk so one program serves every chunk of this width.
            tok, att, mask = (fit_block(a[idx], bs, width) for a in (rows.tokens, rows.attention, rows.loss_mask))
            at = loss_windows(mask, width, self.config.min_seq_len)
            lp = to_host(self._logprobs(params, self.frozen, self._put(tok, 0), self._put(att, 0), self._put(at, 0)))
            out[idx[:, None], at[:len(idx)]] = lp[:len(idx)]
        return out

    def _packed_logprobs(self, params, rows: RowBatch) -> np.ndarray:
        """compute_logprobs over packed rows: every conversation first-fit into rows of one width,
        logprob_batch_size rows a call, the head on each row's loss positions (packed_targets)."""
        bs = self.config.logprob_batch_size
        packed, packing = self._pack({"tokens": rows.tokens, "loss_mask": rows.loss_mask}, real_lengths(rows.attention))
        lp_packed = np.zeros(packed["tokens"].shape, np.float32)
        for i in range(0, packing.num_rows, bs):
            part = np.arange(i, min(i + bs, packing.num_rows))
            block = self._packed_block(packed, part, bs)
            at = packed_targets(block["loss_mask"], packing.width, self.config.min_seq_len)
            lp = to_host(self._logprobs(params, self.frozen, self._put(block["tokens"], 0), None, self._put(at, 0),
                                         self._put(block["positions"], 0), self._put(block["segments"], 0)))
            lp_packed[part[:, None], at[:len(part)]] = lp[:len(part)]
        conv, within, row, slot = packing.slots()
        out = np.zeros(rows.tokens.shape, np.float32)
        out[conv, within] = lp_packed[row, slot]
        return np.where(rows.loss_mask != 0, out, 0.0).astype(np.float32)

    def _minibatch_sums(self, rows: RowBatch, idx: np.ndarray, old_logp, ref_logp, tis):
        """One mini-batch's summed gradients, loss and metric sums (not yet applied), and its denominator."""
        micro, denom = self._micro_batches(rows, idx, old_logp, ref_logp, tis)
        acc = self._zero_sums(self.params)
        for mb in micro:
            acc = self._accumulate(acc, self.params, self.frozen, mb)
        return acc, denom

    def _tis(self, old_logp: np.ndarray, rows: RowBatch) -> np.ndarray | None:
        loss = self.config.loss
        return (tis_weights(old_logp, rows.sampler_logp, loss.tis_cap, log_ratio_clamp=loss.log_ratio_clamp)
                if loss.tis_cap > 0 else None)

    def _old_and_ref_logprobs(self, rows: RowBatch):
        """(old, ref or None) log-probs. Old: recomputed, or the sampler's (rl.old_logprobs). The
        reference pass only with a KL term: nothing else reads it."""
        cfg = self.config
        old_logp = rows.sampler_logp if cfg.old_logprobs == "sampler" else self.compute_logprobs(self.params, rows)
        ref_logp = self.compute_logprobs(self.ref_params, rows) if cfg.loss.kl_coef != 0 else None
        return old_logp, ref_logp

    def train_on_rows(self, rows: RowBatch, rng: np.random.Generator, stale: bool = False) -> dict:
        """Old/ref log-probs, then one update per mini-batch of the shuffled rows that holds a loss token.

        A mini-batch with no loss token (no rows: more optimizer_steps than rows, or than
        trajectories under trajectory_mean; or only rows whose loss mask is all 0) is skipped and
        counted in `empty_minibatches`: it has no gradient, and an AdamW step on zero gradients
        would still move the weights (momentum, weight decay). The loss is averaged over the
        updates taken.

        rl.old_logprobs="sampler": the first mini-batch's loss pass runs the weights the sampler
        ran, so its ratios exp(trainer - sampler) measure the gap on its tokens for free; the other
        rows' gap takes a forward pass over them (`_gap_outside`), before the first update. Above
        old_logprobs_max_gap on any row the old log-probs are recomputed and that mini-batch redone.
        stale (rows sampled by older weights, rl.max_staleness > 0): the sampler's log-probs are the
        behaviour policy's, which the ratio and clip are taken against; the gap is then the policy's
        drift since, not a mismatch: it is logged (the first mini-batch's, free), nothing is recomputed."""
        cfg = self.config
        t0, c0 = time.perf_counter(), compile_stats.snapshot()
        old_logp, ref_logp = self._old_and_ref_logprobs(rows)
        time_logprobs, compiles_logprobs = time.perf_counter() - t0, (compile_stats.snapshot() - c0).programs
        minibatches = minibatch_row_indices(rows.traj_ids, cfg.optimizer_steps, rng, shuffle=cfg.shuffle_rows,
                                            whole_trajectories=cfg.loss.aggregation in WHOLE_TRAJECTORY_AGGREGATIONS)
        minibatches = [idx for idx in minibatches if rows.loss_mask[idx].any()]
        tis = self._tis(old_logp, rows)
        metrics = {"loss": 0.0, "grad_norm": 0.0, "skipped": 0, "old_logprobs_fallback": 0,
                   "empty_minibatches": cfg.optimizer_steps - len(minibatches)}
        totals = empty_metric_sums(np)
        sampler_gap = None
        # The first update's ratios (policy == old policy, so 1 up to rounding) apart from the step's: a
        # ratio far from 1 there is a log-prob mismatch between the passes; later, the updates' own drift.
        metrics.update(ratio_max_first=1.0, ratio_min_first=1.0)
        for i, idx in enumerate(minibatches):
            acc, denom = self._minibatch_sums(rows, idx, old_logp, ref_logp, tis)
            if stale and i == 0:
                sampler_gap = _gap_from_ratios(acc[2])
            elif cfg.old_logprobs == "sampler" and i == 0:
                t1 = time.perf_counter()
                sampler_gap = max(_gap_from_ratios(acc[2]), self._gap_outside(rows, idx))
                if sampler_gap > cfg.old_logprobs_max_gap:
                    sampler_gap = None
                    old_logp = self.compute_logprobs(self.params, rows)
                    tis, metrics["old_logprobs_fallback"] = self._tis(old_logp, rows), 1
                time_logprobs += time.perf_counter() - t1
                if sampler_gap is None:
                    acc, denom = self._minibatch_sums(rows, idx, old_logp, ref_logp, tis)
            self.params, self.opt_state, loss, gnorm, skipped, sums = self._update(
                self.params, self.opt_state, acc, jnp.float32(denom))
            skipped = int(bool(skipped))
            self.skipped_steps += skipped
            metrics["skipped"] += skipped
            metrics["loss"] += float(loss) / len(minibatches)
            metrics["grad_norm"] = max(metrics["grad_norm"], float(gnorm))
            totals = combine_metric_sums(totals, {k: np.float64(v) for k, v in sums.items()}, np)
            if i == 0:
                metrics.update(ratio_max_first=float(sums["ratio_max"]), ratio_min_first=float(sums["ratio_min"]))
        n = max(float(totals["n_tokens"]), 1.0)
        gap = np.abs(rows.sampler_logp - old_logp)[rows.loss_mask > 0]
        metrics.update({
            "clip_fraction": float(totals["is_clipped"]) / n,
            "dual_clip_fraction": float(totals["is_dual_clipped"]) / n,
            "approx_kl": float(totals["kl"]) / n,
            "entropy": float(totals["entropy"]) / n,
            "ratio_max": float(totals["ratio_max"]), "ratio_min": float(totals["ratio_min"]),
            # Over every row: "sampler" mode's sampler_gap (no fallback), else |sampler - old|.
            "logprob_gap_max": sampler_gap if sampler_gap is not None else float(gap.max()) if gap.size else 0.0,
            "trained_tokens": int(rows.loss_mask.sum()),
            "time_logprobs": time_logprobs, "compiles_logprobs": compiles_logprobs,
            **self._padding_metrics(rows, minibatches),
        })
        return metrics

    def _gap_outside(self, rows: RowBatch, first: np.ndarray) -> float:
        """max |trainer - sampler| log-prob over the loss tokens of the rows outside the first
        mini-batch `first`, at the current weights (those the sampler ran: call it before any
        update); inf when not finite. A mismatch confined to some rows (a dtype, kernel or sharding
        difference) must not hide in a later mini-batch, whose own loss pass runs updated weights."""
        rest = np.setdiff1d(np.arange(rows.num_rows), first)
        rest = rest[rows.loss_mask[rest].any(axis=1)]
        if not len(rest):
            return 0.0
        part = rows.take(rest)
        gap = np.abs(self.compute_logprobs(self.params, part) - part.sampler_logp)[part.loss_mask > 0]
        return float(gap.max()) if np.isfinite(gap).all() else float("inf")


def _gap_from_ratios(sums: dict) -> float:
    """max |trainer - old| log-prob over a mini-batch's loss tokens, from its ratio extremes
    (ratio = exp(trainer - old)); 0 when it had no loss tokens."""
    hi, lo = float(sums["ratio_max"]), float(sums["ratio_min"])
    if hi == -np.inf:
        return 0.0
    if not (np.isfinite(hi) and np.isfinite(lo) and lo > 0):  # not finite: never trust the sampler's
        return float("inf")
    return max(abs(math.log(hi)), abs(math.log(lo)))
