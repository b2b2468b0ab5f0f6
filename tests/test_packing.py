"""The learner's packed rows (rl.pack_rows) and its skipped passes (rl.kl_coef 0, rl.old_logprobs).

Packed: a step's conversations go first-fit into shared rows, each a segment that attends only
to itself; the loss, its gradients and every log-prob equal the unpacked path's.
"""
from __future__ import annotations

import os

import jax
import numpy as np
import pytest
from flax import nnx

from memsearcher_jax.models import ModelConfig, Qwen2
from memsearcher_jax.rl.batching import RowBatch, first_fit, pack_segments, packed_targets, real_lengths
from memsearcher_jax.rl.grpo import GRPOConfig, GRPOLearner, OptimConfig
from memsearcher_jax.rl.losses import LossConfig, tis_weights

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MODEL = ModelConfig.tiny(vocab_size=64, num_layers=2)


def _learner(pack: bool, seed: int = 0, **grpo) -> GRPOLearner:
    grpo = {"micro_batch_size": 2, "logprob_batch_size": 4, "min_seq_len": 8, **grpo}
    return GRPOLearner(Qwen2(MODEL, rngs=nnx.Rngs(seed)), GRPOConfig(pack_rows=pack, **grpo))


def _rows(lengths, s: int, seed: int = 0, traj=None) -> RowBatch:
    """Right-padded rows of these real lengths: a prompt (first third), then a response with holes."""
    rng = np.random.default_rng(seed)
    n, lengths = len(lengths), np.asarray(lengths)
    tokens = rng.integers(1, 64, (n, s)).astype(np.int32)
    attention = (np.arange(s)[None] < lengths[:, None]).astype(np.int32)
    tokens[attention == 0] = 0
    mask = ((np.arange(s)[None] >= np.maximum(lengths[:, None] // 3, 1)) & (attention == 1)).astype(np.float32)
    mask[:, ::5] = 0  # observation holes
    traj = np.arange(n) if traj is None else np.asarray(traj)
    return RowBatch(tokens=tokens, attention=attention, loss_mask=mask,
                    sampler_logp=np.where(mask > 0, rng.normal(-4.2, 0.3, (n, s)), 0).astype(np.float32),
                    advantages=rng.normal(size=n).astype(np.float32), traj_ids=traj, group_ids=traj // 2,
                    turns=np.zeros(n, int), is_final=np.ones(n, bool))


# ----------------------------------------------------------------------------- the packer

def test_first_fit_decreasing_fills_rows_in_order_and_never_past_the_width():
    p = first_fit(np.array([3, 5, 1, 4, 3, 2]), 8)
    # Longest first: 5 -> row 0; 4 -> row 1; 3 -> row 0 (full); 3 -> row 1; 2 -> row 2; 1 -> row 1 (full).
    assert p.num_rows == 3 and p.width == 8
    assert p.row.tolist() == [0, 0, 1, 1, 1, 2] and p.offset.tolist() == [5, 0, 7, 0, 4, 0]
    with pytest.raises(ValueError, match="cannot fit"):
        first_fit(np.array([9, 2]), 8)

    rng = np.random.default_rng(0)
    lengths = rng.integers(0, 41, 60)
    p = first_fit(lengths, 40)
    conv, within, row, slot = p.slots()
    assert np.bincount(row, minlength=p.num_rows).max() <= 40 and slot.max() < 40  # never past a width
    assert len(set(zip(row.tolist(), slot.tolist()))) == lengths.sum()              # no slot holds two tokens
    assert np.bincount(conv, minlength=60).tolist() == lengths.tolist()            # every row once, whole
    assert p.num_rows <= -(-lengths.sum() // 40) + 3                               # near the fewest rows

    arrays = {"tokens": rng.integers(1, 64, (60, 40)).astype(np.int32)}
    packed = pack_segments(arrays, p)
    assert packed["tokens"].shape == (p.num_rows, 40)
    for i in range(60):
        seg = packed["segments"][p.row[i]] == i
        assert seg.sum() == lengths[i]
        if lengths[i]:  # one contiguous run from offset, positions from 0, the conversation's own tokens
            assert np.flatnonzero(seg).tolist() == list(range(p.offset[i], p.offset[i] + lengths[i]))
            assert packed["positions"][p.row[i], seg].tolist() == list(range(lengths[i]))
            assert np.array_equal(packed["tokens"][p.row[i], seg], arrays["tokens"][i, :lengths[i]])
    assert (packed["segments"] == -1).sum() == p.num_rows * 40 - lengths.sum()


def test_packed_targets_read_every_loss_position_once():
    mask = np.zeros((3, 24), np.float32)
    mask[0, [2, 3, 9, 15, 16, 23]] = 1   # three segments' responses
    mask[1, 5:8] = 1
    at = packed_targets(mask, 24, 4)      # row 2: no loss positions
    assert at.shape == (3, 8)             # 6 positions -> the whole-octave bucket 8 (from min_window 4)
    for i in range(3):
        assert set(np.flatnonzero(mask[i])) <= set(at[i].tolist()) and len(set(at[i].tolist())) == 8
    assert at.min() >= 1 and at.max() <= 23 and np.all(np.diff(at, axis=1) > 0)


# ----------------------------------------------------------------------------- exactness

@pytest.mark.parametrize("mode", ["token_mean", "trajectory_mean"])
@pytest.mark.slow
def test_packed_loss_and_gradients_equal_the_unpacked_ones(mode):
    # TIS, KL and entropy all on; old log-probs off the trainer's so that tokens are clipped too.
    loss = LossConfig(aggregation=mode, tis_cap=1.5, kl_coef=0.1, entropy_coef=0.01)
    rows = _rows([40, 7, 23, 12, 40, 31, 9, 18], 40, traj=[0, 0, 1, 2, 2, 2, 3, 4])
    rng = np.random.default_rng(1)
    old = np.where(rows.loss_mask > 0, rng.normal(-4.2, 0.3, rows.tokens.shape), 0).astype(np.float32)
    ref = np.where(rows.loss_mask > 0, rng.normal(-4.2, 0.3, rows.tokens.shape), 0).astype(np.float32)
    tis = tis_weights(old, rows.sampler_logp, loss.tis_cap, log_ratio_clamp=loss.log_ratio_clamp)
    assert 0 < (tis[rows.loss_mask > 0] == 1.5).mean() < 1  # the cap acts on some tokens
    idx = np.random.default_rng(2).permutation(rows.num_rows)
    got = {}
    for pack in (False, True):
        learner = _learner(pack, loss=loss)
        micro, denom = learner._micro_batches(rows, idx, old, ref, tis)
        if pack:  # really packed: fewer micro-batches, a row holding several conversations
            assert len(micro) < 4 and max(len(set(np.asarray(mb["segments"]).ravel()) - {-1}) for mb in micro) > 1
        acc = learner._zero_sums(learner.params)
        for mb in micro:
            acc = learner._accumulate(acc, learner.params, None, mb)
        flat = np.concatenate([np.ravel(x) for x in jax.tree.leaves(acc[0])]) / denom
        got[pack] = float(acc[1]) / denom, flat, {k: float(v) for k, v in acc[2].items()}
    (loss_u, g_u, sums_u), (loss_p, g_p, sums_p) = got[False], got[True]
    assert sums_u["is_clipped"] > 0 and sums_u["kl"] > 0 and sums_u["entropy"] > 0
    # The loss is a signed sum whose terms nearly cancel (advantages of both signs): float32 rounds
    # it relative to its terms' size, |A| x ratio ~ mean |A|, not to the small total.
    assert abs(loss_p - loss_u) <= 1e-6 * max(abs(loss_u), float(np.abs(rows.advantages).mean()))
    assert np.linalg.norm(g_u) > 0 and np.linalg.norm(g_p - g_u) <= 1e-6 * np.linalg.norm(g_u)
    for k in sums_u:
        assert sums_p[k] == pytest.approx(sums_u[k], rel=1e-6, abs=1e-6), k


def test_packing_never_mixes_two_conversations():
    # Columns 20: the 20-token row fills a packed row alone, the two 8-token ones share the next.
    rows = _rows([20, 8, 8], 20)
    layout = first_fit(real_lengths(rows.attention), 20)
    assert layout.row.tolist() == [0, 1, 1]
    packed = _learner(True)
    lp = packed.compute_logprobs(packed.params, rows)
    read = rows.loss_mask > 0
    # Another conversation's tokens changed: the first one's log-probs do not move at all.
    other = _rows([20, 8, 8], 20)
    other.tokens[2, :8] = (rows.tokens[2, :8] + 7) % 64
    lp_other = packed.compute_logprobs(packed.params, other)
    assert np.array_equal(lp_other[1], lp[1]) and not np.array_equal(lp_other[2][read[2]], lp[2][read[2]])
    # Alone in its own batch, and through the unpacked path: the same log-probs.
    alone = packed.compute_logprobs(packed.params, _take(rows, [1]))
    unpacked = _learner(False)
    lp_u = unpacked.compute_logprobs(unpacked.params, rows)
    assert np.abs(alone[0] - lp[1])[read[1]].max() <= 1e-6
    assert np.abs(lp_u - lp)[read].max() <= 1e-6 * np.abs(lp_u[read]).max()
    assert np.all(lp[~read] == 0)


def _take(rows: RowBatch, idx) -> RowBatch:
    return rows.take(np.asarray(idx))


# ----------------------------------------------------------------------------- no needless pass

def _count_logprob_passes(learner: GRPOLearner) -> list:
    calls = []
    real = learner.compute_logprobs

    def counted(params, rows):
        calls.append(params is learner.ref_params)
        return real(params, rows)

    learner.compute_logprobs = counted
    return calls


@pytest.mark.slow
def test_reference_pass_runs_only_with_a_kl_term():
    rows = _rows([16, 9, 12, 5], 16)
    for kl, passes in ((0.0, [False]), (0.01, [False, True])):
        # A large step: the second mini-batch's policy is off the reference, so a KL shows when there is one.
        learner = _learner(True, loss=LossConfig(kl_coef=kl), optim=OptimConfig(learning_rate=1e-2))
        calls = _count_logprob_passes(learner)
        m = learner.train_on_rows(rows, np.random.default_rng(0))
        assert calls == passes  # [is the reference's] per pass
        assert (m["approx_kl"] == 0) == (kl == 0)


@pytest.mark.slow
def test_old_logprobs_from_the_sampler_and_the_fallback_above_the_gap():
    rows = _rows([16, 9, 12, 5, 14, 7], 16)
    opts = {"optim": OptimConfig(learning_rate=1e-2), "loss": LossConfig(kl_coef=0.0)}
    trainer_logp = _learner(True, **opts).compute_logprobs(_learner(True, **opts).params, rows)
    read = rows.loss_mask > 0
    noise = np.random.default_rng(3).uniform(-4e-3, 4e-3, rows.tokens.shape).astype(np.float32)
    rows.sampler_logp = np.where(read, trainer_logp + noise, 0).astype(np.float32)

    def run(mode, sampler_logp, recompute_returns=None):
        rows.sampler_logp = sampler_logp
        learner = _learner(True, old_logprobs=mode, **opts)
        calls = _count_logprob_passes(learner)
        if recompute_returns is not None:  # a "recompute" that hands back given numbers
            learner.compute_logprobs = lambda params, r: recompute_returns
        m = learner.train_on_rows(rows, np.random.default_rng(0))
        return np.concatenate([np.ravel(x) for x in jax.tree.leaves(learner.params)]), m, calls

    close = rows.sampler_logp.copy()
    p_sampler, m, calls = run("sampler", close)
    # One forward pass, over the rows outside the first mini-batch (whose ratios give its own gap).
    assert calls == [False] and m["old_logprobs_fallback"] == 0
    assert 1e-3 < m["logprob_gap_max"] <= 4e-3 + 1e-5        # measured on every row's tokens
    p_given, _, _ = run("recompute", close, recompute_returns=close)
    p_recomputed, m_r, _ = run("recompute", close)
    assert np.array_equal(p_sampler, p_given)                # the update used the sampler's numbers
    assert not np.array_equal(p_sampler, p_recomputed)

    far = close.copy()
    far[read] += np.where(np.arange(read.sum()) % 3 == 0, 0.5, 0.0).astype(np.float32)  # past the 0.01 gap
    p_fallback, m, calls = run("sampler", far)
    p_recomputed, m_r, _ = run("recompute", far)
    assert calls == [False, False] and m["old_logprobs_fallback"] == 1  # the check's pass, then the recompute
    assert np.array_equal(p_fallback, p_recomputed) and m["logprob_gap_max"] == m_r["logprob_gap_max"] > 0.4


@pytest.mark.slow
def test_sampler_old_logprobs_fall_back_on_a_gap_in_a_later_minibatch_only():
    """A mismatch confined to the rows of the second mini-batch (a dtype, kernel or sharding
    difference on some rows): the fallback is decided on every row before the first update, and
    logprob_gap_max is the step's true maximum, not the first mini-batch's."""
    from memsearcher_jax.rl.batching import minibatch_row_indices

    rows = _rows([16, 9, 12, 5, 14, 7, 11, 13], 16)
    opts = {"optim": OptimConfig(learning_rate=1e-2), "loss": LossConfig(kl_coef=0.0)}
    learner = _learner(True, **opts)
    trainer_logp = learner.compute_logprobs(learner.params, rows)
    read = rows.loss_mask > 0
    noise = np.random.default_rng(3).uniform(-1e-3, 1e-3, rows.tokens.shape).astype(np.float32)
    # The learner's own split of the rows (train_on_rows draws it from the rng it is given).
    second = minibatch_row_indices(rows.traj_ids, 2, np.random.default_rng(0), shuffle=True)[1]
    later = np.isin(np.arange(rows.num_rows), second)[:, None] & read
    far = np.where(read, trainer_logp + noise + np.where(later, 0.7, 0.0), 0).astype(np.float32)

    def run(mode):
        rows.sampler_logp = far
        learner = _learner(True, old_logprobs=mode, **opts)
        m = learner.train_on_rows(rows, np.random.default_rng(0))
        return np.concatenate([np.ravel(x) for x in jax.tree.leaves(learner.params)]), m

    (p_sampler, m), (p_recomputed, m_r) = run("sampler"), run("recompute")
    assert m["old_logprobs_fallback"] == 1
    assert m["logprob_gap_max"] == pytest.approx(0.7, abs=2e-3) == m_r["logprob_gap_max"]
    assert np.array_equal(p_sampler, p_recomputed)  # the update ran on the recomputed log-probs


def test_sampler_old_logprobs_need_the_trainers_dtype():
    from memsearcher_jax.app.experiment import TrainConfigError, validate
    from memsearcher_jax.settings.config_utils import load_config

    cfg = load_config(os.path.join(ROOT, "configs", "default.py"))
    cfg.rl.old_logprobs = "sampler"
    cfg.sampler.cache_dtype = "bfloat16"
    with pytest.raises(TrainConfigError, match="rl.old_logprobs='sampler' needs the sampler"):
        validate(cfg)
    with pytest.raises(ValueError, match="old_logprobs"):
        GRPOConfig(old_logprobs="rollout")
