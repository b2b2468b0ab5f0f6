"""The agent-shaped update rows of bench/peers.py (`--rows agent_update`): the GRPO update on many
short conversations, the rows a multi-context GRPO step trains, ours packed, Tunix padded its way.

Rows: a fixed, seeded list of conversation lengths shaped like the default job's
(`logs/metrics.jsonl` of `configs/default.py`, 2026-11-29: 90-191 rows a step, context 70-110
tokens a row (mean ~78), responses averaging 30-114 tokens, rows averaging 100-193 tokens): each
row a context of 64-100 tokens and a response of gamma(1.5, 60) tokens (mean ~90, a long tail),
the whole row kept within 400 tokens; 128 rows (--quick: 24), lengths 70-400, mean 173. The loss
mask is the whole response; one advantage per row.

Ours: the rows as `rl.batching.pack_rows` lays them out (right-padded to the quarter-octave bucket of
the longest), through `GRPOLearner.train_on_rows` with rl.pack_rows on: conversations first-fit
into packed rows, --micro packed rows a micro-batch. Tunix, as its GRPO learner feeds its
trainer: prompts left-padded to the rollout's max_prompt_length and completions right-padded to
max_tokens_to_generate (tunix/rl/grpo/grpo_learner.py), given here as the step's longest
context and longest response (the tightest a user could set), --micro conversations a
micro-batch. Both aggregate each micro-batch of --micro conversations (in order) by its token
mean and average over micro-batches (ours: microbatch_token_mean), so the step's loss is one
number on both sides: checked first, through our learner's own packed micro-batches, before any
timing (tolerance LOSS_TOL).
"""
from __future__ import annotations

import jax
import numpy as np
from learner import forward_flops  # bench/learner.py

from memsearcher_jax.rl.batching import RowBatch
from memsearcher_jax.rl.grpo import GRPOLearner, micro_batch_loss
from memsearcher_jax.sampling.buckets import bucket

ROWS, ROWS_QUICK = 128, 24
CONTEXT = (64, 100)          # context tokens a row (question + memory), inclusive
RESPONSE = (1.5, 60.0)       # gamma shape, scale of the response tokens (mean 90)
MAX_LEN, MIN_RESPONSE = 400, 4
SEED = 59
LOSS_TOL = 1e-4              # |ours - Tunix| on the step's loss (f32, sums over ~10k tokens): beyond it, no timing
PAD = 0


def agent_lengths(n_rows: int, seed: int = SEED) -> tuple[np.ndarray, np.ndarray]:
    """(context, response) tokens of each of n_rows conversations, seeded."""
    rng = np.random.RandomState(seed)
    ctx = rng.randint(CONTEXT[0], CONTEXT[1] + 1, n_rows)
    resp = np.round(rng.gamma(*RESPONSE, n_rows)).astype(np.int64)
    return ctx.astype(np.int64), np.clip(resp, MIN_RESPONSE, MAX_LEN - ctx)


def make_agent_rows(vocab: int, n_rows: int, min_len: int = 64, seed: int = SEED) -> dict:
    """The conversations as pack_rows lays them out: [R, S] right-padded, S the quarter-octave
    bucket of the longest; the loss mask on the response; "context" [R] for Tunix's layout."""
    ctx, resp = agent_lengths(n_rows, seed)
    rng = np.random.RandomState(seed + 1)
    s = bucket(int((ctx + resp).max()), min_len, steps_per_octave=4)
    tokens = np.full((n_rows, s), PAD, np.int32)
    attention = np.zeros((n_rows, s), np.int32)
    mask = np.zeros((n_rows, s), np.float32)
    for i, (c, r) in enumerate(zip(ctx, resp)):
        tokens[i, :c + r] = rng.randint(10, vocab, c + r)
        attention[i, :c + r] = 1
        mask[i, c:c + r] = 1
    return dict(tokens=tokens, attention=attention, loss_mask=mask, context=ctx.astype(np.int32),
                advantages=rng.randn(n_rows).astype(np.float32))


def tunix_agent_layout(rows: dict, old: np.ndarray, ref: np.ndarray) -> dict:
    """Our [R, S] rows as Tunix's GRPO learner pads them: prompt [R, P] left-padded, completion
    [R, C] right-padded (P, C: the longest context and response), the completion's log-probs."""
    ctx = rows["context"].astype(np.int64)
    resp = rows["attention"].sum(axis=1) - ctx
    p, c, n = int(ctx.max()), int(resp.max()), len(ctx)
    out = dict(prompt_ids=np.full((n, p), PAD, np.int32), completion_ids=np.full((n, c), PAD, np.int32),
               completion_mask=np.zeros((n, c), np.float32), old_logps=np.zeros((n, c), np.float32),
               ref_logps=np.zeros((n, c), np.float32), advantages=rows["advantages"])
    for i, (k, r) in enumerate(zip(ctx, resp)):
        out["prompt_ids"][i, p - k:] = rows["tokens"][i, :k]
        window = slice(k, k + r)
        out["completion_ids"][i, :r] = rows["tokens"][i, window]
        out["completion_mask"][i, :r] = rows["loss_mask"][i, window]
        out["old_logps"][i, :r] = old[i, window]
        out["ref_logps"][i, :r] = ref[i, window]
    return out


def packed_step_loss(learner: GRPOLearner, rows: RowBatch, old: np.ndarray, ref: np.ndarray) -> float:
    """The optimizer step's loss at the current params through the learner's own micro-batches
    (packed when rl.pack_rows: segments, positions, packed_targets, aggregation weights): what
    train_on_rows differentiates, summed over micro-batches over its denominator."""
    micro, denom = learner._micro_batches(rows, np.arange(rows.num_rows), old, ref, None)
    loss_fn = jax.jit(micro_batch_loss, static_argnums=(1, 3))
    return sum(float(loss_fn(learner.params, learner.graphdef, mb, learner.config.loss)[0]) for mb in micro) / denom


def agent_flops(cfg, rows: dict) -> float:
    """Forward FLOPs over the real tokens alone: each conversation its own causal attention, the
    head on its response (the logits the loss reads)."""
    total = rows["attention"].sum(axis=1)
    resp = total - rows["context"]
    return float(sum(forward_flops(cfg, 1, int(t), int(r)) for t, r in zip(total, resp)))


def describe(rows: dict) -> str:
    n = rows["attention"].sum(axis=1)
    return f"{len(n)} conversations of {n.min()}-{n.max()} tokens (mean {n.mean():.0f})"
