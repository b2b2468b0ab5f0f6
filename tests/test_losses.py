"""GRPO loss vs a float64 loop reference; clip regions; KL clamp; exact micro-batch accumulation."""
from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from memsearcher_jax.rl.advantages import group_advantages
from memsearcher_jax.rl.batching import broadcast_to_rows
from memsearcher_jax.rl.losses import (
    AGGREGATIONS,
    KL_ESTIMATORS,
    LossConfig,
    aggregation_weights,
    masked_aux_sums,
    per_token_loss,
    weighted_loss_sum,
)

CFG = LossConfig()


# ----------------------------------------------------------------------------- references

def ref_token_loss(lp, olp, rlp, ent, a, cfg=CFG):
    """One token, float64, from docs/method.md §2 with plain Python branches."""
    lr = min(max(lp - olp, -cfg.log_ratio_clamp), cfg.log_ratio_clamp)
    r = math.exp(lr)
    clipped_r = min(max(r, 1 - cfg.clip_low), 1 + cfg.clip_high)
    pg = max(-a * r, -a * clipped_r)
    if a < 0:
        pg = min(pg, -a * cfg.dual_clip)
    d = min(max(rlp - lp, -cfg.log_ratio_clamp), cfg.log_ratio_clamp)
    kl = min(max(math.exp(d) - d - 1, -cfg.kl_clamp), cfg.kl_clamp)
    return pg + cfg.kl_coef * kl - cfg.entropy_coef * ent


def ref_loss_matrix(lp, olp, rlp, ent, adv_rows, cfg=CFG):
    n, t = lp.shape
    return np.array([[ref_token_loss(lp[i, j], olp[i, j], rlp[i, j], ent[i, j], adv_rows[i], cfg)
                      for j in range(t)] for i in range(n)])


def ref_batch_loss(mode, loss, mask, traj_ids, mb_ids):
    """The optimizer-batch loss each mode promises, by loops over tokens."""
    n, t = loss.shape
    if mode == "token_mean":
        tot = cnt = 0.0
        for i in range(n):
            for j in range(t):
                if mask[i, j]:
                    tot += loss[i, j]
                    cnt += 1
        return tot / cnt
    if mode == "trajectory_mean":
        means = []
        for tr in sorted(set(traj_ids)):
            vals = [loss[i, j] for i in range(n) if traj_ids[i] == tr for j in range(t) if mask[i, j]]
            if vals:
                means.append(sum(vals) / len(vals))
        return sum(means) / len(means)
    if mode == "trajectory_row_mean":
        means = []
        for tr in sorted(set(traj_ids)):
            rows = [[loss[i, j] for j in range(t) if mask[i, j]] for i in range(n) if traj_ids[i] == tr]
            rows = [r for r in rows if r]
            if rows:
                means.append(sum(sum(r) / len(r) for r in rows) / len(rows))
        return sum(means) / len(means)
    if mode == "microbatch_token_mean":
        means = []
        for m in sorted(set(mb_ids)):
            vals = [loss[i, j] for i in range(n) if mb_ids[i] == m for j in range(t) if mask[i, j]]
            means.append(sum(vals) / len(vals))
        return sum(means) / len(means)
    raise AssertionError(mode)


def make_batch(seed=0):
    """8 rows: trajectory 0 has 1 conversation, trajectory 1 has 5, trajectory 2 has 2.

    Trajectories 0 and 1 form a group, trajectory 2 is a group of one. Rows are shuffled,
    masks ragged (prompt/observation zeros, padding zeros).
    """
    rng = np.random.default_rng(seed)
    n, t = 8, 12
    traj_ids = np.array([1, 0, 1, 2, 1, 1, 2, 1])
    traj_rewards = np.array([0.1, 1.0, 0.6])
    traj_adv = group_advantages(traj_rewards, [0, 0, 1])
    mask = np.zeros((n, t))
    for i in range(n):
        start, end = rng.integers(0, 3), rng.integers(6, t + 1)
        mask[i, start:end] = 1
        mask[i, start + 2:start + 3] = 0  # an observation token inside the response
    lp = rng.normal(-2.0, 0.5, (n, t))
    olp = lp + rng.normal(0, 0.3, (n, t))
    rlp = lp + rng.normal(0, 0.5, (n, t))
    ent = rng.uniform(0, 3, (n, t))
    mb_ids = np.array([0, 0, 1, 1, 2, 2, 3, 3])
    return dict(lp=lp, olp=olp, rlp=rlp, ent=ent, mask=mask, traj_ids=traj_ids, traj_adv=traj_adv,
                row_adv=broadcast_to_rows(traj_adv, traj_ids).astype(np.float64), mb_ids=mb_ids)


