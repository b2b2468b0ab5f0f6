"""The shared learner core: optimizer schedules and the non-finite skip."""
from __future__ import annotations

import jax.numpy as jnp
import numpy as np
import pytest

from memsearcher_jax.rl.learner import OptimConfig, apply_update, make_optimizer


def test_schedules():
    const = OptimConfig(learning_rate=1e-3).schedule_fn()
    assert [float(const(s)) for s in (0, 10, 1000)] == pytest.approx([1e-3] * 3)
    warm = OptimConfig(learning_rate=1e-3, warmup_steps=10).schedule_fn()
    assert [float(warm(s)) for s in (0, 5, 10, 500)] == pytest.approx([0.0, 5e-4, 1e-3, 1e-3])
    cos = OptimConfig(learning_rate=1e-3, schedule="cosine", warmup_steps=10, total_steps=110,
                      final_lr_fraction=0.1).schedule_fn()
    assert [float(cos(s)) for s in (0, 10, 60, 110)] == pytest.approx([0.0, 1e-3, 5.5e-4, 1e-4], rel=1e-4)
    with pytest.raises(ValueError, match="total_steps > warmup_steps"):
        OptimConfig(schedule="cosine", warmup_steps=5, total_steps=5)
    with pytest.raises(ValueError, match="schedule must be one of"):
        OptimConfig(schedule="linear")


def test_later_rates_replace_the_schedule_from_their_steps():
    """A phase added after the cosine's end runs at its own constant rate; nothing before it moves."""
    base = OptimConfig(learning_rate=1e-3, schedule="cosine", warmup_steps=10, total_steps=110).schedule_fn()
    late = OptimConfig(learning_rate=1e-3, schedule="cosine", warmup_steps=10, total_steps=110,
                       later_rates=((150, 3e-4), (200, 5e-5))).schedule_fn()
    for step in (0, 10, 60, 110, 149):
        assert float(late(step)) == float(base(step))
    assert [float(late(s)) for s in (150, 199, 200, 10_000)] == pytest.approx([3e-4, 3e-4, 5e-5, 5e-5])
    for bad in (((0, 1e-4),), ((100, 0.0),), ((200, 1e-4), (150, 1e-4))):
        with pytest.raises(ValueError, match="later_rates"):
            OptimConfig(later_rates=bad)


def test_apply_update_skips_non_finite_and_clips():
    tx = make_optimizer(OptimConfig(learning_rate=0.1, weight_decay=0.0, max_grad_norm=1.0))
    params = {"w": jnp.ones(3)}
    state = tx.init(params)
    new, state2, norm, skipped = apply_update(params, state, {"w": jnp.array([3.0, 4.0, 0.0])}, tx)
    assert float(norm) == pytest.approx(5.0) and not bool(skipped)
    assert np.all(np.asarray(new["w"])[:2] < 1.0)
    same, state3, _, skipped = apply_update(new, state2, {"w": jnp.array([jnp.nan, 1.0, 1.0])}, tx)
    assert bool(skipped) and np.array_equal(np.asarray(same["w"]), np.asarray(new["w"]))
    import jax

    assert all(np.array_equal(np.asarray(a), np.asarray(b)) for a, b in
               zip(jax.tree.leaves(state3), jax.tree.leaves(state2)))  # the optimizer state did not move either
