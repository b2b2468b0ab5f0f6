"""Group advantages against a float64 loop reference; propagation to conversation rows."""
from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from memsearcher_jax.rl.advantages import group_advantages, zero_variance_fraction
from memsearcher_jax.rl.batching import broadcast_to_rows


def reference_advantages(rewards, group_ids, eps=1e-6):
    """Straightforward loops, float64, written from docs/method.md §2."""
    out = []
    for i, r in enumerate(rewards):
        members = [rewards[j] for j in range(len(rewards)) if group_ids[j] == group_ids[i]]
        if len(members) == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(members) / len(members)
            std = math.sqrt(sum((m - mean) ** 2 for m in members) / (len(members) - 1))
        out.append((r - mean) / (std + eps))
    return np.array(out)


def test_hand_batch_with_group_of_one_and_equal_rewards():
    rewards = [1.0, 0.1, 0.0, 0.5, 0.5, 0.5, 0.7, 0.1, 0.1, 0.1]
    groups = [0, 0, 0, 1, 1, 1, 2, 3, 3, 3]
    adv = group_advantages(rewards, groups)
    assert adv.dtype == np.float32 and adv.shape == (10,)
    np.testing.assert_allclose(adv, reference_advantages(rewards, groups), rtol=1e-6, atol=1e-6)
    # Group 0 by hand: mean 11/30, unbiased std.
    m = 1.1 / 3
    s = math.sqrt(((1 - m) ** 2 + (0.1 - m) ** 2 + m**2) / 2)
    assert adv[0] == pytest.approx((1 - m) / (s + 1e-6), rel=1e-6)
    assert np.all(adv[3:6] == 0.0) and np.all(adv[7:10] == 0.0)  # equal rewards: exactly 0
    assert adv[6] == pytest.approx(0.7 / (1 + 1e-6))  # group of one: A = R


def test_unbiased_std_not_population_std():
    adv = group_advantages([0.0, 1.0], [7, 7])
    # mean 0.5, unbiased std sqrt(0.5) -> +-0.7071; the population std would give +-1.
    np.testing.assert_allclose(adv, [-0.5 / math.sqrt(0.5), 0.5 / math.sqrt(0.5)], rtol=1e-5)


def test_group_ids_can_be_strings_and_interleaved():
    rewards = [0.2, 1.0, 0.9, 0.0]
    groups = ["q1", "q2", "q1", "q2"]
    np.testing.assert_allclose(group_advantages(rewards, groups), reference_advantages(rewards, groups), rtol=1e-5)


def test_eps_is_used():
    a1 = group_advantages([0.0, 1e-7], [0, 0], eps=1e-6)
    a2 = group_advantages([0.0, 1e-7], [0, 0], eps=0.0)
    assert abs(a1[1]) < abs(a2[1])


@pytest.mark.parametrize(
    "rewards, groups, match",
    [([1.0, 2.0], [0], "same length"), ([[1.0]], [[0]], "1-D"), ([1.0, float("nan")], [0, 0], "finite")],
)
def test_bad_inputs_raise_naming_the_argument(rewards, groups, match):
    with pytest.raises(ValueError, match=match):
        group_advantages(rewards, groups)


def test_empty():
    assert group_advantages([], []).shape == (0,)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.floats(0, 1), st.integers(0, 5)), min_size=1, max_size=30))
def test_matches_reference_on_random_batches(pairs):
    rewards = [p[0] for p in pairs]
    groups = [p[1] for p in pairs]
    np.testing.assert_allclose(group_advantages(rewards, groups), reference_advantages(rewards, groups),
                               rtol=1e-4, atol=1e-3)


def test_broadcast_trajectories_with_one_and_five_conversations():
    traj_adv = np.array([0.5, -1.25, 2.0])
    # trajectory 0 has 1 conversation, trajectory 1 has 5, trajectory 2 has 2; rows shuffled.
    rows = np.array([1, 0, 1, 2, 1, 1, 2, 1])
    out = broadcast_to_rows(traj_adv, rows)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, [-1.25, 0.5, -1.25, 2.0, -1.25, -1.25, 2.0, -1.25])


def test_broadcast_with_labels():
    out = broadcast_to_rows([1.0, 2.0], ["b", "a", "b"], traj_ids=["a", "b"])
    np.testing.assert_array_equal(out, [2.0, 1.0, 2.0])
    with pytest.raises(ValueError, match="not in traj_ids"):
        broadcast_to_rows([1.0, 2.0], ["c"], traj_ids=["a", "b"])
    with pytest.raises(ValueError, match="unique"):
        broadcast_to_rows([1.0, 2.0], ["a"], traj_ids=["a", "a"])


@pytest.mark.parametrize("rows", [[0, 3], [-1], [0.5]])
def test_broadcast_rejects_bad_positions(rows):
    with pytest.raises(ValueError, match="row_traj_ids"):
        broadcast_to_rows([1.0, 2.0, 3.0], rows)


def test_zero_variance_fraction():
    rewards = [1.0, 1.0, 0.1, 0.1, 0.5, 0.0, 0.3]
    groups = [0, 0, 1, 1, 2, 2, 3]  # group 3 is a singleton and is left out
    assert zero_variance_fraction(rewards, groups) == pytest.approx(2 / 3)
    assert zero_variance_fraction([0.3], [0]) == 0.0
    assert zero_variance_fraction([0.3, 0.4], [0, 0]) == 0.0
