"""Per-context loss weighting (issue 83 item 5), each rule against a hand-computed example.

Four trajectories in two groups of two, as a multi-context design writes them: trajectory 0 has three
rows (a memsearcher-like episode of three turns: 2, 1 and 3 generated tokens), trajectory 1 one row
(a react-like episode: 2 tokens), trajectory 2 two rows (1 and 1 token), trajectory 3 one row (4
tokens). Rewards 1.0 / 0.0 in group 0, 0.5 / 0.5 in group 1.
"""
from __future__ import annotations

import math

import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memsearcher_jax.agent.trajectory import Conversation, Trajectory
from memsearcher_jax.models import ModelConfig, Qwen2
from memsearcher_jax.rl.batching import pack_rows
from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner, OptimConfig, trajectory_advantages
from memsearcher_jax.rl.losses import (
    AGGREGATIONS,
    WHOLE_TRAJECTORY_AGGREGATIONS,
    LossConfig,
    aggregation_weights,
    per_token_loss,
    weighted_loss_sum,
)

TOKENS = {0: [2, 1, 3], 1: [2], 2: [1, 1], 3: [4]}   # generated tokens of each row, by trajectory
GROUP = {0: 0, 1: 0, 2: 1, 3: 1}
REWARD = {0: 1.0, 1: 0.0, 2: 0.5, 3: 0.5}


def _trajectories() -> list[Trajectory]:
    trajs = []
    for tid, rows in TOKENS.items():
        t = Trajectory(traj_id=tid, group_id=GROUP[tid], question="q", golds=["a"])
        for turn, n in enumerate(rows):
            conv = Conversation(prompt_ids=[5, 6], traj_id=tid, group_id=GROUP[tid], turn=turn)
            conv.add_generated([7] * n, [-1.0] * n)
            conv.add_injected([8])  # an observation: never in the loss
            t.conversations.append(conv)
        t.finish("answer")
        trajs.append(t)
    return trajs


def _rows():
    trajs = _trajectories()
    return pack_rows(trajs, trajectory_advantages(trajs, [REWARD[t.traj_id] for t in trajs]), pad_id=0, min_len=8)


def _weights(mode, rows):
    w, denom = aggregation_weights(mode, rows.loss_mask, rows.traj_ids, np.zeros(rows.num_rows, np.int64), 1)
    return w, denom


def _per_row(w, rows):
    """Each row's weight per masked token (every masked token of a row weighs the same)."""
    return [float(w[i][rows.loss_mask[i] > 0][0]) for i in range(rows.num_rows)]


def test_verls_rule_is_the_trajectory_advantage_on_every_row_and_a_token_mean():
    """verl (verl/trainer/ppo/v1/utils.py: compute_advantage_for_multi_trajectories): the GRPO
    advantage is computed over each session's FINAL output only (one score per trajectory, grouped by
    prompt: mean, unbiased std, + 1e-6), then the final row's advantage is copied to the session's other
    rows (times their response mask); the loss then averages over all rows' tokens ("token-mean",
    core_algos.agg_loss). By hand on this batch: group 0's scores 1 and 0 give mean 0.5 and unbiased
    std sqrt(0.5); group 1 ties, so 0."""
    rows = _rows()
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    want_adv = [a, a, a, -a, 0.0, 0.0, 0.0]  # rows in order: traj 0's three, traj 1, traj 2's two, traj 3
    np.testing.assert_allclose(rows.advantages, want_adv, rtol=1e-6)
    w, denom = _weights("token_mean", rows)
    assert denom == 14.0 and _per_row(w, rows) == [1.0] * 7  # 2+1+3 + 2 + 1+1 + 4 tokens, each weighing 1
    # The loss at ratio 1 without KL or entropy is -A per token: (6 tokens of -a, 2 of +a) / 14.
    loss, _ = per_token_loss(jnp.zeros(w.shape), jnp.zeros(w.shape), None, None, jnp.asarray(rows.advantages),
                             LossConfig(kl_coef=0.0, entropy_coef=0.0))
    assert float(weighted_loss_sum(loss, w)) / denom == pytest.approx((-6 * a + 2 * a) / 14, rel=1e-6)


