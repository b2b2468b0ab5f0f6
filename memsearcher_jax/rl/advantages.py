"""Group-relative advantages (docs/method.md §2), host-side NumPy.

A group is the G trajectories sampled for one question. Each trajectory has one scalar
reward; its advantage is the group-normalised reward, and every conversation (row) of the
trajectory gets that same scalar on every loss-masked token: no per-turn baseline, no discount
(the placement on rows is `rl/batching.py:broadcast_to_rows`).
"""
from __future__ import annotations

import numpy as np


def as_1d(name: str, x) -> np.ndarray:
    """x as a 1-D array; a ValueError naming `name` otherwise."""
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    return a


def _group_spans(r: np.ndarray, g: np.ndarray):
    """Per group (in np.unique order of g): (inverse index [N], member counts, lowest and highest reward)."""
    _, inv, counts = np.unique(g, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    lo, hi = np.full(counts.size, np.inf), np.full(counts.size, -np.inf)
    np.minimum.at(lo, inv, r)
    np.maximum.at(hi, inv, r)
    return inv, counts, lo, hi


def _rewards_and_groups(rewards, group_ids) -> tuple[np.ndarray, np.ndarray]:
    r = as_1d("rewards", rewards).astype(np.float64)
    g = as_1d("group_ids", group_ids)
    if r.shape != g.shape:
        raise ValueError(f"rewards {r.shape} and group_ids {g.shape} must have the same length")
    return r, g


def group_advantages(rewards, group_ids, eps: float = 1e-6) -> np.ndarray:
    """A_i = (R_i - mean_g) / (std_g + eps), with the unbiased (N-1) std of i's group.

    rewards: [N] floats; group_ids: [N] any hashable labels (ints, strings).
    A group of one has mean 0 and std 1 (so A = R / (1 + eps)); equal rewards give 0.
    Returns [N] float32. Computed in float64.
    """
    r, g = _rewards_and_groups(rewards, group_ids)
    if not np.all(np.isfinite(r)):
        raise ValueError(f"rewards must be finite, got {r[~np.isfinite(r)][:5]}")
    if r.size == 0:
        return np.zeros(0, np.float32)
    inv, counts, lo, hi = _group_spans(r, g)
    sums = np.bincount(inv, weights=r)
    means = sums / counts
    sq = np.bincount(inv, weights=(r - means[inv]) ** 2)
    # Unbiased std; a singleton group uses mean 0, std 1 (the recipe's convention).
    std = np.sqrt(sq / np.maximum(counts - 1, 1))
    single = counts == 1
    means = np.where(single, 0.0, means)
    std = np.where(single, 1.0, std)
    adv = (r - means[inv]) / (std[inv] + eps)
    # Equal rewards give exactly 0 (the float mean can differ from them by an ulp, / eps).
    flat = (lo == hi) & ~single
    adv[flat[inv]] = 0.0
    return adv.astype(np.float32)


def zero_variance_fraction(rewards, group_ids) -> float:
    """Fraction of groups with >= 2 members whose rewards are all equal (they carry no signal).

    Singleton groups are left out (their advantage is R, not 0). 0.0 if no such group exists.
    """
    r, g = _rewards_and_groups(rewards, group_ids)
    if r.size == 0:
        return 0.0
    _, counts, lo, hi = _group_spans(r, g)
    multi = counts >= 2
    if not multi.any():
        return 0.0
    return float(np.mean(lo[multi] == hi[multi]))


def groups_with_spread(rewards, group_ids) -> np.ndarray:
    """Per trajectory: True when its group's rewards are not all equal (std > 0).

    Dynamic sampling keeps only these: a group whose rewards tie has advantage 0 everywhere
    and adds no signal, only tokens. Rewards are continuous (F1), so ties are checked on the
    values, not on a mean. A group of one has no spread. bool [N].
    """
    r, g = _rewards_and_groups(rewards, group_ids)
    if r.size == 0:
        return np.zeros(0, bool)
    inv, _, lo, hi = _group_spans(r, g)
    return (hi - lo > 0)[inv]
