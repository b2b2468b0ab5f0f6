"""Multi-context GRPO loss (docs/method.md §2): dual-clip PPO surrogate + k3 KL - entropy bonus.

Two halves:
- jittable per-token math (`per_token_loss`, `weighted_loss_sum`), pure jnp, no Python
  control flow on values;
- host-side aggregation weights (`aggregation_weights`), computed once over the whole
  optimizer batch so that micro-batch gradient accumulation is exact:

      batch_loss = sum over micro-batches of weighted_loss_sum(loss_mb, weights_mb) / denominator

KL estimators and aggregation modes are looked up by name in small registries
(`KL_ESTIMATORS`, `AGGREGATIONS`); add one with the `register_*` decorators.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

Array = jnp.ndarray

KL_ESTIMATORS: dict[str, Callable] = {}
AGGREGATIONS: dict[str, Callable] = {}


def register_kl_estimator(name: str):
    def deco(fn):
        KL_ESTIMATORS[name] = fn
        return fn
    return deco


def register_aggregation(name: str):
    def deco(fn):
        AGGREGATIONS[name] = fn
        return fn
    return deco


@dataclasses.dataclass(frozen=True)
class LossConfig:
    """Loss hyper-parameters; the defaults are the recipe's (docs/method.md §2)."""

    clip_low: float = 0.2  # ratio lower bound is 1 - clip_low
    clip_high: float = 0.2  # ratio upper bound is 1 + clip_high
    dual_clip: float = 3.0  # for A < 0 the per-token surrogate is capped at -A * dual_clip
    kl_coef: float = 0.001
    kl_clamp: float = 10.0  # the final per-token KL value is clamped to [-kl_clamp, kl_clamp]
    log_ratio_clamp: float = 20.0  # logp - old_logp (and ref - logp inside the KL) clamped before exp
    entropy_coef: float = 0.001
    aggregation: str = "token_mean"
    kl_estimator: str = "low_var_kl"  # k3
    # Truncated importance sampling for the sampler/trainer mismatch: each token's policy-gradient
    # term is weighted by min(exp(old_logp - sampler_logp), tis_cap), a constant (0 = off).
    tis_cap: float = 0.0
    # The rollouts' sampling temperature: every log-prob (old, reference, current) and the entropy
    # are those of softmax(logits / temperature), the distribution the tokens were drawn from.
    temperature: float = 1.0

    def __post_init__(self):
        if self.aggregation not in AGGREGATIONS:
            raise ValueError(f"LossConfig.aggregation={self.aggregation!r}; expected one of {sorted(AGGREGATIONS)}")
        if self.kl_estimator not in KL_ESTIMATORS:
            raise ValueError(f"LossConfig.kl_estimator={self.kl_estimator!r}; expected one of {sorted(KL_ESTIMATORS)}")
        if not 0 <= self.clip_low < 1 or self.clip_high < 0:
            raise ValueError("LossConfig clip range needs 0 <= clip_low < 1 and clip_high >= 0, "
                             f"got {self.clip_low}, {self.clip_high}")
        if self.dual_clip <= 1.0:
            raise ValueError(f"LossConfig.dual_clip must be > 1, got {self.dual_clip}")
        if self.tis_cap < 0:
            raise ValueError(f"LossConfig.tis_cap must be >= 0 (0 = off), got {self.tis_cap}")
        if not self.temperature > 0:
            raise ValueError(f"LossConfig.temperature must be > 0 (the rollouts' sampling temperature), "
                             f"got {self.temperature}")
        if self.kl_clamp <= 0 or self.log_ratio_clamp <= 0:
            raise ValueError(f"LossConfig clamps must be positive, got kl_clamp={self.kl_clamp}, "
                             f"log_ratio_clamp={self.log_ratio_clamp}")


# ----------------------------------------------------------------------------- KL estimators
# Each maps (logp, ref_logp [N, T], cfg) -> per-token KL(pi || ref) estimate [N, T].