# ----------------------------------------------------------------------------- per-token loss

def test_per_token_loss_matches_reference_with_row_advantages():
    b = make_batch()
    loss, aux = per_token_loss(b["lp"], b["olp"], b["rlp"], b["ent"], b["row_adv"], CFG)
    assert loss.shape == b["lp"].shape and set(aux) >= {"ratio", "is_clipped", "kl", "is_dual_clipped", "pg_loss"}
    np.testing.assert_allclose(np.asarray(loss), ref_loss_matrix(b["lp"], b["olp"], b["rlp"], b["ent"], b["row_adv"]),
                               rtol=1e-5, atol=1e-6)
    # [N, T] advantages give the same as [N].
    loss2, _ = per_token_loss(b["lp"], b["olp"], b["rlp"], b["ent"],
                              np.broadcast_to(b["row_adv"][:, None], b["lp"].shape), CFG)
    np.testing.assert_array_equal(np.asarray(loss), np.asarray(loss2))


def one(lp, olp, a, rlp=None, ent=0.0, cfg=CFG):
    rlp = lp if rlp is None else rlp
    f = lambda x: jnp.array([[x]], jnp.float32)
    loss, aux = per_token_loss(f(lp), f(olp), f(rlp), f(ent), jnp.array([a], jnp.float32), cfg)
    return float(loss[0, 0]), {k: float(v[0, 0]) for k, v in aux.items()}


def test_positive_advantage_ratio_above_upper_clip_is_clipped():
    a = 2.0
    loss, aux = one(math.log(1.5), 0.0, a)
    assert aux["ratio"] == pytest.approx(1.5, rel=1e-6)
    assert loss == pytest.approx(-a * 1.2, rel=1e-6) and aux["is_clipped"] == 1.0 and aux["is_dual_clipped"] == 0.0
    # Gradient w.r.t. logp is zero in the clipped region and -A r inside it.
    g = jax.grad(lambda x: per_token_loss(x, jnp.zeros((1, 1)), x, None, jnp.array([a]), CFG)[0].sum())
    assert float(g(jnp.full((1, 1), math.log(1.5)))[0, 0]) == 0.0
    assert float(g(jnp.full((1, 1), math.log(1.1)))[0, 0]) == pytest.approx(-a * 1.1, rel=1e-5)


def test_positive_advantage_ratio_below_lower_clip_is_not_clipped():
    loss, aux = one(math.log(0.5), 0.0, 1.0)
    assert loss == pytest.approx(-0.5, rel=1e-6) and aux["is_clipped"] == 0.0


def test_negative_advantage_ratio_below_lower_clip_is_clipped():
    a = -1.5
    loss, aux = one(math.log(0.5), 0.0, a)
    assert loss == pytest.approx(-a * 0.8, rel=1e-6) and aux["is_clipped"] == 1.0 and aux["is_dual_clipped"] == 0.0


def test_negative_advantage_moderate_ratio_is_unclipped():
    a = -1.0
    loss, aux = one(math.log(2.0), 0.0, a)  # 2 < dual_clip 3: plain -A r
    assert loss == pytest.approx(2.0, rel=1e-6) and aux["is_clipped"] == 0.0 and aux["is_dual_clipped"] == 0.0


def test_negative_advantage_huge_ratio_hits_dual_clip():
    a = -0.7
    loss, aux = one(5.0, 0.0, a)  # ratio e^5 ~ 148
    assert loss == pytest.approx(-a * 3.0, rel=1e-6) and aux["is_dual_clipped"] == 1.0
    g = jax.grad(lambda x: per_token_loss(x, jnp.zeros((1, 1)), x, None, jnp.array([a]), CFG)[0].sum())
    assert float(g(jnp.full((1, 1), 5.0))[0, 0]) == 0.0


def test_positive_advantage_is_not_dual_clipped():
    loss, aux = one(math.log(0.1), 0.0, 1.0)
    assert loss == pytest.approx(-0.1, rel=1e-5) and aux["is_dual_clipped"] == 0.0


