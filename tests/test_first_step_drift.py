"""Issue 56, 11b (docs/lab/2026-11-29-first-step-kl.md): how far AdamW's first GRPO step moves a token's
log-prob when every group ties (advantages 0, only the entropy bonus pulls), and whether a large
tied vocabulary (Qwen's 151936 rows) makes it larger."""
from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from memsearcher_jax.models import ModelConfig, Qwen2
from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner, OptimConfig, token_logprobs_and_entropy
from memsearcher_jax.rl.learner import merge_params
from tests.test_grpo import _toy_rows

LR, EPS = 1e-4, 1e-8  # EPS: optax.adamw's default, what make_optimizer uses


def _one_step(vocab: int):
    """One AdamW step of a tied one-layer model on the toy rows with every advantage 0 ->
    (per-token log-prob change on the loss tokens, its first-order prediction from the weights'
    change, the embedding table's change)."""
    rows = _toy_rows()
    rows.advantages[:] = 0.0
    learner = GRPOLearner(Qwen2(ModelConfig.tiny(vocab_size=vocab, num_layers=1), rngs=nnx.Rngs(4)),
                          GRPOConfig(optimizer_steps=1, micro_batch_size=8, logprob_batch_size=8, min_seq_len=8,
                                     optim=OptimConfig(learning_rate=LR)))
    before = jax.tree.map(jnp.array, learner.params)
    old = learner.compute_logprobs(before, rows)
    m = learner.train_on_rows(rows, np.random.default_rng(0))
    assert m["ratio_min_first"] == pytest.approx(1.0, abs=1e-6) and m["ratio_max_first"] == pytest.approx(1.0, abs=1e-6)
    new = learner.compute_logprobs(learner.params, rows)
    step = jax.tree.map(lambda a, b: a - b, learner.params, before)

    def logp(params):
        model = merge_params(learner.graphdef, params, learner.frozen)
        return token_logprobs_and_entropy(model, jnp.asarray(rows.tokens), jnp.asarray(rows.attention))[0]

    predicted = np.asarray(jax.jvp(logp, (before,), (step,))[1])  # d logp . (theta_1 - theta_0)
    on = rows.loss_mask > 0
    embed = [np.asarray(d) for d in jax.tree.leaves(step) if d.shape == (vocab, 64)]
    assert len(embed) == 1  # tied: one table, read as input and as output
    return (new - old)[on], predicted[on], embed[0]


@pytest.mark.slow
def test_first_step_drift_is_the_sign_step_and_does_not_grow_with_the_vocabulary():
    small, large = _one_step(64), _one_step(8192)
    for drift, predicted, _ in (small, large):
        # The measured change is the first-order one along the step: the log-prob and loss passes agree.
        assert np.abs(drift - predicted).max() < 0.05 * np.abs(drift).max()
        assert np.abs(drift).max() > 10 * 1e-6  # well above f32 rounding
    # AdamW's first step is lr * g / (|g| + eps): a weight moves by ~lr whatever its gradient's size,
    # once that is well above eps. The entropy bonus pulls each output row by ~p_v ~ 1/V: at 64 ids
    # nearly every row of the tied table moves by ~lr; at 8192 most rows' gradients fall under eps
    # and they barely move. So a large vocabulary's extra rows add rows that hardly move, not drift.
    (_, _, embed_64), (_, _, embed_8192) = small, large
    assert np.median(np.abs(embed_64)) > 0.7 * LR  # measured 0.99 lr
    assert np.median(np.abs(embed_8192)) < 0.5 * LR  # measured 0.23 lr
    # Nor does the drift grow: each logit moves by at most lr * ||h||_1 through its own row, and the
    # log-sum-exp by a p-weighted mean of those, whatever the vocabulary's size.
    assert np.abs(large[0]).max() < 1.5 * np.abs(small[0]).max()  # measured 0.0054 against 0.0090 nats