@register_kl_estimator("low_var_kl")
def kl_k3(logp: Array, ref_logp: Array, cfg: LossConfig) -> Array:
    """k3 = exp(ref - logp) - (ref - logp) - 1 (verl's `low_var_kl`).

    `ref - logp` is clamped to +-log_ratio_clamp before exp so it cannot overflow, and the
    final value is clamped to +-kl_clamp (k3 >= 0, so only the upper bound ever acts).
    """
    d = jnp.clip(ref_logp - logp, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    return jnp.clip(jnp.exp(d) - d - 1.0, -cfg.kl_clamp, cfg.kl_clamp)


@register_kl_estimator("k1")
def kl_k1(logp: Array, ref_logp: Array, cfg: LossConfig) -> Array:
    """k1 = logp - ref (unbiased, high variance), clamped to +-kl_clamp."""
    return jnp.clip(logp - ref_logp, -cfg.kl_clamp, cfg.kl_clamp)


@register_kl_estimator("k2")
def kl_k2(logp: Array, ref_logp: Array, cfg: LossConfig) -> Array:
    """k2 = (logp - ref)^2 / 2, clamped to +-kl_clamp."""
    return jnp.clip(0.5 * jnp.square(logp - ref_logp), -cfg.kl_clamp, cfg.kl_clamp)


# ----------------------------------------------------------------------------- per-token loss

def per_token_loss(
    logp: Array,
    old_logp: Array,
    ref_logp: Array | None,
    entropy: Array | None,
    advantages: Array,
    cfg: LossConfig | None = None,
    tis_weight: Array | None = None,
) -> tuple[Array, dict[str, Array]]:
    """Per-token GRPO loss; jittable (cfg is static: close over it or mark it static).

    logp, old_logp, ref_logp, entropy: [N, T] (ref_logp / entropy may be None: term is 0);
    advantages: [N, T], or [N] which is broadcast over T.
    tis_weight: [N, T] truncated importance weights (`tis_weights`), multiplying pg; None = 1.
    Returns loss [N, T] = w * pg + kl_coef * kl - entropy_coef * entropy, where
      r = exp(clip(logp - old_logp, +-log_ratio_clamp)),
      pg = max(-A r, -A clip(r, 1 - clip_low, 1 + clip_high)), and for A < 0 also min(pg, -A dual_clip),
    and aux {ratio, is_clipped, is_dual_clipped, kl, pg_loss}, each [N, T] float32.
    `is_clipped` marks tokens whose clipped branch is active (zero gradient from pg);
    `is_dual_clipped` marks A < 0 tokens capped by the dual clip.
    Masking and averaging happen in the aggregation weights, not here.
    """
    cfg = LossConfig() if cfg is None else cfg
    logp = jnp.asarray(logp, jnp.float32)
    old_logp = jnp.asarray(old_logp, jnp.float32)
    adv = jnp.asarray(advantages, jnp.float32)
    if adv.ndim == 1:
        adv = adv[:, None]
    adv = jnp.broadcast_to(adv, logp.shape)

    log_ratio = jnp.clip(logp - old_logp, -cfg.log_ratio_clamp, cfg.log_ratio_clamp)
    ratio = jnp.exp(log_ratio)
    pg_unclipped = -adv * ratio
    pg_clipped = -adv * jnp.clip(ratio, 1.0 - cfg.clip_low, 1.0 + cfg.clip_high)
    pg = jnp.maximum(pg_unclipped, pg_clipped)
    dual_cap = -adv * cfg.dual_clip
    pg_final = jnp.where(adv < 0, jnp.minimum(pg, dual_cap), pg)

    if ref_logp is None:
        kl = jnp.zeros_like(logp)
    else:
        kl = KL_ESTIMATORS[cfg.kl_estimator](logp, jnp.asarray(ref_logp, jnp.float32), cfg)
    ent = jnp.zeros_like(logp) if entropy is None else jnp.asarray(entropy, jnp.float32)

    if tis_weight is not None:
        pg_final = jnp.asarray(tis_weight, jnp.float32) * pg_final
    loss = pg_final + cfg.kl_coef * kl - cfg.entropy_coef * ent
    aux = {
        "ratio": ratio,
        "is_clipped": (pg_clipped > pg_unclipped).astype(jnp.float32),
        "is_dual_clipped": ((adv < 0) & (pg > dual_cap)).astype(jnp.float32),
        "kl": kl,
        "pg_loss": pg_final,
    }
    return loss, aux


def tis_weights(old_logp: np.ndarray, sampler_logp: np.ndarray, cap: float, *, log_ratio_clamp: float) -> np.ndarray:
    """min(exp(old_logp - sampler_logp), cap): how much likelier the trainer finds each sampled
    token than the sampler did, capped (verl's truncated importance sampling). The log-ratio is
    clamped to +-log_ratio_clamp (LossConfig's, as in the loss) before exp. [N, T] float32."""
    log_ratio = np.clip(old_logp - sampler_logp, -log_ratio_clamp, log_ratio_clamp)
    return np.minimum(np.exp(log_ratio), cap).astype(np.float32)


def weighted_loss_sum(loss: Array, weights: Array) -> Array:
    """sum(weights * loss): the scalar the train step differentiates, per micro-batch.

    loss, weights: [N, T]. Zero-weight positions contribute exactly 0 even if `loss` is not
    finite there (padding); gradients through them are clean as long as the inputs are finite.
    """
    weights = jnp.asarray(weights, jnp.float32)
    return jnp.sum(jnp.where(weights != 0, loss * weights, 0.0))


# ----------------------------------------------------------------------------- metric sums
# What a micro-batch reports for the step's metrics, and how two reports combine: the one key
# table and the one reducer, used inside the jitted scan and again on the host across mini-batches.

AUX_METRIC_KEYS = ("ratio", "is_clipped", "is_dual_clipped", "kl", "pg_loss", "entropy")  # masked sums
_EXTREMES = {"ratio_max": ("max", -np.inf), "ratio_min": ("min", np.inf)}  # every other key is summed from 0
METRIC_SUM_KEYS = AUX_METRIC_KEYS + ("n_tokens",) + tuple(_EXTREMES)


def empty_metric_sums(xp=jnp) -> dict:
    """The identity of `combine_metric_sums`: 0 for sums, -inf / inf for the ratio's max / min.
    xp: the array module (jnp inside a jitted program, np on the host)."""
    return {k: xp.asarray(_EXTREMES.get(k, (None, 0.0))[1], xp.float32) for k in METRIC_SUM_KEYS}


def combine_metric_sums(acc: dict, new: dict, xp=jnp) -> dict:
    """Two micro-batches' (or mini-batches') metric sums as one: sums add, extremes take max / min."""
    ops = {"max": xp.maximum, "min": xp.minimum}
    return {k: ops[_EXTREMES[k][0]](acc[k], new[k]) if k in _EXTREMES else acc[k] + new[k] for k in METRIC_SUM_KEYS}


def masked_aux_sums(aux: dict[str, Array], loss_mask: Array) -> dict[str, Array]:
    """Masked sums of the aux arrays plus `n_tokens`, for exact metrics across micro-batches.

    Also gives `ratio_max` / `ratio_min` over masked tokens (for the importance-ratio range).
    """
    m = jnp.asarray(loss_mask, jnp.float32)
    out = {k: jnp.sum(v * m) for k, v in aux.items()}
    out["n_tokens"] = jnp.sum(m)
    out["ratio_max"] = jnp.max(jnp.where(m > 0, aux["ratio"], -jnp.inf))
    out["ratio_min"] = jnp.min(jnp.where(m > 0, aux["ratio"], jnp.inf))
    return out


# ----------------------------------------------------------------------------- aggregation
# Each maps (mask [N, T] float64, traj_ids [N], microbatch_ids [N] int, num_microbatches)
# -> (weights [N, T] float64, denominator float).

def _group_token_counts(mask: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-row count of masked tokens in the row's group, and the per-group counts."""
    _, inv = np.unique(ids, return_inverse=True)
    inv = inv.reshape(-1)
    per_group = np.bincount(inv, weights=mask.sum(axis=1))
    return per_group[inv], per_group


@register_aggregation("token_mean")
def _agg_token_mean(mask, traj_ids, microbatch_ids, num_microbatches):
    """Exact global token mean over the optimizer batch."""
    n = mask.sum()
    return mask.copy(), float(n) if n > 0 else 1.0


@register_aggregation("trajectory_mean")
def _agg_trajectory_mean(mask, traj_ids, microbatch_ids, num_microbatches):
    """Each trajectory's masked tokens (over all its conversations) weigh 1 in total."""
    row_counts, per_traj = _group_token_counts(mask, traj_ids)
    w = mask / np.maximum(row_counts, 1.0)[:, None]
    n_traj = int(np.sum(per_traj > 0))
    return w, float(n_traj) if n_traj > 0 else 1.0


@register_aggregation("trajectory_row_mean")
def _agg_trajectory_row_mean(mask, traj_ids, microbatch_ids, num_microbatches):
    """Each trajectory weighs 1 in total, split equally over its rows (its contexts: one per turn in
    memsearcher, one per episode in react) and each row's share over its masked tokens: a turn of a
    multi-context design counts the same whatever its length (docs/method.md §2)."""
    row_tokens = mask.sum(axis=1)
    rows_per_traj, per_traj = _group_token_counts((row_tokens > 0).astype(np.float64)[:, None], traj_ids)
    w = mask / (np.maximum(row_tokens, 1.0) * np.maximum(rows_per_traj, 1.0))[:, None]
    n_traj = int(np.sum(per_traj > 0))
    return w, float(n_traj) if n_traj > 0 else 1.0


# The modes whose weights read every row of a trajectory: the mini-batches keep trajectories whole.
WHOLE_TRAJECTORY_AGGREGATIONS = ("trajectory_mean", "trajectory_row_mean")


@register_aggregation("microbatch_token_mean")
def _agg_microbatch_token_mean(mask, traj_ids, microbatch_ids, num_microbatches):
    """The recipe's behaviour: each micro-batch's token mean, averaged over micro-batches."""
    row_counts, _ = _group_token_counts(mask, microbatch_ids)
    w = mask / (np.maximum(row_counts, 1.0)[:, None] * num_microbatches)
    return w, 1.0


def aggregation_weights(mode: str, loss_mask, traj_ids, microbatch_ids,
                        num_microbatches: int) -> tuple[np.ndarray, float]:
    """Per-token weights for the whole optimizer batch (host side).

    loss_mask: [N, T] (1 on generated tokens); traj_ids: [N] trajectory of each row (any
    labels); microbatch_ids: [N] ints in [0, num_microbatches).
    Returns (weights [N, T] float32, denominator): the optimizer-batch loss is
    sum over micro-batches of sum(weights * loss) / denominator. An all-zero mask gives
    denominator 1 (the loss is then 0, not NaN).
    """
    if mode not in AGGREGATIONS:
        raise ValueError(f"unknown aggregation mode {mode!r}; expected one of {sorted(AGGREGATIONS)}")
    mask = np.asarray(loss_mask, np.float64)
    if mask.ndim != 2:
        raise ValueError(f"loss_mask must be [N, T], got shape {mask.shape}")
    traj = np.asarray(traj_ids)
    mb = np.asarray(microbatch_ids)
    for name, a in (("traj_ids", traj), ("microbatch_ids", mb)):
        if a.shape != (mask.shape[0],):
            raise ValueError(f"{name} must have shape ({mask.shape[0]},) to match loss_mask rows, got {a.shape}")
    if int(num_microbatches) < 1:
        raise ValueError(f"num_microbatches must be >= 1, got {num_microbatches}")
    if mb.size and (not np.issubdtype(mb.dtype, np.integer) or mb.min() < 0 or mb.max() >= num_microbatches):
        raise ValueError(f"microbatch_ids must be integers in [0, {num_microbatches}), "
                         f"got range [{mb.min()}, {mb.max()}]")
    weights, denom = AGGREGATIONS[mode](mask, traj, mb, int(num_microbatches))
    return weights.astype(np.float32), float(denom)