def test_log_ratio_clamp_keeps_ratio_finite():
    loss, aux = one(100.0, 0.0, 1.0)
    assert aux["ratio"] == pytest.approx(math.exp(20.0), rel=1e-5)
    assert loss == pytest.approx(-1.2, rel=1e-6)
    loss, aux = one(-100.0, 0.0, 1.0)
    assert aux["ratio"] == pytest.approx(math.exp(-20.0), rel=1e-4) and np.isfinite(loss)


def test_kl_is_k3_and_clamped_to_ten():
    cfg = dataclasses.replace(CFG, kl_coef=1.0, entropy_coef=0.0)
    # ref - logp = 1: k3 = e - 2.
    _, aux = one(0.0, 0.0, 0.0, rlp=1.0, cfg=cfg)
    assert aux["kl"] == pytest.approx(math.e - 2, rel=1e-6)
    # ref - logp = 5: e^5 - 6 ~ 142 -> clamped to 10.
    loss, aux = one(-5.0, -5.0, 0.0, rlp=0.0, cfg=cfg)
    assert aux["kl"] == pytest.approx(10.0) and loss == pytest.approx(10.0)
    # ref - logp = -5: e^-5 + 4 ~ 4.0067, below the clamp.
    _, aux = one(0.0, 0.0, 0.0, rlp=-5.0, cfg=cfg)
    assert aux["kl"] == pytest.approx(math.exp(-5) + 4, rel=1e-6)
    # ref - logp = 1000 does not overflow.
    _, aux = one(-1000.0, -1000.0, 0.0, rlp=0.0, cfg=cfg)
    assert aux["kl"] == 10.0


def test_kl_and_entropy_coefficients_enter_the_loss():
    base, _ = one(0.0, 0.0, 0.0, rlp=1.0, ent=2.0)
    assert base == pytest.approx(0.001 * (math.e - 2) - 0.001 * 2.0, rel=1e-5)


def test_none_ref_and_entropy_mean_no_terms():
    b = make_batch(1)
    loss, aux = per_token_loss(b["lp"], b["olp"], None, None, b["row_adv"], CFG)
    cfg0 = dataclasses.replace(CFG, kl_coef=0.0, entropy_coef=0.0)
    expect = ref_loss_matrix(b["lp"], b["olp"], b["lp"], np.zeros_like(b["lp"]), b["row_adv"], cfg0)
    np.testing.assert_allclose(np.asarray(loss), expect, rtol=1e-5, atol=1e-6)
    assert float(jnp.abs(aux["kl"]).max()) == 0.0


@pytest.mark.parametrize("name", sorted(KL_ESTIMATORS))
def test_kl_estimators_registered_and_zero_at_equal_policies(name):
    cfg = dataclasses.replace(CFG, kl_estimator=name)
    x = jnp.linspace(-3, 0, 6).reshape(2, 3)
    _, aux = per_token_loss(x, x, x, None, jnp.zeros(2), cfg)
    np.testing.assert_allclose(np.asarray(aux["kl"]), 0.0, atol=1e-6)