def test_trajectory_mean_gives_each_trajectory_one_share_over_its_tokens():
    rows = _rows()
    w, denom = _weights("trajectory_mean", rows)
    # 1 / (the trajectory's tokens): traj 0 has 6, traj 1 has 2, traj 2 has 2, traj 3 has 4.
    assert denom == 4.0
    np.testing.assert_allclose(_per_row(w, rows), [1 / 6, 1 / 6, 1 / 6, 1 / 2, 1 / 2, 1 / 2, 1 / 4], rtol=1e-6)


def test_trajectory_row_mean_gives_each_row_of_a_trajectory_one_share():
    rows = _rows()
    w, denom = _weights("trajectory_row_mean", rows)
    # traj 0: three rows of 2, 1, 3 tokens, each row 1/3: 1/6, 1/3, 1/9 per token; traj 2: two rows of
    # one token, 1/2 each; one-row trajectories as in trajectory_mean.
    assert denom == 4.0
    np.testing.assert_allclose(_per_row(w, rows), [1 / 6, 1 / 3, 1 / 9, 1 / 2, 1 / 2, 1 / 2, 1 / 4], rtol=1e-6)
    assert all(w[rows.traj_ids == t].sum() == pytest.approx(1.0) for t in TOKENS)
    # A row without a generated token takes no share: the other rows of its trajectory keep theirs.
    mask = rows.loss_mask.copy()
    mask[1] = 0
    w2, _ = aggregation_weights("trajectory_row_mean", mask, rows.traj_ids, np.zeros(rows.num_rows, np.int64), 1)
    np.testing.assert_allclose(_per_row(w2, rows)[:1] + _per_row(w2, rows)[2:3], [1 / 4, 1 / 6], rtol=1e-6)


def test_the_weighting_modes_differ_where_trajectories_have_several_rows():
    rows = _rows()
    losses = {}
    loss = np.where(rows.loss_mask > 0, rows.turns[:, None] + 1.0, 0.0)  # a row's loss: its turn + 1
    for mode in ("token_mean", "trajectory_mean", "trajectory_row_mean"):
        w, denom = _weights(mode, rows)
        losses[mode] = float(weighted_loss_sum(jnp.asarray(loss), w)) / denom
    # By hand: token mean (2*1 + 1*2 + 3*3 + 2*1 + 1*1 + 1*2 + 4*1) / 14; trajectory mean: traj 0's
    # (2 + 2 + 9) / 6, then 1, 1.5, 1, over 4; row mean: traj 0's (1 + 2 + 3) / 3, then 1, 1.5, 1.
    assert losses["token_mean"] == pytest.approx(22 / 14)
    assert losses["trajectory_mean"] == pytest.approx((13 / 6 + 1 + 1.5 + 1) / 4)
    assert losses["trajectory_row_mean"] == pytest.approx((2 + 1 + 1.5 + 1) / 4)


def test_row_mean_keeps_trajectories_whole_in_the_minibatches():
    assert "trajectory_row_mean" in AGGREGATIONS and "trajectory_row_mean" in WHOLE_TRAJECTORY_AGGREGATIONS
    # 3 rows of 2 trajectories over 5 requested optimizer steps: whole trajectories make 2 mini-batches
    # (3 empty ones skipped), as trajectory_mean does; a row split would make 3.
    from tests.test_grpo import _toy_rows

    rows = _toy_rows(n=3)
    rows.traj_ids = np.array([0, 0, 1])
    learner = GRPOLearner(Qwen2(ModelConfig.tiny(vocab_size=64, num_layers=1), rngs=nnx.Rngs(1)),
                          GRPOConfig(min_seq_len=64, optimizer_steps=5, micro_batch_size=2, logprob_batch_size=4,
                                     loss=LossConfig(aggregation="trajectory_row_mean"),
                                     optim=OptimConfig(learning_rate=1e-3)))
    assert learner.train_on_rows(rows, np.random.default_rng(0))["empty_minibatches"] == 3