def test_per_token_loss_jits_with_static_config():
    b = make_batch(2)
    f = jax.jit(per_token_loss, static_argnums=5)
    loss_j, _ = f(b["lp"], b["olp"], b["rlp"], b["ent"], b["row_adv"], CFG)
    loss, _ = per_token_loss(b["lp"], b["olp"], b["rlp"], b["ent"], b["row_adv"], CFG)
    np.testing.assert_allclose(np.asarray(loss_j), np.asarray(loss), rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize(
    "kwargs, field",
    [({"aggregation": "mean"}, "aggregation"), ({"kl_estimator": "k9"}, "kl_estimator"),
     ({"dual_clip": 1.0}, "dual_clip"), ({"clip_low": 1.0}, "clip")],
)
def test_bad_config_raises_naming_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        LossConfig(**kwargs)


# ----------------------------------------------------------------------------- aggregation

@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_aggregation_matches_reference(mode):
    b = make_batch(3)
    loss = ref_loss_matrix(b["lp"], b["olp"], b["rlp"], b["ent"], b["row_adv"])
    w, denom = aggregation_weights(mode, b["mask"], b["traj_ids"], b["mb_ids"], 4)
    assert w.dtype == np.float32 and w.shape == loss.shape
    assert np.all(w[b["mask"] == 0] == 0)
    got = float(weighted_loss_sum(jnp.asarray(loss, jnp.float32), w)) / denom
    assert got == pytest.approx(ref_batch_loss(mode, loss, b["mask"], b["traj_ids"], b["mb_ids"]), rel=1e-5, abs=1e-6)


def test_aggregation_modes_differ_on_unequal_lengths():
    # Trajectory 0: one row of 1 token with loss 1; trajectory 1: one row of 3 tokens with loss 0.
    mask = np.array([[1, 0, 0], [1, 1, 1]])
    loss = jnp.array([[1.0, 9.0, 9.0], [0.0, 0.0, 0.0]])
    vals = {}
    for mode in AGGREGATIONS:
        w, d = aggregation_weights(mode, mask, [0, 1], [0, 1], 2)
        vals[mode] = float(weighted_loss_sum(loss, w)) / d
    assert vals["token_mean"] == pytest.approx(1 / 4)
    assert vals["trajectory_mean"] == pytest.approx(1 / 2)
    assert vals["microbatch_token_mean"] == pytest.approx((1 + 0) / 2)


def test_trajectory_mean_weights_sum_to_one_per_trajectory():
    b = make_batch(4)
    w, denom = aggregation_weights("trajectory_mean", b["mask"], b["traj_ids"], b["mb_ids"], 4)
    for tr in set(b["traj_ids"].tolist()):
        assert w[b["traj_ids"] == tr].sum() == pytest.approx(1.0, rel=1e-6)
    assert denom == 3.0


def test_empty_mask_gives_zero_loss_not_nan():
    for mode in AGGREGATIONS:
        w, d = aggregation_weights(mode, np.zeros((2, 3)), [0, 1], [0, 0], 1)
        assert d == 1.0 and float(weighted_loss_sum(jnp.ones((2, 3)), w)) / d == 0.0


def test_weighted_sum_ignores_nonfinite_padding():
    loss = jnp.array([[1.0, jnp.nan, jnp.inf]])
    assert float(weighted_loss_sum(loss, np.array([[2.0, 0.0, 0.0]]))) == 2.0


@pytest.mark.parametrize(
    "args, match",
    [
        (("nope", np.ones((2, 3)), [0, 1], [0, 0], 1), "aggregation mode"),
        (("token_mean", np.ones(3), [0], [0], 1), "loss_mask"),
        (("token_mean", np.ones((2, 3)), [0], [0, 0], 1), "traj_ids"),
        (("token_mean", np.ones((2, 3)), [0, 1], [0, 2], 2), "microbatch_ids"),
        (("token_mean", np.ones((2, 3)), [0, 1], [0, 0], 0), "num_microbatches"),
    ],
)
def test_aggregation_bad_inputs_raise(args, match):
    with pytest.raises(ValueError, match=match):
        aggregation_weights(*args)


# ----------------------------------------------------------------------------- micro-batching

@pytest.mark.parametrize("mode", sorted(AGGREGATIONS))
def test_four_microbatches_sum_to_the_full_batch_loss_and_grad(mode):
    b = make_batch(5)
    w, denom = aggregation_weights(mode, b["mask"], b["traj_ids"], b["mb_ids"], 4)
    args = [jnp.asarray(b[k], jnp.float32) for k in ("olp", "rlp", "ent", "row_adv")]

    def objective(lp, olp, rlp, ent, adv, wt):
        loss, _ = per_token_loss(lp, olp, rlp, ent, adv, CFG)
        return weighted_loss_sum(loss, wt)

    lp = jnp.asarray(b["lp"], jnp.float32)
    full_val, full_grad = jax.value_and_grad(objective)(lp, *args, jnp.asarray(w))
    total, grads = 0.0, np.zeros_like(b["lp"])
    for m in range(4):
        rows = np.flatnonzero(b["mb_ids"] == m)
        v, g = jax.value_and_grad(objective)(lp[rows], *(a[rows] for a in args), jnp.asarray(w[rows]))
        total += float(v)
        grads[rows] = np.asarray(g)
    assert total / denom == pytest.approx(float(full_val) / denom, rel=1e-5, abs=1e-7)
    np.testing.assert_allclose(grads, np.asarray(full_grad), rtol=1e-5, atol=1e-7)
    # And both equal the mode's reference batch loss.
    loss = ref_loss_matrix(b["lp"], b["olp"], b["rlp"], b["ent"], b["row_adv"])
    ref = ref_batch_loss(mode, loss, b["mask"], b["traj_ids"], b["mb_ids"])
    assert total / denom == pytest.approx(ref, rel=1e-5, abs=1e-6)
    # Gradient vanishes on masked-out tokens.
    assert np.all(grads[b["mask"] == 0] == 0)


def test_token_mean_is_not_the_mean_of_microbatch_means():
    # The point of exact aggregation: with ragged micro-batches the two differ.
    b = make_batch(6)
    loss = ref_loss_matrix(b["lp"], b["olp"], b["rlp"], b["ent"], b["row_adv"])
    mask = b["mask"].copy()
    mask[0:2, :] = 0
    mask[0, 0] = 1  # micro-batch 0 has a single token
    a = ref_batch_loss("token_mean", loss, mask, b["traj_ids"], b["mb_ids"])
    c = ref_batch_loss("microbatch_token_mean", loss, mask, b["traj_ids"], b["mb_ids"])
    assert abs(a - c) > 1e-3
    w, d = aggregation_weights("token_mean", mask, b["traj_ids"], b["mb_ids"], 4)
    assert float(weighted_loss_sum(jnp.asarray(loss, jnp.float32), w)) / d == pytest.approx(a, rel=1e-5)


def test_masked_aux_sums():
    b = make_batch(7)
    _, aux = per_token_loss(b["lp"], b["olp"], b["rlp"], b["ent"], b["row_adv"], CFG)
    s = masked_aux_sums(aux, b["mask"])
    m = b["mask"] > 0
    assert float(s["n_tokens"]) == m.sum()
    assert float(s["is_clipped"]) == pytest.approx(np.asarray(aux["is_clipped"])[m].sum())
    assert float(s["ratio_max"]) == pytest.approx(np.asarray(aux["ratio"])[m].max())
    assert float(s["ratio_min"]) == pytest.approx(np.asarray(aux["ratio"])[m].min())


def test_tis_weights_and_their_place_in_the_loss():
    from memsearcher_jax.rl.losses import tis_weights

    w = tis_weights(np.array([[0.0, -1.0]]), np.array([[-1.0, 0.0]]), cap=2.0, log_ratio_clamp=20.0)
    np.testing.assert_allclose(w, [[2.0, np.exp(-1.0)]], rtol=1e-6)  # e capped at 2; e^-1 as it is
    logp, old, ref, ent = (np.full((1, 2), v, np.float32) for v in (-0.5, -0.7, -0.6, 1.3))
    adv = np.array([1.5], np.float32)
    cfg = LossConfig()
    base, aux = per_token_loss(logp, old, ref, ent, adv, cfg)
    weighted, _ = per_token_loss(logp, old, ref, ent, adv, cfg, tis_weight=w)
    # Only the policy-gradient term is weighted; KL and entropy terms are as they were.
    np.testing.assert_allclose(np.asarray(weighted - base), np.asarray(aux["pg_loss"]) * (w - 1.0), rtol=1e-5)
    with pytest.raises(ValueError, match="tis_cap"):
        LossConfig(tis_cap=-1.0)


def test_tis_weights_clamp_the_log_ratio_at_the_configured_bound():
    from memsearcher_jax.rl.losses import tis_weights

    old, sampler = np.array([[0.0, 0.0]]), np.array([[-3.0, 1.0]])
    w = tis_weights(old, sampler, cap=100.0, log_ratio_clamp=0.5)
    np.testing.assert_allclose(w, [[np.exp(0.5), np.exp(-0.5)]], rtol=1e-6)
    w = tis_weights(old, sampler, cap=100.0, log_ratio_clamp=20.0)
    np.testing.assert_allclose(w, [[np.exp(3.0), np.exp(-1.0)]], rtol=1e-6)


def test_metric_sums_of_two_halves_combine_to_the_whole():
    from memsearcher_jax.rl.losses import AUX_METRIC_KEYS, METRIC_SUM_KEYS, combine_metric_sums, empty_metric_sums

    b = make_batch(7)
    _, aux = per_token_loss(b["lp"], b["olp"], b["rlp"], b["ent"], b["row_adv"], CFG)
    aux = dict(aux, entropy=jnp.asarray(b["ent"], jnp.float32))
    sums = lambda rows: masked_aux_sums({k: aux[k][rows] for k in AUX_METRIC_KEYS}, b["mask"][rows])
    whole = sums(slice(None))
    assert set(whole) == set(METRIC_SUM_KEYS)
    for xp in (jnp, np):  # in the jitted scan and on the host
        halves = combine_metric_sums(combine_metric_sums(empty_metric_sums(xp), sums(slice(0, 3)), xp),
                                     sums(slice(3, None)), xp)
        for k in METRIC_SUM_KEYS:
            assert float(halves[k]) == pytest.approx(float(whole[k]), rel=1e-5), k
